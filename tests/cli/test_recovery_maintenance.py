"""A host maintenance during a run is a maintenance, not a preemption: on a one-host on-demand TPU API
slice (which Google keeps through it: docs/preemption.md#host-maintenance), a tiny program that knows
nothing of tpuctl is killed when its VM stops, and the run waits for the slice to be READY again and
starts the program again on the same slice. Nothing is deleted, nothing is placed again, and no
preemption is on the record."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from recovery_helpers import HOST_XLA_ENV, LM_ARGS, V5E_ZONE, WORLD, events_of, run_dir

from tpuctl.sim import SimAdminClient
from tpuctl.testing.cli import Cli

#: Real seconds of notice, and 2 s of maintenance (2000 simulated seconds at the world's 1000x).
MAINTAINED_WORLD: dict[str, Any] = {
    **WORLD,
    "durations": {**WORLD["durations"], "maintenance_notice_s": 2, "maintenance_s": 2000},
}

#: Trains until its VM stops under it at its first start; done at once at the next.
SCRIPT = """\
import os, time
restart = int(os.environ["TPUCTL_RESTART_COUNT"])
print("training, attempt", restart, flush=True)
while restart == 0:
    time.sleep(0.05)
print("done on attempt", restart, flush=True)
"""


@pytest.fixture
def admin(
    serve_sim: Callable[..., SimAdminClient], state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> SimAdminClient:
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(state_dir))
    return serve_sim(MAINTAINED_WORLD)


def _maintain_when_training(admin: SimAdminClient, state_dir: Path, noticed: list[float]) -> None:
    """Start a host maintenance of the run's slice once its first start trains."""
    deadline = time.monotonic() + 300
    log = run_dir(state_dir, 300) / "worker-0.log"
    while time.monotonic() < deadline:
        ready = [n for n in admin.status()["nodes"] if n.get("state") == "READY"]
        if log.exists() and "training, attempt 0" in log.read_text() and ready:
            noticed.append(time.time())
            admin.maintenance(ready[0]["zone"], ready[0]["name"])
            return
        time.sleep(0.05)


def test_a_maintained_slice_is_waited_for_and_the_program_starts_again_on_it(
    admin: SimAdminClient, cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "user" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text(SCRIPT)
    noticed: list[float] = []
    chaos = threading.Thread(target=_maintain_when_training, args=(admin, state_dir, noticed), daemon=True)
    chaos.start()
    # A stdlib program: nothing for the hosts to install.
    result = cli("run", str(script), "--type", "v5e-4", "--zone", V5E_ZONE, "--no-runtime-deps")
    chaos.join(30)
    assert result.code == 0, result.stderr[-4000:]
    assert noticed, "the run ended before its slice was maintained"
    assert "host maintenance notice (TERMINATE_ON_HOST_MAINTENANCE)" in result.stderr
    assert "is back after its maintenance" in result.stderr

    (listed,) = cli("runs", "list", "-o", "json").json["runs"]
    run = cli("runs", "describe", listed["run_id"], "-o", "json").json["run"]
    assert run["status"] == "succeeded" and run["preemptions"] == 0, run
    recovery = run["recovery"]
    assert recovery["preemptions"] == [] and recovery["restarts"] == 0
    (maintained,) = recovery["maintenance"]
    assert (
        maintained["value"] == "TERMINATE_ON_HOST_MAINTENANCE"
        and maintained["source"] == "follower-maintenance"
    )
    assert maintained["pod"] == run["pod"] and maintained["went_down"]
    # One slice all along: created once, never replaced; the cost report counts no preemption.
    assert cli("cost", "report", "-o", "json").json["totals"]["preemptions"] == 0
    log = (run_dir(state_dir) / "worker-0.log").read_text()
    assert "done on attempt 1" in log


def _maintain_at_step(admin: SimAdminClient, state_dir: Path, step: int, noticed: list[float]) -> None:
    """Start a host maintenance of the run's slice once host 0 of its first start has done ``step``."""
    deadline = time.monotonic() + 600
    log = run_dir(state_dir, 600) / "worker-0.log"
    while time.monotonic() < deadline:
        steps = [e["step"] for e in events_of(log) if e["event"] == "step"] if log.exists() else []
        ready = [n for n in admin.status()["nodes"] if n.get("state") == "READY"]
        if steps and steps[-1] >= step and ready:
            noticed.append(time.time())
            admin.maintenance(ready[0]["zone"], ready[0]["name"])
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_tpuctls_runtime_checkpoints_on_the_notice_and_resumes_from_it_on_the_same_slice(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(state_dir))
    # A notice long enough for the tiny LM to reach its next step and save, on a loaded machine.
    admin = serve_sim(
        {**WORLD, "durations": {**WORLD["durations"], "maintenance_notice_s": 20, "maintenance_s": 2000}}
    )
    noticed: list[float] = []
    chaos = threading.Thread(target=_maintain_at_step, args=(admin, state_dir, 3, noticed), daemon=True)
    chaos.start()
    args = ["--example", "lm", "--type", "v5e-4", "--zone", V5E_ZONE, "--checkpoint-every", "100"]
    result = cli("run", *args, *HOST_XLA_ENV, "--", *LM_ARGS)
    chaos.join(30)
    assert result.code == 0, result.stderr[-4000:]
    assert noticed, "the run ended before its slice was maintained"
    # Started again only once the host had been taken and was back, not at once on the host that stops.
    assert "is back after its maintenance" in result.stderr
    log = run_dir(state_dir) / "worker-0.log"
    stopped = next(e for e in events_of(log) if e["event"] == "preempted")
    assert stopped["checkpoint"] == "saved" and stopped["reason"] == "maintenance"
    starts = [e for e in events_of(log) if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["restored"] == stopped["step"]  # not step 0: the notice's save
    (listed,) = cli("runs", "list", "-o", "json").json["runs"]
    run = cli("runs", "describe", listed["run_id"], "-o", "json").json["run"]
    assert run["preemptions"] == 0
    (maintained,) = run["recovery"]["maintenance"]
    assert maintained["checkpoint_step"] == stopped["step"] and maintained["pod"] == run["pod"]
