"""`pod create`, `pod delete` and `pod gc` done by `tpuctl server`, on its session: the same checks,
plan, placement (failover included) and deletion as the local commands, recorded in the server's ledger.

A create is idempotent on the client's key: the key fixes the placement's request id (``request_id_of``),
which labels every slice the placement makes and is recorded with each in the ledger. A retry of a key
whose slices the ledger has answers those slices (``created`` False) and places nothing; a retry while
the first is still being placed by this server is 409 (retry later); the same key with another slice
name is 422. (Across replicas, a retry that arrives while another replica is still placing is caught by
the ledger once the first has recorded its request (409 until its slice is in the cloud), and before
that by the cloud where both place in the same zone: the same request id is the same create request to
Google, and a slice of that name carrying the request id is adopted, never made twice. Two replicas
placing one key in two zones at the same moment is the case left open; a client retries only after a
dropped connection, long after the first replica recorded its request.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tpuctl.errors import NotFoundError, TpuctlError
from tpuctl.server.problems import Conflict, RequestProblem, document
from tpuctl.server.wire_pods import (
    CollectGarbage,
    CreatePod,
    DeletePods,
    GarbageCollected,
    PodCreated,
    PodsDeleted,
)

if TYPE_CHECKING:
    from tpuctl.server.wire_views import ServedBy
    from tpuctl.services.session import Session


def request_id_of(key: str) -> str:
    """The placement's request id for an idempotency key: 12 hex digits, as ``new_request_id`` makes."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


