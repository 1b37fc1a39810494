"""`tpuctl queue` over the ledger: the waiting runs in admission order (band first), with position, whose
they are and why they wait; `run --priority` is the job file's ``priority``, checked as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.store import Ledger, RunStatus
from tpuctl.testing.backend import InProcessCli


def queued(ledger: Ledger, run_id: str, *, priority: str, at: float) -> None:
    ledger.create_run(
        run_id, script="train.py", status=RunStatus.QUEUED, accelerator_type="v5litepod-16", ts=at,
        principal="a1@example.com", workspace="default", priority=priority, queue_reason="waiting for room",
    )  # fmt: skip


def test_the_queue_lists_waiting_runs_in_admission_order(sim_cli: InProcessCli, state_dir: Path) -> None:
    with Ledger(state_dir) as ledger:
        queued(ledger, "r-batch", priority="batch", at=1000.0)
        queued(ledger, "r-prod", priority="production", at=2000.0)
        ledger.create_run("r-running", script="x.py", status=RunStatus.RUNNING)
    result = sim_cli("queue", "-o", "json")
    assert result.code == 0, result.stderr
    rows = result.json["queue"]
    assert [(r["position"], r["run_id"], r["priority"]) for r in rows] == [
        (1, "r-prod", "production"),
        (2, "r-batch", "batch"),
    ]
    assert rows[0]["workspace"] == "default" and rows[0]["principal"] == "a1@example.com"
    assert rows[0]["reason"] == "waiting for room" and rows[0]["waiting_since"].startswith(
        "1970-01-01T00:33:20"
    )
    text = sim_cli("queue")
    assert text.code == 0 and "r-prod" in text.stdout and "waiting for room" in text.stdout
    described = sim_cli("runs", "describe", "r-prod", "-o", "json")
    assert described.code == 0, described.stderr
    queue = described.json["run"]["queue"]
    assert (queue["priority"], queue["queued_at"], queue["admitted_at"]) == (
        "production",
        "1970-01-01T00:33:20Z",
        None,
    )
    assert queue["reason"] == "waiting for room" and queue["waited_s"] > 0
    assert described.json["run"]["supervisor_state"] == "none yet (waiting in the server's queue)"
    said = sim_cli("runs", "describe", "r-prod").stdout
    assert "waiting for room" in said and "production" in said


@pytest.mark.parametrize(("given", "code"), [("interactive", 0), ("urgent", 2)])
def test_run_priority_is_a_band(sim_cli: InProcessCli, tmp_path: Path, given: str, code: int) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    result = sim_cli("run", str(tmp_path / "train.py"), "--type", "v5e-4", "--priority", given, "--dry-run",
                     "-o", "json")  # fmt: skip
    assert result.code == code, result.stderr
    if code == 0:
        assert result.json["plan"]["priority"] == "interactive"
    else:
        assert "production, interactive, batch" in result.stderr
