"""Where a run goes and how its slice is made: the ``Target`` (an existing READY slice, or one to create),
its part of a plan, and creating it.

A new slice goes through the allocator, as every slice tpuctl creates does (``pod create``, a run's
first slice, a recovery's re-creation, ``runs resume``): the same capacity types, price cap, zones,
quota check and failover, whatever the backend or executor. What the hosts need at creation (the run's
SSH key) travels in the placement request's node metadata.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.base import LABEL_RUN, Node, OperationProgress
from tpuctl.errors import NameNotFoundError, NotFoundError, UsageError
from tpuctl.services.access import with_host_access
from tpuctl.services.placement import TypePreference
from tpuctl.services.run import backstop
from tpuctl.services.run.model import LaunchObserver, PhaseUpdate, PreparedRun, RunRequest, Target
from tpuctl.services.run.occupancy import refuse_second_run
from tpuctl.services.run.sliceset import SliceSet, multislice_prefix
from tpuctl.store.records import SegmentKind

if TYPE_CHECKING:
    from tpuctl.catalog import Catalog
    from tpuctl.services.attempts import Placement
    from tpuctl.services.placement import PlacementRequest
    from tpuctl.services.session import Session


def target(session: Session, request: RunRequest, run_id: str) -> Target:
    """Where ``request`` runs: the ``--pod`` slice (READY, of a known type) or a slice of ``--type``."""
    if request.pod is not None:
        return _existing(session, request, run_id)
    types = slice_type_names(request)
    if not types:
        raise UsageError(
            "say where to run: --pod NAME (an existing slice) or --type TYPE (a new one)",
            field="type",
            fix="e.g. --type v5e-8, or --pod my-slice (see `tpuctl pod list`)",
        )
    placement = request.placement.request(
        session.catalog,
        session.settings,
        types[0],
        name=run_slice_name(run_id, request.slices),
        labels={**request.labels, LABEL_RUN: run_id},
        slices=request.slices,
        other_types=types[1:],
        type_preference=_type_preference(request.type_preference),
    )
    return Target(accelerator=placement.accelerator, placement=placement)


def slice_type_names(request: RunRequest) -> tuple[str, ...]:
    """Every slice type the run may be placed on, as given: ``accelerator_type`` first, then the others."""
    first = () if request.accelerator_type is None else (request.accelerator_type,)
    return (*first, *request.other_accelerator_types)


def placed_type_line(
    prepared: PreparedRun, slices: SliceSet, before: str | None, *, recovering: bool
) -> str | None:
    """What a run of several types says of the type ``slices`` are: which one, when first placed; when a
    recovery lands on another type than ``before`` (the one it ran on), that it did. None for a run of
    one type, or a recovery on the same type."""
    placement = prepared.target.placement
    if placement is None or not placement.other_types:
        return None
    placed = slices.accelerator_type
    if recovering:
        return None if before in (None, placed) else f"recovered on another slice type: {before} -> {placed}"
    allowed = ", ".join(t.accelerator.api_name for t in placement.slice_types)
    return f"placed on {placed} (of the run's slice types {allowed}, {placement.type_preference.value})"


def _type_preference(value: str) -> TypePreference:
    try:
        return TypePreference(value)
    except ValueError:
        raise UsageError(
            f"unknown slice type preference {value!r}",
            field="type_preference",
            value=value,
            fix=f"use one of: {', '.join(p.value for p in TypePreference)}",
        ) from None


def placed_as(catalog: Catalog, prepared: PreparedRun, slices: SliceSet) -> PreparedRun:
    """The run as placed on ``slices``: where the run allows several types, the one the allocator chose
    (its hosts, chips, topology and launch spec follow it); the placement keeps every type, so that a
    recovery ranks them all again. A run of one type is returned as prepared."""
    return _of_type(catalog, prepared, slices.accelerator_type)


def planned_as(catalog: Catalog, prepared: PreparedRun, created: Mapping[str, Any] | None) -> PreparedRun:
    """The run as its dry-run plan would place it: of the chosen candidate's type (``placed_as``)."""
    chosen = (created or {}).get("chosen") or {}
    name = chosen.get("accelerator_type")
    return prepared if name is None else _of_type(catalog, prepared, str(name))


