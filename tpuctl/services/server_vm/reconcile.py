"""What a server whose ledger was restored from a copy learns from the cloud before it acts.

A copy is up to a minute old (``backup``), and the server it came from may have gone on longer than
that: in between it may have made slices and queued resources the copy never heard of (a run's recovery
onto a new slice), and deleted or lost slices the copy still thinks live. Both are found the way ``pod gc``
finds them, by tpuctl's labels and the ledger's identity label (the copy carries the identity of the
ledger it copies):

- what carries this ledger's identity but no live entry of the copy owns is deleted: no run of the copy
  knows it, so nothing would ever use or delete it (a run that was on it recovers onto a new slice, as
  after any loss of its slice);
- an entry the copy thinks live whose slice the cloud no longer has is recorded gone, so the run on it
  recovers instead of waiting on a slice that will never answer.

Runs themselves need nothing here: their supervisors' leases in the copy expire and the new server
adopts them, as it adopts any orphan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.services.gc import GarbageCollector, GcItem, GcResult

if TYPE_CHECKING:
    from tpuctl.services.session import Session


@dataclass(frozen=True)
class Reconciliation:
    """What the restored ledger and the cloud disagreed on, and what was done about it."""

    deleted: list[GcResult]  # made by this ledger, unknown to the copy
    recorded_gone: list[tuple[str, str]]  # (zone, slice) the copy thought live

    def to_dict(self) -> dict[str, Any]:
        return {
            "deleted_unknown": [r.to_dict() for r in self.deleted],
            "recorded_gone": [{"zone": z, "slice": n} for z, n in self.recorded_gone],
        }


def reconcile_restored(session: Session) -> Reconciliation:
    """Make the restored ledger of ``session`` and the cloud agree (see the module docstring)."""
    gc = GarbageCollector(session)
    unknown = [item for item in gc.survey().items if not _known(session, item)]
    deleted = gc.collect(unknown) if unknown else []
    vanished = gc.vanished()
    gc.record_gone(vanished)
    return Reconciliation(deleted=list(deleted), recorded_gone=[(p.zone, p.name) for p in vanished])


def _known(session: Session, item: GcItem) -> bool:
    """Whether a live entry of the ledger owns any slice of ``item`` (a dead slice the copy knows is its
    run's business: the run's recovery deletes it)."""
    for name in item.slices or (item.name,):
        record = session.ledger.get_pod(name, zone=item.zone)
        if record is not None and record.alive:
            return True
    return False
