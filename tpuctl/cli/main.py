"""The `tpuctl` command: global options, the command groups, and the one place errors become exit codes.

Only typer is imported at start-up; every command imports what it needs when it runs, so
`tpuctl --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tpuctl.cli import catalog_cmds, cost_cmds, misc_cmds, pod_cmds, run_cmds, sim_cmds
from tpuctl.cli.context import GlobalOptions

app = typer.Typer(
    name="tpuctl",
    help="A control plane for Google Cloud TPU slices. With no GCP project configured, every command "
    "runs against a built-in simulated TPU cloud.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(pod_cmds.app, name="pod")
app.add_typer(catalog_cmds.app, name="catalog")
app.add_typer(sim_cmds.app, name="sim")
app.add_typer(cost_cmds.app, name="cost")
misc_cmds.register(app)
run_cmds.register(app)


@app.callback()
def main(
    ctx: typer.Context,
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
    ctx.obj = opts


def run(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and turn tpuctl errors into messages and exit codes."""
    from tpuctl.cli.context import exit_code_for

    args = sys.argv[1:] if argv is None else argv
    opts = GlobalOptions()
    try:
        result = app(args=args, prog_name="tpuctl", standalone_mode=False, obj=opts)
    except SystemExit as exc:
        raise SystemExit(_code(exc.code)) from None
    except BaseException as exc:
        raise SystemExit(exit_code_for(exc, args, opts)) from None
    # Commands return an int exit code when they end with a non-error status (e.g. a gate's verdict).
    raise SystemExit(result if isinstance(result, int) else 0)


def _code(code: Any) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
