"""`tpuctl pod ...`: create, list, describe and delete TPU slices."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuctl.cli import remote
from tpuctl.cli.context import ONE_OBJECT, build_settings, confirm, is_dry_run, make_output, session
from tpuctl.cli.options import (
    DryRunOpt,
    OutputOpt,
    WorkspaceOpt,
    YesOpt,
    ZoneOpt,
    server_of,
    type_given_once,
)
from tpuctl.cli.placement_flags import (
    ApiOpt,
    CapacityTypeOpt,
    MaxPriceOpt,
    NetworkOpt,
    PreemptibleOpt,
    QueuedOpt,
    RaceKOpt,
    RegionOpt,
    ReservedOpt,
    ServiceAccountOpt,
    SpotOpt,
    StrategyOpt,
    SubnetworkOpt,
    TagsOpt,
    ValidForOpt,
    ZonesOpt,
    host_network_words,
    network_settings,
    placement_choices,
)
from tpuctl.words import counted

if TYPE_CHECKING:
    from tpuctl.cli.render import Output
    from tpuctl.server.wire_pods import CreatePod, DeletePods
    from tpuctl.services.attempts import Placement
    from tpuctl.services.gc import GcResult, GcSurvey
    from tpuctl.services.placement import Plan
    from tpuctl.services.pods import PodView
    from tpuctl.store.records import PodRecord

app = typer.Typer(help="Create, list, describe and delete TPU slices (pods).", no_args_is_help=True)

_POD_COLUMNS = ("NAME", "ZONE", "TYPE", "TOPOLOGY", "HOSTS", "STATE", "CAPACITY", "USD/H")


def _pod_row(view: PodView) -> list[Any]:
    price = None if view.price_per_hour is None else f"{view.price_per_hour:.2f}"
    return [
        view.name,
        view.zone,
        view.accelerator_type,
        view.topology,
        view.hosts,
        view.state,
        view.capacity,
        price,
    ]


@app.command("create")
def create(
    ctx: typer.Context,
    type_argument: Annotated[
        str | None, typer.Argument(metavar="TYPE", help="e.g. v5e-64, v6e-8, v5p-128 (or --type).")
    ] = None,
    type_option: Annotated[
        str | None,
        typer.Option("--type", "--accelerator-type", metavar="TYPE", help="The slice's type, as TYPE."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Slice name (default: generated).")] = None,
    zone: ZonesOpt = None,
    region: RegionOpt = None,
    capacity_type: CapacityTypeOpt = None,
    spot: SpotOpt = False,
    preemptible: PreemptibleOpt = False,
    reserved: ReservedOpt = None,
    max_price: MaxPriceOpt = None,
    queued: QueuedOpt = False,
    valid_for: ValidForOpt = None,
    strategy: StrategyOpt = None,
    race_k: RaceKOpt = None,
    api: ApiOpt = None,
    network: NetworkOpt = None,
    subnetwork: SubnetworkOpt = None,
    tags: TagsOpt = None,
    service_account: ServiceAccountOpt = None,
    slices: Annotated[
        str | None,
        typer.Option(
            "--slices",
            metavar="N",
            help="Number of slices (N > 1: a multislice through one queued resource).",
        ),
    ] = None,
    runtime_version: Annotated[
        str | None, typer.Option("--runtime-version", help="TPU software version (default per type).")
    ] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="KEY=VALUE label (repeatable).")] = None,
    workspace: WorkspaceOpt = None,
    wait: Annotated[
        bool,
        typer.Option("--wait/--no-wait", help="Wait until READY (without waiting there is no failover)."),
    ] = True,
    max_hours: Annotated[
        str | None,
        typer.Option(
            "--max-hours", metavar="HOURS", help="A run on this slice stops before H hours from READY (cost)."
        ),
    ] = None,
    output: OutputOpt = None,
    dry_run: DryRunOpt = False,
) -> int:
    """Create TPU slices where they are allowed, offered, available and under the cap; wait until READY.

    Every candidate (zone x capacity type) is checked for offer, price and zone/region quota; the
    cheapest feasible one is tried first and stockouts fail over to the next. --dry-run prints the plan
    and exits 0 if feasible, 4 (no quota), 5 (not offered / no capacity) or 6 (over the price cap).
    """
    from tpuctl import params
    from tpuctl.catalog import Catalog
    from tpuctl.cli.context import build_settings
    from tpuctl.server.wire_pods import CreatePod
    from tpuctl.services.access import with_host_access
    from tpuctl.services.allocator import Allocator
    from tpuctl.services.budget import max_hours_labels, warn_monthly_budget  # the budget's warnings
    from tpuctl.services.locations import check_region, check_zones
    from tpuctl.services.placed import placed_views

    def hours_of(value: str | None) -> float | None:
        return None if value is None else params.hours(value, "max_hours")

    out = make_output(ctx, output, ONE_OBJECT)
    # Every flag is parsed and checked before anything is contacted: bad input exits 2 without starting
    # a backend.
    accelerator_type = _one_type(type_argument, type_option)
    choices = placement_choices(
        zone=zone,
        region=region,
        capacity_type=capacity_type,
        spot=spot,
        preemptible=preemptible,
        reserved=reserved,
        max_price=max_price,
        queued=queued,
        valid_for=valid_for,
        strategy=strategy,
        race_k=race_k,
        api=api,
    )
    if workspace is not None:
        choices = dataclasses.replace(choices, workspace=workspace)  # checked by the actor at the plan
    settings = build_settings(
        ctx,
        **network_settings(
            network=network, subnetwork=subnetwork, tags=tags, service_account=service_account
        ),
    )
    labels = {**params.labels(label or []), **max_hours_labels(hours_of(max_hours))}
    request = choices.request(
        Catalog.load(),
        settings,
        accelerator_type,
        name=name,
        slices=1 if slices is None else params.whole(slices, "slices"),
        runtime_version=runtime_version,
        labels=labels,
        wait=wait,
    )
    server = server_of(settings)
    if server is not None:
        if any(v is not None for v in (network, subnetwork, tags, service_account)):
            # The flags win over the server's settings, as they win over this machine's.
            choices = dataclasses.replace(
                choices, network=request.network, service_account=request.service_account
            )
        body = CreatePod(accelerator_type=accelerator_type, name=request.name, choices=choices,
                         slices=request.slices, runtime_version=runtime_version, labels=labels, wait=wait,
                         dry_run=is_dry_run(ctx, dry_run))  # fmt: skip
        return _create_through(out, server, body)
    with session(ctx, out, settings) as sess:
        # A typo is exit 2, not "not offered"; its suggestion is a zone that offers the type.
        check_zones(sess.catalog, sess.cloud, list(choices.zones), accelerator=request.accelerator)
        if choices.region is not None:
            check_region(sess.catalog, sess.cloud, choices.region)
        if not is_dry_run(ctx, dry_run):
            warn_monthly_budget(sess, out.warn)  # the profile's monthly_budget
        # The slice is made reachable by `tpuctl run` (its key, external IPs unless a ProxyCommand).
        request = with_host_access(
            sess, request, proxy_command=settings.ssh_proxy_command, plan=is_dry_run(ctx, dry_run)
        )
        allocator = Allocator(sess)
        plan = allocator.plan(request)
        if is_dry_run(ctx, dry_run):
            return _dry_run_end(out, plan)
        for warning in plan.warnings:
            out.warn(warning)
        error = plan.error()
        if error is not None:
            if not out.machine:
                _render_candidates(out, plan)
            raise error
        what = (
            f"{request.slices} x {request.accelerator.api_name}"
            if request.slices > 1
            else (request.accelerator.api_name)
        )
        with out.progress(f"placing {request.name} ({what})") as prog, _placing(request.name):
            placement = allocator.place(request, progress=prog, plan=plan)
        views = placed_views(sess, placement)
        if out.machine:
            out.document(out.envelope(pod=views[0] if views else None, pods=views,
                                      placement=placement.to_dict()))  # fmt: skip
            return 0
        _render_placement(out, placement, views, prog.elapsed_s)
    return 0


def _dry_run_end(out: Output, plan: Plan) -> int:
    """`pod create --dry-run`'s plan, and its verdict's exit code (what is infeasible said on stderr)."""
    _render_plan(out, plan)
    if not plan.feasible:
        out.err.print(f"[red]infeasible ({plan.verdict.value}):[/] {_escape(plan.message or '')}")
        if plan.fix:
            out.err.print(f"[dim]fix:[/] {_escape(plan.fix)}")
    return plan.verdict.exit_code


def _create_through(out: Output, server: str, body: CreatePod) -> int:
    """`pod create` by the server: its plan (a dry run), its placement, or for a retry the slices it had
    placed, rendered as a local create renders them."""
    import time

    started = time.monotonic()
    with remote.client(server) as api, _placing(body.name):
        answer = api.create_pod(body)
    remote.banner(out, answer.served_by, server)
    for warning in answer.warnings:
        out.warn(warning)
    if body.dry_run:
        assert answer.plan is not None
        return _dry_run_end(out, answer.plan)
    placement, views = answer.placement, answer.pods
    if out.machine:
        out.document(out.envelope(pod=views[0] if views else None, pods=views,
                                  placement=None if placement is None else placement.to_dict()))  # fmt: skip
    elif placement is not None:
        _render_placement(out, placement, views, time.monotonic() - started)
    else:
        out.out.print(f"[bold]{body.name}[/] was placed by an earlier try of this request:")
        out.rows("slices", ("NAME", "ZONE", "TYPE", "STATE"),
                 ([v["name"], v["zone"], v["accelerator_type"], v["state"]] for v in views),
                 key="pods", records=views)  # fmt: skip
    return 0


def _one_type(argument: str | None, option: str | None) -> str:
    """TYPE, given as the argument or as --type/--accelerator-type (gcloud's name), once."""
    from tpuctl.errors import UsageError

    chosen = type_given_once(argument, option, command="pod create")
    if chosen is None:
        raise UsageError(
            "missing the slice's type",
            field="TYPE",
            fix="e.g. `tpuctl pod create v5e-8` (`tpuctl catalog types` lists the types)",
        )
    return chosen


@contextmanager
def _placing(name: str) -> Iterator[None]:
    """Ctrl-C while a slice is placed says that one may exist, and how to find and delete it."""
    from tpuctl.errors import InterruptedByUser

    try:
        yield
    except KeyboardInterrupt as exc:
        raise InterruptedByUser(
            f"interrupted while placing {name}: a slice may have been created",
            fix=f"`tpuctl pod list` shows it; `tpuctl pod delete {name}` deletes it, "
            "`tpuctl pod gc` collects what tpuctl left",
        ) from exc


def _zone(zone: str | None) -> str | None:
    """--zone, checked before a backend is opened."""
    from tpuctl import params

    return None if zone is None else params.zone(zone)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _render_placement(
    out: Output, placement: Placement, views: list[dict[str, Any]], elapsed_s: float
) -> None:
    cand = placement.candidate
    failed = [a for a in placement.attempts if a.outcome.value not in ("created", "queued")]
    price = "" if cand.price_per_hour is None else f", {cand.price_per_hour:.2f} USD/h"
    tried = f" after {len(failed)} failed attempt(s)" if failed else ""
    state = "READY" if placement.ready_at is not None else "accepted (not waited for)"
    out.out.print(
        f"placed [bold]{placement.request.name}[/] in {cand.zone} ({cand.capacity.value}{price}): "
        f"{len(views) or placement.request.slices} slice(s) {state} in {elapsed_s:.1f} s{tried}"
        + (f", queued resource {placement.queued_resource}" if placement.queued_resource else "")
    )
    out.rows(
        "slices",
        ("SLICE", "NAME", "ZONE", "TYPE", "TOPOLOGY", "HOSTS", "STATE", "CAPACITY"),
        (
            [
                "-" if v.get("slice_index") is None else v["slice_index"],
                v["name"],
                v["zone"],
                v.get("accelerator_type"),
                v.get("topology"),
                v.get("hosts"),
                v.get("state"),
                v.get("capacity", cand.capacity.value),
            ]
            for v in views
        ),
        key="pods",
        records=views,
    )
    if failed:
        out.rows(
            "attempts",
            ("ZONE", "CAPACITY", "OUTCOME", "SECONDS", "COST USD", "MESSAGE"),
            (
                [
                    a.zone,
                    a.capacity.value,
                    a.outcome.value,
                    f"{a.duration_s:.1f}",
                    "" if a.cost_usd is None else f"{a.cost_usd:.4f}",
                    a.message[:100],
                ]
                for a in placement.attempts
            ),
            key="attempts",
            records=[a.to_dict() for a in placement.attempts],
        )


def _render_candidates(out: Output, plan: Plan) -> None:
    def quota_cell(c: dict[str, Any]) -> str:
        parts = []
        for q in c["quota"]:
            avail = "unlimited" if q["available"] is None else str(q["available"])
            parts.append(f"{q['scope']} {avail}/{q['needed']}")
        return ", ".join(parts) or "reservation"

    records = plan.to_dict()["candidates"]
    out.rows(
        "candidates",
        ("RANK", "ZONE", "CAPACITY", "USD/H", "QUOTA AVAIL/NEEDED", "STATUS", "WHY"),
        (
            [
                c["rank"] or "-",
                c["zone"],
                c["capacity"],
                "-" if c["price_per_hour"] is None else f"{c['price_per_hour']:.2f}",
                quota_cell(c),
                c["status"],
                c["reason"],
            ]
            for c in records
        ),
        key="candidates",
        records=records,
    )


def _render_plan(out: Output, plan: Plan) -> None:
    if out.machine:
        out.document(out.envelope(dry_run=True, plan=plan.to_dict()))
        return
    import json

    req = plan.request
    cap = "no price cap" if req.max_price is None else f"cap {req.max_price:.2f} USD/h"
    slices = f"{req.slices} x " if req.slices > 1 else ""
    out.out.print(
        f"[bold]dry run[/]: nothing was changed. Plan for {req.name}: {slices}{req.accelerator.api_name} "
        f"({req.accelerator.topology}, {counted(req.accelerator.hosts, 'host')} each), "
        f"{', '.join(c.value for c in req.capacity_types)}, {cap}, strategy {req.strategy.value}"
        + (", queued" if req.uses_queued_resource else "")
    )
    hosts = host_network_words(req.to_dict())
    if hosts is not None:
        out.out.print(_escape(hosts))
    _render_candidates(out, plan)
    chosen = plan.chosen
    if chosen is not None:
        price = plan.estimated_price_per_hour()
        out.out.print(
            f"chosen: {chosen.zone} {chosen.capacity.value}"
            + ("" if price is None else f", estimated {price:.2f} USD/h")
        )
    for request in plan.requests:
        out.out.print(f"request: {request.method} {request.url}")
        if request.body is not None:
            out.out.print("body: " + json.dumps(request.body, indent=2))
    for warning in plan.warnings:
        out.warn(warning)
    out.out.print(f"verdict: {plan.verdict.value} (exit {plan.verdict.exit_code})")


@app.command("gc")
def gc(
    ctx: typer.Context,
    zone: ZoneOpt = None,
    output: OutputOpt = None,
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
) -> None:
    """Delete what holds quota and gives nothing back: PREEMPTED/TERMINATED slices, failed or suspended
    queued resources, and the slices this ledger created that no ledger entry owns (a live slice it cannot
    prove its own is listed as not ours, never deleted); record ledger entries whose slice no longer exists
    as gone. --dry-run lists only."""
    from tpuctl.services.gc import GarbageCollector

    out = make_output(ctx, output)
    zone = _zone(zone)
    dry = is_dry_run(ctx, dry_run)
    server = server_of(build_settings(ctx))
    if server is not None:
        _gc_through(ctx, out, server, zone, dry=dry, yes=yes)
        return
    with session(ctx, out) as sess:
        collector = GarbageCollector(sess)
        # Ledger entries whose slice is gone: recorded at once (only the ledger changes, nothing to ask).
        vanished = collector.vanished(zone)
        if not dry:
            collector.record_gone(vanished)
        found = collector.survey(zone)
        if _gc_found(out, vanished, found, dry=dry):
            return
        confirm(ctx, yes, f"delete these {len(found.items)}?", out)
        with out.progress("collecting") as prog:
            results = collector.collect(found.items, progress=prog)
    _gc_collected(out, vanished, found, results, dry=dry)


def _gone(vanished: list[PodRecord], *, dry: bool) -> list[dict[str, Any]]:
    return [{"name": p.name, "zone": p.zone, "state": p.state.value, "recorded": not dry} for p in vanished]


def _gc_found(out: Output, vanished: list[PodRecord], found: GcSurvey, *, dry: bool) -> bool:
    """Say what gc found; True when that is all (a dry run, or nothing to delete), else the table of what
    it would delete, before asking."""
    items = found.items
    if not out.machine:
        for p in vanished:
            verdict = "would be recorded as gone" if dry else "recorded as gone"
            out.out.print(f"slice {p.name} ({p.zone}) no longer exists; its ledger entry {verdict}")
        for n in found.not_ours:
            out.out.print(f"{n.kind.replace('_', ' ')} {n.name} ({n.zone}, {n.state}): {_escape(n.reason)}")
    records = [i.to_dict() for i in items]
    columns = ("KIND", "NAME", "ZONE", "STATE", "TYPE", "WHY")
    rows = [[i.kind, i.name, i.zone, i.state, i.accelerator_type, i.reason] for i in items]
    if dry or not items:
        if out.machine:
            out.document(out.envelope(dry_run=dry, gc=records, deleted=[], gone=_gone(vanished, dry=dry),
                                      not_ours=[n.to_dict() for n in found.not_ours]))  # fmt: skip
        elif not items:
            out.out.print("nothing to collect")
        else:
            out.out.print("[bold]dry run[/]: nothing was changed. Would delete:")
            out.rows("garbage", columns, rows, key="gc", records=records)
        return True
    if not out.machine:
        out.rows("garbage", columns, rows, key="gc", records=records)
    return False


def _gc_collected(
    out: Output, vanished: list[PodRecord], found: GcSurvey, results: list[GcResult], *, dry: bool
) -> None:
    """What gc deleted; exit 4 naming what it could not."""
    from tpuctl.errors import CloudError

    if out.machine:
        out.document(out.envelope(gc=[r.to_dict() for r in results],
                                  deleted=[r.item.name for r in results if r.deleted],
                                  gone=_gone(vanished, dry=dry),
                                  not_ours=[n.to_dict() for n in found.not_ours]))  # fmt: skip
    else:
        for r in results:
            verdict = "deleted" if r.deleted else f"[red]not deleted[/]: {_escape(r.error or '')}"
            out.out.print(f"{r.item.kind} {r.item.name} ({r.item.zone}): {verdict}")
    failures = [r for r in results if not r.deleted]
    if failures:
        names = ", ".join(f"{r.item.name} ({r.item.zone})" for r in failures)
        raise CloudError(
            f"could not delete {names}", fix="run `tpuctl pod gc` again; `tpuctl pod list` shows them"
        )


def _gc_through(ctx: typer.Context, out: Output, server: str, zone: str | None, *, dry: bool,
                yes: bool) -> None:  # fmt: skip
    """`pod gc` by the server: its survey (the gone entries recorded unless a dry run), then, once
    confirmed here, the deletion of what it surveyed and still finds dead."""
    from tpuctl.server.wire_pods import CollectGarbage, GcKey

    with remote.client(server) as api:
        first = api.collect_garbage(CollectGarbage(zone=zone, dry_run=dry))
        remote.banner(out, first.served_by, server)
        if _gc_found(out, first.vanished, first.survey, dry=dry):
            return
        confirm(ctx, yes, f"delete these {len(first.survey.items)}?", out)
        confirmed = [GcKey(kind=i.kind, zone=i.zone, name=i.name) for i in first.survey.items]
        done = api.collect_garbage(CollectGarbage(zone=zone, confirmed=confirmed))
    _gc_collected(out, first.vanished, first.survey, done.results, dry=False)


@app.command("list")
def list_pods(ctx: typer.Context, zone: ZoneOpt = None, output: OutputOpt = None) -> None:
    """List the slices that exist (every zone unless --zone)."""
    from tpuctl.services.pods import PodService

    out = make_output(ctx, output)
    zone = _zone(zone)
    server = server_of(build_settings(ctx))
    if server is not None:
        with remote.client(server) as api:
            answer = api.list_pods(zone)
        remote.banner(out, answer.served_by, server)
        views = answer.pods
    else:
        with session(ctx, out) as sess:
            views = PodService(sess).list(zone)
    out.rows(
        "pods",
        _POD_COLUMNS,
        (_pod_row(v) for v in views),
        key="pods",
        records=[v.to_dict() for v in views],
        keep=frozenset({"NAME", "ZONE", "STATE"}),
        drop=("TOPOLOGY", "HOSTS", "USD/H", "CAPACITY", "TYPE"),
    )


@app.command("describe")
def describe(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Slice name.")],
    zone: ZoneOpt = None,
    output: OutputOpt = None,
) -> None:
    """Show one slice: its state, hosts, price and the events tpuctl recorded for it."""
    from tpuctl.services.pods import PodService

    out = make_output(ctx, output, ONE_OBJECT)
    zone = _zone(zone)
    server = server_of(build_settings(ctx))
    if server is not None:
        with remote.client(server) as api:
            described = api.describe_pod(name, zone)
        remote.banner(out, described.served_by, server)
        data = described.pod
    else:
        with session(ctx, out) as sess:
            data = PodService(sess).describe(name, zone)
    if out.machine:
        out.document(out.envelope(pod=data))
        return
    _render_description(out, name, data)


def _render_description(out: Output, name: str, data: dict[str, Any]) -> None:
    """`pod describe` for people: prices with their units, labels as k=v, one row per host, events in
    words."""
    from tpuctl.cli.render import human, words

    fields = dict(data)
    events, endpoints = fields.pop("events"), fields.pop("network_endpoints")
    gone = fields["deleted_at"] is not None
    if not gone:  # a live slice: nothing to say about a deletion
        del fields["deleted_at"], fields["deleted_by"]
    for key, unit in (("price_per_chip_hour", "USD/chip-hour"), ("price_per_hour", "USD/hour")):
        if fields.get(key) is not None:
            fields[key] = f"{fields[key]:.2f} {unit}"
    fields["labels"] = ", ".join(f"{k}={v}" for k, v in sorted((fields.get("labels") or {}).items()))
    for key in ("created_at", "deleted_at"):
        if isinstance(fields.get(key), str):
            fields[key] = fields[key][:19].replace("T", " ") + " UTC"
    out.fields(f"pod {name}" + (" (deleted: as the ledger recorded it)" if gone else ""), fields)
    out.rows(
        "hosts",
        ("WORKER", "ADDRESS", "PORT"),
        ([i, e["ip_address"], e["port"]] for i, e in enumerate(endpoints)),
        key="hosts",
        records=endpoints,
    )
    out.rows(
        "events",
        ("TIME (UTC)", "EVENT", "DETAIL"),
        (
            [e["time"][:19].replace("T", " "), e["kind"], words(e.get("detail") or {}) or human(None)]
            for e in events
        ),
        key="events",
        records=events,
    )


@app.command("delete")
def delete(
    ctx: typer.Context,
    names: Annotated[list[str], typer.Argument(help="Slice names.")],
    zone: ZoneOpt = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until deleted.")] = True,
    output: OutputOpt = None,
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
    force: Annotated[
        bool, typer.Option("--force", help="Delete a slice even while a run is on it (the run stops).")
    ] = False,
) -> None:
    """Delete slices (they stop billing and free their quota). A slice a live run is on needs --force."""
    from tpuctl.errors import NotFoundError, TpuctlError
    from tpuctl.server.wire_pods import DeletePods
    from tpuctl.services.pods import PodService
    from tpuctl.services.run.occupancy import guard_deletion, live_runs_on

    out = make_output(ctx, output)
    zone = _zone(zone)
    server = server_of(build_settings(ctx))
    if server is not None:
        _delete_through(ctx, out, server, DeletePods(names=names, zone=zone, wait=wait, force=force),
                        dry_run=is_dry_run(ctx, dry_run), yes=yes)  # fmt: skip
        return
    with session(ctx, out) as sess:
        pods = PodService(sess)
        plans = pods.plan_delete(names, zone)
        for plan in plans:
            plan["in_use_by"] = [r.run_id for r in live_runs_on(sess, plan["name"], plan["zone"])]
        if is_dry_run(ctx, dry_run):
            _render_delete_plan(out, plans)
            return
        for plan in plans:  # refused without --force while a run is on it (checked before asking)
            if plan["in_use_by"] and not force:
                guard_deletion(sess, plan["name"], plan["zone"], force=False)
        confirm(ctx, yes, f"delete {_deletion_listing(plans)}?", out)
        for plan in plans:  # the runs on it will record a deletion, not a preemption
            guard_deletion(sess, plan["name"], plan["zone"], force=True)
        deleted: list[dict[str, Any]] = []
        failures: list[TpuctlError] = []
        for plan in plans:
            try:
                with out.progress(f"deleting {plan['name']}") as prog:
                    done = pods.delete(plan["name"], zone=plan["zone"], wait=wait, progress=prog)
                qr = done.queued_resource
                entry: dict[str, Any] = {"name": plan["name"], "zone": plan["zone"]}
                if qr:
                    entry["queued_resource"] = qr
                deleted.append(entry)
                also = f" and its queued resource {qr}" if qr else ""
                out.note(f"deleted {plan['name']} ({plan['zone']}){also}")
            except NotFoundError as exc:
                failures.append(exc)
        if out.machine:
            out.document(out.envelope(deleted=deleted))
        if failures:
            raise failures[0]


def _render_delete_plan(out: Output, plans: list[dict[str, Any]]) -> None:
    if out.machine:
        out.document(out.envelope(dry_run=True, plan=plans))
        return
    out.out.print("[bold]dry run[/]: nothing was changed. Would delete:")
    for plan in plans:
        for req in plan["requests"]:
            out.out.print(f"  {plan['name']} ({plan['zone']}): {req['method']} {req['url']}")


def _deletion_listing(plans: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{p['name']} ({p['zone']}"
        + (f"; in use by run {', '.join(p['in_use_by'])})" if p["in_use_by"] else ")")
        for p in plans
    )


def _delete_through(ctx: typer.Context, out: Output, server: str, body: DeletePods, *, dry_run: bool,
                    yes: bool) -> None:  # fmt: skip
    """`pod delete` by the server: its plan first (shown, or asked about), then the deletion; a slice a
    live run is on is refused by the server without --force before anything is deleted, as here."""
    from tpuctl.client.api import ServerError

    with remote.client(server) as api:
        planned = api.delete_pods(body.model_copy(update={"dry_run": True}))
        remote.banner(out, planned.served_by, server)
        if dry_run:
            _render_delete_plan(out, planned.plan)
            return
        if not any(p["in_use_by"] for p in planned.plan) or body.force:
            confirm(ctx, yes, f"delete {_deletion_listing(planned.plan)}?", out)
        answer = api.delete_pods(body)
    for entry in answer.deleted:
        also = f" and its queued resource {entry['queued_resource']}" if entry.get("queued_resource") else ""
        out.note(f"deleted {entry['name']} ({entry['zone']}){also}")
    if out.machine:
        out.document(out.envelope(deleted=answer.deleted))
    if answer.failures:
        raise ServerError(answer.failures[0])
