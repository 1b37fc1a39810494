"""`tpuctl queue`: the server's waiting runs in the order they will be admitted, each with its position,
who and whose it is, its band, since when it waits and why (``admission`` orders them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.server.admission import band_of, order_key
from tpuctl.store.queue import workspace_of
from tpuctl.store.records import RunStatus
from tpuctl.timefmt import iso_or_none

if TYPE_CHECKING:
    from tpuctl.services.cost.monthly_spend import MonthSpend
    from tpuctl.services.session import Session
    from tpuctl.teams.workspaces import Workspaces


@dataclass(frozen=True)
class QueuedRun:
    """One waiting run: ``position`` 1 is admitted first when its workspace has room."""

    position: int
    run_id: str
    workspace: str
    principal: str | None
    priority: str
    accelerator_type: str | None
    waiting_since: str | None
    waited_s: float
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def queue_of(session: Session, workspaces: Workspaces, spend: MonthSpend) -> list[QueuedRun]:
    """The waiting runs the session's actor may see, in the queue's order (positions count only those:
    a run of a workspace the actor cannot see is not revealed, not even by a gap)."""
    now = session.clock()
    waiting = session.ledger.list_runs(status=RunStatus.QUEUED, workspaces=session.actor.visible)
    ordered = sorted(waiting, key=lambda r: order_key(r, workspaces, spend))
    return [
        QueuedRun(
            position=index,
            run_id=r.run_id,
            workspace=workspace_of(r),
            principal=r.principal,
            priority=band_of(r).value,
            accelerator_type=r.accelerator_type,
            waiting_since=iso_or_none(r.queued_at),
            waited_s=round(max(now - (r.queued_at or r.created_at), 0.0), 3),
            reason=r.queue_reason,
        )
        for index, r in enumerate(ordered, 1)
    ]
