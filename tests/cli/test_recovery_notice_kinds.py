"""Every preemption on the record, whatever the program does with its notice: an unmodified JAX script
(``jax.distributed.initialize()``, which makes JAX's preemption notifier catch SIGTERM, and no tpuctl
import) preempted with notice in a world with a short grace, on the simulator's VMs.

- It goes on: killed at the grace's end, restarted on a new slice, a preemption of kind
  ``notice_ignored`` detected at the notice (not at the kill).
- It finishes inside the grace: the run succeeds, and its record and the cost report show a preemption
  of kind ``notice_finished``.

The default suite has both in one run on one host (its first start goes on through the notice, its
second finishes inside it): each case alone costs a slice's setup and the first a whole grace. Each on
its own, and the first on 4 hosts, with --slow."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from recovery_helpers import V5E_ZONE, WORLD, run_dir, serve_for_jax_runs

from tpuctl.sim import SimAdminClient
from tpuctl.testing.cli import Cli

#: Real seconds from the notice to SIGKILL: long enough for the script's last steps and JAX's shutdown at
#: its exit on a machine loaded five times over (5 s was not, once), short enough that waiting for a
#: whole grace costs little.
GRACE_S = 8
SHORT_GRACE_WORLD: dict[str, Any] = {
    **WORLD,
    "durations": {**WORLD["durations"], "preemption_grace_s": GRACE_S},
}

#: An unmodified script. ``PLAN`` says what each start does when its slice is preempted: ``ignore`` trains
#: on (JAX caught the SIGTERM) until the grace's end kills it; ``finish`` has its work end just after the
#: notice (the test's stand-in for "the last steps fell inside the grace": it reads the metadata flag
#: itself only to be on time). A start beyond the plan has nothing left to do.
SCRIPT = """\
import os, time, urllib.request
import jax
import jax.numpy as jnp

jax.distributed.initialize()
restart = int(os.environ["TPUCTL_RESTART_COUNT"])
plan = os.environ["PLAN"].split(",")
when_preempted = plan[restart] if restart < len(plan) else "done"
w = jnp.ones(4)
print("training, attempt", restart, "of", jax.process_count(), "processes", flush=True)
flag = "http://" + os.environ["GCE_METADATA_HOST"] + "/computeMetadata/v1/instance/preempted"

