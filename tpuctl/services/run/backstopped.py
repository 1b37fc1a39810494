"""Reading back what a run's backstop did (``backstop``): the first tpuctl command that looks at a run
whose supervisor went silent, and whose slices are gone while the ledger still has them, records why they
went and ends the run.

Nobody tells the ledger: the deadman that deleted the slices (or Compute Engine, at their termination
time) has no ledger to write to. So when a command reads a run that is not finished, was armed with a
backstop (its detail's ``backstop``), and has no live lease (no supervisor speaks for it), the run's
slices are looked up; once every one is gone, the command claims the run's lease (so no resuming
supervisor is contradicted), records each slice DELETED by the backstop, closes the open segments and
ends the run FAILED with the reason: how long its supervisor had been silent, and the grace it had.
A run left that way can still be resumed (``runs resume``) from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from tpuctl.errors import CloudError, LeaseHeldError, NotFoundError
from tpuctl.store.records import EventKind, LeaseAction, LeaseOwner, PodState, RunStatus
from tpuctl.timefmt import iso

if TYPE_CHECKING:
    from tpuctl.services.session import Session
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.records import PodRecord, RunRecord

#: Who the ledger says deleted the slices.
DELETED_BY = "the run's backstop"
_HEARD = (LeaseAction.CLAIM.value, LeaseAction.TAKEOVER.value, LeaseAction.RENEW.value)


def settle(session: Session, record: RunRecord) -> RunRecord:
    """``record``, or, when its backstop deleted its slices behind a silent supervisor, the run as the
    ledger has it once that is recorded (see the module docstring). Never raises for what it cannot tell:
    a slice the cloud cannot be asked about leaves the run as it is."""
    armed = (record.detail or {}).get("backstop")
    if not armed or _finished(record):
        return record
    ledger = session.ledger
    lease = ledger.lease_of(record.run_id)
    if lease is not None and not lease.expired:
        return record  # its supervisor speaks for it
    pods = [p for p in ledger.list_pods(run_id=record.run_id) if _may_exist(p)]
    if not pods or not all(_gone(session, p) for p in pods):
        return record
    # Read before this command claims the lease (its own claim is a row of the history too).
    heard = [h.at for h in ledger.lease_history(record.run_id) if str(h.action) in _HEARD]
    try:
        claim = ledger.claim_lease(
            record.run_id, LeaseOwner.of_this_process(), session.settings.lease_duration
        )
    except LeaseHeldError:
        return record  # a supervisor took it over meanwhile: it finds the slices gone itself
    try:
        fenced = ledger.fenced(claim)
        fresh = fenced.get_run(record.run_id)
        if fresh is None or _finished(fresh):
            return fresh or record
        last_heard = max(heard) if heard else None
        _record_deletion(fenced, fresh, pods, armed, last_heard=last_heard, seen_at=session.clock())
    finally:
        with contextlib.suppress(Exception):  # it expires on its own
            ledger.release_lease(claim)
    return ledger.get_run(record.run_id) or record


def reason(last_heard: float | None, seen_at: float, grace_s: float | None) -> str:
    """Why the slices went, in the run's record and on each slice's event. When the deletion itself
    happened is not known here (the cloud keeps no time of a resource it deleted): between the grace
    after the last word and the moment this command saw the slices gone."""
    grace = f"its grace ({grace_s:g} s)" if grace_s is not None else "its grace"
    if last_heard is None:
        return (
            f"deleted by its backstop: no supervisor of the run was heard from for {grace}; "
            f"the slice seen gone at {iso(seen_at)}"
        )
    return (
        f"deleted by its backstop after the run's supervisor was silent for {grace}: last heard from at "
        f"{iso(last_heard)}, the slice seen gone {seen_at - last_heard:.0f} s later, at {iso(seen_at)}"
    )


def _record_deletion(
    ledger: Ledger,
    record: RunRecord,
    pods: list[PodRecord],
    armed: dict[str, Any],
    *,
    last_heard: float | None,
    seen_at: float,
) -> None:
    grace = armed.get("grace_s")
    why = reason(last_heard, seen_at, float(grace) if grace is not None else None)
    for pod in pods:
        ledger.record_event(
            EventKind.DELETED,
            pod=pod.name,
            zone=pod.zone,
            run_id=record.run_id,
            ts=seen_at,
            detail={"by": DELETED_BY, "reason": why},
        )
    for segment in ledger.segments(record.run_id):
        if segment.end is None:
            ledger.close_segment(segment.id, end=seen_at)
    detail = dict(record.detail or {})
    detail.update(
        reason=why,
        deleted_pod=True,
        supervisor=None,
        backstop={**armed, "seen_deleted_at": seen_at},
    )
    ledger.update_run(record.run_id, status=RunStatus.FAILED, detail=detail)


def _finished(record: RunRecord) -> bool:
    known = record.status in RunStatus._value2member_map_
    return not known or RunStatus(record.status).finished


def _may_exist(pod: PodRecord) -> bool:
    return pod.deleted_at is None and pod.state not in (PodState.DELETED, PodState.FAILED, PodState.REQUESTED)


def _gone(session: Session, pod: PodRecord) -> bool:
    try:
        session.cloud.get_node(pod.zone, pod.name)
    except NotFoundError:
        return True
    except CloudError:
        return False  # cannot tell now: the next command looks again
    return False


def settle_all(session: Session, records: list[RunRecord]) -> list[RunRecord]:
    """``settle`` each of ``records`` (a listing), in order."""
    started = time.monotonic()
    out = []
    for record in records:
        # A listing of many silent runs must not take long: those left are looked at by the next one.
        out.append(settle(session, record) if time.monotonic() - started < 10.0 else record)
    return out