def _of_type(catalog: Catalog, prepared: PreparedRun, api_name: str) -> PreparedRun:
    target = prepared.target
    if target.placement is None or not target.placement.other_types:
        return prepared
    if api_name == target.accelerator.api_name:
        return prepared
    accel = catalog.resolve(api_name)
    return dataclasses.replace(prepared, target=dataclasses.replace(target, accelerator=accel))


def run_slice_name(run_id: str, slices: int) -> str:
    """The name of the slice a run creates: its run id, so `pod list` says whose slice it is, and a run
    prepared again (`runs resume`) names its slices as before rather than at random. Each later slice of
    the run adds ``-r<restart>`` (``renamed``): a node name is unique among a zone's nodes, and the one
    it replaces may still be deleting. Cut to leave a multislice's ``-<i>`` room within the API's 63
    characters (run ids have the same alphabet as node names, but may end with a dash: they may not)."""
    room = 63 - (len(f"-{slices - 1}") if slices > 1 else 0)
    return run_id[:room].rstrip("-")


def _existing(session: Session, request: RunRequest, run_id: str) -> Target:
    assert request.pod is not None
    if slice_type_names(request):
        raise UsageError(
            "--pod and --type exclude each other",
            field="pod",
            value=request.pod,
            fix="run on an existing slice with --pod, or create one with --type",
        )
    existing = find_pods(session, request.pod, _pod_zone(request))
    if request.slices not in (1, existing.count):
        raise UsageError(
            f"--slices {request.slices} does not match pod {existing.describe()}",
            field="slices",
            value=request.slices,
            fix=f"drop --slices: a run on --pod {request.pod} spans its {existing.count} slice(s)",
        )
    for node in existing.nodes:
        if node.state != "READY":
            raise UsageError(
                f"pod {node.name} in {node.zone} is {node.state}, not READY",
                field="pod",
                value=request.pod,
                fix="wait until `tpuctl pod list` shows it READY, or run with --type to create a slice",
            )
        refuse_second_run(session, node.name, node.zone, run_id)
    try:
        accel = session.catalog.resolve(existing.accelerator_type)
    except UsageError as exc:
        raise UsageError(
            f"pod {existing.name} has accelerator type {existing.accelerator_type!r}, which the catalog "
            "does not know",
            field="pod",
            value=request.pod,
            fix="update tpuctl",
        ) from exc
    return Target(accelerator=accel, existing=existing)


def _pod_zone(request: RunRequest) -> str | None:
    """The zone ``--pod`` names a slice in: one ``--zone`` at most (a slice is in one zone)."""
    zones = request.placement.zones
    if len(zones) > 1:
        raise UsageError(
            f"--pod {request.pod} is in one zone, and {len(zones)} were given ({', '.join(zones)})",
            field="zone",
            value=", ".join(zones),
            fix="give the zone of the slice once, or no --zone (`tpuctl pod list` shows where it is)",
        )
    return zones[0] if zones else None


def find_pods(session: Session, name: str, zone: str | None) -> SliceSet:
    """The slice ``name``, or the multislice ``name`` (``pod create --slices N --name NAME``: nodes
    ``NAME-0 .. NAME-(N-1)`` of one queued resource) as one set."""
    try:
        return SliceSet.single(find_pod(session, name, zone))
    except UsageError:
        members = _multislice_members(session, name, zone)
        if not members:
            raise
    return SliceSet.multislice(name, members)


def _multislice_members(session: Session, name: str, zone: str | None) -> list[Node]:
    """The nodes of the multislice whose node prefix is ``name`` (its queued resource made them)."""
    try:
        listed = session.cloud.list_nodes(zone)
    except NotFoundError:
        return []
    members = [n for n in listed if n.multislice_node and multislice_prefix(n.name) == name]
    _refuse_several_zones("multislice", name, members)
    return members


