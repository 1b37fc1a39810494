"""``GET /v1/queue``: `tpuctl queue` on the server: its waiting runs in admission order, under the
server's workspaces (the replica's), as the caller may see them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

from tpuctl.server.wire_queue import QueueOut
from tpuctl.server.wire_views import ServedBy

if TYPE_CHECKING:
    from tpuctl.services.session import Session
    from tpuctl.teams.workspaces import Workspaces


def queue_routes(session: Session, workspaces: Workspaces) -> APIRouter:
    router = APIRouter()
    served = ServedBy(backend=session.backend.label, project=session.project)

    @router.get("/v1/queue", response_model=QueueOut)
    def queue() -> QueueOut:
        from tpuctl.server.queue_view import queue_of
        from tpuctl.services.cost.monthly_spend import this_month_spend

        spend = this_month_spend(session, now=session.clock())
        return QueueOut(served_by=served, runs=queue_of(session, workspaces, spend))

    return router
