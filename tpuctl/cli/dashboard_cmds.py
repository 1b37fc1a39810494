"""`tpuctl dashboard`: the runs, slices and money pages (``tpuctl.dashboard``) in a browser, over the
local ledger, or a team server's pages through a loopback proxy (``--server``)."""

from __future__ import annotations

from typing import Annotated

import typer

from tpuctl.cli.context import build_settings, make_output, session

DEFAULT_PORT = 8472  # beside `tpuctl server`'s 8471, so both can run on one machine


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)


def dashboard(
    ctx: typer.Context,
    port: Annotated[str, typer.Option("--port", metavar="P", help="Listen on 127.0.0.1:P.")] = str(
        DEFAULT_PORT
    ),
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Do not open a browser.")] = False,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            metavar="URL",
            help="Show this `tpuctl server`'s pages (through a proxy on 127.0.0.1 that sends this CLI's "
            "credentials); also `tpuctl --server URL dashboard` or TPUCTL_SERVER.",
        ),
    ] = None,
) -> None:
    """Serve the dashboard (runs, a run's timeline and preemptions, money per day, live slices) on this
    machine only, and open it in the browser. Ctrl-C stops it. `tpuctl server` serves the same pages
    at /; with --server URL the pages are that server's, reached with this CLI's own credentials."""
    from tpuctl import params
    from tpuctl.cli import remote
    from tpuctl.cli.options import server_of
    from tpuctl.dashboard.serve import serve_app, serve_dashboard
    from tpuctl.server.listen import parse_listen

    out = make_output(ctx, None)
    number = params.whole(port, "port", minimum=1)
    address = parse_listen(f"127.0.0.1:{number}")  # exit 2 for a port out of range, before anything opens
    settings = build_settings(ctx, server=server)
    server = server_of(settings)
    if server is not None:
        from tpuctl.dashboard.proxy import proxy_app

        with remote.client(server) as client:
            serve_app(lambda: proxy_app(client), address, open_browser=not no_browser)
        return
    with session(ctx, out, settings) as sess:
        serve_dashboard(sess, address, open_browser=not no_browser)