def find_pod(session: Session, name: str, zone: str | None) -> Node:
    cloud = session.cloud
    try:
        if zone:
            return cloud.get_node(zone, name)
        matches = [n for n in cloud.list_nodes(None) if n.name == name]
    except NotFoundError:
        matches = []
    if not matches:
        raise NameNotFoundError(
            f"pod {name!r} does not exist" + (f" in {zone}" if zone else ""),
            field="pod",
            value=name,
            fix="`tpuctl pod list` shows the slices; or run with --type TYPE to create one",
        )
    _refuse_several_zones("pod name", name, matches)
    return matches[0]


def _refuse_several_zones(what: str, name: str, nodes: list[Node]) -> None:
    """A name given without --zone must mean one place."""
    zones = sorted({n.zone for n in nodes})
    if len(zones) > 1:
        raise UsageError(
            f"{what} {name!r} exists in several zones ({', '.join(zones)})",
            field="zone",
            value=name,
            fix="pass --zone to say which",
        )


def plan_creation(session: Session, prepared: PreparedRun) -> tuple[dict[str, Any] | None, str | None]:
    """The plan of the slice's creation (None for an existing slice) and the zone it would land in."""
    target = prepared.target
    if target.placement is not None:
        from tpuctl.services.allocator import Allocator

        placement_plan = Allocator(session).plan(_with_host_metadata(session, prepared, plan=True))
        error = placement_plan.error()
        if error is not None:
            raise error  # the run could not start: say why, with the placement's exit code
        created = placement_plan.to_dict()
        return created, (created.get("chosen") or {}).get("zone") or target.zone
    return None, target.zone


def provision(
    session: Session,
    observer: LaunchObserver,
    prepared: PreparedRun,
    *,
    progress: OperationProgress | None = None,
    prefer_zone: str | None = None,
    detail: Mapping[str, Any] | None = None,
) -> SliceSet:
    """Create the run's slices and wait until READY (a provisioning segment in the ledger).

    ``prefer_zone``: try that zone first, then the others in the allocator's order (a recovery goes
    back where the run was: its data and its quota are there)."""
    target = prepared.target
    ledger = session.ledger
    segment = ledger.add_segment(
        prepared.run_id,
        SegmentKind.PROVISIONING,
        start=session.clock(),
        pod=target.name,
        zone=target.zone,
        capacity=target.capacity,
        detail=detail,
    )
    started = session.monotonic()
    title = f"creating {target.name} ({_shape(prepared)})"
    try:
        placed = _create(session, observer, prepared, progress, prefer_zone, title)
    except BaseException as exc:
        failed = {**(detail or {}), "error": str(exc) or type(exc).__name__}
        ledger.close_segment(segment, end=session.clock(), detail=failed)
        raise
    slices = _placed_set(target.placement, placed.nodes)
    ledger.close_segment(segment, end=session.clock())
    ledger.update_segment(segment, pod=slices.name, zone=slices.zone, capacity=slices.capacity)
    terms = _terms(slices.capacity.value, placed.candidate.price_per_hour)
    named = "" if slices.name == target.name else f"{slices.describe()} "
    took = session.monotonic() - started
    observer.phase(
        PhaseUpdate(title, outcome=f"{named}{slices.state} in {slices.zone} ({terms}), {took:.1f} s")
    )
    return slices


def _shape(prepared: PreparedRun) -> str:
    """``v5litepod-16, 4 hosts``: what a run's new slice (or slice set) is; of several types, each of
    them (``v5litepod-8 or v6e-8, 1 host``), with the host count where they share it."""
    target = prepared.target
    kinds = (
        [target.accelerator]
        if target.placement is None
        else [t.accelerator for t in target.placement.slice_types]
    )
    what = " or ".join(a.api_name for a in kinds)
    if target.slices > 1:
        what = f"{target.slices} x {what}"
    hosts = {a.hosts * target.slices for a in kinds}
    if len(hosts) > 1:
        return what
    (count,) = hosts
    return f"{what}, {count} host{'s' if count != 1 else ''}"


