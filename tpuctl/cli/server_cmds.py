"""`tpuctl server`: the HTTP API and the run supervisors in one process (``tpuctl.server``)."""

from __future__ import annotations

from typing import Annotated

import typer

from tpuctl.cli.context import build_settings, make_output, session


def register(app: typer.Typer) -> None:
    from tpuctl.cli import server_vm_cmds

    # A group whose callback is the server itself: `tpuctl server --listen ...` serves as before, and
    # `tpuctl server up|status|logs|down` manage the server's VM.
    group = typer.Typer(invoke_without_command=True)
    group.callback()(server)
    server_vm_cmds.register(group)
    app.add_typer(group, name="server")


def server(
    ctx: typer.Context,
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Where the API listens: a loopback address only (no authentication yet).",
        ),
    ] = "127.0.0.1:8471",
    database: Annotated[
        str | None,
        typer.Option("--database", metavar="URL", help="The ledger the server uses (as tpuctl --database)."),
    ] = None,
    max_runs: Annotated[
        str,
        typer.Option("--max-runs", metavar="N", help="Supervise at most N runs at once (the rest wait)."),
    ] = "50",
) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json) and supervise every run nobody holds: submitted ones
    (`tpuctl run --server URL`) and orphans whose supervisor died (adopted once their lease expires).
    Runs outlive every client. SIGTERM or Ctrl-C stops it; its runs are adopted by the next server."""
    if ctx.invoked_subcommand is not None:
        return  # a subcommand (server up, ...) runs instead of the server
    from tpuctl import params
    from tpuctl.server.listen import parse_listen
    from tpuctl.server.serve import serve

    out = make_output(ctx, None)
    address = parse_listen(listen)  # exit 2 for a non-loopback address, before anything opens
    runs = params.whole(max_runs, "max_runs", minimum=1)
    settings = build_settings(ctx, database=database)
    with session(ctx, out, settings) as sess:
        serve(sess, address, max_runs=runs)