def preempted():
    ask = urllib.request.Request(flag, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(ask, timeout=5) as answer:
        return answer.read().decode().strip() == "TRUE"

steps = 0
while when_preempted != "done":
    w = w * 0.999
    steps += 1
    time.sleep(0.05)
    if when_preempted == "finish" and steps % 2 == 0 and preempted():
        time.sleep(1.0)  # the last steps, inside the grace
        break
print("done after", steps, "steps:", float(w.sum()), flush=True)
"""


@pytest.fixture
def admin(
    serve_sim: Callable[..., SimAdminClient], state_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> SimAdminClient:
    return serve_for_jax_runs(
        serve_sim,
        SHORT_GRACE_WORLD,
        state_dir=state_dir,
        jax_cache=tmp_path / "jax-cache",
        monkeypatch=monkeypatch,
    )


@dataclass
class PreemptWhenTraining:
    """Preempts (with notice) the run's slice once host 0 says its start N is training, for each of the
    first ``starts`` starts, on a thread."""

    admin: SimAdminClient
    state_dir: Path
    starts: int
    preempted_at: list[float] = field(default_factory=list)
    error: BaseException | None = None
    _thread: threading.Thread = field(init=False)

    def start(self) -> PreemptWhenTraining:
        self._thread = threading.Thread(target=self._run, name="preempt", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            deadline = time.monotonic() + 300
            log = run_dir(self.state_dir, 300) / "worker-0.log"
            while len(self.preempted_at) < self.starts and time.monotonic() < deadline:
                ready = [n for n in self.admin.status()["nodes"] if n.get("state") == "READY"]
                training = f"training, attempt {len(self.preempted_at)}"
                if log.exists() and training in log.read_text() and len(ready) == 1:
                    self.preempted_at.append(time.time())
                    self.admin.preempt(ready[0]["zone"], ready[0]["name"], notice=True)
                time.sleep(0.05)
        except BaseException as exc:  # raised by join()
            self.error = exc

    def join(self) -> list[float]:
        """When each start's slice was preempted (the notices' moments)."""
        self._thread.join(30)
        if self.error is not None:
            raise self.error
        assert len(self.preempted_at) == self.starts, self.preempted_at
        return self.preempted_at


def _run(
    cli: Cli, admin: SimAdminClient, state_dir: Path, script: Path, accelerator: str, plan: str
) -> list[float]:
    """``tpuctl run`` of the script, each start of ``plan`` preempted once it trains; when they were."""
    chaos = PreemptWhenTraining(admin, state_dir, len(plan.split(","))).start()
    result = cli(
        "run",
        str(script),
        "--type",
        accelerator,
        "--spot",
        "--zone",
        V5E_ZONE,
        "--env",
        f"PLAN={plan}",
        "-o",
        "json",
    )
    assert result.code == 0, result.stderr[-4000:]
    return chaos.join()


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _preemptions_on_record(cli: Cli, kinds: list[str]) -> list[dict[str, Any]]:
    """The run's preemptions, of ``kinds`` in order, as `runs describe` and `cost report` show them; the
    run succeeded, and its slices are gone."""
    (listed,) = cli("runs", "list", "-o", "json").json["runs"]
    run = cli("runs", "describe", listed["run_id"], "-o", "json").json["run"]
    assert run["status"] == "succeeded" and run["preemptions"] == len(kinds), run
    preemptions = run["recovery"]["preemptions"]
    assert [p["kind"] for p in preemptions] == kinds, preemptions
    assert all(p["source"] == "follower-notice" for p in preemptions), preemptions
    totals = cli("cost", "report", "-o", "json").json["totals"]
    by_kind = {kind: kinds.count(kind) for kind in kinds}
    assert totals["preemptions"] == len(kinds) and totals["preemption_kinds"] == by_kind, totals
    table = cli("cost", "report").stdout
    said = ", ".join(f"{kind} {n}" for kind, n in sorted(by_kind.items()))
    assert f"preemptions: {len(kinds)} ({said}, " in table, table
    return list(preemptions)


def _ignored_then_restarted(preemption: dict[str, Any], preempted_at: float) -> None:
    """Detected at the notice, not at the kill a grace later; the program started again elsewhere."""
    noticed, detected = _epoch(preemption["occurred_at"]), _epoch(preemption["detected_at"])
    assert 0 <= noticed - preempted_at < 2.0 and 0 <= detected - noticed < 2.0, preemption
    assert detected < preempted_at + GRACE_S - 1.0 and preemption["checkpoint_step"] is None
    assert preemption["new_pod"] and preemption["new_pod"] != preemption["pod"]


def _finished_in_grace(preemption: dict[str, Any], preempted_at: float) -> None:
    """Noticed at the notice; nothing started again after it."""
    noticed = _epoch(preemption["occurred_at"])
    assert 0 <= noticed - preempted_at < 2.0 and preemption["detection_latency_s"] < 2.0, preemption
    assert preemption["new_pod"] is None


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "user" / "train.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SCRIPT)
    return path


def _log(state_dir: Path) -> str:
    return (run_dir(state_dir) / "worker-0.log").read_text()


def test_an_unmodified_script_killed_through_one_grace_then_finishing_inside_the_next_has_both_on_record(
    admin: SimAdminClient, cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    first, second = _run(cli, admin, state_dir, _script(tmp_path), "v5e-4", "ignore,finish")
    ignored, finished = _preemptions_on_record(cli, ["notice_ignored", "notice_finished"])
    _ignored_then_restarted(ignored, first)
    _finished_in_grace(finished, second)
    assert finished["pod"] == ignored["new_pod"]
    log = _log(state_dir)
    assert "training, attempt 1" in log and "training, attempt 2" not in log and "done after" in log
    assert admin.status()["nodes"] == []


@pytest.mark.slow
def test_an_unmodified_script_that_finishes_inside_the_grace_succeeds_with_its_preemption_on_record(
    admin: SimAdminClient, cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    (preempted_at,) = _run(cli, admin, state_dir, _script(tmp_path), "v5e-4", "finish")
    (preemption,) = _preemptions_on_record(cli, ["notice_finished"])
    _finished_in_grace(preemption, preempted_at)
    assert "training, attempt 1" not in _log(state_dir)  # not started again
    assert admin.status()["nodes"] == []


@pytest.mark.slow
def test_an_unmodified_script_on_4_hosts_that_trains_through_the_grace_is_restarted_detected_at_the_notice(
    admin: SimAdminClient, cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    (preempted_at,) = _run(cli, admin, state_dir, _script(tmp_path), "v5e-16", "ignore")
    (preemption,) = _preemptions_on_record(cli, ["notice_ignored"])
    _ignored_then_restarted(preemption, preempted_at)
    log = _log(state_dir)
    assert "training, attempt 1 of 4 processes" in log and "done after 0 steps" in log
    assert admin.status()["nodes"] == []
