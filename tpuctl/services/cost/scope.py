"""Whose cost a report covers: some workspaces and one principal (``CostScope``), as SQL over a slice.

A slice's workspace and principal are its own (``pods.workspace``, ``pods.principal``: its run's owner,
else who made it; ``tpuctl.store.view``); a slice from before workspaces is the local workspace's and an
unknown principal's, exactly as runs read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from tpuctl.store import cost_sql as sd
from tpuctl.store.records import LOCAL_WORKSPACE, UNKNOWN_PRINCIPAL
from tpuctl.store.sql import Dialect

#: Per grouping by whose a slice is: the slice's own column, and what a NULL there (a row from before
#: workspaces) is read as.
ATTRIBUTION_COLUMNS: Final = {
    "workspace": ("workspace", LOCAL_WORKSPACE),
    "user": ("principal", UNKNOWN_PRINCIPAL),
}


def owner_sql(kind: str, value: str) -> str:
    """``value`` (SQL: a slice's workspace or principal column, by ``kind``) as reports show it. The
    default is a literal: a constant of this code."""
    return f"COALESCE({value}, '{ATTRIBUTION_COLUMNS[kind][1]}')"


#: A slice's (alias p) workspace and principal as reports show them.
WORKSPACE_OF_P: Final = owner_sql("workspace", "p.workspace")
PRINCIPAL_OF_P: Final = owner_sql("user", "p.principal")


@dataclass(frozen=True)
class CostScope:
    """The slices a report covers: those of ``workspaces`` (None: every workspace) and of ``principal``
    (None: anyone's). The server's reader sees only its actor's workspaces (``Actor.visible``); a report's
    ``--workspace``/``--user`` narrow it further."""

    workspaces: frozenset[str] | None = None
    principal: str | None = None

    @property
    def everything(self) -> bool:
        return self.workspaces is None and self.principal is None

    def narrowed(self, workspace: str | None, principal: str | None) -> CostScope:
        """This scope and ``--workspace``/``--user`` (a workspace outside it gives an empty scope: a
        workspace the reader may not see is reported as one with no cost, never named as forbidden)."""
        workspaces = self.workspaces
        if workspace is not None:
            workspaces = frozenset({workspace}) & (workspaces if workspaces is not None else {workspace})
        return CostScope(workspaces, principal if principal is not None else self.principal)

    def params(self) -> dict[str, Any]:
        """The parameters ``scope_sql`` reads."""
        return {
            "scope_all_ws": int(self.workspaces is None),
            "scope_ws": json.dumps(sorted(self.workspaces or ())),
            "scope_anyone": int(self.principal is None),
            "scope_principal": self.principal or "",
        }


def scope_sql(alias: str, d: Dialect) -> str:
    """Whether slice ``alias`` is in the report's scope (parameters: ``CostScope.params``)."""
    workspace = f"COALESCE({alias}.workspace, '{LOCAL_WORKSPACE}')"
    principal = f"COALESCE({alias}.principal, '{UNKNOWN_PRINCIPAL}')"
    return (
        f"(:scope_all_ws = 1 OR {workspace} IN ({sd.json_values(':scope_ws', 'TEXT', d)}))"
        f" AND (:scope_anyone = 1 OR {principal} = :scope_principal)"
    )
