"""How an event moves the pods view: one pure function, used by every write path and by the replay check.

Keeping this a pure function of (current row, event) is what makes "view and log never disagree"
checkable: replaying the event log from an empty view must give the pods table exactly
(``Ledger.check_view``). The single-event path, the bulk path and the replay all call ``apply_event``.

Rules, for the latest incarnation ``cur`` of the event's zone+name:

* requested / queued / created / ready: if there is no incarnation, or ``cur`` has ended, a new
  incarnation starts (a name reused after a delete is a new slice with its own cost). Otherwise the
  event's non-null attributes are merged into ``cur``, the state only moves forward
  (REQUESTED < QUEUED < CREATING < READY; a late ``created`` after ``ready`` does not regress it),
  and the matching timestamp is set once (the first one wins: billing starts at the first READY).
* preempted / failed / deleted / gone on an open ``cur``: ``ended_at`` = ts, ``end_reason`` = kind,
  state PREEMPTED / FAILED / DELETED; deleted and gone also set ``deleted_at``.
  deleted / gone on a preempted or failed ``cur`` only sets ``deleted_at`` and state DELETED: billing
  ended at the preemption, but the slice held quota until now. Other end events on an ended ``cur``
  are duplicates and change nothing. An end event for a pod never seen creates an ended row, so a
  slice tpuctl only learns about when it goes away still shows up.
* price_change on an open ``cur`` sets the price in force from now on.
* every other kind is log-only.

Who a slice belongs to (its principal and workspace) is the first event's that says: an incarnation
takes them from the event that opened it, or from the first later one that carries them when the opening
event had none (a slice first learnt of from the listing). Later events never move them: a slice's cost
stays with the run or user that made it, whoever writes its later events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from tpuctl.store import schema
from tpuctl.store.billing import is_free_preemption
from tpuctl.store.records import EventKind, PodState

#: The columns of ``events`` and ``pods`` as the ledger reads and writes them: the hand-written
#: migrations' and the attribution revision 0003 added (``tpuctl.store.tables.attribution_columns``), in
#: ``Ev``'s and ``PodRow``'s field order.
EVENT_COLUMNS: Final = (*schema.EVENT_COLUMNS, "principal", "workspace")
POD_COLUMNS: Final = (*schema.POD_COLUMNS, "principal", "workspace")


class Ev(NamedTuple):
    """A validated event ready for storage: enums as their values, JSON already encoded."""

    ts: float
    kind: str
    pod: str | None
    zone: str | None
    accelerator_type: str | None
    chips: int | None
    capacity: str | None
    price_per_chip_hour: float | None
    labels: str | None
    run_id: str | None
    request_id: str | None
    detail: str | None
    hosts: int | None
    queued_resource: str | None
    slice_index: int | None
    backend: str | None
    project: str | None
    #: Who the event was done for (None: not known, a row from before revision 0003).
    principal: str | None = None
    workspace: str | None = None


@dataclass(slots=True)
class PodRow:
    """A mutable working copy of one ``pods`` row, fields in ``POD_COLUMNS`` order."""

    id: int
    zone: str
    name: str
    incarnation: int
    state: str
    accelerator_type: str | None
    chips: int | None
    hosts: int | None
    capacity: str | None
    price_per_chip_hour: float | None
    labels: str
    request_id: str | None
    run_id: str | None
    queued_resource: str | None
    slice_index: int | None
    backend: str | None
    project: str | None
    requested_at: float | None
    created_at: float | None
    ready_at: float | None
    ended_at: float | None
    end_reason: str | None
    deleted_at: float | None
    updated_at: float
    last_event_id: int
    # Billing facts (schema v2), kept up to date as events arrive; see ``_bill_piece``.
    bill_mark: float | None = None
    billed_s: float = 0.0
    billed_chip_s: float = 0.0
    billed_usd_s: float = 0.0
    billed_unpriced_chip_s: float = 0.0
    #: Whose slice it is (revision 0003): its first attributed event's.
    principal: str | None = None
    workspace: str | None = None

    def as_tuple(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.zone,
            self.name,
            self.incarnation,
            self.state,
            self.accelerator_type,
            self.chips,
            self.hosts,
            self.capacity,
            self.price_per_chip_hour,
            self.labels,
            self.request_id,
            self.run_id,
            self.queued_resource,
            self.slice_index,
            self.backend,
            self.project,
            self.requested_at,
            self.created_at,
            self.ready_at,
            self.ended_at,
            self.end_reason,
            self.deleted_at,
            self.updated_at,
            self.last_event_id,
            self.bill_mark,
            self.billed_s,
            self.billed_chip_s,
            self.billed_usd_s,
            self.billed_unpriced_chip_s,
            self.principal,
            self.workspace,
        )

    @classmethod
    def from_tuple(cls, row: tuple[Any, ...]) -> PodRow:
        return cls(*row)

    @classmethod
    def new(cls, pod_id: int, zone: str, name: str, incarnation: int, state: str, ts: float) -> PodRow:
        return cls(
            pod_id, zone, name, incarnation, state, None, None, None, None, None, "{}", None, None,
            None, None, None, None, None, None, None, None, None, None, ts, 0,
        )  # fmt: skip


_OPENING: dict[str, str] = {
    EventKind.REQUESTED: PodState.REQUESTED,
    EventKind.QUEUED: PodState.QUEUED,
    EventKind.CREATED: PodState.CREATING,
    EventKind.READY: PodState.READY,
}
_RANK: dict[str, int] = {
    PodState.REQUESTED: 0,
    PodState.QUEUED: 1,
    PodState.CREATING: 2,
    PodState.READY: 3,
}
_ENDING: dict[str, str] = {
    EventKind.PREEMPTED: PodState.PREEMPTED,
    EventKind.FAILED: PodState.FAILED,
    EventKind.DELETED: PodState.DELETED,
    EventKind.GONE: PodState.DELETED,
}
_DELETING = frozenset({EventKind.DELETED.value, EventKind.GONE.value})

#: Kinds that move the view: for these an event must name a pod and a zone.
POD_KINDS = frozenset({*_OPENING, *_ENDING, EventKind.PRICE_CHANGE.value})


def _merge(row: PodRow, ev: Ev) -> bool:
    """Copy the event's given attributes onto ``row``; return whether any value changed.

    ``None`` means "not given", not "clear it". Spelled out field by field because this runs once per
    event in a million-event import, and getattr/setattr loops cost twice as much.
    """
    changed = False
    if ev.accelerator_type is not None and ev.accelerator_type != row.accelerator_type:
        row.accelerator_type = ev.accelerator_type
        changed = True
    if ev.chips is not None and ev.chips != row.chips:
        row.chips = ev.chips
        changed = True
    if ev.hosts is not None and ev.hosts != row.hosts:
        row.hosts = ev.hosts
        changed = True
    if ev.capacity is not None and ev.capacity != row.capacity:
        row.capacity = ev.capacity
        changed = True
    if ev.price_per_chip_hour is not None and ev.price_per_chip_hour != row.price_per_chip_hour:
        row.price_per_chip_hour = ev.price_per_chip_hour
        changed = True
    if ev.labels is not None and ev.labels != row.labels:
        row.labels = ev.labels
        changed = True
    if ev.request_id is not None and ev.request_id != row.request_id:
        row.request_id = ev.request_id
        changed = True
    if ev.run_id is not None and ev.run_id != row.run_id:
        row.run_id = ev.run_id
        changed = True
    if ev.queued_resource is not None and ev.queued_resource != row.queued_resource:
        row.queued_resource = ev.queued_resource
        changed = True
    if ev.slice_index is not None and ev.slice_index != row.slice_index:
        row.slice_index = ev.slice_index
        changed = True
    if ev.backend is not None and ev.backend != row.backend:
        row.backend = ev.backend
        changed = True
    if ev.project is not None and ev.project != row.project:
        row.project = ev.project
        changed = True
    if row.principal is None and row.workspace is None and (ev.principal or ev.workspace) is not None:
        row.principal, row.workspace = ev.principal, ev.workspace  # the first event that says
        changed = True
    return changed


def apply_event(
    cur: PodRow | None, ev: Ev, event_id: int, new_pod_id: Callable[[], int]
) -> tuple[PodRow | None, bool]:
    """Apply ``ev`` (already given ``event_id``) to ``cur``, the latest incarnation of its zone+name.

    Returns the row the event belongs to (a new incarnation, ``cur`` changed in place, ``cur`` as it
    was, or ``None`` when there is no pod) and whether that row changed and must be written.
    ``new_pod_id`` allocates the id of a new incarnation.
    """
    kind = ev.kind
    opening_state = _OPENING.get(kind)
    if opening_state is not None:
        return _apply_opening(cur, ev, opening_state, event_id, new_pod_id)
    ending_state = _ENDING.get(kind)
    if ending_state is not None:
        return _apply_ending(cur, ev, ending_state, event_id, new_pod_id)
    if kind == EventKind.PRICE_CHANGE:
        return _apply_price_change(cur, ev, event_id)
    return cur, False


def _apply_opening(
    cur: PodRow | None, ev: Ev, opening_state: str, event_id: int, new_pod_id: Callable[[], int]
) -> tuple[PodRow, bool]:
    """requested / queued / created / ready: a new incarnation, or the open one moved forward."""
    assert ev.zone is not None and ev.pod is not None
    kind, ts = ev.kind, ev.ts
    if cur is None or cur.ended_at is not None:
        incarnation = 1 if cur is None else cur.incarnation + 1
        row = PodRow.new(new_pod_id(), ev.zone, ev.pod, incarnation, opening_state, ts)
        changed = True
    else:
        row = cur
        changed = False
    # Tracked field by field (not by comparing snapshots) so a duplicate event, which changes
    # nothing, does not move updated_at / last_event_id, and replay gives the same answer.
    price, chips = row.price_per_chip_hour, row.chips
    if _merge(row, ev):
        changed = True
        if row.bill_mark is not None and (row.price_per_chip_hour != price or row.chips != chips):
            _bill_piece(row, ts, price, chips)  # the time so far at what was in force
    if _RANK[opening_state] > _RANK[row.state]:
        row.state = opening_state
        changed = True
    if kind == EventKind.CREATED:
        if row.created_at is None:
            row.created_at = ts
            changed = True
    elif kind == EventKind.READY:
        if row.ready_at is None:
            row.ready_at = ts
            row.bill_mark = ts  # billing starts at the first READY
            changed = True
        if row.created_at is None:  # a slice first seen READY (adopted) existed by then
            row.created_at = ts
            changed = True
    elif row.requested_at is None:  # requested, queued
        row.requested_at = ts
        changed = True
    return _touched(row, ts, event_id) if changed else (row, False)


def _apply_ending(
    cur: PodRow | None, ev: Ev, ending_state: str, event_id: int, new_pod_id: Callable[[], int]
) -> tuple[PodRow, bool]:
    """preempted / failed / deleted / gone: billing ends (or, on an ended slice, it is deleted)."""
    assert ev.zone is not None and ev.pod is not None
    kind, ts = ev.kind, ev.ts
    deleting = kind in _DELETING
    if cur is None:
        row = PodRow.new(new_pod_id(), ev.zone, ev.pod, 1, ending_state, ts)
        _merge(row, ev)
        _end(row, kind, ending_state, ts, deleting)
        return _touched(row, ts, event_id)
    if cur.ended_at is None:
        price, chips = cur.price_per_chip_hour, cur.chips
        _merge(cur, ev)
        _end(cur, kind, ending_state, ts, deleting)
        if cur.ready_at is not None:
            _close_bill(cur, ts, price, chips)
        return _touched(cur, ts, event_id)
    if deleting and cur.deleted_at is None:
        cur.deleted_at = ts
        cur.state = PodState.DELETED
        return _touched(cur, ts, event_id)
    return cur, False


def _apply_price_change(cur: PodRow | None, ev: Ev, event_id: int) -> tuple[PodRow | None, bool]:
    """price_change on an open slice: the time so far billed at the old price, the new one from now."""
    price = ev.price_per_chip_hour
    if cur is not None and cur.ended_at is None and price is not None and price != cur.price_per_chip_hour:
        if cur.bill_mark is not None:
            _bill_piece(cur, ev.ts, cur.price_per_chip_hour, cur.chips)  # each price for its own part
        cur.price_per_chip_hour = price
        return _touched(cur, ev.ts, event_id)
    return cur, False


def _end(row: PodRow, kind: str, state: str, ts: float, deleting: bool) -> None:
    row.ended_at = ts
    row.end_reason = kind
    row.state = state
    if deleting:
        row.deleted_at = ts


def _bill_piece(row: PodRow, ts: float, price: float | None, chips: int | None) -> None:
    """Bill ``row``'s open piece [bill_mark, ts) at ``price`` x ``chips`` (what was in force during it)."""
    mark = row.bill_mark
    assert mark is not None
    dt = ts - mark
    if dt <= 0:
        return  # an event stamped before the piece began (clocks disagree): nothing to bill
    if chips is not None:
        chip_s = chips * dt
        row.billed_chip_s += chip_s
        if price is None:
            row.billed_unpriced_chip_s += chip_s
        else:
            row.billed_usd_s += chip_s * price
    row.bill_mark = ts


