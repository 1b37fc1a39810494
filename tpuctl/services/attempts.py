"""What placement does to the outside world besides the create calls: it records every attempt and every
slice's lifecycle in the ledger, retries what may be retried, and cleans up after itself.

Shared by the node path (``tpuctl.services.allocator``) and the queued-resource paths
(``tpuctl.services.queued``). Plain Python: no CLI, no rendering.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import (
    LABEL_REQUEST,
    LABEL_RUN,
    NEVER_READY_NODE_STATES,
    Node,
    NodeRequest,
    OperationProgress,
    QueuedResource,
    QueuedResourceRequest,
    TpuCloud,
)
from tpuctl.cloud.retry import Polling, RetryPolicy, Sleep
from tpuctl.errors import (
    AlreadyExistsError,
    AmbiguousError,
    CloudError,
    NetworkError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    RateLimitedError,
    StockoutError,
    TpuctlError,
    TransientError,
    UnauthenticatedError,
)
from tpuctl.services.placement import Candidate, PlacementRequest, Plan
from tpuctl.store.records import AttemptOutcome, EventKind

if TYPE_CHECKING:
    from tpuctl.store.ledger import Ledger
    from tpuctl.teams.actor import Actor

T = TypeVar("T")

#: A queued resource in one of these states is finished waiting, one way or the other.
QR_SETTLED_STATES = frozenset({"ACTIVE", "FAILED", "SUSPENDED", "SUSPENDING", "DELETING"})

#: Namespace of the API request ids tpuctl derives for queued resources (a UUID per request x zone x
#: capacity type, so a retry of the same attempt repeats its id and a different attempt never does).
_REQUEST_ID_NAMESPACE = uuid.UUID("7b0f7d2e-4a36-5b1d-9c55-2f1d8a0c6e11")


def api_request_id(request_id: str, zone: str, capacity: CapacityType) -> str:
    """The queued-resource ``requestId`` of one attempt: a UUID (as the API wants), also a valid label."""
    return str(uuid.uuid5(_REQUEST_ID_NAMESPACE, f"{request_id}/{zone}/{capacity.value}"))


def outcome_for(exc: BaseException) -> AttemptOutcome:
    """The ledger outcome of a failed attempt."""
    if isinstance(exc, StockoutError):
        return AttemptOutcome.STOCKOUT
    if isinstance(exc, QuotaExceededError):
        return AttemptOutcome.QUOTA
    if isinstance(exc, RateLimitedError):
        return AttemptOutcome.RATE_LIMITED
    if isinstance(exc, AmbiguousError):
        return AttemptOutcome.AMBIGUOUS
    if isinstance(exc, TransientError):
        return AttemptOutcome.TRANSIENT
    if isinstance(exc, KeyboardInterrupt):
        return AttemptOutcome.CANCELLED
    return AttemptOutcome.FAILED


def is_fatal(exc: BaseException) -> bool:
    """Failures that another zone would not cure: credentials and permissions, the hosts' network, and
    anything not from the cloud (a usage error, a bug). Everything else fails over to the next candidate."""
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError | NameTakenError | NetworkError):
        return True
    return not isinstance(exc, CloudError)


def retrying(policy: RetryPolicy, sleep: Sleep) -> Any:
    """A tenacity ``Retrying`` for one placement step: rate limits and transient errors (ambiguous ones
    included: each step looks before it repeats a mutation), jittered exponential waits, bounded by
    attempts and a deadline."""
    import tenacity

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.max_attempts) | tenacity.stop_before_delay(policy.deadline_s),
        # The policy's own jittered exponential wait, the same the cloud layer uses.
        wait=lambda state: policy.wait_for(state.attempt_number),
        retry=tenacity.retry_if_exception_type((RateLimitedError, TransientError)),
        reraise=True,
        sleep=sleep,
    )


#: In a ``requested`` event's detail: the process that is about to create the slice (``requester()``).
REQUESTED_BY = "requested_by"


def requester() -> dict[str, Any]:
    """This process, as a ``requested`` event records it: so that `pod gc` can tell a request whose tpuctl
    died before its create reached the cloud (nothing will ever come of it) from one still on its way."""
    from tpuctl.processes import process_start_ticks

    pid = os.getpid()
    return {"pid": pid, "start_ticks": process_start_ticks(pid), "host": os.uname().nodename}


def requester_gone(detail: Mapping[str, Any] | None) -> bool:
    """True when a ``requested`` event's requester is a process of this machine that no longer runs (False
    when it runs, or cannot be told: another machine, or no requester recorded by an older tpuctl)."""
    from tpuctl.processes import is_same_process, is_zombie

    who = (detail or {}).get(REQUESTED_BY)
    if not isinstance(who, Mapping) or who.get("host") != os.uname().nodename:
        return False
    pid, ticks = who.get("pid"), who.get("start_ticks")
    if not isinstance(pid, int) or not isinstance(ticks, int):
        return False
    return not is_same_process(pid, ticks) or is_zombie(pid)


@dataclass
class AttemptResult:
    """One placement attempt as it ended: where, how, how long, and (race losers) what it cost."""

    zone: str
    capacity: CapacityType
    outcome: AttemptOutcome
    message: str
    duration_s: float
    price_per_hour: float | None
    queued_resource: str | None = None
    cost_usd: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "zone": self.zone,
            "capacity": self.capacity.value,
            "outcome": self.outcome.value,
            "message": self.message,
            "duration_s": round(self.duration_s, 3),
            "price_per_hour": self.price_per_hour,
            "queued_resource": self.queued_resource,
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6),
            **({"detail": self.detail} if self.detail else {}),
        }


@dataclass
class Placement:
    """A successful placement: the candidate that took it, its slices (in slice-index order), and every
    attempt on the way."""

    plan: Plan
    candidate: Candidate
    nodes: list[Node]
    attempts: list[AttemptResult]
    queued_resource: str | None
    started_at: float  # monotonic
    ready_at: float | None  # monotonic; None with --no-wait

    @property
    def request(self) -> PlacementRequest:
        return self.plan.request

    def to_dict(self) -> dict[str, Any]:
        cand = self.candidate
        multi = len(self.nodes) > 1 or self.request.slices > 1
        return {
            "request_id": self.request.request_id,
            "name": self.request.name,
            "zone": cand.zone,
            "capacity": cand.capacity.value,
            "accelerator_type": self.request.placing(cand).accelerator.api_name,
            "slices": self.request.slices,
            "queued_resource": self.queued_resource,
            "price_per_hour": None if cand.price_per_hour is None else round(cand.price_per_hour, 6),
            "pods": [
                {
                    "name": n.name,
                    "zone": n.zone,
                    "slice_index": i if multi else None,
                    "state": n.state,
                    "accelerator_type": n.accelerator_type,
                    "hosts": len(n.network_endpoints) or self.request.accelerator.hosts,
                }
                for i, n in enumerate(self.nodes)
            ],
            "attempts": [a.to_dict() for a in self.attempts],
            "seconds_to_ready": None if self.ready_at is None else round(self.ready_at - self.started_at, 3),
        }


class Recorder:
    """Writes a placement's lifecycle events and attempts to the ledger, each attributed: a run's to the
    run (the ledger reads its owner), a slice made outside any run to ``actor`` in the request's
    workspace."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        backend: str,
        project: str,
        clock: Callable[[], float] = time.monotonic,
        actor: Actor | None = None,
    ) -> None:
        self._ledger = ledger
        self._backend = backend
        self._project = project
        self._clock = clock
        self._actor = actor

    def _owner(self, request: PlacementRequest) -> tuple[str | None, str | None]:
        """(principal, workspace) a write of ``request`` is for when it is no run's; (None, None) for a
        run's (the ledger knows its owner)."""
        if LABEL_RUN in request.labels or self._actor is None:
            return None, None
        return self._actor.principal, self._actor.submit_workspace(request.workspace)

    def pod_event(
        self,
        kind: EventKind,
        request: PlacementRequest,
        candidate: Candidate,
        name: str,
        *,
        slice_index: int | None = None,
        queued_resource: str | None = None,
        labels: Mapping[str, str] | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        accel = request.accelerator
        principal, workspace = self._owner(request)
        if kind is EventKind.REQUESTED:
            detail = {**(detail or {}), REQUESTED_BY: requester()}
        self._ledger.record_event(
            kind,
            pod=name,
            zone=candidate.zone,
            accelerator_type=accel.api_name,
            chips=accel.chips,
            hosts=accel.hosts,
            capacity=candidate.capacity,
            price_per_chip_hour=candidate.price_per_chip_hour,
            labels=labels,
            # A slice placed for a run belongs to it in the ledger (per-run cost, budgets).
            run_id=request.labels.get(LABEL_RUN),
            request_id=request.request_id,
            queued_resource=queued_resource,
            slice_index=slice_index,
            backend=self._backend,
            project=self._project,
            detail=detail,
            principal=principal,
            workspace=workspace,
        )

    def gone(self, zone: str, name: str, request_id: str, reason: str) -> None:
        """A slice of this request was deleted (cleanup): ends its incarnation and marks it deleted."""
        self._ledger.record_event(
            EventKind.DELETED, pod=name, zone=zone, request_id=request_id, detail={"reason": reason}
        )

    def attempt(
        self,
        request: PlacementRequest,
        candidate: Candidate,
        outcome: AttemptOutcome,
        *,
        message: str,
        started: float,
        queued_resource: str | None = None,
        cost_usd: float | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> AttemptResult:
        duration = self._clock() - started
        extra: dict[str, Any] = dict(detail or {})
        if cost_usd is not None:
            extra["cost_usd"] = round(cost_usd, 6)
        if queued_resource is not None:
            extra["queued_resource"] = queued_resource
        extra["price_per_hour"] = candidate.price_per_hour
        principal, workspace = self._owner(request)
        self._ledger.record_attempt(
            request.request_id,
            zone=candidate.zone,
            outcome=outcome,
            capacity=candidate.capacity,
            message=message,
            duration_s=duration,
            pod=request.name,
            accelerator_type=request.accelerator.api_name,
            detail=extra,
            run_id=request.labels.get(LABEL_RUN),
            principal=principal,
            workspace=workspace,
        )
        return AttemptResult(
            zone=candidate.zone,
            capacity=candidate.capacity,
            outcome=outcome,
            message=message,
            duration_s=duration,
            price_per_hour=candidate.price_per_hour,
            queued_resource=queued_resource,
            cost_usd=cost_usd,
            detail=dict(detail or {}),
        )


def node_request(request: PlacementRequest, candidate: Candidate, label_request_id: str) -> NodeRequest:
    """The node (or node template) for a candidate; ``label_request_id`` goes in the tpuctl-request label
    (the request id for a node; the API request id for a queued resource, which the cloud requires)."""
    labels = {**request.labels, LABEL_REQUEST: label_request_id}
    return NodeRequest(
        name=request.name,
        zone=candidate.zone,
        accelerator_type=request.accelerator.api_name,
        runtime_version=request.runtime_version,
        capacity=candidate.capacity,
        labels=labels,
        metadata=dict(request.metadata),
        external_ips=request.external_ips,
        reservation=request.reservation if candidate.capacity is CapacityType.RESERVED else None,
        description=f"created by tpuctl (request {request.request_id})",
        surface=request.surface,
        flex_valid_for_s=request.valid_for_s if request.flex_start else None,
        network=request.network,
        service_account=request.service_account,
        terminate_at=request.terminate_at,
    )


def queued_request(request: PlacementRequest, candidate: Candidate) -> tuple[QueuedResourceRequest, str]:
    """The queued resource for a candidate and its API request id. Spot and preemptible capacity queue in
    the spot tier, on-demand and reserved in the guaranteed tier; a multislice is one queued resource with
    ``multisliceParams`` whose node prefix is the request's name."""
    rid = api_request_id(request.request_id, candidate.zone, candidate.capacity)
    node = node_request(request, candidate, rid)
    qr = QueuedResourceRequest(
        id=request.name,
        zone=candidate.zone,
        node=node,
        node_count=request.slices,
        node_id_prefix=request.name if request.slices > 1 else None,
        tier="spot" if candidate.capacity.is_preemptible else "guaranteed",
        valid_for_seconds=request.valid_for_s,
        reservation=node.reservation,
    )
    return qr, rid


def find_own_node(cloud: TpuCloud, zone: str, name: str, label_request_id: str) -> Node | None:
    """The node ``name`` in ``zone`` if it exists and carries this request's label; None if it does not
    exist; a ``NameTakenError`` if it exists and is somebody else's."""
    try:
        node = cloud.get_node(zone, name)
    except NotFoundError:
        return None
    if node.labels.get(LABEL_REQUEST) != label_request_id:
        raise NameTakenError(
            f"a slice named {name!r} already exists in {zone} and is not this request's",
            fix="choose another --name, or delete the existing slice first (`tpuctl pod delete`)",
        )
    return node


def find_own_queued(cloud: TpuCloud, zone: str, qr_id: str, label_request_id: str) -> QueuedResource | None:
    """As ``find_own_node``, for a queued resource (its node template carries the label)."""
    try:
        qr = cloud.get_queued_resource(zone, qr_id)
    except NotFoundError:
        return None
    if qr.labels.get(LABEL_REQUEST) != label_request_id:
        raise NameTakenError(
            f"a queued resource named {qr_id!r} already exists in {zone} and is not this request's",
            fix="choose another --name, or delete it first (`tpuctl pod gc` lists failed ones)",
        )
    return qr


class NameTakenError(AlreadyExistsError):
    """The name is taken in that zone by a slice this request did not make (fatal: the name is the
    user's choice, and failing over would give two slices of that name in different zones)."""


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, TpuctlError):
        return exc.message
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"{type(exc).__name__}: {exc}"


@dataclass
class PlacementContext:
    """The collaborators and knobs every placement path shares."""

    cloud: TpuCloud
    recorder: Recorder
    retry: RetryPolicy
    sleep: Sleep
    clock: Callable[[], float]
    poll_interval_s: float
    poll_max_interval_s: float
    ready_timeout_s: float
    max_workers: int = 16
    # Without --valid-for a queued resource may wait for ever; this bounds how long tpuctl waits for it
    # (None: until it is ACTIVE or FAILED, or the user interrupts).
    queued_timeout_s: float | None = None

    def retried(self, fn: Callable[[], T]) -> T:
        result: T = retrying(self.retry, self.sleep)(fn)
        return result

    def wait_node_ready(
        self, zone: str, name: str, progress: OperationProgress | None, *, label: str = ""
    ) -> Node:
        """Poll the node until READY; a state it will not come back from raises (failover follows)."""

        def done(node: Node) -> bool:
            if node.state in NEVER_READY_NODE_STATES:
                raise CloudError(
                    f"slice {name} in {zone} went {node.state} before it was READY",
                    fix="`tpuctl pod gc` cleans up dead slices",
                )
            return node.state == "READY"

        def on_poll(node: Node, elapsed: float) -> None:
            if progress is not None:
                progress.update(f"{label or name} in {zone}: {node.state}", elapsed_s=elapsed)

        polling = Polling(self.ready_timeout_s, self.poll_interval_s, self.poll_max_interval_s, self.sleep)
        return polling.until(
            lambda: self.cloud.get_node(zone, name),
            done,
            still=f"slice {name} in {zone} was not READY",
            fix="`tpuctl pod describe` shows its state; delete it if it is stuck",
            on_poll=on_poll,
        )

    def delete_node_quietly(self, zone: str, name: str) -> bool:
        """Delete a node of ours, retried; True once it is gone (or was never there)."""

        def once() -> None:
            try:
                self.cloud.delete_node(zone, name, wait=True)
            except NotFoundError:
                return

        try:
            self.retried(once)
        except CloudError:
            return False
        return True

    def delete_queued_quietly(self, zone: str, qr_id: str) -> bool:
        """Force-delete a queued resource of ours (its nodes too), retried; True once it is gone."""

        def once() -> None:
            try:
                self.cloud.delete_queued_resource(zone, qr_id, force=True, wait=True)
            except NotFoundError:
                return

        try:
            self.retried(once)
        except CloudError:
            return False
        return True


def exhausted_error(plan: Plan, attempts: list[AttemptResult]) -> TpuctlError:
    """Every feasible candidate was tried and failed: the error names each attempt and its outcome."""
    from tpuctl.errors import InfeasibleError
    from tpuctl.services.placement import NoCapacityForRequest, NoQuotaForRequest

    listing = "; ".join(f"{a.zone} {a.capacity.value}: {a.outcome.value} ({a.message})" for a in attempts)
    records = [a.to_dict() for a in attempts]
    candidates = [plan.candidate_dict(c) for c in plan.candidates]
    outcomes = {a.outcome for a in attempts}
    if outcomes and outcomes <= {AttemptOutcome.QUOTA}:
        return NoQuotaForRequest(
            f"every feasible candidate was refused for quota when creating (something else took it since "
            f"the plan was made): {listing}",
            fix="free quota (`tpuctl pod gc`, delete slices you no longer need), try another type, zone or "
            "capacity type, or request more quota",
            attempts=records,
            candidates=candidates,
        )
    if outcomes & {AttemptOutcome.STOCKOUT, AttemptOutcome.QUOTA}:
        return NoCapacityForRequest(
            f"no capacity: every feasible candidate failed: {listing}",
            fix="try again later, allow more zones (--zone/--region) or capacity types (--capacity-type), or "
            "queue for capacity with --queued [--valid-for 2h] or --strategy race",
            attempts=records,
            candidates=candidates,
        )
    return InfeasibleError(
        f"every feasible candidate failed: {listing}",
        fix="retry; `tpuctl pod describe` and the attempts above say what failed where",
        attempts=records,
    )
