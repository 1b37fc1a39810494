"""The supervisor's pieces without slices or JAX: confirming a lost slice over polls (a failed poll is
no evidence), the step accounting (recomputed steps, productive time), the lease."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import Node
from tpuctl.errors import NotFoundError, TransientError
from tpuctl.services.run.accounting import PreemptionRecord, Progress, recovery_summary
from tpuctl.services.run.lease import LOCK_FILE, Lease, lease_holder
from tpuctl.services.run.model import RecoveryPolicy
from tpuctl.services.run.signals import SliceWatch as _SliceWatch
from tpuctl.services.run.sliceset import SliceSet
from tpuctl.store.records import PreemptionKind

NODE = Node(name="p", zone="us-central1-a", accelerator_type="v5litepod-8", state="READY",
            capacity=CapacityType.SPOT)  # fmt: skip


@dataclass
class ScriptedCloud:
    """get_node answers from a script: a state, or an exception to raise."""

    answers: list[Any]
    calls: int = 0
    qr_states: list[str] = field(default_factory=list)

    def get_node(self, zone: str, name: str) -> Node:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, BaseException):
            raise answer
        qr = "qr-1" if self.qr_states else None
        return Node(name=name, zone=zone, accelerator_type="v5litepod-8", state=answer,
                    capacity=CapacityType.SPOT, queued_resource=qr)  # fmt: skip

    def get_queued_resource(self, zone: str, qr_id: str) -> Any:
        state = self.qr_states.pop(0) if self.qr_states else "ACTIVE"
        return type("QR", (), {"state": state})()


def watch(cloud: ScriptedCloud, confirm: int = 2) -> _SliceWatch:
    return _SliceWatch(cloud, SliceSet.single(NODE), poll_s=0.001, confirm=confirm)


def test_a_lost_slice_is_confirmed_only_after_consecutive_polls_and_errors_are_no_evidence() -> None:
    err = TransientError("503 from the API")
    cloud = ScriptedCloud(["READY", "PREEMPTED", err, "READY", "PREEMPTED", err, err, "PREEMPTED", "READY"])
    w = watch(cloud)
    results = [w.poll_once() for _ in range(8)]
    # READY; PREEMPTED (1); error (no evidence); READY (reset); PREEMPTED (1); 2 errors; PREEMPTED (2).
    assert results == [False] * 7 + [True]
    assert w.confirmed_state == "PREEMPTED" and w.errors == 3 and w.polls == 8


def test_twenty_percent_errors_never_confirm_a_healthy_slice() -> None:
    import random

    rng = random.Random(7)
    answers = [TransientError("x") if rng.random() < 0.2 else "READY" for _ in range(500)]
    w = watch(ScriptedCloud(answers))
    assert not any(w.poll_once() for _ in range(500))
    assert w.errors > 50 and not w.confirmed.is_set()


def test_gone_terminated_and_suspended_queued_resources_count_as_lost() -> None:
    assert watch(ScriptedCloud([NotFoundError("gone")]), confirm=1).poll_once()
    assert watch(ScriptedCloud(["TERMINATED"]), confirm=1).confirmed_state is None
    w = watch(ScriptedCloud(["TERMINATED"]), confirm=1)
    assert w.poll_once() and w.confirmed_state == "TERMINATED"
    qr = ScriptedCloud(["READY"], qr_states=["SUSPENDING"])
    w = watch(qr, confirm=1)
    assert w.poll_once() and w.confirmed_state == "QR_SUSPENDING"
    assert not watch(ScriptedCloud(["READY", "CREATING"]), confirm=1).poll_once()


def test_confirm_now_waits_for_the_api_to_catch_up_and_gives_up_at_the_timeout() -> None:
    w = watch(ScriptedCloud(["READY", "READY", "PREEMPTED", "PREEMPTED"]))
    assert w.confirm_now(5.0) == "PREEMPTED"
    assert watch(ScriptedCloud(["READY"])).confirm_now(0.05) is None


def test_progress_counts_recomputed_steps_and_productive_time_once_per_final_step() -> None:
    p = Progress()
    p.new_attempt()
    p.on_event({"event": "start", "step": 0, "restored": None, "skipped": []}, 0.0)
    for s in range(1, 11):
        p.on_event({"event": "step", "step": s, "dt": 1.0}, float(s))
    assert p.attempt_steps == 10 and p.attempt_recomputed == 0
    # A hard kill after step 10; the newest checkpoint is step 8: steps 9 and 10 are done again.
    p.new_attempt()
    skipped = [{"step": 8, "reason": "truncated"}]
    p.on_event({"event": "start", "step": 8, "restored": 8, "skipped": skipped}, 20.0)
    for s in range(9, 13):
        p.on_event({"event": "step", "step": s, "dt": 2.0}, 20.0 + s)
    assert p.attempt_recomputed == 2 and p.recomputed == 2 and p.attempt_steps == 4
    assert p.first_step_at == 29.0
    # Productive: steps 1-8 at 1 s, 9-12 at 2 s (the last computation of each); computed: all 14.
    assert p.productive_s(12) == pytest.approx(16.0)
    assert p.computed_s == pytest.approx(18.0)
    assert p.fallbacks == [{"at": 20.0, "restored": 8, "skipped": skipped, "attempt_start": 8}]
    summary = recovery_summary(p, [], 0, final_step=12, end=40.0, wall_start=0.0)
    assert summary["goodput"] == pytest.approx(16.0 / 40.0)
    assert summary["steps_recomputed"] == 2 and summary["steps_completed"] == 12


def test_a_preemption_record_says_its_latency_recovery_and_overhead() -> None:
    r = PreemptionRecord(number=1, kind=PreemptionKind.NOTICE, source="runtime-notice", pod="p", zone="z",
                         capacity="spot", occurred_at=100.0, detected_at=100.4, provisioning_s=2.0,
                         hosts_started_at=103.0, resumed_at=110.4)  # fmt: skip
    d = r.to_dict()
    assert d["detection_latency_s"] == 0.4 and d["recovery_s"] == 10.0 and d["startup_s"] == 7.4
    assert d["recovery_overhead_s"] == pytest.approx(0.6)
    assert PreemptionRecord.from_dict(d) == r
    # The new hosts' setup (fresh VMs install the runtime) is its own part, not tpuctl's overhead.
    with_setup = PreemptionRecord.from_dict({**d, "setup_s": 0.5}).to_dict()
    assert with_setup["setup_s"] == 0.5 and with_setup["recovery_overhead_s"] == pytest.approx(0.1)


def test_policy_validation_and_backend_defaults() -> None:
    with pytest.raises(ValueError, match="max_restarts"):
        RecoveryPolicy(max_restarts=-1)
    with pytest.raises(ValueError, match="confirm_polls"):
        RecoveryPolicy(confirm_polls=0)
    from tpuctl.backends.gcp import GCP_TUNING
    from tpuctl.backends.sim import SIM_TUNING

    sim, gcp = RecoveryPolicy().resolved(SIM_TUNING.recovery), RecoveryPolicy().resolved(GCP_TUNING.recovery)
    assert sim.poll_s == 0.25 and gcp.poll_s == 10.0
    assert gcp.confirm_timeout_s == 120.0 and gcp.budget_margin_s == 120.0
    assert RecoveryPolicy(poll_s=3.0).resolved(SIM_TUNING.recovery).poll_s == 3.0


def test_the_lease_is_exclusive_and_dies_with_its_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert lease_holder(run_dir) is None
    held = Lease.acquire(run_dir / LOCK_FILE)
    assert held is not None
    try:
        assert Lease.acquire(run_dir / LOCK_FILE) is None
        holder = lease_holder(run_dir)
        assert holder is not None and holder["pid"] == os.getpid()
    finally:
        held.release()
    assert lease_holder(run_dir) is None
    # A holder killed with SIGKILL leaves the lock free (the kernel drops it with the process).
    code = (
        "import sys, time\nsys.path.insert(0, sys.argv[2])\nfrom pathlib import Path\n"
        "from tpuctl.services.run.lease import Lease\n"
        "lease = Lease.acquire(Path(sys.argv[1]))\nassert lease\n"
        "print('held', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir / LOCK_FILE), str(Path.cwd())],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        holder = lease_holder(run_dir)
        assert holder is not None and holder["pid"] == proc.pid
        proc.kill()
        proc.wait(timeout=10)
        assert lease_holder(run_dir) is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_preemption_note_promises_only_a_checkpoint_that_exists() -> None:
    from tpuctl.services.run.accounting import Progress

    silent = Progress()  # a program with no step events
    assert (
        silent.checkpoint_note(None, None)
        == "no checkpoint on the way out, and none known: the program starts over"
    )
    assert silent.checkpoint_note(None, 10) == silent.checkpoint_note(None, None)  # no step ever reached 10
    assert not silent.reports_steps and silent.attempt_recomputed_known is None
    assert silent.checkpoint_note(40, None) == "checkpoint at step 40"
    stepping = Progress()
    for step in range(1, 13):
        stepping.on_event({"event": "step", "step": step, "dt": 0.1}, at=float(step))
    assert stepping.checkpoint_note(None, 5) == (
        "no checkpoint on the way out; the newest periodic one (every 5 steps) will do"
    )
    assert stepping.checkpoint_note(None, 20).endswith("none known: the program starts over")
    assert stepping.attempt_recomputed_known == 0
    restored = Progress()
    restored.on_event({"event": "start", "step": 8, "restored": 8}, at=0.0)
    assert "step 8 or later" in restored.checkpoint_note(None, None)


def test_a_restart_past_every_step_seen_counts_the_steps_it_restored() -> None:
    """A supervisor killed after step 8 never heard of steps 9-12; the takeover's program restores step 12
    and is done: the run did 12 steps, none of them twice."""
    p = Progress()
    p.on_event({"event": "start", "step": 0, "restored": None}, 0.0)
    for s in range(1, 9):
        p.on_event({"event": "step", "step": s, "dt": 1.0}, float(s))
    p.new_attempt()
    p.on_event({"event": "start", "step": 12, "restored": 12}, 30.0)
    assert p.last_step == 12 and p.recomputed == 0 and p.attempt_recomputed == 0
