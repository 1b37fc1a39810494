"""Which live runs use a slice, so that a slice in use is not given to a second run or deleted from
under one by surprise; and how a deletion the user forced is told apart from a preemption.

A run is live while it is not finished in the ledger AND a supervisor holds the run's live ledger lease,
on any machine (a supervisor that was killed leaves its run unfinished, and the slice free once its lease
expires: ``runs resume`` takes it up).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tpuctl.errors import UsageError
from tpuctl.services.run.sliceset import multislice_prefix
from tpuctl.store.records import RunStatus

if TYPE_CHECKING:
    from tpuctl.services.session import Session
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.records import RunRecord

#: The run detail key a forced ``pod delete`` sets on every live run on the slice.
SLICE_DELETED = "slice_deleted"


def live_runs_on(session: Session, pod: str, zone: str, *, other_than: str | None = None) -> list[RunRecord]:
    """The live runs on slice ``pod`` in ``zone`` (but ``other_than``), oldest first: a multislice run
    (recorded under its slices' common prefix) uses each of its ``<prefix>-<i>`` slices too."""
    found = []
    for record in session.ledger.list_runs():
        if record.run_id == other_than or record.zone != zone or not _uses(record, pod):
            continue
        if RunStatus(record.status).finished:
            continue
        lease = session.ledger.lease_of(record.run_id)
        if lease is not None and not lease.expired:
            found.append(record)
    return sorted(found, key=lambda r: r.created_at)


def _uses(record: RunRecord, pod: str) -> bool:
    if record.pod == pod:
        return True
    slices = (record.detail or {}).get("slices")
    return isinstance(slices, int) and slices > 1 and multislice_prefix(pod) == record.pod


def refuse_second_run(session: Session, pod: str, zone: str, run_id: str | None) -> None:
    """A run on ``--pod`` is refused while another live run uses the slice: two programs would fight over
    its TPUs (a TPU chip is opened by one process), and whichever ended first would stop the other's
    hosts' bundle. Refused, not queued: tpuctl has no scheduler to wake the second one up."""
    users = live_runs_on(session, pod, zone, other_than=run_id)
    if users:
        first = users[0]
        raise UsageError(
            f"pod {pod} ({zone}) is in use by run {first.run_id} ({first.status}); one run at a time "
            "on a slice: two programs would fight over its TPUs",
            field="pod",
            value=pod,
            fix=f"wait for it (`tpuctl runs describe {first.run_id}`), stop it with "
            f"`tpuctl runs cancel {first.run_id}`, or run on a slice of your own with --type",
        )


def guard_deletion(session: Session, pod: str, zone: str, *, force: bool) -> list[str]:
    """Before ``pod delete``: refuse while live runs use the slice unless ``force``; with ``force``, mark
    each of them so its supervisor records a deletion, not a preemption. Returns their run ids."""
    users = live_runs_on(session, pod, zone)
    if not users:
        return []
    ids = [r.run_id for r in users]
    if not force:
        raise UsageError(
            f"pod {pod} ({zone}) is in use by run {', '.join(ids)}; deleting it stops the run",
            field="force",
            value=pod,
            fix=f"stop the run first (`tpuctl runs cancel {ids[0]}`), or pass --force to delete the slice "
            "anyway (the run ends cancelled: 'slice deleted')",
        )
    for record in users:
        detail = {**(record.detail or {}), SLICE_DELETED: {"by": "pod delete --force", "at": time.time()}}
        session.ledger.update_run(record.run_id, detail=detail)
    return ids


def deletion_of(ledger: Ledger, run_id: str) -> dict[str, Any] | None:
    """The forced deletion of the run's slice, if the user deleted it (see ``guard_deletion``)."""
    record = ledger.get_run(run_id)
    marked = (record.detail or {}).get(SLICE_DELETED) if record is not None else None
    return marked if isinstance(marked, dict) else None
