"""The answers of `tpuctl workspace` and `tpuctl audit` through a server: the workspace file's own model
(``Workspace``) and the audit log's rows (``AuditEntry``), so the CLI renders them as it does locally."""

from __future__ import annotations

from pydantic import BaseModel

from tpuctl.store.audit import AuditEntry
from tpuctl.teams.workspaces import Workspace


class WorkspaceList(BaseModel):
    """``GET /v1/workspaces``: the workspaces the caller belongs to."""

    workspaces: list[Workspace]


class WorkspaceOut(BaseModel):
    """``GET /v1/workspaces/{name}``."""

    workspace: Workspace


class AuditOut(BaseModel):
    """``GET /v1/audit``: rows newest first."""

    entries: list[AuditEntry]
