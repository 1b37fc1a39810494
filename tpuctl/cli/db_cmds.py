"""`tpuctl db ...`: the ledger's schema: where it stands against this tpuctl's history (`db status`), and
bringing it there now (`db upgrade`) rather than at the next command that opens it; and moving a
ledger's history into another database (`db copy`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuctl.cli.context import ONE_OBJECT, build_settings, is_dry_run, make_output
from tpuctl.cli.options import DryRunOpt, OutputOpt

if TYPE_CHECKING:
    from tpuctl.cli.render import Output
    from tpuctl.services.db_copy import CopyResult
    from tpuctl.store.copy import CopyStep
    from tpuctl.store.migrate import SchemaState
    from tpuctl.store.url import DatabaseUrl

app = typer.Typer(
    help="The ledger's schema: where it stands, upgrading it; copying a ledger into another database.",
    no_args_is_help=True,
)


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


@app.command("copy")
def copy(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(metavar="SRC", help="The ledger to copy from (a database URL).")],
    target: Annotated[
        str, typer.Argument(metavar="DST", help="The database to copy into (created or upgraded).")
    ],
    dry_run: DryRunOpt = False,
    output: OutputOpt = None,
) -> None:
    """Copy a ledger's finished runs and its events into another database (a laptop's
    sqlite:////path/ledger.db into the team's postgresql://...), then check that both give the same row
    counts and cost totals. Safe to run again: what is there already is skipped, a stopped copy goes on
    where it stopped. Refused while SRC has runs not finished or slices not ended. `--dry-run` counts
    what would be copied and writes nothing."""
    from tpuctl.services.db_copy import copy_database
    from tpuctl.services.prices import load_catalog
    from tpuctl.store.url import parse_database_url

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    src, dst = parse_database_url(source, "source"), parse_database_url(target, "target")
    catalog, prices = load_catalog(settings.resolved_state_dir, settings.resolved_backend.value)
    with _copy_progress(out) as on_step:
        result = copy_database(
            src, dst, catalog=catalog, prices=prices, dry_run=is_dry_run(ctx, dry_run), on_step=on_step
        )
    if out.machine:
        out.document(out.envelope(copy=result.to_dict()))
        return
    out.fields(_copy_title(result), _copy_fields(result))


@contextmanager
def _copy_progress(out: Output) -> Iterator[Callable[[CopyStep], None]]:
    """Each committed batch on stderr: a status line on a terminal, else a plain line (a log, a CI job)."""
    with out.progress("copying the ledger") as status:
        live = status.shown

        def on_step(step: CopyStep) -> None:
            text = f"{step.phase}: {step.done:,} of {step.total:,}"
            if live:
                status.update(text, elapsed_s=status.elapsed_s)
            else:
                out.err.print(f"db copy: {text} ({status.elapsed_s:.1f} s)")

        yield on_step


def _copy_title(result: CopyResult) -> str:
    if result.plan is not None:
        return f"would copy {result.source} into {result.target}"
    checked = {"ledger": "every table and the cost totals match", "copied": "every copied row is there"}
    return f"copied {result.source} into {result.target}: {checked[result.scope or 'copied']}"


def _copy_fields(result: CopyResult) -> dict[str, Any]:
    doc = result.to_dict()
    fields: dict[str, Any] = {"source": doc["source"], "target": doc["target"]}
    fields.update(doc.get("plan") or doc.get("copied") or {})
    fields.pop("progress", None)
    if result.outcome is not None:
        fields["source_rows"] = doc["rows"]["source"]
        fields["cost_usd"] = f"{result.source_cost['cost_usd']:.2f} (both)"
        fields["verified"] = result.scope
    fields["elapsed_s"] = doc["elapsed_s"]
    return fields


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
