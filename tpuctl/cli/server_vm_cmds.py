"""`tpuctl server up|status|logs|down`: the team server on a small always-on Compute Engine VM; and the
two commands its units run there, `server backup` (the ledger's copies to the team bucket) and `server
restore` (the newest copy back, reconciled with the cloud before the server starts)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tpuctl.cli.context import ONE_OBJECT, build_settings, is_dry_run, make_output, session
from tpuctl.cli.options import DryRunOpt, OutputOpt
from tpuctl.errors import UsageError

if TYPE_CHECKING:
    from tpuctl.cli.render import Output
    from tpuctl.services.server_vm.plan import ServerVmPlan, ServerVmSpec
    from tpuctl.settings import Settings

ZoneArg = Annotated[str, typer.Option("--zone", help="The server VM's zone, e.g. us-central1-a.")]
NameOpt = Annotated[str, typer.Option("--name", help="The server VM's name.")]
DatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--database",
        metavar="URL",
        help="The team's PostgreSQL (postgresql://...); without it, SQLite on the VM's disk, copied to "
        "--bucket every minute.",
    ),
]
BucketOpt = Annotated[
    str | None,
    typer.Option("--bucket", help="The team bucket the ledger's copies go to (default: the bucket setting)."),
]


def register(group: typer.Typer) -> None:
    group.command("up")(up)
    group.command("status")(status)
    group.command("logs")(logs)
    group.command("down")(down)
    group.command("backup", hidden=True)(backup)
    group.command("restore", hidden=True)(restore)


def up(
    ctx: typer.Context,
    zone: ZoneArg,
    name: NameOpt = "tpuctl-server",
    machine_type: Annotated[
        str, typer.Option("--machine-type", help="A general-purpose machine type.")
    ] = "e2-small",
    database: DatabaseOpt = None,
    bucket: BucketOpt = None,
    dry_run: DryRunOpt = False,
    output: OutputOpt = None,
) -> None:
    """The plan for the server's VM (--dry-run only in this release: nothing is created yet): create it
    (standard provisioning, never spot), set it up as run hosts are, restore the newest ledger copy (no
    --database), start the server under systemd, and say how to reach it (an SSH port forward through
    IAP: the server listens on the VM's loopback only) and what it costs a month."""
    from tpuctl.services.server_vm.plan import plan_up

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    spec = _spec(settings, zone, name, machine_type, database, bucket)
    _show_or_refuse(ctx, out, dry_run, plan_up(spec, _compute_base(settings)))


def status(
    ctx: typer.Context,
    zone: ZoneArg,
    name: NameOpt = "tpuctl-server",
    dry_run: DryRunOpt = False,
    output: OutputOpt = None,
) -> None:
    """The plan for reading the VM's state, the service's, the last ledger copy's time and the server's
    /readyz (--dry-run only in this release)."""
    from tpuctl.services.server_vm.plan import plan_status

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    spec = _spec(settings, zone, name, "e2-small", None, settings.bucket)
    _show_or_refuse(ctx, out, dry_run, plan_status(spec, _compute_base(settings)))


def logs(
    ctx: typer.Context,
    zone: ZoneArg,
    name: NameOpt = "tpuctl-server",
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
    dry_run: DryRunOpt = False,
    output: OutputOpt = None,
) -> None:
    """The plan for reading the server unit's journal over SSH (--dry-run only in this release)."""
    from tpuctl.services.server_vm.plan import plan_logs

    out = make_output(ctx, output, ONE_OBJECT)
    spec = _spec(build_settings(ctx), zone, name, "e2-small", None, None)
    _show_or_refuse(ctx, out, dry_run, plan_logs(spec, follow=follow))


def down(
    ctx: typer.Context,
    zone: ZoneArg,
    name: NameOpt = "tpuctl-server",
    database: DatabaseOpt = None,
    bucket: BucketOpt = None,
    keep_disk: Annotated[bool, typer.Option("--keep-disk", help="Keep the VM's boot disk.")] = False,
    dry_run: DryRunOpt = False,
    output: OutputOpt = None,
) -> None:
    """The plan for stopping the server, taking a final ledger copy (SQLite) and deleting the VM
    (--dry-run only in this release)."""
    from tpuctl.services.server_vm.plan import plan_down

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    spec = _spec(settings, zone, name, "e2-small", database, bucket)
    _show_or_refuse(ctx, out, dry_run, plan_down(spec, _compute_base(settings), keep_disk=keep_disk))


def backup(
    ctx: typer.Context,
    ledger: Annotated[Path, typer.Option("--ledger", help="The SQLite ledger to copy.")],
    bucket: Annotated[str, typer.Option("--bucket")],
    prefix: Annotated[str, typer.Option("--prefix")],
    every: Annotated[float, typer.Option("--every", help="Seconds between copies.")] = 60.0,
    once: Annotated[bool, typer.Option("--once", help="One copy, then exit.")] = False,
    output: OutputOpt = None,
) -> None:
    """Copy the ledger to gs://BUCKET/PREFIX/ every --every seconds (SQLite's online backup)."""
    import sys
    import threading

    from tpuctl.services.server_vm.backup import LedgerBackups, backup_every

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    with session(ctx, out, settings) as sess:
        backups = LedgerBackups(sess.buckets(), bucket, prefix)
        if once:
            copy = backups.take(ledger, datetime.now(UTC))
            out.fields(f"copied to {copy.url}", copy.to_dict())
            return
        backup_every(
            backups,
            ledger,
            every_s=every,
            clock=lambda: datetime.now(UTC),
            stop=threading.Event(),  # the unit's stop (SIGTERM) ends the process
            on_copy=lambda copy: print(f"copied to {copy.url}", file=sys.stderr, flush=True),
            on_error=lambda exc: print(f"copy failed: {exc}", file=sys.stderr, flush=True),
        )


def restore(
    ctx: typer.Context,
    ledger: Annotated[Path, typer.Option("--ledger", help="Where the restored SQLite ledger goes.")],
    bucket: Annotated[str, typer.Option("--bucket")],
    prefix: Annotated[str, typer.Option("--prefix")],
    output: OutputOpt = None,
) -> None:
    """Restore the newest copy to --ledger (none: a new ledger), then reconcile it with the cloud."""
    from tpuctl.services.server_vm.backup import LedgerBackups
    from tpuctl.services.server_vm.reconcile import reconcile_restored
    from tpuctl.store.url import sqlite_url

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    with session(ctx, out, settings) as sess:
        copy = LedgerBackups(sess.buckets(), bucket, prefix).restore_newest(ledger)
    if copy is None:
        out.fields("no copy to restore: the server starts with a new ledger", {"restored": None})
        return
    restored = build_settings(ctx, database=sqlite_url(ledger).text)
    with session(ctx, out, restored) as sess:
        result = reconcile_restored(sess)
    out.fields(f"restored {copy.url}", {"restored": copy.to_dict(), **result.to_dict()})


def _spec(
    settings: Settings, zone: str, name: str, machine_type: str, database: str | None, bucket: str | None
) -> ServerVmSpec:
    from tpuctl.catalog import validate_zone
    from tpuctl.catalog.server_vm_prices import general_machine_types
    from tpuctl.services.server_vm.plan import ServerVmSpec

    if not settings.project:
        raise UsageError("server up needs a project", field="--project", fix="pass --project P")
    if machine_type not in general_machine_types():
        known = ", ".join(sorted(general_machine_types()))
        raise UsageError(
            f"--machine-type {machine_type}: not a general-purpose type tpuctl knows ({known})",
            field="--machine-type",
            value=machine_type,
        )
    if database is not None and not database.startswith("postgresql"):
        raise UsageError(
            "--database on the server VM is a PostgreSQL URL (without it: SQLite on the VM, copied to "
            "the bucket)",
            field="--database",
            value=database,
        )
    return ServerVmSpec(
        project=settings.project,
        zone=validate_zone(zone),
        name=name,
        machine_type=machine_type,
        database=database,
        bucket=bucket or settings.bucket,
    )


def _compute_base(settings: Settings) -> str:
    from tpuctl.cloud.compute import GOOGLE_COMPUTE_ENDPOINT
    from tpuctl.settings import Backend

    if settings.resolved_backend is Backend.SIM:
        return settings.sim_url or "http://<the simulator>"
    return GOOGLE_COMPUTE_ENDPOINT


def _show_or_refuse(ctx: typer.Context, out: Output, dry_run: bool, plan: ServerVmPlan) -> None:
    if plan.command in ("up", "down") and plan.spec.database is None and plan.spec.bucket is None:
        raise UsageError(
            "a server VM with a SQLite ledger needs the team bucket for its copies",
            field="--bucket",
            fix="pass --bucket B (or set bucket), or --database postgresql://...",
        )
    if not is_dry_run(ctx, dry_run):
        raise UsageError(
            f"server {plan.command} runs with --dry-run only in this release: the plan is printed, "
            "nothing is created or changed",
            fix=f"tpuctl server {plan.command} --dry-run ...",
        )
    _show(out, plan)


def _show(out: Output, plan: ServerVmPlan) -> None:
    data = plan.to_dict()
    if out.machine:
        out.document(out.envelope(dry_run=True, plan=data))
        return
    out.out.print(f"server {plan.command} {plan.spec.name} in {plan.spec.zone} (dry run: nothing changed)")
    for index, step in enumerate(plan.steps, 1):
        out.out.print(f"{index:>2}. {step.what}")
        if step.request is not None:
            out.out.print(f"    {step.request.method} {step.request.url}", markup=False)
        if step.command is not None:
            out.out.print(f"    $ {step.command}", markup=False)
    for file_name, text in plan.units.items():
        out.out.print(f"--- {file_name}", markup=False)
        out.out.print(text, markup=False)
    if plan.reach:
        out.out.print("reach it with:")
        for line in plan.reach:
            out.out.print(f"    {line}", markup=False)
    if plan.cost is not None:
        total = plan.cost.total_usd
        out.out.print(
            f"cost: {'unknown' if total is None else f'{total:.2f} USD'} per month at catalog prices "
            f"({plan.cost.machine_type} always on, {plan.cost.disk_gb} GB balanced disk, external IPv4)"
        )
