"""The audit log on both engines: rows at the ledger's clock, newest first, filtered by time, principal
and workspace (a workspace filter keeps the rows without one)."""

from __future__ import annotations

from collections.abc import Callable

from tpuctl.store.audit import ANONYMOUS, AuditRecord
from tpuctl.store.ledger import Ledger


def _record(principal: str, workspace: str | None, status: int, target: str = "r1") -> AuditRecord:
    return AuditRecord(principal=principal, workspace=workspace, method="POST",
                       path=f"/v1/runs/{target}/cancel", action="runs.cancel", target=target, status=status,
                       detail={"error": "forbidden", "message": "no"} if status == 403 else {})  # fmt: skip


def test_rows_are_written_and_read_back_with_their_filters(open_ledger: Callable[..., Ledger]) -> None:
    with open_ledger() as ledger:
        before = ledger.db_now()
        ledger.record_audit(_record(ANONYMOUS, None, 401))
        ledger.record_audit(_record("a2@example.com", "team-a", 403))
        ledger.record_audit(_record("b1@example.com", "team-b", 200, target="r2"))
    with open_ledger() as ledger:  # another process's view
        rows = ledger.audit_entries()
        assert [(r.principal, r.workspace, r.status) for r in rows] == [
            ("b1@example.com", "team-b", 200),
            ("a2@example.com", "team-a", 403),
            (ANONYMOUS, None, 401),
        ]
        assert rows[1].detail == {"error": "forbidden", "message": "no"} and rows[0].detail == {}
        assert rows[0].at >= before and rows[0].id > rows[1].id
        assert [r.principal for r in ledger.audit_entries(workspaces={"team-a"})] == [
            "a2@example.com",
            ANONYMOUS,
        ]
        assert [r.principal for r in ledger.audit_entries(workspaces=set())] == [ANONYMOUS]
        assert [r.target for r in ledger.audit_entries(principal="b1@example.com")] == ["r2"]
        assert ledger.audit_entries(since=rows[0].at + 60) == []
        assert len(ledger.audit_entries(limit=2)) == 2
