"""`tpuctl server`: the HTTP API and the run supervisors in one process (``tpuctl.server``)."""

from __future__ import annotations

from pathlib import Path
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
            help="Where the API listens: a loopback address, unless --workspaces turns authentication on.",
        ),
    ] = "127.0.0.1:8471",
    workspaces: Annotated[
        str | None,
        typer.Option(
            "--workspaces",
            metavar="FILE",
            help="The workspace file (docs/teams.md): every request then needs a member's Google ID token.",
        ),
    ] = None,
    audience: Annotated[
        str | None,
        typer.Option(
            "--audience", metavar="AUD", help="The ID tokens' audience for this server (default: its URL)."
        ),
    ] = None,
    iap_audience: Annotated[
        str | None,
        typer.Option(
            "--iap-audience",
            metavar="AUD",
            help="Behind IAP: accept its signed header for /projects/NUMBER/global/backendServices/ID.",
        ),
    ] = None,
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
    from tpuctl.errors import UsageError
    from tpuctl.server.listen import parse_listen
    from tpuctl.server.serve import TeamAccess, serve
    from tpuctl.teams.workspaces import load_workspaces

    out = make_output(ctx, None)
    # Exit 2 naming the file's line for a bad workspace file, and for a non-loopback address without one,
    # before anything opens.
    team = None
    if workspaces is not None:
        team = TeamAccess(load_workspaces(Path(workspaces)), audience=audience, iap_audience=iap_audience)
    elif audience is not None or iap_audience is not None:
        raise UsageError(
            "--audience and --iap-audience need --workspaces (who may call the server)",
            field="--workspaces",
            fix="give --workspaces FILE",
        )
    address = parse_listen(listen, authenticated=team is not None)
    if team is not None and audience is None and address.unspecified:
        raise UsageError(
            f"--listen {listen} names no address clients can use, so it cannot be the tokens' audience",
            field="--audience",
            fix="give --audience with the URL clients reach the server at (their --server), e.g. "
            f"--audience http://HOST:{address.port}",
        )
    runs = params.whole(max_runs, "max_runs", minimum=1)
    settings = build_settings(ctx, database=database)
    with session(ctx, out, settings) as sess:
        serve(sess, address, max_runs=runs, team=team)