def _close_bill(row: PodRow, ts: float, price: float | None, chips: int | None) -> None:
    """The billable interval [ready_at, ts) is over: bill its last piece and make the facts final.

    A free preemption (``tpuctl.store.billing``), or a slice whose chip count was never known, is billed
    nothing."""
    assert row.ready_at is not None
    if row.bill_mark is not None:
        _bill_piece(row, ts, price, chips)
    row.bill_mark = None
    if is_free_preemption(row.end_reason, row.capacity, row.ready_at, ts) or row.chips is None:
        row.billed_s = row.billed_chip_s = row.billed_usd_s = row.billed_unpriced_chip_s = 0.0
    else:
        row.billed_s = max(ts - row.ready_at, 0.0)


def _touched(row: PodRow, ts: float, event_id: int) -> tuple[PodRow, bool]:
    row.updated_at = ts
    row.last_event_id = event_id
    return row, True


def replay_pods(events: Iterable[tuple[int, Ev]]) -> dict[int, PodRow]:
    """The pods view an empty ledger reaches by applying ``(event id, event)`` in order: every pod row
    an event changed, by id (pod ids allocated 1, 2, ... as the write paths do)."""
    replayed: dict[int, PodRow] = {}
    latest: dict[tuple[str, str], PodRow] = {}
    next_pod = 1

    def new_pod_id() -> int:
        nonlocal next_pod
        next_pod += 1
        return next_pod - 1

    for event_id, ev in events:
        if ev.pod is None or ev.zone is None:
            continue
        key = (ev.zone, ev.pod)
        row, changed = apply_event(latest.get(key), ev, event_id, new_pod_id)
        if row is not None:
            latest[key] = row
            if changed:
                replayed[row.id] = row
    return replayed
