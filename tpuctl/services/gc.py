"""``pod gc``: find and delete what costs quota (or money) and gives nothing back.

* slices in state PREEMPTED or TERMINATED: they no longer run, but hold their quota until deleted;
* queued resources that FAILED or were SUSPENDED: they hold quota until deleted
  (https://cloud.google.com/tpu/docs/queued-resources); deleting
  one (with force) deletes its slices too, so their dead slices are not listed separately;
* slices and queued resources that this ledger created (``managed-by=tpuctl`` and ``tpuctl-ledger=<this
  ledger's identity>``, a random id made with the ledger) that no live ledger entry owns: left over by a
  tpuctl that was killed. A live slice gc cannot prove its own (another machine's ledger, even of the same
  ``$USER``, or a slice made before slices carried the identity) is never deleted: ``survey()`` lists it
  as not ours. Another user's slices are never touched.

The other way round, ``vanished()`` finds live ledger entries whose slice the cloud does not have: a
delete that landed before the tpuctl that sent it was killed could record it, a slice deleted behind
tpuctl's back, or a request whose tpuctl was killed before its create reached the cloud (the ``requested``
event names the requesting process; while it runs, or when it cannot be told, the create may still be on
its way and the entry is left alone; QUEUED entries are their queued resource's business).
``record_gone()`` ends them in the ledger (``gone``; ``failed`` for a request that never got anywhere), so
after one gc the ledger and the cloud agree.

``find()`` and ``vanished()`` only read; ``collect(items)`` deletes, retrying transient failures, and
records each deletion in the ledger (a ``gc`` event, and ``deleted`` for the slices).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.catalog import validate_zone
from tpuctl.cloud.base import (
    LABEL_LEDGER,
    LABEL_MANAGED_BY,
    LABEL_MANAGED_BY_VALUE,
    LABEL_OWNER,
    Node,
    OperationProgress,
    PlannedRequest,
    QueuedResource,
)
from tpuctl.cloud.retry import RetryPolicy
from tpuctl.errors import CloudError, NotFoundError, TpuctlError
from tpuctl.services.attempts import requester_gone, retrying
from tpuctl.store.records import EventKind, PodState

if TYPE_CHECKING:
    from tpuctl.services.session import Session
    from tpuctl.store.records import PodRecord


@dataclass(frozen=True)
class GcItem:
    """One thing to delete, and why."""

    kind: str  # "slice" | "queued_resource"
    name: str
    zone: str
    state: str
    reason: str
    accelerator_type: str
    slices: tuple[str, ...]  # the slices that go with it (a queued resource's nodes; the slice itself)
    requests: tuple[PlannedRequest, ...]  # in order (a Compute Engine MIG slice: MIG, template, policy)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "zone": self.zone,
            "state": self.state,
            "accelerator_type": self.accelerator_type,
            "reason": self.reason,
            "slices": list(self.slices),
            "requests": [r.to_dict() for r in self.requests],
        }


@dataclass(frozen=True)
class NotOurs:
    """A live tpuctl slice or queued resource of this owner that gc cannot prove this ledger created."""

    kind: str  # "slice" | "queued_resource"
    name: str
    zone: str
    state: str
    ledger: str | None  # the identity it carries; None: made before slices carried one

    @property
    def reason(self) -> str:
        made_by = f"ledger {self.ledger}" if self.ledger else "a tpuctl that did not stamp its ledger"
        return f"not ours: made by {made_by}, not this one; left alone"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "zone": self.zone,
            "state": self.state,
            "ledger": self.ledger,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class GcSurvey:
    """What gc would delete, and the live slices it leaves because it cannot prove they are its own."""

    items: list[GcItem]
    not_ours: list[NotOurs]


@dataclass(frozen=True)
class GcResult:
    item: GcItem
    deleted: bool
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**self.item.to_dict(), "deleted": self.deleted, "error": self.error}


class GarbageCollector:
    """Finds and deletes dead and orphaned slices and queued resources for one session."""

    def __init__(
        self,
        session: Session,
        *,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        """``sleep`` defaults to the session's (a test's simulated time moves when gc waits)."""
        self._session = session
        self._cloud = session.cloud
        self._ledger = session.ledger
        self._owner = session.settings.resolved_owner
        self._identity = session.ledger.identity
        self._retry = retry or session.backend.tuning.gc_retry
        self._sleep = sleep or session.sleep

    def find(self, zone: str | None = None) -> list[GcItem]:
        return self.survey(zone).items

    def survey(self, zone: str | None = None) -> GcSurvey:
        where = validate_zone(zone) if zone else None
        nodes = self._cloud.list_nodes(where)
        queued = self._cloud.list_queued_resources(where)
        items: list[GcItem] = []
        not_ours: list[NotOurs] = []
        covered: set[tuple[str, str]] = set()  # slices deleted with their queued resource
        queued_names: set[tuple[str, str]] = set()
        for qr in sorted(queued, key=lambda q: (q.zone, q.id)):
            queued_names.add((qr.zone, qr.id))
            reason = self._queued_reason(qr)
            if reason is None:
                if self._foreign(qr.labels, qr.zone, qr.node_ids or (qr.id,)):
                    not_ours.append(
                        NotOurs("queued_resource", qr.id, qr.zone, qr.state, qr.labels.get(LABEL_LEDGER))
                    )
                    covered.update((qr.zone, n) for n in qr.node_ids)
                continue
            slices = tuple(qr.node_ids)
            covered.update((qr.zone, n) for n in slices)
            items.append(
                GcItem(
                    kind="queued_resource",
                    name=qr.id,
                    zone=qr.zone,
                    state=qr.state,
                    reason=reason,
                    accelerator_type=qr.accelerator_type,
                    slices=slices,
                    requests=(self._cloud.plan_delete_queued_resource(qr.zone, qr.id, force=True),),
                )
            )
        for node in sorted(nodes, key=lambda n: (n.zone, n.name)):
            if (node.zone, node.name) in covered or node.state == "DELETING":
                continue
            reason = self._node_reason(node, queued_names)
            if reason is None:
                if self._foreign(node.labels, node.zone, (node.name,)) and not _queued_listed(
                    node, queued_names
                ):
                    not_ours.append(
                        NotOurs("slice", node.name, node.zone, node.state, node.labels.get(LABEL_LEDGER))
                    )
                continue
            items.append(
                GcItem(
                    kind="slice",
                    name=node.name,
                    zone=node.zone,
                    state=node.state,
                    reason=reason,
                    accelerator_type=node.accelerator_type,
                    slices=(node.name,),
                    requests=tuple(self._cloud.plan_delete_node(node.zone, node.name)),
                )
            )
        return GcSurvey(items, not_ours)

    def vanished(self, zone: str | None = None) -> list[PodRecord]:
        """Live ledger entries of this backend and project whose slice the cloud no longer has: missing
        from the listing, and a look at each one says not found (a listing may miss a zone)."""
        where = validate_zone(zone) if zone else None
        listed = {(n.zone, n.name) for n in self._cloud.list_nodes(where)}
        backend, project = self._cloud.backend, self._cloud.project
        out: list[PodRecord] = []
        for pod in self._ledger.list_pods(alive=True, zone=where):
            if pod.state is PodState.QUEUED or (pod.zone, pod.name) in listed:
                continue
            if pod.backend not in (None, backend) or pod.project not in (None, project):
                continue
            if pod.state is PodState.REQUESTED and not self._abandoned(pod):
                continue
            try:
                self._cloud.get_node(pod.zone, pod.name)
                continue
            except NotFoundError:
                pass
            except CloudError:
                continue  # cannot tell now: the next gc looks again
            if pod.state is PodState.REQUESTED and pod.queued_resource:
                try:
                    self._cloud.get_queued_resource(pod.zone, _short(pod.queued_resource) or "")
                    continue  # the queue may still make it
                except NotFoundError:
                    pass
                except CloudError:
                    continue
            out.append(pod)
        return out

    def _abandoned(self, pod: PodRecord) -> bool:
        """A REQUESTED entry whose requesting tpuctl no longer runs (so no create is on its way)."""
        requested = list(self._ledger.events(kinds=[EventKind.REQUESTED], pod_id=pod.id))
        return bool(requested) and requester_gone(requested[-1].detail)

    def record_gone(self, pods: Sequence[PodRecord]) -> None:
        for pod in pods:
            if pod.state is PodState.REQUESTED:
                self._ledger.record_event(
                    EventKind.FAILED,
                    pod=pod.name,
                    zone=pod.zone,
                    detail={
                        "outcome": "abandoned",
                        "seen_by": "pod gc",
                        "why": "its tpuctl stopped before the slice was created",
                    },
                )
                continue
            self._ledger.record_event(
                EventKind.GONE,
                pod=pod.name,
                zone=pod.zone,
                detail={"seen_by": "pod gc", "why": "missing from the listing and not found"},
            )

    def _queued_reason(self, qr: QueuedResource) -> str | None:
        if qr.state == "FAILED":
            why = f": {qr.error_message}" if qr.error_message else ""
            return f"failed queued resource; it holds quota until deleted{why}"
        if qr.state == "SUSPENDED":
            return "suspended (preempted) queued resource; it holds quota until deleted"
        if qr.state == "DELETING":
            return None
        if self._is_ours(qr.labels) and not any(
            self._owned(qr.zone, name) for name in (qr.node_ids or (qr.id,))
        ):
            return f"tpuctl queued resource of {self._owner} that no ledger entry owns ({qr.state})"
        return None

    def _node_reason(self, node: Node, queued_names: set[tuple[str, str]]) -> str | None:
        if node.is_dead:
            return f"{node.state} slice; it holds quota until deleted"
        if self._is_ours(node.labels) and not self._owned(node.zone, node.name):
            qr = _short(node.queued_resource)
            if qr and (node.zone, qr) in queued_names:
                return None  # its queued resource decides (listed above if it is an orphan too)
            return f"tpuctl slice of {self._owner} that no ledger entry owns ({node.state})"
        return None

    def _is_ours(self, labels: dict[str, str]) -> bool:
        """Provably made by this ledger's tpuctl: the identity label, not ``$USER``, decides."""
        managed = labels.get(LABEL_MANAGED_BY) == LABEL_MANAGED_BY_VALUE
        return managed and labels.get(LABEL_LEDGER) == self._identity

    def _foreign(self, labels: dict[str, str], zone: str, names: Sequence[str]) -> bool:
        """A live tpuctl thing of this owner, not tracked here, that another ledger (or none) made."""
        managed = labels.get(LABEL_MANAGED_BY) == LABEL_MANAGED_BY_VALUE
        if not managed or labels.get(LABEL_OWNER) != self._owner or self._is_ours(labels):
            return False
        return not any(self._owned(zone, name) for name in names)

    def _owned(self, zone: str, name: str) -> bool:
        record = self._ledger.get_pod(name, zone=zone)
        return record is not None and record.alive

    # --- deleting ------------------------------------------------------------------------------------------

    def collect(
        self, items: Sequence[GcItem], *, progress: OperationProgress | None = None
    ) -> list[GcResult]:
        started = self._session.monotonic()
        results: list[GcResult] = []
        for item in items:
            if progress is not None:
                progress.update(
                    f"deleting {item.kind} {item.name} in {item.zone}",
                    elapsed_s=self._session.monotonic() - started,
                )
            try:
                retrying(self._retry, self._sleep)(self._delete, item)
            except TpuctlError as exc:
                results.append(GcResult(item, deleted=False, error=exc.message))
                self._ledger.record_event(
                    EventKind.GC,
                    zone=item.zone,
                    detail={"action": "delete_failed", **_brief(item), "error": exc.message},
                )
                continue
            results.append(GcResult(item, deleted=True))
            if item.kind == "slice" and item.state == "PREEMPTED":
                # The ledger may not have seen the preemption yet: billing stopped then, not now.
                record = self._ledger.get_pod(item.name, zone=item.zone)
                if record is not None and record.alive:
                    self._ledger.record_event(
                        EventKind.PREEMPTED, pod=item.name, zone=item.zone, detail={"seen_by": "pod gc"}
                    )
            self._ledger.record_event(
                EventKind.GC, zone=item.zone, detail={"action": "deleted", **_brief(item)}
            )
            for name in item.slices:
                self._ledger.record_event(
                    EventKind.DELETED, pod=name, zone=item.zone, detail={"reason": f"gc: {item.reason}"}
                )
        return results

    def _delete(self, item: GcItem) -> None:
        try:
            if item.kind == "queued_resource":
                self._cloud.delete_queued_resource(item.zone, item.name, force=True, wait=True)
            else:
                self._cloud.delete_node(item.zone, item.name, wait=True)
        except NotFoundError:
            # Gone already: what we wanted. (After an ambiguous failure the retry lands here or on the
            # running delete operation: repeating a delete is harmless.)
            return


def _queued_listed(node: Node, queued_names: set[tuple[str, str]]) -> bool:
    qr = _short(node.queued_resource)
    return bool(qr) and (node.zone, qr) in queued_names


def _short(full_name: str | None) -> str | None:
    return full_name.rsplit("/", 1)[-1] if full_name else None


def _brief(item: GcItem) -> dict[str, Any]:
    return {"kind": item.kind, "name": item.name, "state": item.state, "reason": item.reason}
