"""The audit log: one row per request the server took that changed something or that it refused (who,
what, on which target, when, and the HTTP status it answered). The SQL is plain, the same on SQLite and
PostgreSQL; "now" is the ledger's clock (``db_now``), so rows of several replicas order by one clock."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tpuctl.store.leases import db_now
from tpuctl.store.sql import SqlConnection, in_list

#: The principal of a request that proved no identity (no token, or one that failed verification).
ANONYMOUS: Final = "(anonymous)"
_COLS: Final = "id, at, principal, workspace, method, path, action, target, status, detail"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """What a request writes. ``workspace`` None: the request was refused before a workspace was known
    (no token, a run the caller cannot see), or it had none. ``detail``: the error's kind and message,
    when refused."""

    principal: str
    workspace: str | None
    method: str
    path: str
    action: str
    target: str | None
    status: int
    detail: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class AuditEntry(AuditRecord):
    """One row: the record with its id and the ledger's time of it."""

    id: int
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "at": self.at, "principal": self.principal, "workspace": self.workspace,
            "method": self.method, "path": self.path, "action": self.action, "target": self.target,
            "status": self.status, "detail": dict(self.detail),
        }  # fmt: skip


def write(conn: SqlConnection, record: AuditRecord) -> None:
    conn.execute(
        "INSERT INTO audit_log (at, principal, workspace, method, path, action, target, status, detail) "
        "VALUES (:at, :principal, :workspace, :method, :path, :action, :target, :status, :detail)",
        {
            "at": db_now(conn), "principal": record.principal, "workspace": record.workspace,
            "method": record.method, "path": record.path[:2000], "action": record.action,
            "target": record.target, "status": record.status,
            "detail": json.dumps(dict(record.detail), default=str) if record.detail else None,
        },
    )  # fmt: skip


def entries(
    conn: SqlConnection,
    *,
    since: float | None = None,
    principal: str | None = None,
    workspaces: Collection[str] | None = None,
    limit: int = 100,
) -> list[AuditEntry]:
    """Rows newest first; ``workspaces`` (None: all): only rows of those workspaces and rows without
    one (``AuditEntry.workspace``)."""
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    if since is not None:
        where.append("at >= :since")
        params["since"] = since
    if principal is not None:
        where.append("principal = :principal")
        params["principal"] = principal
    if workspaces is not None:
        where.append(f"(workspace IS NULL OR workspace IN ({in_list('ws', sorted(workspaces), params)}))")
    sql = f"SELECT {_COLS} FROM audit_log"
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = conn.execute(sql + " ORDER BY at DESC, id DESC LIMIT :limit", params).fetchall()
    return [_entry(row) for row in rows]


def _entry(row: Any) -> AuditEntry:
    detail = json.loads(row[9]) if row[9] else {}
    return AuditEntry(
        id=int(row[0]), at=float(row[1]), principal=str(row[2]), workspace=row[3], method=str(row[4]),
        path=str(row[5]), action=str(row[6]), target=row[7], status=int(row[8]),
        detail=detail if isinstance(detail, dict) else {"detail": detail},
    )  # fmt: skip
