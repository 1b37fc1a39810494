"""The `tpuctl` command: global options, the command groups, and the one place errors become exit codes.

Only typer is imported at start-up; every command imports what it needs when it runs, so
`tpuctl --help` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from tpuctl.cli import (
    catalog_cmds,
    cost_cmds,
    dashboard_cmds,
    db_cmds,
    job_cmds,
    misc_cmds,
    pod_cmds,
    queue_cmds,
    run_cmds,
    server_cmds,
    sim_cmds,
    team_cmds,
)
from tpuctl.cli.context import GlobalOptions

if TYPE_CHECKING:
    from tpuctl.backends.base import Backend

app = typer.Typer(
    name="tpuctl",
    help="A control plane for Google Cloud TPU slices. With no GCP project configured, every command "
    "runs against a built-in simulated TPU cloud.",
    no_args_is_help=True,
    # --install-completion / --show-completion: typer's, for bash, zsh, fish and PowerShell.
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(pod_cmds.app, name="pod")
app.add_typer(catalog_cmds.app, name="catalog")
app.add_typer(sim_cmds.app, name="sim")
app.add_typer(cost_cmds.app, name="cost")
app.add_typer(job_cmds.app, name="job")
app.add_typer(db_cmds.app, name="db")
misc_cmds.register(app)
run_cmds.register(app)
server_cmds.register(app)
dashboard_cmds.register(app)
team_cmds.register(app)
queue_cmds.register(app)


def _print_version(value: bool) -> None:
    if value:
        from tpuctl import __version__

        typer.echo(f"tpuctl {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version),
    ] = False,
    profile: Annotated[str | None, typer.Option("--profile", help="Config profile to use.")] = None,
    project: Annotated[
        str | None, typer.Option("--project", help="GCP project; giving one selects the gcp backend.")
    ] = None,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Output format: table, json, yaml or csv.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")] = False,
    yes: Annotated[bool, typer.Option("-y", "--yes", help="Do not ask for confirmation.")] = False,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="Where the ledger and simulator state live.")
    ] = None,
    database: Annotated[
        str | None,
        typer.Option(
            "--database",
            metavar="URL",
            help="The ledger: sqlite:////ABS/PATH/ledger.db (default: ledger.db in the state dir).",
        ),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            metavar="URL",
            help="Work through this `tpuctl server`: run, runs, cost, pod, quota, catalog prices.",
        ),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="Config file (YAML).")] = None,
    backend: Annotated[
        str | None, typer.Option("--backend", help="sim or gcp (default: gcp if a project is set).")
    ] = None,
) -> None:
    opts = ctx.obj if isinstance(ctx.obj, GlobalOptions) else GlobalOptions()
    opts.profile, opts.project, opts.output = profile, project, output
    opts.dry_run, opts.yes, opts.state_dir, opts.config, opts.backend = (
        dry_run,
        yes,
        state_dir,
        config,
        backend,
    )
    opts.database = database
    opts.server = server
    ctx.obj = opts


def run(argv: list[str] | None = None, *, backend: Backend | None = None) -> None:
    """Console-script entry point: run the app and turn tpuctl errors into messages and exit codes.
    ``backend``: the one every session of the command opens, instead of the one the settings choose
    (tests: ``tpuctl.testing.backend``)."""
    from tpuctl.cli.context import exit_code_for

    args = sys.argv[1:] if argv is None else argv
    opts = GlobalOptions(given_backend=backend)
    try:
        result = _command()(args=args, prog_name="tpuctl", standalone_mode=False, obj=opts)
    except SystemExit as exc:
        raise SystemExit(_code(exc.code)) from None
    except BaseException as exc:
        raise SystemExit(exit_code_for(exc, args, opts)) from None
    # Commands return an int exit code when they end with a non-error status (e.g. a gate's verdict).
    raise SystemExit(result if isinstance(result, int) else 0)


def console_main() -> NoReturn:
    """The ``tpuctl`` process (console script and ``python -m tpuctl``): ``run()``, then end the process
    without tearing the interpreter down.

    Tearing down a process that imported typer, pydantic, rich and the TPU client (clearing every module,
    freeing every object) takes 0.15-0.2 s after the command has finished, on every command. By then the
    command has closed everything it opened, so once the output is flushed there is nothing left to do,
    unless something still runs: a non-daemon thread, a child process, a registered exit handler of
    ours. Then the interpreter exits normally and does its work. (``run()`` itself is what tests call in
    process; it never ends the process.)"""
    import threading

    try:
        run()
        code = 0
    except SystemExit as exc:
        code = _code(exc.code)
    busy = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    children = "multiprocessing" in sys.modules and bool(sys.modules["multiprocessing"].active_children())
    if busy or children:
        raise SystemExit(code)
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe (`| head`): nothing more can be said there.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if "logging" in sys.modules:  # flush and close log handlers, as the interpreter's exit would
        sys.modules["logging"].shutdown()
    os._exit(code)


def _command() -> Any:
    """The click command tree typer builds for ``app`` (what ``app()`` runs), its help polished
    (``tpuctl.cli.helpfmt``): commands in order, whole descriptions, named values."""
    from typer.main import get_command

    from tpuctl.cli.helpfmt import polish

    command = get_command(app)
    polish(command)
    return command


def _code(code: Any) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
