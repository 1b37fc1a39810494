"""`tpuctl server up|status|logs|down`: the team server on a small always-on Compute Engine VM; and the
two commands its units run there, `server backup` (the ledger's copies to the team bucket) and `server
restore` (the newest copy back, reconciled with the cloud before the server starts)."""

from __future__ import annotations

from collections.abc import Callable
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
    ready_timeout: Annotated[
        float, typer.Option("--ready-timeout", help="Seconds the server may take to answer /readyz.")
    ] = 300.0,
    dry_run: DryRunOpt = False,
    output: OutputOpt = None,
) -> None:
    """Create the server's VM (standard provisioning, never spot), set it up as run hosts are, restore
    the newest ledger copy (no --database), start the server as a user service unit, wait until it is
    ready, and say how to reach it (an SSH port forward through IAP: it listens on the VM's loopback
    only). --dry-run prints the plan and what it costs a month."""
    from tpuctl.services.server_vm.plan import plan_up
    from tpuctl.services.server_vm.vm import server_up
    from tpuctl.services.server_vm.wheel import build_server_wheel

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    spec = _spec(settings, zone, name, machine_type, database, bucket)
    the_plan = plan_up(spec, _compute_base(settings))
    if _show_plan(ctx, out, dry_run, the_plan):
        return
    say = _say(out)
    with session(ctx, out, settings) as sess:
        say("building tpuctl's wheel from this checkout (uv build, offline)")
        wheel = build_server_wheel(sess.state_dir / "server-wheel")
        result = server_up(sess, spec, wheel, say=say, ready_timeout_s=ready_timeout)
    if out.machine:
        out.document(out.envelope(server=result.to_dict()))
        return
    out.out.print(
        f"server {spec.name} is up in {spec.zone} ({result.vm.machine_type}, {result.vm.address}); "
        f"ready after {result.ready_after_s:.0f} s",
        markup=False,
    )
    if result.restored:
        out.out.print(f"ledger: {result.restored}", markup=False)
    out.out.print("reach it with:")
    for line in result.reach:
        out.out.print(f"    {line}", markup=False)


def status(
    ctx: typer.Context,
    zone: ZoneArg,
    name: NameOpt = "tpuctl-server",
    bucket: BucketOpt = None,
    dry_run: DryRunOpt = False,
    output: OutputOpt = None,
) -> None:
    """The VM's state, the server unit's, its /readyz and the last ledger copy's time."""
    from tpuctl.services.server_vm.plan import plan_status
    from tpuctl.services.server_vm.vm import server_status

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    spec = _spec(settings, zone, name, "e2-small", None, bucket or settings.bucket)
    if _show_plan(ctx, out, dry_run, plan_status(spec, _compute_base(settings))):
        return
    with session(ctx, out, settings) as sess:
        state = server_status(sess, spec)
    data = state.to_dict()
    if out.machine:
        out.document(out.envelope(server=data))
        return
    vm = state.vm
    last = state.last_copy
    out.fields(
        f"server {spec.name} in {spec.zone}",
        {
            "vm": f"{vm.status} ({vm.machine_type}, {vm.address})" if vm else "none",
            "unit": state.unit or "-",
            "ready": state.ready,
            "last copy": f"{last['url']} at {last['taken_at']}" if last else "none",
        },
    )


def logs(
    ctx: typer.Context,
    zone: ZoneArg,
    name: NameOpt = "tpuctl-server",
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
    dry_run: DryRunOpt = False,
    output: OutputOpt = None,
) -> None:
    """The server unit's journal, read over SSH (-f: followed until interrupted)."""
    from tpuctl.services.server_vm.plan import plan_logs
    from tpuctl.services.server_vm.vm import server_logs

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    spec = _spec(settings, zone, name, "e2-small", None, None)
    if _show_plan(ctx, out, dry_run, plan_logs(spec, follow=follow)):
        return
    lines: list[str] = []

    def on_line(line: str) -> None:
        if out.machine:
            lines.append(line)
        else:
            out.out.print(line, markup=False, highlight=False)

    with session(ctx, out, settings) as sess:
        server_logs(sess, spec, follow=follow, on_line=on_line)
    if out.machine:
        out.document(out.envelope(lines=lines))


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
    """Stop the server, take a final ledger copy (SQLite) and delete the VM. --keep-disk is a plan only
    in this release."""
    from tpuctl.services.server_vm.plan import plan_down
    from tpuctl.services.server_vm.vm import server_down

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    spec = _spec(settings, zone, name, "e2-small", database, bucket)
    if _show_plan(ctx, out, dry_run, plan_down(spec, _compute_base(settings), keep_disk=keep_disk)):
        return
    if keep_disk:
        raise UsageError(
            "--keep-disk is printed as a plan only in this release", field="--keep-disk", fix="drop it"
        )
    with session(ctx, out, settings) as sess:
        copied = server_down(sess, spec, say=_say(out))
    if out.machine:
        out.document(out.envelope(server={"name": spec.name, "zone": spec.zone, "deleted": True,
                                          "final_copy": copied}))  # fmt: skip
        return
    out.out.print(f"server {spec.name} is down; its VM is deleted", markup=False)
    if copied:
        out.out.print(f"final ledger copy: {copied.removeprefix('copied to ')}", markup=False)


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


def _show_plan(ctx: typer.Context, out: Output, dry_run: bool, plan: ServerVmPlan) -> bool:
    """Refuse what cannot work; print the plan and return True on --dry-run."""
    from tpuctl.settings import Backend

    if plan.command in ("up", "down") and plan.spec.database is None and plan.spec.bucket is None:
        raise UsageError(
            "a server VM with a SQLite ledger needs the team bucket for its copies",
            field="--bucket",
            fix="pass --bucket B (or set bucket), or --database postgresql://...",
        )
    if is_dry_run(ctx, dry_run):
        _show(out, plan)
        return True
    settings = build_settings(ctx)
    if plan.command == "up" and settings.resolved_backend is Backend.SIM and not settings.sim_url:
        raise UsageError(
            "server up on the simulator needs a served simulator: the server on the VM keeps using the "
            "simulated cloud after this command ends, and a simulator started for one command ends with "
            "it (a served one keeps the VMs and their network up)",
            field="sim_url",
            fix="tpuctl sim serve (in another shell), then TPUCTL_SIM_URL=<its URL> tpuctl server up ...",
        )
    return False


def _say(out: Output) -> Callable[[str], None]:
    """Progress lines on stderr (also under -o json: stdout holds the document alone)."""

    def say(line: str) -> None:
        out.err.print(line, markup=False, highlight=False)

    return say


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
