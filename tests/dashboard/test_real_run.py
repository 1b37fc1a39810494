"""The run page of a real run on the simulator's VMs, preempted twice (with a notice, then without), then
finished: its timeline has two preemption marks with the kinds and recovery times `runs describe -o json`
gives, and its cost is its group of `cost report --group-by run`. Minutes of simulated VMs: --slow (the
default suite draws the same pages over runs recorded through the ledger, test_dashboard_routes and
test_browser)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tpuctl.sim import SimAdminClient
from tpuctl.testing.cli import Cli

ZONE = "us-central1-a"
WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {ZONE: {"v5e": {"on_demand": 16, "preemptible": 16}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    "durations": {"node_create_s": 60, "node_delete_s": 10, "preemption_grace_s": 3},
}
#: Reports steps (as tpuctl's runtime would: step events), long enough on its first two starts to be
#: preempted there; the third does five steps and finishes.
STEPPER = """\
import json, os, time
restart = int(os.environ["TPUCTL_RESTART_COUNT"])
print("attempt", restart, flush=True)
for step in range(1, 1200 if restart < 2 else 6):
    time.sleep(0.05)
    event = {"event": "step", "step": step, "dt": 0.05, "loss": 1 / step}
    print("TPUCTL_EVENT " + json.dumps(event), flush=True)
print("done", flush=True)
"""


def _preempt_each_start(admin: SimAdminClient, state_dir: Path, halt: threading.Event) -> None:
    """Preempt the run's slice once its start 0 has reported a step (with a notice), then once start 1
    has (without): a start preempted before its first step would leave its recovery time unknown."""
    for attempt, notice in ((0, True), (1, False)):
        while not halt.is_set():
            logs = list((state_dir / "runs").glob("*/worker-0.log"))
            said = logs[0].read_text(errors="replace") if logs else ""
            ready = [n for n in admin.status()["nodes"] if n.get("state") == "READY"]
            started = said.partition(f"attempt {attempt}\n")[2]
            if "TPUCTL_EVENT" in started and len(ready) == 1:
                admin.preempt(ready[0]["zone"], ready[0]["name"], notice=notice)
                break
            time.sleep(0.1)


@pytest.fixture
def admin(serve_sim: Callable[..., SimAdminClient]) -> SimAdminClient:
    return serve_sim(WORLD)


@pytest.mark.slow
def test_a_real_run_preempted_twice_is_drawn_with_both_preemptions(
    admin: SimAdminClient, cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "proj" / "stepper.py"
    script.parent.mkdir(parents=True)
    script.write_text(STEPPER)
    halt = threading.Event()
    chaos = threading.Thread(target=_preempt_each_start, args=(admin, state_dir, halt), daemon=True)
    chaos.start()
    try:
        result = cli("run", str(script), "--no-runtime-deps", "--type", "v5e-8", "--spot", "--zone", ZONE,
                     "-o", "json")  # fmt: skip
    finally:
        halt.set()
        chaos.join(10)
    assert result.code == 0, result.stderr[-3000:]
    run_id = result.json["run"]["run_id"]
    described = cli("runs", "describe", run_id, "-o", "json").json["run"]
    preemptions = described["recovery"]["preemptions"]
    assert len(preemptions) == 2
    assert preemptions[0]["kind"].startswith("notice") and preemptions[1]["kind"] == "hard", [
        (p["kind"], p["detection_latency_s"]) for p in preemptions
    ]
    costs = cli("cost", "report", "--group-by", "run", "-o", "json").json
    _check_page(state_dir, run_id, preemptions, costs)


def _check_page(
    state_dir: Path, run_id: str, preemptions: list[dict[str, Any]], costs: dict[str, Any]
) -> None:
    from tpuctl.dashboard.serve import dashboard_app
    from tpuctl.services.session import open_session
    from tpuctl.settings import load_settings

    with open_session(load_settings({"state_dir": state_dir})) as sess, TestClient(dashboard_app(sess)) as c:
        html = c.get(f"/runs/{run_id}").text
        money = c.get("/money?group_by=run").text
    marks = re.findall(r'data-mark="preemption" data-kind="([a-z_]+)" data-number="(\d+)"', html)
    assert marks == [(p["kind"], str(p["number"])) for p in preemptions]
    wanted = [p["recovery_s"] for p in preemptions]
    in_table = [float(v) for v in re.findall(r'data-preemption="\d+" [^>]*data-recovery-s="([\d.]+)"', html)]
    on_marks = [float(v) for v in re.findall(r'data-mark="preemption" [^>]*data-recovery-s="([\d.]+)"', html)]
    assert in_table == on_marks == wanted and all(v > 0 for v in wanted)
    assert 'data-mark="point" data-series="loss"' in html
    (group,) = [g for g in costs["groups"] if g["key"] == run_id]
    assert re.search(rf'data-cost-usd="{group["cost_usd"]}"', html)
    # The money page's totals are the (reconciled) report's.
    for figure in ("cost_usd", "waste_usd", "preemptions"):
        total = re.search(rf'data-total="{figure}" data-value="([^"]*)"', money)
        assert total is not None and float(total[1]) == costs["totals"][figure], figure