def _placed_set(placement: PlacementRequest | None, nodes: list[Node]) -> SliceSet:
    """What the allocator placed, as the run's slice set (a multislice's nodes in slice order)."""
    assert placement is not None
    if placement.slices == 1:
        return SliceSet.single(nodes[0])
    if len(nodes) != placement.slices:
        raise AssertionError(f"placed {len(nodes)} nodes for {placement.slices} slices")
    return SliceSet.multislice(placement.name, nodes)


def _terms(capacity: str, price_per_hour: float | None) -> str:
    """``spot, 4.80 USD/h``: what a slice costs, said wherever one is created."""
    return f"{capacity}, " + ("price unknown" if price_per_hour is None else f"{price_per_hour:.2f} USD/h")


def _create(
    session: Session,
    observer: LaunchObserver,
    prepared: PreparedRun,
    progress: OperationProgress | None,
    prefer_zone: str | None,
    title: str,
) -> Placement:
    from tpuctl.services.allocator import Allocator

    target = prepared.target
    if target.placement is None:
        raise AssertionError("provision() of a run on an existing slice")
    allocator = Allocator(session)
    placement = _with_host_metadata(session, prepared, plan=False)
    plan = allocator.plan(placement)
    if prefer_zone is not None:
        first = [c for c in plan.order if c.zone == prefer_zone]
        plan = dataclasses.replace(plan, order=[*first, *(c for c in plan.order if c.zone != prefer_zone)])
    best = plan.order[0] if plan.order else None
    where = "where the allocator finds room"
    if best is not None:
        # Of several types, the first choice names its type: it may not be the run's first one.
        kind = f"{best.slice_type.accelerator.api_name} in " if best.several_types and best.slice_type else ""
        where = f"first choice {kind}{best.zone} ({_terms(best.capacity.value, best.price_per_hour)})"
    observer.phase(PhaseUpdate(title))
    observer.detail(None, f"{title}: {where}")
    return allocator.place(placement, progress=progress, plan=plan)


def _with_host_metadata(session: Session, prepared: PreparedRun, *, plan: bool) -> PlacementRequest:
    """The run's placement request with what its hosts need at creation (the run's SSH key; external IPs
    unless a ProxyCommand reaches the internal ones). A plan shows a placeholder key and creates none."""
    placement = prepared.target.placement
    assert placement is not None
    key = prepared.ssh_key
    placement = with_host_access(
        session,
        placement,
        proxy_command=prepared.request.ssh_proxy_command,
        plan=plan,
        public_openssh=None if key is None else key.public_openssh,
    )
    # Past its --max-hours, Compute Engine ends the slice itself (the run's backstop).
    terminate_at = backstop.termination_at(session, prepared)
    return placement if terminate_at is None else dataclasses.replace(placement, terminate_at=terminate_at)


def renamed(prepared: PreparedRun, restart: int, tries: int) -> PreparedRun:
    """The prepared run with a fresh slice name and request id for a recovery or a resume: the run's own
    name with ``-r<restart>`` (and ``-<try>`` after the first try), since the old name may still be
    deleting, and a new request must not be mistaken for the old one's retry."""
    from tpuctl.services.pods import new_request_id

    target = prepared.target
    suffix = f"-r{restart}" + (f"-{tries}" if tries > 1 else "")
    if target.placement is not None:
        base = target.placement.name
        # A multislice's nodes are <name>-<i>: leave room for the largest index too.
        room = (
            63 - len(suffix) - (len(f"-{target.placement.slices - 1}") if target.placement.slices > 1 else 0)
        )
        name = base[:room].rstrip("-") + suffix
        placement = dataclasses.replace(target.placement, name=name, request_id=new_request_id())
        return dataclasses.replace(prepared, target=dataclasses.replace(target, placement=placement))
    return prepared