class PodCreates:
    """The creates this server is placing now, by request id (a retry must not start a second one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._placing: set[str] = set()

    @contextmanager
    def placing(self, request_id: str, key: str) -> Iterator[None]:
        with self._lock:
            if request_id in self._placing:
                raise Conflict(
                    f"the slice of Idempotency-Key {key!r} is still being placed",
                    fix="retry the same request in a moment; it answers the slice once it is placed",
                )
            self._placing.add(request_id)
        try:
            yield
        finally:
            with self._lock:
                self._placing.discard(request_id)

    def create(self, session: Session, served: ServedBy, body: CreatePod, key: str) -> PodCreated:
        from tpuctl.services.allocator import Allocator

        rid = request_id_of(key)
        request, warnings = _checked_request(session, body, rid)
        if body.dry_run:
            plan = Allocator(session).plan(request)
            return PodCreated(served_by=served, plan=plan, placement=None, pods=[], warnings=warnings,
                              created=False)  # fmt: skip
        with self.placing(rid, key):
            earlier = _placed_before(session, served, rid, body.name, key)
            if earlier is not None:
                return earlier
            return _place(session, served, request, warnings)


def _checked_request(session: Session, body: CreatePod, rid: str) -> tuple[Any, list[str]]:
    """The placement request as `pod create` builds it, checked against this server's catalog and
    cloud, with its warnings (the monthly budget's, for a real create)."""
    from tpuctl.services.access import with_host_access
    from tpuctl.services.budget import warn_monthly_budget
    from tpuctl.services.locations import check_region, check_zones
    from tpuctl.services.placement_choices import PlacementChoices

    with _choices_checked():
        # Read back as a saved request is: its network values parsed again, as flags are.
        choices = PlacementChoices.from_dict(body.choices.to_dict())
        request = choices.request(
            session.catalog, session.settings, body.accelerator_type, name=body.name, slices=body.slices,
            runtime_version=body.runtime_version, labels=body.labels, wait=body.wait,
        )  # fmt: skip
    request = dataclasses.replace(request, request_id=rid)
    check_zones(session.catalog, session.cloud, list(choices.zones), accelerator=request.accelerator)
    if choices.region is not None:
        check_region(session.catalog, session.cloud, choices.region)
    warnings: list[str] = []
    if not body.dry_run:
        warn_monthly_budget(session, warnings.append)
    request = with_host_access(
        session, request, proxy_command=session.settings.ssh_proxy_command, plan=body.dry_run
    )
    return request, warnings


@contextmanager
def _choices_checked() -> Iterator[None]:
    """The choices come from a client: a value the flags' parsers cannot take is the client's error
    (422), never a bug."""
    try:
        yield
    except TpuctlError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise RequestProblem(
            f"choices: not the placement choices tpuctl writes ({type(exc).__name__}: {exc})",
            status=422,
            field="choices",
            fix="send the placement flags as tpuctl parses them (see the API's schema at /openapi.json)",
        ) from None


def _placed_before(session: Session, served: ServedBy, rid: str, name: str, key: str) -> PodCreated | None:
    """The answer to a retry: the live slices the ledger has of this request id, or None if none."""
    from tpuctl.services.pods import PodService

    mine = [p for p in session.ledger.list_pods(alive=True) if p.request_id == rid]
    if not mine:
        return None
    if not any(p.name == name or p.name.startswith(f"{name}-") for p in mine):
        raise RequestProblem(
            f"the Idempotency-Key {key!r} was used for another slice ({mine[0].name})",
            status=422,
            field="Idempotency-Key",
            value=key,
            fix="use a new key for a new slice; a retry sends the same body with the same key",
        )
    listed = {(v.zone, v.name): v for v in PodService(session).list(mine[0].zone)}
    views = [listed[(p.zone, p.name)].to_dict() for p in mine if (p.zone, p.name) in listed]
    if len(views) < len(mine):  # recorded as requested, not yet in the cloud: another replica places it
        raise Conflict(
            f"the slice of Idempotency-Key {key!r} is still being placed",
            fix="retry the same request in a moment; it answers the slice once it is placed",
        )
    return PodCreated(served_by=served, plan=None, placement=None, pods=views, warnings=[], created=False)


def _place(session: Session, served: ServedBy, request: Any, warnings: list[str]) -> PodCreated:
    from tpuctl.services.allocator import Allocator
    from tpuctl.services.placed import placed_views

    allocator = Allocator(session)
    plan = allocator.plan(request)
    warnings = [*warnings, *plan.warnings]
    error = plan.error()
    if error is not None:
        raise error
    placement = allocator.place(request, plan=plan)
    return PodCreated(served_by=served, plan=plan, placement=placement, pods=placed_views(session, placement),
                      warnings=warnings, created=True)  # fmt: skip


def delete_pods(session: Session, served: ServedBy, body: DeletePods) -> PodsDeleted:
    """`pod delete`: the plan (each slice's requests and the live runs on it); unless ``dry_run``, refused
    while a run is on a slice without ``force``, then each slice deleted."""
    from tpuctl.services.pods import PodService
    from tpuctl.services.run.occupancy import guard_deletion, live_runs_on

    pods = PodService(session)
    plans = pods.plan_delete(body.names, body.zone)
    for plan in plans:
        plan["in_use_by"] = [r.run_id for r in live_runs_on(session, plan["name"], plan["zone"])]
    if body.dry_run:
        return PodsDeleted(served_by=served, plan=plans, deleted=[], failures=[])
    for plan in plans:
        guard_deletion(session, plan["name"], plan["zone"], force=body.force)
    deleted: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for plan in plans:
        try:
            done = pods.delete(plan["name"], zone=plan["zone"], wait=body.wait)
        except NotFoundError as exc:
            failures.append(document(exc))
            continue
        entry: dict[str, Any] = {"name": plan["name"], "zone": plan["zone"]}
        if done.queued_resource:
            entry["queued_resource"] = done.queued_resource
        deleted.append(entry)
    return PodsDeleted(served_by=served, plan=plans, deleted=deleted, failures=failures)


def collect_garbage(session: Session, served: ServedBy, body: CollectGarbage) -> GarbageCollected:
    """`pod gc` on the server's ledger and cloud (``CollectGarbage``)."""
    from tpuctl.services.gc import GarbageCollector

    collector = GarbageCollector(session)
    vanished = collector.vanished(body.zone)
    if not body.dry_run:
        collector.record_gone(vanished)
    survey = collector.survey(body.zone)
    wanted = {(k.kind, k.zone, k.name) for k in body.confirmed}
    items = [i for i in survey.items if (i.kind, i.zone, i.name) in wanted]
    results = collector.collect(items) if items and not body.dry_run else []
    return GarbageCollected(served_by=served, vanished=vanished, survey=survey, results=results)
