"""The team routes: ``GET /v1/workspaces[/{name}]`` (those the caller belongs to) and ``GET /v1/audit``
(a workspace admin's view of the audit log), each over the request's own session (``gate.scoped``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Path, Query

from tpuctl.server.gate import scoped
from tpuctl.server.wire_teams import AuditOut, WorkspaceList, WorkspaceOut

if TYPE_CHECKING:
    from tpuctl.services.session import Session
    from tpuctl.teams.workspaces import Workspaces


def team_routes(session: Session, workspaces: Workspaces) -> APIRouter:
    from tpuctl.services import teams

    router = APIRouter()

    @router.get("/v1/workspaces", response_model=WorkspaceList)
    def list_workspaces() -> WorkspaceList:
        return WorkspaceList(workspaces=teams.workspaces_of(scoped(session), workspaces))

    @router.get("/v1/workspaces/{name}", response_model=WorkspaceOut)
    def describe_workspace(name: Annotated[str, Path(min_length=1, max_length=63)]) -> WorkspaceOut:
        return WorkspaceOut(workspace=teams.workspace(scoped(session), workspaces, name))

    @router.get("/v1/audit", response_model=AuditOut)
    def audit(
        since: Annotated[float | None, Query(description="Rows at or after this epoch second.")] = None,
        principal: Annotated[str | None, Query(max_length=320)] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    ) -> AuditOut:
        entries = teams.audit_log(scoped(session), since=since, principal=principal, limit=limit)
        return AuditOut(entries=entries)

    return router
