"""`tpuctl db ...`: the ledger's schema: where it stands against this tpuctl's history (`db status`), and
bringing it there now (`db upgrade`) rather than at the next command that opens it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from tpuctl.cli.context import ONE_OBJECT, build_settings, is_dry_run, make_output
from tpuctl.cli.options import DryRunOpt, OutputOpt

if TYPE_CHECKING:
    from tpuctl.store.migrate import SchemaState
    from tpuctl.store.url import DatabaseUrl

app = typer.Typer(help="The ledger's schema: where it stands, and upgrading it.", no_args_is_help=True)


@app.command("status")
def status(ctx: typer.Context, output: OutputOpt = None) -> None:
    """Say where the ledger's schema stands: its revision, this tpuctl's newest, and what opening it
    would run. Reads only; creates nothing."""
    from tpuctl.store.migrate import schema_state

    out = make_output(ctx, output, ONE_OBJECT)
    url = build_settings(ctx).resolved_database
    fields = _fields(url, schema_state(url))
    if out.machine:
        out.document(out.envelope(database=fields))
        return
    out.fields(f"ledger {url.text}", fields)


@app.command("upgrade")
def upgrade(ctx: typer.Context, dry_run: DryRunOpt = False, output: OutputOpt = None) -> None:
    """Bring the ledger's schema to this tpuctl's newest revision now, in one transaction (a new ledger
    is created). `--dry-run` says what would run and changes nothing."""
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.migrate import schema_state

    out = make_output(ctx, output, ONE_OBJECT)
    url = build_settings(ctx).resolved_database
    before = schema_state(url)
    if before.newer or not is_dry_run(ctx, dry_run):
        # Opening migrates; it refuses a newer ledger (upgrade tpuctl) and what this release cannot open.
        Ledger.open(url).close()
    fields = _fields(url, before)
    fields["dry_run"] = is_dry_run(ctx, dry_run)
    if out.machine:
        out.document(out.envelope(database=fields))
        return
    verb = "would run" if fields["dry_run"] else "ran"
    title = f"ledger {url.text}: {verb} {', '.join(before.pending)}" if before.pending else "up to date"
    out.fields(title, fields)


def _fields(url: DatabaseUrl, state: SchemaState) -> dict[str, Any]:
    from tpuctl.store import migrations

    return {
        "database": url.text,
        "engine": "sqlite" if url.path is not None else "postgresql",
        "revision": state.revision,
        "newest": migrations.HEAD,
        "pending": list(state.pending),
        "sqlite_user_version": state.legacy_version,
        "newer_than_this_tpuctl": state.newer,
    }
