"""Reconcile the ledger with the live listing before a cost report.

* A slice in the cloud that the ledger does not track (no incarnation of its zone+name that is not
  deleted) is reported as **untracked**, with its running rate (chips x the catalog's list price while it
  is in a billable state, 0 otherwise): made outside tpuctl, from another state dir, or lost by a crash.
  Nothing is recorded for it: tpuctl does not know when it became READY, so it cannot bill its past.
* A slice the ledger thinks exists (created, ready or preempted, not deleted) that the listing no longer
  has is confirmed with a GET (a listing can miss unreachable zones) and then **closed**: a ``gone``
  event at the time it was seen gone. Billing ends there; it may have ended earlier, which the ledger
  cannot know, so the report errs towards the higher figure.
* A slice the ledger has as READY (or CREATING) that the listing shows PREEMPTED gets a ``preempted``
  event, and one the ledger has as CREATING that is READY gets ``ready``, both at the time seen.

Only slices of this backend and project are considered (a state dir may serve the simulator and Google);
rows that recorded neither are taken as this backend's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tpuctl.catalog import Catalog
from tpuctl.cloud.base import Node, TpuCloud
from tpuctl.errors import NotFoundError, UsageError
from tpuctl.services.cost.model import CostReport
from tpuctl.services.cost.window import iso
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, LedgerError, PodRecord, PodState

T = TypeVar("T")

#: Node states GCP bills. READY is the documented one; the in-place maintenance states keep the hardware.
BILLABLE_NODE_STATES = frozenset({"READY", "RESTARTING", "REIMAGING", "REPAIRING"})
_SEEN_BY = "cost report reconciliation"


@dataclass
class Reconciliation:
    untracked: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)  # events recorded (or, dry run, not)
    warnings: list[str] = field(default_factory=list)


class Reconciler:
    def __init__(
        self,
        ledger: Ledger,
        cloud: TpuCloud,
        catalog: Catalog,
        *,
        clock: Callable[[], float],
    ) -> None:
        self._ledger = ledger
        self._cloud = cloud
        self._catalog = catalog
        self._clock = clock

    def reconcile(self, *, dry_run: bool = False, nodes: Sequence[Node] | None = None) -> Reconciliation:
        result = Reconciliation()
        listing = list(self._cloud.list_nodes(None) if nodes is None else nodes)
        seen_at = self._clock()
        listed = {(n.zone, n.name): n for n in listing}
        ours = [p for p in self._tracked() if self._is_ours(p)]
        tracked = {(p.zone, p.name) for p in ours}
        for node in sorted(listing, key=lambda n: (n.zone, n.name)):
            if (node.zone, node.name) in tracked or node.state == "DELETING":
                continue
            result.untracked.append(self._untracked(node))
        for pod in ours:
            live = listed.get((pod.zone, pod.name))
            if live is None:
                self._maybe_gone(pod, seen_at, dry_run, result)
            elif live.state == "PREEMPTED" and pod.state in (PodState.READY, PodState.CREATING):
                self._record(result, pod, EventKind.PREEMPTED, seen_at, dry_run, f"listed as {live.state}")
            elif live.state == "READY" and pod.state is PodState.CREATING:
                self._record(result, pod, EventKind.READY, seen_at, dry_run, "listed as READY")
        return result

    # ----------------------------------------------------------------------------------------------

    def _tracked(self) -> list[PodRecord]:
        """Every incarnation that may still exist: alive, or ended (preempted) but not deleted."""
        alive = self._ledger.list_pods(alive=True)
        preempted = self._ledger.list_pods(state=PodState.PREEMPTED)
        return [p for p in [*alive, *preempted] if p.deleted_at is None]

    def _is_ours(self, pod: PodRecord) -> bool:
        backend, project = self._cloud.backend, self._cloud.project
        return pod.backend in (None, backend) and pod.project in (None, project)

    def _maybe_gone(self, pod: PodRecord, seen_at: float, dry_run: bool, result: Reconciliation) -> None:
        if pod.state in (PodState.REQUESTED, PodState.QUEUED):
            return  # not created yet (a create may be in flight in another tpuctl): nothing to miss
        try:
            node = self._cloud.get_node(pod.zone, pod.name)
        except NotFoundError:
            self._record(result, pod, EventKind.GONE, seen_at, dry_run, "missing from the listing")
            return
        result.warnings.append(
            f"slice {pod.name} ({pod.zone}) was missing from the listing but exists ({node.state}); "
            "some zone may have been unreachable"
        )

    def _record(
        self,
        result: Reconciliation,
        pod: PodRecord,
        kind: EventKind,
        ts: float,
        dry_run: bool,
        why: str,
    ) -> None:
        result.actions.append(
            {
                "name": pod.name,
                "zone": pod.zone,
                "event": kind.value,
                "at": iso(ts),
                "ledger_state": pod.state.value,
                "reason": why,
                "recorded": not dry_run,
            }
        )
        if not dry_run:
            self._ledger.record_event(
                kind, pod=pod.name, zone=pod.zone, ts=ts, detail={"seen_by": _SEEN_BY, "why": why}
            )

    def _untracked(self, node: Node) -> dict[str, Any]:
        chips: int | None = None
        per_chip: float | None = None
        try:
            accel = self._catalog.resolve(node.accelerator_type)
            chips = accel.chips
            per_chip = self._catalog.price_per_chip_hour(accel, node.zone, node.capacity)
        except UsageError:
            pass
        billing = node.state in BILLABLE_NODE_STATES
        rate = None if per_chip is None or chips is None else per_chip * chips
        return {
            "name": node.name,
            "zone": node.zone,
            "accelerator_type": node.accelerator_type,
            "state": node.state,
            "capacity": node.capacity.value,
            "chips": chips,
            "price_per_chip_hour": per_chip,
            "billing": billing,
            "usd_per_hour": (round(rate, 6) if billing else 0.0) if rate is not None else None,
            "list_usd_per_hour": None if rate is None else round(rate, 6),
            "created_at": node.create_time.isoformat() if node.create_time else None,
            "labels": dict(node.labels),
        }


class InBackground(Generic[T]):
    """``fn()`` on a thread of its own, started at once; ``result()`` joins it and returns its value or
    raises its exception. The cost report uses two: the live listing (its first call imports and builds
    the TPU client, ``google.cloud.tpu_v2`` and protobuf: a few tenths of a second of Python) and the
    report itself (its queries run in the database, whose driver releases the GIL), so that the two,
    and the command's own start-up, overlap instead of adding up."""

    def __init__(self, fn: Callable[[], T], *, name: str) -> None:
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # handed to the caller's thread by result()
            self._error = exc

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> T:
        self.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set when no error


def reconciled_report(
    reconciler: Reconciler,
    cloud: TpuCloud,
    report: Callable[[], CostReport],
    *,
    dry_run: bool = False,
    first: InBackground[CostReport] | None = None,
) -> CostReport:
    """``report()`` reconciled with the live listing: untracked slices, and the events reconciliation
    records (a slice gone, preempted or READY), which the report includes.

    The listing is fetched while the report is computed (``first``: a report already under way, started
    before the session; if it could not read the ledger, which opening the session creates or migrates,
    ``report()`` runs instead). In the rare case reconciliation then records an event, the report is
    computed again so that it bills what was recorded."""
    listing = InBackground(lambda: list(cloud.list_nodes(None)), name="tpuctl-cost-listing")
    try:
        if first is not None:
            try:
                result = first.result()
            except LedgerError:
                result = report()
        else:
            result = report()
        rec = reconciler.reconcile(dry_run=dry_run, nodes=listing.result())
    finally:
        listing.wait()  # never leave the listing running against a session being closed
    if any(action["recorded"] for action in rec.actions):
        result = report()
    result.untracked = rec.untracked
    result.reconciled = rec.actions
    result.warnings = [*rec.warnings, *result.warnings]
    return result
