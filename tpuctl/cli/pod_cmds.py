"""`tpuctl pod ...`: create, list, describe and delete TPU slices."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuctl.cli.context import assume_yes, is_dry_run, make_output, session
from tpuctl.cli.options import DryRunOpt, OutputOpt, YesOpt, ZoneOpt

if TYPE_CHECKING:
    from tpuctl.cli.render import Output
    from tpuctl.services.pods import PodView

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
    accelerator_type: Annotated[str, typer.Argument(metavar="TYPE", help="e.g. v5e-64, v6e-8, v5p-128.")],
    name: Annotated[str | None, typer.Option("--name", help="Slice name (default: generated).")] = None,
    zone: Annotated[
        list[str] | None, typer.Option("--zone", help="Zone (repeatable; the first is used).")
    ] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Spot capacity.")] = False,
    preemptible: Annotated[bool, typer.Option("--preemptible", help="Preemptible capacity.")] = False,
    reserved: Annotated[
        str | None, typer.Option("--reserved", help="Reserved capacity from this reservation.")
    ] = None,
    runtime_version: Annotated[
        str | None, typer.Option("--runtime-version", help="TPU software version (default per type).")
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="KEY=VALUE label (repeatable).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until the slice is READY.")] = True,
    output: OutputOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Create a TPU slice and wait until it is READY."""
    from tpuctl.catalog import CapacityType
    from tpuctl.errors import UsageError
    from tpuctl.services.pods import PodService, parse_labels

    out = make_output(ctx, output)
    chosen = [c for c, flag in ((CapacityType.SPOT, spot), (CapacityType.PREEMPTIBLE, preemptible)) if flag]
    if reserved is not None:
        chosen.append(CapacityType.RESERVED)
    if len(chosen) > 1:
        raise UsageError(
            "--spot, --preemptible and --reserved exclude each other",
            field="capacity",
            value=", ".join(c.value for c in chosen),
            fix="pick one capacity type",
        )
    if reserved is not None and not reserved.strip():
        raise UsageError(
            "--reserved needs a reservation name", field="--reserved", fix="--reserved RESERVATION"
        )
    capacity = chosen[0] if chosen else CapacityType.ON_DEMAND
    labels = parse_labels(label or [])
    with session(ctx, out, zones=zone or None) as sess:
        pods = PodService(sess)
        spec = pods.build_spec(
            accelerator_type,
            name=name,
            zone=(zone or [None])[0],
            capacity=capacity,
            runtime_version=runtime_version,
            labels=labels,
            reservation=reserved,
        )
        if is_dry_run(ctx, dry_run):
            plan = pods.plan_create(spec)
            _render_plan(out, plan)
            return
        with out.progress(f"creating {spec.name} ({spec.accelerator.api_name}) in {spec.zone}") as prog:
            pods.create(spec, wait=wait, progress=prog)
        view = next(v for v in pods.list(spec.zone) if v.name == spec.name)
        if out.machine:
            out.document(out.envelope(pod=view.to_dict()))
        else:
            out.out.print(
                f"created [bold]{view.name}[/] in {view.zone}: {view.accelerator_type} "
                f"({view.topology}, {view.hosts} hosts), {view.state}, {view.capacity}"
                + (f", {view.price_per_hour:.2f} USD/h" if view.price_per_hour is not None else "")
                + f" in {prog.elapsed_s:.1f} s"
            )


def _render_plan(out: Output, plan: dict[str, Any]) -> None:
    if out.machine:
        out.document(out.envelope(dry_run=True, plan=plan))
        return
    import json

    out.out.print("[bold]dry run[/]: nothing was changed. Plan:")
    for key in ("action", "name", "zone", "accelerator_type", "topology", "chips", "hosts", "capacity"):
        if key in plan:
            out.out.print(f"  {key}: {plan[key]}")
    if plan.get("price_per_hour") is not None:
        out.out.print(f"  estimated price: {plan['price_per_hour']:.2f} USD/h")
    for request in plan.get("requests", []):
        out.out.print(f"  request: {request['method']} {request['url']}")
        if request.get("body") is not None:
            out.out.print("  body: " + json.dumps(request["body"], indent=2).replace("\n", "\n  "))


@app.command("list")
def list_pods(ctx: typer.Context, zone: ZoneOpt = None, output: OutputOpt = None) -> None:
    """List the slices that exist (every zone unless --zone)."""
    from tpuctl.services.pods import PodService

    out = make_output(ctx, output)
    with session(ctx, out) as sess:
        views = PodService(sess).list(zone)
    out.rows(
        "pods",
        _POD_COLUMNS,
        (_pod_row(v) for v in views),
        key="pods",
        records=[v.to_dict() for v in views],
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

    out = make_output(ctx, output)
    with session(ctx, out) as sess:
        data = PodService(sess).describe(name, zone)
    if out.machine:
        out.document(out.envelope(pod=data))
        return
    events = data.pop("events")
    out.fields(f"pod {name}", data)
    out.rows(
        "events",
        ("TIME", "EVENT", "DETAIL"),
        ([e["time"], e["kind"], e.get("detail") or ""] for e in events),
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
) -> None:
    """Delete slices (they stop billing and free their quota)."""
    from tpuctl.errors import NotFoundError, TpuctlError
    from tpuctl.services.pods import PodService

    out = make_output(ctx, output)
    with session(ctx, out) as sess:
        pods = PodService(sess)
        plans = pods.plan_delete(names, zone)
        if is_dry_run(ctx, dry_run):
            if out.machine:
                out.document(out.envelope(dry_run=True, plan=plans))
            else:
                out.out.print("[bold]dry run[/]: nothing was changed. Would delete:")
                for plan in plans:
                    req = plan["requests"][0]
                    out.out.print(f"  {plan['name']} ({plan['zone']}): {req['method']} {req['url']}")
            return
        if not assume_yes(ctx, yes) and not out.machine:
            listing = ", ".join(f"{p['name']} ({p['zone']})" for p in plans)
            typer.confirm(f"delete {listing}?", abort=True)
        deleted: list[dict[str, Any]] = []
        failures: list[TpuctlError] = []
        for plan in plans:
            try:
                with out.progress(f"deleting {plan['name']}") as prog:
                    pods.delete(plan["name"], zone=plan["zone"], wait=wait, progress=prog)
                deleted.append({"name": plan["name"], "zone": plan["zone"]})
                out.note(f"deleted {plan['name']} ({plan['zone']})")
            except NotFoundError as exc:
                failures.append(exc)
        if out.machine:
            out.document(out.envelope(deleted=deleted))
        if failures:
            raise failures[0]
