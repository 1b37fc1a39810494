"""Placement through queued resources: ``--queued``, ``--slices N`` (multislice) and ``--strategy race``.

A queued resource does not fail for a stockout: it waits (WAITING_FOR_RESOURCES) until there is capacity
(PROVISIONING, then ACTIVE once its nodes are READY) or until its ``validUntilDuration`` passes (FAILED).

* ``sequential``: queue in the first candidate and wait, with progress, until ACTIVE or FAILED; a FAILED
  one (no capacity in time, or quota) is deleted (it would hold quota) and the next candidate is tried.
* ``race``: queue in the top K candidates at once, keep the first to become ACTIVE, force-delete the others
  (their nodes too), and record what each cost: nothing while waiting, its price for the time it was
  ACTIVE before the delete.

Every create carries a ``requestId`` (a UUID per request x zone x capacity type), so a retry after an
ambiguous failure cannot queue twice; after such a failure the placer also looks for its queued resource
before creating again. A multislice is one queued resource with ``multisliceParams`` (node count = N,
prefix = the request's name): its slices are ``<name>-0 .. <name>-(N-1)``, recorded with their index.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from tpuctl.cloud.base import LABEL_REQUEST, Node, OperationProgress, QueuedResource, QueuedResourceRequest
from tpuctl.errors import (
    AlreadyExistsError,
    AmbiguousError,
    CloudError,
    NotFoundError,
    QuotaExceededError,
    StockoutError,
    TransientError,
)
from tpuctl.services.attempts import (
    AttemptResult,
    NameTakenError,
    Placement,
    PlacementContext,
    describe_error,
    exhausted_error,
    find_own_queued,
    is_fatal,
    outcome_for,
    queued_request,
)
from tpuctl.services.placement import Candidate, PlacementRequest, Plan
from tpuctl.store.records import AttemptOutcome, EventKind

_FAILED_STATES = frozenset({"FAILED", "SUSPENDED", "SUSPENDING"})


@dataclass
class _Entry:
    """One queued resource this placement made (or tried to make) in one candidate."""

    candidate: Candidate
    rank: int
    spec: QueuedResourceRequest
    api_request_id: str
    started: float
    state: str = "NONE"
    error: BaseException | None = None
    attempt: AttemptResult | None = None
    active_since_wall: float | None = None  # wall clock, for cost
    last: QueuedResource | None = None

    @property
    def zone(self) -> str:
        return self.candidate.zone

    @property
    def qr_id(self) -> str:
        return self.spec.id


class QueuedPlacer:
    """Carries out a plan through queued resources. Built by ``Allocator.place``."""

    def __init__(self, context: PlacementContext, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._ctx = context
        self._cloud = context.cloud
        self._rec = context.recorder
        self._wall = wall_clock

    # --- the two strategies -----------------------------------------------------------------------------

    def sequential(
        self, request: PlacementRequest, plan: Plan, *, progress: OperationProgress | None, started: float
    ) -> Placement:
        """Queue in one candidate at a time, cheapest first, until one becomes ACTIVE."""
        attempts: list[AttemptResult] = []
        order = plan.order if request.wait else plan.order[:1]
        kept: _Entry | None = None
        try:
            for rank, cand in enumerate(order, 1):
                entry = self._submit(request, cand, rank, progress, started)
                if entry.error is not None:
                    assert entry.attempt is not None
                    attempts.append(entry.attempt)
                    if is_fatal(entry.error):
                        raise entry.error
                    continue
                if not request.wait:
                    kept = entry
                    attempts.append(self._finish_queued(request, entry))
                    return self._placement(plan, entry, [], attempts, started, ready=False)
                try:
                    self._wait_one(request, entry, progress, started)
                except BaseException as exc:
                    attempts.append(self._give_up(request, entry, exc))
                    if is_fatal(exc) or isinstance(exc, KeyboardInterrupt):
                        raise
                    continue
                if entry.state == "ACTIVE":
                    nodes, attempt = self._activate(request, entry, progress)
                    attempts.append(attempt)
                    if nodes is not None:
                        kept = entry
                        return self._placement(plan, entry, nodes, attempts, started, ready=True)
                    continue
                attempts.append(self._failed(request, entry))
            raise exhausted_error(plan, attempts)
        finally:
            self._sweep(request, plan, kept)

    def race(
        self, request: PlacementRequest, plan: Plan, *, progress: OperationProgress | None, started: float
    ) -> Placement:
        """Queue in the top K candidates at once; keep the first ACTIVE; force-delete the rest. If the whole
        batch fails (each FAILED: no capacity before --valid-for ran out, or quota), race the next K."""
        attempts: list[AttemptResult] = []
        pending = list(plan.order)
        k = max(1, request.race_k)
        kept: _Entry | None = None
        try:
            rank = 0
            while pending:
                batch, pending = pending[:k], pending[k:]
                entries = self._submit_all(request, batch, rank, progress, started)
                rank += len(batch)
                live: list[_Entry] = []
                for entry in entries:
                    if entry.error is not None:
                        assert entry.attempt is not None
                        attempts.append(entry.attempt)
                        if is_fatal(entry.error):
                            self._cancel_all(request, [e for e in entries if e.error is None], "aborted")
                            raise entry.error
                    else:
                        live.append(entry)
                try:
                    winner = self._await_first_active(request, live, attempts, progress, started)
                except BaseException as exc:
                    for entry in live:
                        attempts.append(self._give_up(request, entry, exc))
                    if is_fatal(exc) or isinstance(exc, KeyboardInterrupt):
                        raise
                    continue  # e.g. none went ACTIVE in time: race the next batch
                if winner is None:
                    continue
                losers = [e for e in live if e is not winner and e.attempt is None]
                with ThreadPoolExecutor(
                    max_workers=max(1, min(len(losers), self._ctx.max_workers)),
                    thread_name_prefix="tpuctl-race",
                ) as pool:
                    # Cancel the losers while the winner's nodes are checked: every second they are
                    # ACTIVE costs money.
                    cancels = [pool.submit(self._cancel, request, e, "lost the race") for e in losers]
                    nodes, attempt = self._activate(request, winner, progress)
                    attempts.extend(f.result() for f in cancels)
                attempts.append(attempt)
                if nodes is not None:
                    kept = winner
                    return self._placement(plan, winner, nodes, attempts, started, ready=True)
            raise exhausted_error(plan, attempts)
        finally:
            self._sweep(request, plan, kept)

    # --- steps ---------------------------------------------------------------------------------------------

    def _submit_all(
        self,
        request: PlacementRequest,
        batch: Sequence[Candidate],
        first_rank: int,
        progress: OperationProgress | None,
        started: float,
    ) -> list[_Entry]:
        if len(batch) == 1:
            return [self._submit(request, batch[0], first_rank + 1, progress, started)]
        with ThreadPoolExecutor(
            max_workers=min(len(batch), self._ctx.max_workers), thread_name_prefix="tpuctl-race"
        ) as pool:
            futures: list[Future[_Entry]] = [
                pool.submit(self._submit, request, cand, first_rank + i + 1, progress, started)
                for i, cand in enumerate(batch)
            ]
            return [f.result() for f in futures]

    def _submit(
        self,
        request: PlacementRequest,
        cand: Candidate,
        rank: int,
        progress: OperationProgress | None,
        started: float,
    ) -> _Entry:
        """Create the queued resource in ``cand`` (idempotent: requestId, and look before creating again)."""
        spec, api_rid = queued_request(request, cand)
        entry = _Entry(cand, rank, spec, api_rid, started=self._ctx.clock())
        for index, name in enumerate(request.node_names):
            self._rec.pod_event(
                EventKind.REQUESTED,
                request,
                cand,
                name,
                slice_index=self._index(request, index),
                queued_resource=spec.id,
                labels=spec.node.labels,
                detail={"rank": rank, "api_request_id": api_rid},
            )
        if progress is not None:
            progress.update(f"queueing in {cand.label()}", elapsed_s=self._ctx.clock() - started)

        def create_once() -> QueuedResource:
            try:
                return self._cloud.create_queued_resource(spec, request_id=api_rid)
            except (AmbiguousError, AlreadyExistsError):
                own = find_own_queued(self._cloud, cand.zone, spec.id, api_rid)
                if own is not None:
                    return own
                raise

        try:
            qr = self._ctx.retried(create_once)
        except BaseException as exc:
            entry.error = exc
            self._end_nodes(request, entry, EventKind.FAILED, {"error": describe_error(exc)})
            if not isinstance(exc, QuotaExceededError | StockoutError | NameTakenError):
                self._delete_own(entry)
            entry.attempt = self._rec.attempt(
                request,
                cand,
                outcome_for(exc),
                message=describe_error(exc),
                started=entry.started,
                queued_resource=spec.id,
                detail={"api_request_id": api_rid},
            )
            return entry
        entry.state, entry.last = qr.state, qr
        for index, name in enumerate(request.node_names):
            self._rec.pod_event(
                EventKind.QUEUED,
                request,
                cand,
                name,
                slice_index=self._index(request, index),
                queued_resource=spec.id,
                detail={"state": qr.state},
            )
        return entry

    def _wait_one(
        self, request: PlacementRequest, entry: _Entry, progress: OperationProgress | None, started: float
    ) -> None:
        """Poll one queued resource until it settles (ACTIVE, FAILED, SUSPENDED)."""
        deadline = self._deadline(request)
        interval = self._ctx.poll_interval_s
        while True:
            qr = self._get(entry)
            entry.last = qr
            entry.state = "GONE" if qr is None else qr.state
            if progress is not None:
                progress.update(
                    f"queued resource {entry.qr_id} in {entry.zone}: {entry.state}",
                    elapsed_s=self._ctx.clock() - started,
                )
            if qr is None or entry.state == "ACTIVE" or entry.state in _FAILED_STATES:
                return
            if deadline is not None and self._ctx.clock() >= deadline:
                raise TransientError(
                    f"queued resource {entry.qr_id} in {entry.zone} was still {entry.state} after "
                    f"{self._ctx.clock() - entry.started:.0f} s",
                    fix="queue with --valid-for so it fails on its own, or try other zones",
                )
            self._ctx.sleep(interval)
            interval = min(interval * 1.5, self._ctx.poll_max_interval_s)

    def _await_first_active(
        self,
        request: PlacementRequest,
        live: list[_Entry],
        attempts: list[AttemptResult],
        progress: OperationProgress | None,
        started: float,
    ) -> _Entry | None:
        """Poll every live entry (one list call per round) until one is ACTIVE; failed ones are recorded,
        deleted and dropped. Returns None when all failed."""
        deadline = self._deadline(request)
        interval = self._ctx.poll_interval_s
        waiting = list(live)
        while waiting:
            states = self._snapshot(waiting)
            now_wall = self._wall()
            winner: _Entry | None = None
            for entry in list(waiting):
                qr = states.get((entry.zone, entry.qr_id))
                entry.last = qr
                entry.state = "GONE" if qr is None else qr.state
                if entry.state == "ACTIVE":
                    self._mark_active(request, entry, now_wall)
                    if winner is None:
                        winner = entry
                elif qr is None or entry.state in _FAILED_STATES:
                    attempts.append(self._failed(request, entry))
                    waiting.remove(entry)
            if winner is not None:
                return winner
            if progress is not None:
                summary = ", ".join(f"{e.zone} {e.state}" for e in waiting)
                progress.update(
                    f"racing {len(waiting)} queued resources: {summary}",
                    elapsed_s=self._ctx.clock() - started,
                )
            if deadline is not None and self._ctx.clock() >= deadline:
                raise TransientError(
                    f"none of the {len(waiting)} queued resources became ACTIVE in time",
                    fix="queue with --valid-for so they fail on their own, or try other zones",
                )
            self._ctx.sleep(interval)
            interval = min(interval * 1.5, self._ctx.poll_max_interval_s)
        return None

    def _snapshot(self, entries: Sequence[_Entry]) -> dict[tuple[str, str], QueuedResource | None]:
        """Every entry's queued resource: one list over all zones, or one get each if listing fails."""
        try:
            listed = self._cloud.list_queued_resources(None)
        except CloudError:
            return {(e.zone, e.qr_id): self._get(e) for e in entries}
        by_key = {(q.zone, q.id): q for q in listed}
        return {(e.zone, e.qr_id): by_key.get((e.zone, e.qr_id)) for e in entries}

    def _get(self, entry: _Entry) -> QueuedResource | None:
        try:
            return self._cloud.get_queued_resource(entry.zone, entry.qr_id)
        except NotFoundError:
            return None

    def _activate(
        self, request: PlacementRequest, entry: _Entry, progress: OperationProgress | None
    ) -> tuple[list[Node] | None, AttemptResult]:
        """The queued resource is ACTIVE: check its nodes are READY and record them (slice index each)."""
        names = list(entry.last.node_ids) if entry.last and entry.last.node_ids else list(request.node_names)
        self._mark_active(request, entry, self._wall())
        nodes: list[Node] = []
        try:
            for name in names:
                nodes.append(self._ctx.wait_node_ready(entry.zone, name, progress))
        except BaseException as exc:
            attempt = self._give_up(request, entry, exc)
            if is_fatal(exc) or isinstance(exc, KeyboardInterrupt):
                raise
            return None, attempt
        return nodes, self._rec.attempt(
            request,
            entry.candidate,
            AttemptOutcome.CREATED,
            message=f"queued resource ACTIVE in {entry.zone} with {len(nodes)} READY slice(s)",
            started=entry.started,
            queued_resource=entry.qr_id,
            detail={"api_request_id": entry.api_request_id, "nodes": names},
        )

    def _finish_queued(self, request: PlacementRequest, entry: _Entry) -> AttemptResult:
        """--no-wait: the queued resource is accepted; that is the attempt's outcome."""
        return self._rec.attempt(
            request,
            entry.candidate,
            AttemptOutcome.QUEUED,
            message=f"queued resource accepted in {entry.zone} ({entry.state})",
            started=entry.started,
            queued_resource=entry.qr_id,
            detail={"api_request_id": entry.api_request_id},
        )

    def _failed(self, request: PlacementRequest, entry: _Entry) -> AttemptResult:
        """It FAILED (or was suspended, or vanished) before it was ours to use: record, delete, move on."""
        qr = entry.last
        message = (qr.error_message if qr and qr.error_message else None) or (
            f"queued resource {entry.qr_id} went {entry.state}"
        )
        outcome = AttemptOutcome.FAILED
        if qr is not None and qr.state == "FAILED":
            outcome = AttemptOutcome.QUOTA if "quota" in message.lower() else AttemptOutcome.STOCKOUT
        self._end_nodes(request, entry, EventKind.FAILED, {"state": entry.state, "error": message})
        # A failed or suspended queued resource keeps holding quota until it is deleted.
        if qr is not None and self._ctx.delete_queued_quietly(entry.zone, entry.qr_id):
            self._end_nodes(request, entry, EventKind.DELETED, {"reason": "cleanup after failed attempt"})
        entry.attempt = self._rec.attempt(
            request,
            entry.candidate,
            outcome,
            message=message,
            started=entry.started,
            queued_resource=entry.qr_id,
            detail={"api_request_id": entry.api_request_id, "state": entry.state},
        )
        return entry.attempt

    def _give_up(self, request: PlacementRequest, entry: _Entry, exc: BaseException) -> AttemptResult:
        """Waiting on it failed (timeout, interrupt, error): delete it and record why."""
        if entry.attempt is not None:
            return entry.attempt
        self._end_nodes(request, entry, EventKind.FAILED, {"error": describe_error(exc)})
        if self._ctx.delete_queued_quietly(entry.zone, entry.qr_id):
            self._end_nodes(request, entry, EventKind.DELETED, {"reason": "cleanup after failed attempt"})
        entry.attempt = self._rec.attempt(
            request,
            entry.candidate,
            outcome_for(exc),
            message=describe_error(exc),
            started=entry.started,
            queued_resource=entry.qr_id,
            detail={"api_request_id": entry.api_request_id, "state": entry.state},
        )
        return entry.attempt

    def _cancel(self, request: PlacementRequest, entry: _Entry, reason: str) -> AttemptResult:
        """Force-delete a race loser (its nodes too) and record what it cost: its price for the time it was
        ACTIVE (seen) until the delete finished; nothing while it only waited."""
        deleted = self._ctx.delete_queued_quietly(entry.zone, entry.qr_id)
        end_wall = self._wall()
        cost = 0.0
        active_s = 0.0
        if entry.active_since_wall is not None and entry.candidate.price_per_hour is not None:
            active_s = max(0.0, end_wall - entry.active_since_wall)
            cost = entry.candidate.price_per_hour * active_s / 3600.0
        kind = EventKind.DELETED if deleted else EventKind.FAILED
        self._end_nodes(request, entry, kind, {"reason": reason, "state_before": entry.state})
        entry.attempt = self._rec.attempt(
            request,
            entry.candidate,
            AttemptOutcome.CANCELLED,
            message=f"{reason}: {entry.state} when cancelled" + ("" if deleted else " (delete failed)"),
            started=entry.started,
            queued_resource=entry.qr_id,
            cost_usd=cost,
            detail={
                "api_request_id": entry.api_request_id,
                "state_when_cancelled": entry.state,
                "active_s": round(active_s, 3),
                "deleted": deleted,
            },
        )
        return entry.attempt

    def _cancel_all(self, request: PlacementRequest, entries: Sequence[_Entry], reason: str) -> None:
        for entry in entries:
            if entry.attempt is None:
                self._cancel(request, entry, reason)

    def _delete_own(self, entry: _Entry) -> None:
        try:
            own = self._ctx.retried(
                lambda: find_own_queued(self._cloud, entry.zone, entry.qr_id, entry.api_request_id)
            )
        except CloudError:
            return
        if own is not None:
            self._ctx.delete_queued_quietly(entry.zone, entry.qr_id)

    def _sweep(self, request: PlacementRequest, plan: Plan, kept: _Entry | None) -> None:
        """Delete every queued resource of this request but the kept one (whatever a failed attempt left
        that its own cleanup did not see): they carry the attempt's API request id as their label."""
        ours = {queued_request(request, c)[1] for c in plan.order}
        try:
            listed = self._cloud.list_queued_resources(None)
        except CloudError:
            return  # `pod gc` finds them later: labelled as ours, owned by no live ledger entry
        for qr in listed:
            if qr.labels.get(LABEL_REQUEST) not in ours:
                continue
            if kept is not None and qr.zone == kept.zone and qr.id == kept.qr_id:
                continue
            if self._ctx.delete_queued_quietly(qr.zone, qr.id):
                for name in qr.node_ids or (qr.id,):
                    self._rec.gone(qr.zone, name, request.request_id, "cleanup sweep")

    # --- helpers --------------------------------------------------------------------------------------------

    def _mark_active(self, request: PlacementRequest, entry: _Entry, now_wall: float) -> None:
        """First sight of it ACTIVE: its slices exist and bill from now. The ledger must know at once,
        even for a race loser deleted a moment later."""
        if entry.active_since_wall is not None:
            return
        entry.active_since_wall = now_wall
        self._end_nodes(request, entry, EventKind.CREATED, {"state": "ACTIVE"})
        self._end_nodes(request, entry, EventKind.READY, None)

    def _end_nodes(
        self, request: PlacementRequest, entry: _Entry, kind: EventKind, detail: dict[str, object] | None
    ) -> None:
        for index, name in enumerate(request.node_names):
            self._rec.pod_event(
                kind,
                request,
                entry.candidate,
                name,
                slice_index=self._index(request, index),
                queued_resource=entry.qr_id,
                detail=detail,
            )

    @staticmethod
    def _index(request: PlacementRequest, index: int) -> int | None:
        return index if request.slices > 1 else None

    def _deadline(self, request: PlacementRequest) -> float | None:
        limit = self._ctx.queued_timeout_s
        if limit is None and request.valid_for_s is not None:
            # The API fails it once validUntil passes; allow some slack for that to show.
            limit = request.valid_for_s + 120.0
        return None if limit is None else self._ctx.clock() + limit

    def _placement(
        self,
        plan: Plan,
        entry: _Entry,
        nodes: list[Node],
        attempts: list[AttemptResult],
        started: float,
        *,
        ready: bool,
    ) -> Placement:
        return Placement(
            plan=plan,
            candidate=entry.candidate,
            nodes=nodes,
            attempts=attempts,
            queued_resource=entry.qr_id,
            started_at=started,
            ready_at=self._ctx.clock() if ready else None,
        )
