"""What a caller may read of the team set-up: the workspaces it belongs to (`tpuctl workspace`) and, for
a workspace admin, the audit log of its workspaces (`tpuctl audit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuctl.errors import NameNotFoundError
from tpuctl.teams.actor import ForbiddenError
from tpuctl.teams.workspaces import Role

if TYPE_CHECKING:
    from tpuctl.services.session import Session
    from tpuctl.store.audit import AuditEntry
    from tpuctl.teams.workspaces import Workspace, Workspaces


def workspaces_of(session: Session, workspaces: Workspaces) -> list[Workspace]:
    """The workspaces the session's actor belongs to (all of them for one that sees all), by name."""
    actor = session.actor
    return [ws for ws in workspaces if actor.sees_all or ws.name in actor.roles]


def workspace(session: Session, workspaces: Workspaces, name: str) -> Workspace:
    """Workspace ``name``; exit 11 when there is none the actor belongs to (another team's is not found,
    as one that does not exist)."""
    for ws in workspaces_of(session, workspaces):
        if ws.name == name:
            return ws
    shown = ", ".join(ws.name for ws in workspaces_of(session, workspaces)) or "(none)"
    raise NameNotFoundError(f"no workspace {name!r}", field="WORKSPACE", value=name, fix=f"yours: {shown}")


def audit_log(
    session: Session, *, since: float | None = None, principal: str | None = None, limit: int = 100
) -> list[AuditEntry]:
    """The audit rows the actor may read, newest first: every row for one that sees all (a local user),
    else the rows of the workspaces it administers and the rows refused before any workspace was known
    (no token, an unknown run); 403 for an actor that administers none."""
    actor = session.actor
    admin_of = None if actor.sees_all else {ws for ws, role in actor.roles.items() if role is Role.ADMIN}
    if admin_of is not None and not admin_of:
        raise ForbiddenError(
            f"{actor.principal} administers no workspace; only workspace admins read the audit log",
            field="principal",
            value=actor.principal,
            fix="ask an admin of your workspace",
        )
    return session.ledger.audit_entries(
        since=since, principal=principal.lower() if principal else None, workspaces=admin_of, limit=limit
    )
