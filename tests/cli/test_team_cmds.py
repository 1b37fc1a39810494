"""`tpuctl workspace` and `tpuctl audit` without a server: the implicit workspace (or a workspace file's),
and this machine's ledger's audit log, read as its user (who sees it all)."""

from __future__ import annotations

import json
from pathlib import Path

from tpuctl.store.audit import AuditRecord
from tpuctl.store.ledger import Ledger
from tpuctl.testing.backend import InProcessCli

WORKSPACES = """\
workspaces:
  team-a:
    chips: {v5e: 32, v6e: {total: 64, spot: 64, on-demand: 16}}
    usd_per_month: 50
    run_budget_usd: {default: 10, max: 25}
    members:
      a1@example.com: member
      a2@example.com: viewer
"""


def test_workspaces_locally_are_the_implicit_one_or_a_files(sim_cli: InProcessCli, tmp_path: Path) -> None:
    listed = sim_cli("workspace", "list", "-o", "json")
    assert listed.code == 0 and [w["name"] for w in json.loads(listed.stdout)["workspaces"]] == ["default"]
    path = tmp_path / "team.yaml"
    path.write_text(WORKSPACES)
    described = sim_cli("workspace", "describe", "team-a", "--workspaces", str(path), "-o", "json")
    document = json.loads(described.stdout)
    assert document["members"] == {"a1@example.com": "member", "a2@example.com": "viewer"}
    assert document["chips"] == "v5e: 32, v6e: 64 (on-demand 16, spot 64)"
    assert document["run_budget_usd"] == {"default": 10.0, "max": 25.0}
    table = sim_cli("workspace", "describe", "team-a", "--workspaces", str(path))
    assert "a2@example.com" in table.stdout and table.code == 0
    missing = sim_cli("workspace", "describe", "team-z", "--workspaces", str(path))
    assert missing.code == 11 and "no workspace 'team-z'" in missing.stderr


def test_audit_locally_reads_the_ledgers_log_newest_first(sim_cli: InProcessCli, state_dir: Path) -> None:
    with Ledger(state_dir / "ledger.db") as ledger:
        for who, status in (("a1@example.com", 200), ("a2@example.com", 403)):
            detail = {"error": "forbidden"} if status == 403 else {}
            record = AuditRecord(principal=who, workspace="team-a", method="POST", path="/v1/runs/r1/cancel",
                                 action="runs.cancel", target="r1", status=status, detail=detail)  # fmt: skip
            ledger.record_audit(record)
    every = json.loads(sim_cli("audit", "-o", "json").stdout)["entries"]
    assert [(e["principal"], e["status"]) for e in every] == [
        ("a2@example.com", 403),
        ("a1@example.com", 200),
    ]
    assert every[0]["detail"] == {"error": "forbidden"}
    one = json.loads(sim_cli("audit", "--principal", "A1@example.com", "--since", "1h", "-o", "json").stdout)
    assert [e["principal"] for e in one["entries"]] == ["a1@example.com"]
    assert sim_cli("audit", "--limit", "0").code == 2
