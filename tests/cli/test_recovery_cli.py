"""Preemption recovery end to end on the simulator: `tpuctl run` survives preemptions with and without
notice, comes back bit for bit, frees every slice, and accounts for each segment; limits, stockouts,
transient API errors, checkpoint fallbacks, budgets and detached supervisors. JAX runs are few and tiny:
the machine has 2 cores."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from recovery_helpers import (
    HOST_XLA_ENV,
    LM_ARGS,
    LM_STEPS,
    REPO,
    WORLD,
    ZONE,
    Chaos,
    Preempt,
    events_of,
    fast_jax_env,
    final_hash,
    run_reference,
    serve_for_jax_runs,
)

from tpuctl.sim import SimAdminClient
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import RunStatus
from tpuctl.testing.cli import Cli
from tpuctl.testing.clock import wait_for

if TYPE_CHECKING:
    from tpuctl.services.budget import BudgetGuard


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jax-cache")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, jax_cache: Path) -> str:
    """The uninterrupted run's final hash (1 host x 4 chips, as a v4-8 slice)."""
    return run_reference(
        tmp_path_factory.mktemp("reference"),
        LM_ARGS,
        hosts=1,
        accelerator_type=LM_TYPE,
        topology="2x2x1",
        extra_env=fast_jax_env(jax_cache),
    )


@pytest.fixture
def world_file(tmp_path: Path) -> Path:
    path = tmp_path / "world.yaml"
    path.write_text(yaml.safe_dump(WORLD))
    return path


@pytest.fixture
def admin(
    serve_sim: Callable[..., SimAdminClient],
    state_dir: Path,
    world_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    jax_cache: Path,
) -> SimAdminClient:
    """A simulator serving this test's state dir; CLI commands run in-process against it."""
    return serve_for_jax_runs(
        serve_sim, WORLD, state_dir=state_dir, jax_cache=jax_cache, monkeypatch=monkeypatch
    )


#: The LM's slice: one host keeps these end-to-end recoveries in the default suite affordable; every host
#: of a multi-host slice checkpointing at one step on a notice is tests/runtime/test_preemption.py's, and
#: the multi-host recoveries end to end are tests/cli/test_recovery_acceptance.py's (--slow).
LM_TYPE = "v4-8"


def lm_run(*extra: str) -> list[str]:
    return ["run", "--example", "lm", "--type", LM_TYPE, "--spot", "--zone", ZONE, "--checkpoint-every", "4",
            *HOST_XLA_ENV, *extra, "--", *LM_ARGS]  # fmt: skip


# --- three preemptions, bit for bit -------------------------------------------------------------------


def test_three_preemptions_two_with_notice_end_bit_identical_and_every_segment_is_recorded(
    admin: SimAdminClient, cli: Cli, state_dir: Path, reference: str
) -> None:
    plan = [Preempt(1, 3, notice=True), Preempt(2, 3, notice=False), Preempt(3, 3, notice=True)]
    chaos = Chaos(admin, state_dir, plan).start()
    try:
        result = cli(*lm_run("-o", "json"))
    finally:
        chaos.join(check=False)
    assert result.code == 0, result.stderr[-4000:]
    chaos.check()
    run = result.json["run"]
    run_id = run["run_id"]
    log = state_dir / "runs" / run_id / "worker-0.log"
    assert final_hash(log) == reference
    assert all(p.done_at is not None for p in plan)

    # Nothing is left in the simulator: no preempted slice, no extra one.
    assert admin.status()["nodes"] == []

    described = cli("runs", "describe", run_id, "-o", "json").json["run"]
    assert described["status"] == "succeeded" and described["preemptions"] == 3
    recovery = described["recovery"]
    kinds = [p["kind"] for p in recovery["preemptions"]]
    assert kinds == ["notice", "hard", "notice"], recovery["preemptions"]
    first, hard, third = recovery["preemptions"]
    # Noticed: checkpoint at the step every host stopped at, nothing done twice.
    for noticed in (first, third):
        assert noticed["checkpoint_step"] == noticed["last_step"] == noticed["restored_step"]
        assert noticed["steps_recomputed"] == 0
    # The hard kill: back to the last periodic checkpoint, at most one interval (4 steps) lost.
    assert hard["checkpoint_step"] is None
    # (The newest checkpoint is a periodic one, or the first notice's if no multiple of 4 came since.)
    assert hard["restored_step"] in (first["checkpoint_step"], hard["last_step"] // 4 * 4)
    assert 0 <= hard["steps_recomputed"] <= 4
    assert hard["steps_recomputed"] == hard["last_step"] - hard["restored_step"]
    assert recovery["steps_recomputed"] == hard["steps_recomputed"]
    assert recovery["steps_completed"] == LM_STEPS
    for p in recovery["preemptions"]:
        assert p["detection_latency_s"] is not None and p["detection_latency_s"] <= 2.0, p
        assert p["recovery_s"] is not None and p["recovery_s"] > 0, p
        assert p["setup_s"] is not None and 0 < p["setup_s"] < p["recovery_s"], p
        assert p["new_pod"] and p["new_pod"] != p["pod"] and p["new_zone"] == ZONE
    assert 0 < recovery["goodput"] < 1

    # Every segment, closed, in order; the running ones carry their slice and step counts.
    segs = described["segments"]
    assert all(not s["open"] and s["end"] >= s["start"] for s in segs)
    kinds_seen = [s["kind"] for s in segs]
    assert kinds_seen[0] == "provisioning" and kinds_seen[-1] == "running"
    assert {"provisioning", "running", "checkpointing", "preempted", "recovering"} <= set(kinds_seen)
    assert kinds_seen.count("running") == 4 and kinds_seen.count("preempted") == 3
    assert kinds_seen.count("checkpointing") == 2
    running = [s for s in segs if s["kind"] == "running"]
    assert sum(s["steps_completed"] for s in running) == LM_STEPS + recovery["steps_recomputed"]
    assert [s["steps_recomputed"] for s in running] == [0, 0, hard["steps_recomputed"], 0]
    assert all(s["pod"] and s["zone"] == ZONE and s["capacity"] == "spot" for s in running)
    for a, b in itertools.pairwise(segs):
        assert b["start"] >= a["start"]

    # The table form shows the same, with a timeline.
    table = cli("runs", "describe", run_id)
    assert table.code == 0 and "timeline" in table.stdout and "checkpointing" in table.stdout
    with Ledger(state_dir) as ledger:
        record = ledger.get_run(run_id)
    assert record is not None and record.status is RunStatus.SUCCEEDED
    assert record.preemptions == 3 and record.restarts == 0 and record.steps == LM_STEPS
    # Each start saw its restart count.
    starts = [e for e in events_of(log) if e["event"] == "start"]
    assert [e["restart_count"] for e in starts] == [0, 1, 2, 3]
    done_at = plan[-1].done_at
    assert done_at is not None and time.time() - done_at < 120


# --- limits, stockouts, transient errors ---------------------------------------------------------------

CRASHER = "import sys\nprint('starting, then crashing', flush=True)\nsys.exit(3)\n"

SLEEPER = """\
import os, sys, time
restart = int(os.environ["TPUCTL_RESTART_COUNT"])
print("attempt", restart, "on", os.environ["TPUCTL_ACCELERATOR_TYPE"], flush=True)
time.sleep(float(os.environ.get("SLEEP_S", "3")) if restart == 0 else 0.2)
print("done", flush=True)
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_program_that_crashes_on_every_start_stops_after_max_restarts_with_its_error(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    script = write(tmp_path / "proj" / "crash.py", CRASHER)
    result = cli(
        "run",
        str(script),
        "--no-runtime-deps",
        "--type",
        "v5e-8",
        "--spot",
        "--max-restarts",
        "2",
        "-o",
        "json",
    )
    assert result.code == 8, result.stderr[-3000:]
    error = result.json
    assert error["error"] == "run_failed" and error["returncode"] == 3 and error["worker"] == 0
    assert "host 0 exited with status 3" in error["message"]
    assert "after 2 restarts, --max-restarts 2" in error["message"]
    assert result.stderr.count("starting, then crashing") == 3  # the first start and two restarts
    runs = cli("runs", "list", "-o", "json").json["runs"]
    assert len(runs) == 1
    run = cli("runs", "describe", runs[0]["run_id"], "-o", "json").json["run"]
    assert run["status"] == "failed" and run["exit_code"] == 3
    assert run["restarts"] == 2 and run["preemptions"] == 0
    assert run["recovery"]["preemptions"] == []
    kinds = [s["kind"] for s in run["segments"]]
    assert kinds == ["provisioning", "running", "running", "running"]
    assert admin.status()["nodes"] == []  # the run's slice is deleted at the end


def test_a_preemption_while_the_zone_is_stocked_out_recovers_in_another_zone(
    admin: SimAdminClient, cli: Cli, tmp_path: Path, state_dir: Path
) -> None:
    from recovery_helpers import V5E_OTHER, V5E_ZONE

    script = write(tmp_path / "proj" / "sleeper.py", SLEEPER)
    # The stockout comes with the preemption: the same zone is tried first and is full.
    chaos = _Seen(admin, state_dir, stockout=V5E_ZONE).start()
    try:
        result = cli(
            "run",
            str(script),
            "--no-runtime-deps",
            "--type",
            "v5e-8",
            "--spot",
            "--env",
            "SLEEP_S=30",
            "-o",
            "json",
        )
    finally:
        chaos.join(check=False)
    assert result.code == 0, result.stderr[-3000:]
    chaos.check()
    run = cli("runs", "describe", result.json["run"]["run_id"], "-o", "json").json["run"]
    (preemption,) = run["recovery"]["preemptions"]
    assert preemption["zone"] == V5E_ZONE and preemption["new_zone"] == V5E_OTHER
    assert preemption["kind"] == "hard" and run["zone"] == V5E_OTHER
    assert admin.status()["nodes"] == []
    # The sleeper reports no steps: what it recomputed is unknown (null), not 0, and no checkpoint is
    # promised that does not exist.
    recovery = run["recovery"]
    assert recovery["steps_reported"] is False
    assert recovery["steps_recomputed"] is None and recovery["goodput"] is None
    assert recovery["productive_step_s"] is None and preemption["steps_recomputed"] is None
    assert [s["steps_recomputed"] for s in run["segments"] if s["kind"] == "running"] == [None, None]
    table = cli("runs", "describe", result.json["run"]["run_id"])
    assert table.stdout.count("unknown (the program reports no steps)") >= 3


@dataclass
class _Seen:
    """Preempts (without notice) the run's slice once its program has said "attempt 0"."""

    admin: SimAdminClient
    state_dir: Path
    stockout: str | None = None
    notice: bool = False

    def start(self) -> Chaos:
        plan = [Preempt(1, 0, notice=self.notice, stockout=self.stockout)]
        return _LineChaos(self.admin, self.state_dir, plan).start()


class _LineChaos(Chaos):
    """Chaos for programs without runtime events: the first start is the first "attempt 0" line."""

    def _run(self) -> None:
        from recovery_helpers import run_dir

        try:
            deadline = time.monotonic() + self.timeout
            log = run_dir(self.state_dir) / "worker-0.log"
            step = self.plan[0]
            while not self._halt.is_set() and time.monotonic() < deadline:
                node = self._live_node()
                if log.exists() and "attempt 0" in log.read_text() and node is not None:
                    if step.stockout:
                        self.admin.stockout(step.stockout)
                    step.node, step.zone, step.done_at = node["name"], node["zone"], time.time()
                    self.admin.preempt(node["zone"], node["name"], notice=step.notice)
                    return
                time.sleep(0.02)
        except BaseException as exc:
            self.error = exc


def test_transient_api_errors_during_a_run_cause_no_recovery(
    admin: SimAdminClient, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuctl.sim import server as sim_server

    injected: list[str] = []
    inject = sim_server._Handler._inject_transient

    def counting(self: Any, engine: Any, method: str, path: str) -> None:
        try:
            inject(self, engine, method, path)
        except Exception:
            injected.append(f"{method} {path}")
            raise

    monkeypatch.setattr(sim_server._Handler, "_inject_transient", counting)
    script = write(tmp_path / "proj" / "sleeper.py", SLEEPER)
    admin.set_faults(transient_error_rate=0.2)
    result = cli(
        "run",
        str(script),
        "--no-runtime-deps",
        "--type",
        "v5e-8",
        "--spot",
        "--env",
        "SLEEP_S=4",
        "-o",
        "json",
    )
    admin.set_faults(transient_error_rate=0.0)
    assert result.code == 0, result.stderr[-3000:]
    run = cli("runs", "describe", result.json["run"]["run_id"], "-o", "json").json["run"]
    assert run["preemptions"] == 0 and run["restarts"] == 0
    assert run["recovery"]["preemptions"] == []
    assert [s["kind"] for s in run["segments"]] == ["provisioning", "running"]
    # The slice was polled all along (4 s at 0.25 s) and about a fifth of the requests failed (the
    # cloud layer retries them; a poll that still fails is no evidence either).
    running = run["segments"][1]["detail"]
    assert running["api_polls"] >= 8, running
    # The stdlib sleeper installs nothing (--no-runtime-deps): no setup ran, and none was timed.
    assert running["setup_s"] == 0.0, running
    node_gets = [r for r in injected if r.startswith("GET ") and "/nodes/" in r]
    assert len(node_gets) >= 2, injected
    assert result.stderr.count("attempt 0") == 1 and "attempt 1" not in result.stderr
    assert admin.status()["nodes"] == []


# --- detached supervisors: another process preempts, kill -9, resume, cancel -----------------------------


@pytest.fixture
def own_sim(
    state_dir: Path, world_file: Path, monkeypatch: pytest.MonkeyPatch, jax_cache: Path
) -> Iterator[Path]:
    """No shared simulator: every tpuctl process (this test's CLI calls, the detached supervisor) starts
    its own in-process one over the state dir's sim.db, as on a user's machine."""
    monkeypatch.delenv("TPUCTL_SIM_URL", raising=False)
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(state_dir))
    monkeypatch.setenv("TPUCTL_SIM_WORLD", str(world_file))
    # A killed supervisor's run is taken over only once its lease expires: short leases, so tests wait
    # seconds for it, not the default minute.
    monkeypatch.setenv("TPUCTL_LEASE_DURATION", "6")
    monkeypatch.setenv("TPUCTL_LEASE_RENEW_EVERY", "1.5")
    for key, value in fast_jax_env(jax_cache).items():
        monkeypatch.setenv(key, value)
    yield state_dir
    _kill_leftovers(state_dir)


def _kill_leftovers(state_dir: Path) -> None:
    """What a failed test left running: the detached supervisor (its hosts are VMs, discarded with the
    test's state by the root conftest)."""
    import os
    import signal

    if not (state_dir / "ledger.db").exists():
        return
    with Ledger(state_dir) as ledger:
        for run in ledger.list_runs():
            detail = run.detail or {}
            holder = (detail.get("supervisor") or {}).get("pid")
            if isinstance(holder, int) and holder != os.getpid():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(holder, signal.SIGKILL)


def _steps(log: Path) -> list[int]:
    return [e["step"] for e in events_of(log) if e["event"] == "step"]


# ~40 s on 2 cores (three starts of the LM and a lease's expiry). Each of its parts is in the default suite:
# a run preempted by `sim preempt` from another process, its supervisor killed -9 and `runs resume`d bit
# for bit with nothing left running (tests/hardening/test_crash.py's run loop), a takeover once the dead
# owner's lease expired (tests/cli/test_runs_lease.py), orphaned programs stopped before the restart
# (test_programs_started_before_the_supervisor_recorded_them_are_stopped_too, below), a detached
# supervisor (test_runs_cancel_stops_a_detached_run_and_deletes_its_slice, below), a notice's checkpoint
# restored at its step (the three-preemption case above), the supervisor's state as `runs describe` says it
# (tests/services/run/test_service.py).
@pytest.mark.slow
def test_detached_run_is_preempted_by_another_process_survives_kill_9_and_resumes_bit_identical(
    own_sim: Path, cli: Cli, reference: str
) -> None:
    import os
    import signal

    from tpuctl.processes import is_same_process, is_zombie

    state_dir = own_sim
    started = cli(*lm_run("--detach", "-o", "json"))
    assert started.code == 0, started.stderr[-3000:]
    run_id = started.json["run"]["run_id"]
    supervisor_pid = started.json["run"]["supervisor"]["pid"]
    log = state_dir / "runs" / run_id / "worker-0.log"
    wait_for(lambda: len(_steps(log)) >= 3, 120, 0.1, what="the first steps")

    # While it runs, every `runs` command sees it, and it is supervised by the background process.
    listed = cli("runs", "list", "-o", "json").json["runs"]
    assert [r["run_id"] for r in listed] == [run_id] and listed[0]["status"] == "running"
    live = cli("runs", "describe", run_id, "-o", "json").json["run"]
    assert live["supervisor"]["pid"] == supervisor_pid and live["supervisor_state"].startswith("alive")

    # 6. `tpuctl sim preempt` from this process: its own simulator engine signals the pids the
    # supervisor's process registered (same machine, shared sim.db).
    pod = live["pod"]
    preempted = cli("sim", "preempt", pod)
    assert preempted.code == 0, preempted.stderr
    wait_for(
        lambda: len([e for e in events_of(log) if e["event"] == "start"]) >= 2, 120, 0.1, what="the recovery"
    )
    first_stop = next(e for e in events_of(log) if e["event"] == "preempted")
    assert first_stop["checkpoint"] == "saved"

    # kill -9 of the supervisor mid-run (its hosts are left running, orphaned).
    wait_for(lambda: _steps(log)[-1] >= first_stop["step"] + 2, 120, 0.1, what="steps after the recovery")
    os.kill(supervisor_pid, signal.SIGKILL)
    from recovery_helpers import program_pids

    # Seen at once: the lease's expiry below takes long enough that the program may finish meanwhile.
    orphans = program_pids(run_id)
    assert orphans  # the hosts' programs outlive their supervisor: they run detached from SSH
    # (It is this process's child, so it stays a zombie until reaped: dead all the same.)
    wait_for(
        lambda: not is_same_process(supervisor_pid, None) or is_zombie(supervisor_pid),
        10,
        0.1,
        what="its death",
    )
    # Its lease outlives it until it expires (by the ledger's clock): only then is it gone.
    orphaned = wait_for(
        lambda: (
            (r := cli("runs", "describe", run_id, "-o", "json").json["run"])["supervisor_state"].startswith(
                "gone"
            )
            and r
        ),
        30,
        0.2,
        what="its lease to expire",
    )
    assert orphaned["status"] == "running"

    resumed = cli("runs", "resume", run_id, "-o", "json")
    assert resumed.code == 0, resumed.stderr[-4000:]
    assert final_hash(log) == reference
    for pid, ticks in orphans.items():
        assert not is_same_process(pid, ticks)  # the orphans were stopped before the restart
    done = cli("runs", "describe", run_id, "-o", "json").json["run"]
    assert done["status"] == "succeeded" and done["preemptions"] == 1
    assert done["supervisor_state"].startswith("none")
    assert done["recovery"]["steps_completed"] == LM_STEPS
    starts = [e for e in events_of(log) if e["event"] == "start"]
    assert [e["restart_count"] for e in starts] == [0, 1, 2]
    assert starts[1]["restored"] == first_stop["step"]
    assert all(not s["open"] for s in done["segments"])
    assert cli("sim", "status", "-o", "json").json["nodes"] == []
    logs = cli("runs", "logs", run_id, "--worker", "0")
    assert logs.code == 0 and "final_params_sha256" in logs.stdout


@pytest.mark.parametrize("died", ["placing", "deleting", "preempted"])
def test_resume_takes_over_every_slice_the_ledger_has_for_the_run(
    own_sim: Path, cli: Cli, tmp_path: Path, died: str
) -> None:
    """A supervisor killed while the allocator placed its slice (any zone: the run record names no zone
    yet), right after its delete of the slice landed (the ledger never heard), or after it recorded a
    preemption but before it deleted the preempted slice (which holds quota): `runs resume` finds the slice
    through the ledger's entries for the run, records it gone or deletes it, and the run ends on a fresh
    slice with no slice left and no ledger entry alive."""
    from recovery_helpers import V5E_OTHER, V5E_ZONE

    from tpuctl.services.run.launcher import Launcher
    from tpuctl.services.run.model import RunRequest
    from tpuctl.services.run.supervisor import Supervisor
    from tpuctl.services.session import open_session
    from tpuctl.settings import load_settings
    from tpuctl.store.records import EventKind, PodState

    script = write(tmp_path / "proj" / "sleeper.py", SLEEPER)
    with open_session(load_settings()) as sess:
        launcher = Launcher(sess)
        prepared = launcher.prepare(
            # A stdlib program: nothing for the new slice's hosts to install.
            RunRequest(script=str(script), accelerator_type="v5e-8", env=("SLEEP_S=0",), runtime_deps=False)
        )
        Supervisor(sess).create_record(prepared)
        placed = launcher.provision(prepared)  # what the killed supervisor's allocator made
        run_id = prepared.run_id
        record = sess.ledger.get_run(run_id)
        assert record is not None and record.zone is None and placed.zone in (V5E_ZONE, V5E_OTHER)
        if died != "placing":
            sess.ledger.update_run(run_id, pod=placed.name, zone=placed.zone)
        if died == "deleting":
            sess.cloud.delete_node(placed.zone, placed.name, wait=True)
        if died == "preempted":
            assert cli("sim", "preempt", placed.name, "--no-notice").code == 0
            assert sess.cloud.get_node(placed.zone, placed.name).state == "PREEMPTED"
            sess.ledger.record_event(EventKind.PREEMPTED, pod=placed.name, zone=placed.zone, run_id=run_id)

    resumed = cli("runs", "resume", run_id, "-o", "json")
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert cli("sim", "status", "-o", "json").json["nodes"] == []
    with Ledger(own_sim) as ledger:
        assert ledger.list_pods(alive=True) == []
        pods = {p.name: p for p in ledger.list_pods(run_id=run_id)}
        first = pods[placed.name]
        assert first.state is PodState.DELETED
        assert ledger.check_view() == []
    # The dead supervisor's slice is never used again (what ran on its hosts is in an unknown state):
    # the run restarts from its bucket on a fresh slice.
    assert first.end_reason == {"placing": "deleted", "deleting": "gone", "preempted": "preempted"}[died]
    assert first.deleted_at is not None and len(pods) == 2
    # Both named after the run: the resumed one with its restart number (the old one may be deleting).
    assert placed.name == run_id and resumed.json["run"]["pod"].startswith(f"{run_id}-r")


@pytest.mark.parametrize("command", ["resume", "cancel"])
def test_programs_started_before_the_supervisor_recorded_them_are_stopped_too(
    own_sim: Path, cli: Cli, tmp_path: Path, command: str
) -> None:
    """A supervisor killed right after it started the hosts' programs (which run detached from SSH and
    outlive it) and before it recorded anything: `runs resume` and `runs cancel` stop them all the same,
    found over SSH by the run id."""
    from recovery_helpers import program_pids

    from tpuctl.processes import is_same_process
    from tpuctl.services.run.hosts import build_executor
    from tpuctl.services.run.launcher import Launcher
    from tpuctl.services.run.model import RunRequest
    from tpuctl.services.run.supervisor import Supervisor
    from tpuctl.services.session import open_session
    from tpuctl.settings import load_settings

    script = write(tmp_path / "proj" / "sleeper.py", SLEEPER)
    with open_session(load_settings()) as sess:
        launcher = Launcher(sess)
        prepared = launcher.prepare(
            RunRequest(script=str(script), accelerator_type="v5e-8", env=("SLEEP_S=300",), runtime_deps=False)
        )
        Supervisor(sess).create_record(prepared)
        node = launcher.provision(prepared)
        sess.ledger.update_run(prepared.run_id, pod=node.name, zone=node.zone)
        # The dead supervisor's program: started on the run's slice, never recorded in the run.
        orphan = build_executor(sess, prepared, node, for_plan=False)
        try:
            orphan.ship(prepared.bundle)
            orphan.start(prepared.spec(0))
            wait_for(lambda: program_pids(prepared.run_id), 30, 0.1, what="the orphan program")
        finally:
            orphan.close()
    pids = program_pids(prepared.run_id)
    result = cli("runs", command, prepared.run_id, "-o", "json")
    assert result.code == 0, result.stderr[-3000:]
    assert not [pid for pid, ticks in pids.items() if is_same_process(pid, ticks)]
    assert cli("sim", "status", "-o", "json").json["nodes"] == []


def test_runs_cancel_stops_a_detached_run_and_deletes_its_slice(
    own_sim: Path, cli: Cli, tmp_path: Path
) -> None:
    script = write(tmp_path / "proj" / "sleeper.py", SLEEPER)
    started = cli(
        "run",
        str(script),
        "--no-runtime-deps",
        "--type",
        "v5e-8",
        "--env",
        "SLEEP_S=120",
        "--detach",
        "-o",
        "json",
    )
    assert started.code == 0, started.stderr
    run_id = started.json["run"]["run_id"]
    log = own_sim / "runs" / run_id / "worker-0.log"
    wait_for(lambda: log.exists() and "attempt 0" in log.read_text(), 60, 0.1, what="the program to start")
    cancelled = cli("runs", "cancel", run_id, "-o", "json")
    assert cancelled.code == 0, cancelled.stderr
    assert cancelled.json["cancel"]["cancelled"] is True and cancelled.json["cancel"]["status"] == "cancelled"
    run = cli("runs", "describe", run_id, "-o", "json").json["run"]
    assert run["status"] == "cancelled" and run["exit_code"] == 130 and run["preemptions"] == 0
    assert cli("sim", "status", "-o", "json").json["nodes"] == []
    again = cli("runs", "cancel", run_id, "-o", "json")
    assert again.code == 0 and again.json["cancel"]["cancelled"] is False


def test_a_slice_in_use_is_protected_and_its_forced_deletion_is_not_a_preemption(
    own_sim: Path, cli: Cli, tmp_path: Path
) -> None:
    script = write(tmp_path / "proj" / "sleeper.py", SLEEPER)
    assert cli("pod", "create", "v5e-8", "--zone", "us-central1-a", "--name", "shared").code == 0
    started = cli(
        "run",
        str(script),
        "--no-runtime-deps",
        "--pod",
        "shared",
        "--env",
        "SLEEP_S=120",
        "--detach",
        "-o",
        "json",
    )
    assert started.code == 0, started.stderr
    run_id = started.json["run"]["run_id"]
    log = own_sim / "runs" / run_id / "worker-0.log"
    wait_for(lambda: log.exists() and "attempt 0" in log.read_text(), 60, 0.1, what="the program to start")

    second = cli("run", str(script), "--no-runtime-deps", "--pod", "shared", "-o", "json")
    assert second.code == 2, second.stderr
    assert second.json["field"] == "--pod" and f"in use by run {run_id}" in second.json["message"]
    assert f"tpuctl runs cancel {run_id}" in second.json["fix"]
    plain = cli("pod", "delete", "shared", "-y", "-o", "json")
    assert plain.code == 2, plain.stderr
    assert plain.json["field"] == "--force" and run_id in plain.json["message"]
    assert [n["name"] for n in cli("sim", "status", "-o", "json").json["nodes"]] == ["shared"]
    dry = cli("pod", "delete", "shared", "--dry-run", "-o", "json")
    assert dry.json["plan"][0]["in_use_by"] == [run_id]

    forced = cli("pod", "delete", "shared", "-y", "--force", "-o", "json")
    assert forced.code == 0, forced.stderr

    def ended() -> bool:
        return cli("runs", "describe", run_id, "-o", "json").json["run"]["status"] not in (
            "pending", "provisioning", "running", "recovering")  # fmt: skip

    wait_for(ended, 60, 0.2, what="the run to end")
    run = cli("runs", "describe", run_id, "-o", "json").json["run"]
    assert run["status"] == "cancelled" and run["exit_code"] == 1, run
    assert run["preemptions"] == 0 and run["recovery"]["preemptions"] == []
    assert "was deleted (pod delete --force)" in run["detail"]["error"]


def test_a_detached_run_takes_relative_paths_where_the_user_typed_them(
    own_sim: Path, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background supervisor starts in the run's log directory: `train.py` and `--workdir .` are the
    user's directory's, not that one's. (A relative `--checkpoint-dir` is refused before anything: no host
    could reach it.)"""
    work = tmp_path / "proj"
    write(work / "train.py", "print('data', open('data.txt').read(), flush=True)\n")
    write(work / "data.txt", "from-the-workdir")
    monkeypatch.chdir(work)
    refused = cli("run", "train.py", "--type", "v5e-8", "--checkpoint-dir", "ck", "--detach", "-o", "json")
    assert refused.code == 2 and "relative path" in refused.json["message"]
    assert cli("runs", "list", "-o", "json").json["runs"] == []
    started = cli("run", "train.py", "--type", "v5e-8", "--workdir", ".", "--no-runtime-deps",
                  "--detach", "-o", "json")  # fmt: skip
    assert started.code == 0, started.stderr
    run_id = started.json["run"]["run_id"]

    def finished() -> bool:
        status = cli("runs", "describe", run_id, "-o", "json").json["run"]["status"]
        return status in ("succeeded", "failed")

    wait_for(finished, 120, 0.2, what="the detached run to end")
    run = cli("runs", "describe", run_id, "-o", "json").json["run"]
    assert run["status"] == "succeeded", run
    log = (own_sim / "runs" / run_id / "worker-0.log").read_text()
    assert "data from-the-workdir" in log


def test_a_supervisor_that_cannot_start_leaves_its_run_failed_with_the_reason(
    own_sim: Path, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    script = write(tmp_path / "proj" / "ok.py", "print(1)\n")
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the supervisor's interpreter exits 1 at once
    started = cli("run", str(script), "--no-runtime-deps", "--type", "v5e-8", "--detach", "-o", "json")
    assert started.code != 0
    assert "exited at once (status 1)" in started.json["message"]
    [run] = cli("runs", "list", "-o", "json").json["runs"]
    assert run["status"] == "failed"
    assert "exited at once (status 1)" in run["detail"]["error"]
    assert run["duration_s"] is None  # it never ran


def test_a_cancelled_run_that_never_started_shows_no_duration(own_sim: Path, cli: Cli) -> None:
    with Ledger(own_sim) as ledger:
        ledger.create_run("run-20260101-000000-abcd", script="train.py", ts=time.time() - 575)
    cancelled = cli("runs", "cancel", "run-20260101-000000-abcd", "-o", "json")
    assert cancelled.code == 0, cancelled.stderr
    [run] = cli("runs", "list", "-o", "json").json["runs"]
    assert run["status"] == "cancelled" and run["duration_s"] is None


# --- checkpoint fallback, budget -----------------------------------------------------------------------

SMALL_LM = ["--checkpoint-every", "4", "--log-every", "4", "--batch", "8", "--seed", "2", "--layers", "1",
            "--d-model", "16", "--heads", "2", "--vocab", "32", "--seq-len", "16"]  # fmt: skip


FALLBACK_REPORTER = """\
import json
skipped = [{"step": 8, "reason": "checksum mismatch in 1 array(s), first ['params']"}]
print("TPUCTL_EVENT " + json.dumps({"event": "start", "step": 4, "restored": 4, "skipped": skipped}))
print("TPUCTL_EVENT " + json.dumps({"event": "step", "step": 5, "dt": 0.01}))
"""


def test_the_runtimes_checkpoint_fallback_is_said_and_recorded(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    """The supervisor's side of a fallback (the runtime's is tests/runtime/test_multihost.py's; the
    end-to-end case below is slow)."""
    script = write(tmp_path / "proj" / "reporter.py", FALLBACK_REPORTER)
    result = cli("run", str(script), "--no-runtime-deps", "--type", "v5e-8")
    assert result.code == 0, result.stderr
    assert "checkpoint fallback: step 8 (checksum mismatch in 1 array(s)" in result.stderr
    assert "unreadable; restored step 4" in result.stderr
    assert "TPUCTL_EVENT" not in result.stdout  # events go to the log, not the screen
    run_id = cli("runs", "list", "-o", "json").json["runs"][0]["run_id"]
    run = cli("runs", "describe", run_id, "-o", "json").json["run"]
    (fallback,) = run["recovery"]["checkpoint_fallbacks"]
    assert fallback["restored"] == 4 and fallback["skipped"][0]["step"] == 8


@pytest.mark.slow
def test_a_truncated_latest_checkpoint_falls_back_to_the_previous_one_and_the_run_says_so(
    admin: SimAdminClient, cli: Cli, state_dir: Path
) -> None:
    from gcp_storage_emulator.storage import STORAGE_DIR

    from tpuctl.sim.storage import DEFAULT_BUCKET, storage_dir_for

    # In the simulated bucket (a host's own disk is refused: it dies with a preempted VM), whose emulator
    # keeps each object as a file.
    common = ["run", "--example", "lm", "--type", "v5e-4", "--checkpoint-dir", f"gs://{DEFAULT_BUCKET}/ckpt"]
    first = cli(*common, "--", *SMALL_LM, "--steps", "8")
    assert first.code == 0, first.stderr[-3000:]
    ckpt = storage_dir_for(state_dir) / STORAGE_DIR / DEFAULT_BUCKET / "ckpt"
    assert {p.name for p in ckpt.iterdir() if p.name.isdigit()} == {"4", "8"}
    # Every data file of step 8 cut in half in the bucket (orbax may keep the same bytes under two paths).
    for victim in (p for p in (ckpt / "8").rglob("*") if p.is_file() and p.parent.name == "d"):
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])

    second = cli(*common, "--", *SMALL_LM, "--steps", "12")
    assert second.code == 0, second.stderr[-3000:]
    assert "checkpoint fallback: step 8 (" in second.stderr and "unreadable; restored step 4" in second.stderr
    run_id = cli("runs", "list", "-o", "json").json["runs"][0]["run_id"]
    run = cli("runs", "describe", run_id, "-o", "json").json["run"]
    (fallback,) = run["recovery"]["checkpoint_fallbacks"]
    assert fallback["restored"] == 4 and [s["step"] for s in fallback["skipped"]] == [8]
    assert fallback["skipped"][0]["reason"]
    table = cli("runs", "describe", run_id)
    assert "checkpoint fallback: skipped step 8" in table.stdout and "restored step 4" in table.stdout


SAVER = """\
import json, signal, sys, time

def emit(**event):
    print("TPUCTL_EVENT " + json.dumps(event), flush=True)

stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
emit(event="start", step=0, restored=None, skipped=[], restart_count=0, steps=5000)
for step in range(1, 5001):
    time.sleep(0.05)
    emit(event="step", step=step, dt=0.05)
    if stop:  # checkpoints the step it stopped at (as the runtime does on SIGTERM), then stops
        emit(event="preempted", step=step, checkpoint="saved")
        sys.exit(75)
"""


def test_a_run_with_a_budget_below_its_cost_stops_its_program_checkpointed_and_deletes_its_slice(
    admin: SimAdminClient, cli: Cli, tmp_path: Path, state_dir: Path
) -> None:
    """The default suite's budget stop of a program that checkpoints on SIGTERM: a stdlib one, nothing to
    install, so the stop comes seconds after READY. The bundled runtime's checkpoint in the bucket on such
    a stop is the LM's case below (--slow); its checkpoint on SIGTERM the notice tests' above."""
    # v5e-4 spot: 4 chips x 0.245 = 0.98 USD/h, so about 22 s from READY, the stop decided about 11 s
    # (the margin) before: room for a stdlib program's start on a loaded machine (a stop before the program
    # runs is a hard stop, nothing to checkpoint).
    limit = 0.006
    script = write(tmp_path / "proj" / "saver.py", SAVER)
    result = cli("run", str(script), "--no-runtime-deps", "--type", "v5e-4", "--spot", "--budget", str(limit))
    assert result.code == 7, result.stderr[-3000:]
    assert "stopped at its budget" in result.stderr
    assert admin.status()["nodes"] == []
    run, guard = _stopped_at_budget(state_dir, limit)
    # Checkpointed on the way out, at the step it stopped at.
    log = state_dir / "runs" / run.run_id / "worker-0.log"
    (stop,) = [e for e in events_of(log) if e["event"] == "preempted"]
    assert stop["checkpoint"] == "saved"
    # Within one step's cost of the limit, never over it by more.
    steps = [e["dt"] for e in events_of(log) if e["event"] == "step"]
    step_usd = 0.98 * max(steps) / 3600
    spent = guard.spent()
    assert spent <= limit + step_usd, (spent, limit)
    assert spent >= 0.5 * limit  # it did use its budget


def _stopped_at_budget(state_dir: Path, limit: float) -> tuple[Any, BudgetGuard]:
    """The ledger's record of the one run, stopped at its budget ``limit``: its status, exit code and
    budget, its slice deleted; with the guard that says what it spent."""
    from tpuctl.catalog import Catalog
    from tpuctl.services.budget import BudgetGuard

    with Ledger(state_dir) as ledger:
        (run,) = ledger.list_runs()
        guard = BudgetGuard.for_run(ledger, run.run_id, Catalog.load(), limit_usd=limit)
        pods = ledger.list_pods(run_id=run.run_id)
    assert run.status is RunStatus.BUDGET_EXCEEDED and run.exit_code == 7
    assert run.detail is not None and run.detail["budget"]["limit_usd"] == limit
    assert [p.state.value for p in pods] == ["DELETED"]  # the slice is gone, billing ended
    return run, guard


# ~45 s on 2 cores (the LM's setup and start-up fill most of its budget): the stdlib program's case above is
# the default suite's.
@pytest.mark.slow
def test_a_run_with_a_budget_below_its_cost_stops_checkpointed_at_the_budget_and_deletes_its_slice(
    admin: SimAdminClient, cli: Cli, state_dir: Path
) -> None:
    # v5e-4 spot: 4 chips x 0.245 = 0.98 USD/h, so about 55 s from READY, the stop decided about 11 s
    # (the margin) before: room for start-up on a loaded machine (a stop before the program listens is a
    # hard stop, nothing to checkpoint yet). Setup and JAX start-up took over 25 s with the suite and a
    # second one running beside it, where a 37 s budget failed; the run itself would take minutes.
    limit = 0.015
    result = cli("run", "--example", "lm", "--type", "v5e-4", "--spot", "--budget", str(limit), "--",
                    *SMALL_LM, "--steps", "5000", "--step-delay", "0.02")  # fmt: skip
    assert result.code == 7, result.stderr[-3000:]
    assert "stopped at its budget" in result.stderr
    assert admin.status()["nodes"] == []
    run, guard = _stopped_at_budget(state_dir, limit)
    # Checkpointed on the way out, at the step every host stopped at.
    log = state_dir / "runs" / run.run_id / "worker-0.log"
    (stop,) = [e for e in events_of(log) if e["event"] == "preempted"]
    assert stop["checkpoint"] == "saved"
    from tpuctl.sim.storage import stored_objects

    prefix = f"tpuctl/runs/{run.run_id}/checkpoints/{stop['step']}/"
    assert stored_objects(state_dir / "sim-gcs", prefix=prefix)  # in the bucket, not on a host's disk
    # Within one step's cost of the limit, never over it by more.
    steps = [e["dt"] for e in events_of(log) if e["event"] == "step"]
    step_usd = 0.98 * max(steps) / 3600
    spent = guard.spent()
    assert spent <= limit + step_usd, (spent, limit)
    assert spent >= 0.5 * limit  # it did use its budget


STUBBORN = """\
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_budget_stop_the_program_ignores_is_enforced_and_the_spend_reported_is_the_ledgers(
    admin: SimAdminClient, cli: Cli, tmp_path: Path, state_dir: Path
) -> None:
    """SIGTERM ignored: SIGKILL at the end of --grace, the slice deleted, the run over within grace + 10 s
    of the stop, and the error and the run's record say what the ledger says was spent."""
    from tpuctl.catalog import Catalog
    from tpuctl.services.budget import BudgetGuard

    script = write(tmp_path / "proj" / "stubborn.py", STUBBORN)
    limit, grace = 0.015, 2.0  # v5e-4 on demand, 4.80 USD/h: 11.25 s of it
    result = cli("run", str(script), "--no-runtime-deps", "--type", "v5e-4", "--budget", str(limit),
                 "--grace", str(grace),
                 "-o", "json")  # fmt: skip
    assert result.code == 7, result.stderr[-3000:]
    assert admin.status()["nodes"] == []
    with Ledger(state_dir) as ledger:
        (run,) = ledger.list_runs()
        ledger_spent = BudgetGuard.for_run(ledger, run.run_id, Catalog.load(), limit_usd=limit).spent()
    assert run.status is RunStatus.BUDGET_EXCEEDED and run.ended_at is not None
    budget = (run.detail or {})["budget"]
    assert run.ended_at - budget["stopped_at"] <= grace + 10
    assert budget["spent_usd"] == pytest.approx(ledger_spent, abs=1e-9)
    assert f"spent {ledger_spent:.4f} of {limit:.4f} USD" in result.json["message"]
    [group] = cli("cost", "report", "--group-by", "run", "-o", "json").json["groups"]
    assert group["cost_usd"] == pytest.approx(ledger_spent, abs=1e-4)
    assert ledger_spent <= limit  # the stop left room for the grace
    # The program reports no steps: its recomputed work and waste are unknown, not 0.
    assert group["steps_reported"] is False
    assert group["recomputed_usd"] is None and group["waste_usd"] is None and group["steps"] is None
    table = cli("cost", "report", "--group-by", "run")
    assert "unknown" in table.stdout and "the program reports no steps" in table.stdout


def test_with_no_capacity_anywhere_the_recovery_backs_off_with_progress_until_a_zone_frees_up(
    admin: SimAdminClient, cli: Cli, tmp_path: Path, state_dir: Path
) -> None:
    import threading

    from recovery_helpers import V5E_OTHER, V5E_ZONE

    script = write(tmp_path / "proj" / "sleeper.py", SLEEPER)
    chaos = _Seen(admin, state_dir, stockout=V5E_ZONE).start()
    admin.stockout(V5E_OTHER)  # both zones full once the preemption comes

    def waits_for_capacity() -> int:
        with Ledger(state_dir) as ledger:
            runs = ledger.list_runs()
            segments = ledger.segments(runs[0].run_id) if runs else []
        waits = [(s.detail or {}) for s in segments if s.kind == "recovering"]
        return max((int(d.get("try", 0)) for d in waits if d.get("waiting_for") == "capacity"), default=0)

    def clear_later() -> None:
        # Once the recovery has found both zones full (and backs off with progress), not after a fixed
        # time: on a loaded machine the recovery may not have tried yet.
        deadline = time.monotonic() + 120
        while waits_for_capacity() < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        admin.stockout(V5E_OTHER, clear=True)

    clearer = threading.Thread(target=clear_later, daemon=True)
    clearer.start()
    try:
        result = cli(
            "run", str(script), "--no-runtime-deps", "--type", "v5e-8", "--spot", "--env", "SLEEP_S=30"
        )
    finally:
        chaos.join()
        clearer.join(timeout=130)
    assert result.code == 0, result.stderr[-3000:]
    assert "no capacity for v5e-8 yet (try 1:" in result.stderr and "retrying in" in result.stderr
    run_id = cli("runs", "list", "-o", "json").json["runs"][0]["run_id"]
    run = cli("runs", "describe", run_id, "-o", "json").json["run"]
    (preemption,) = run["recovery"]["preemptions"]
    # It waited out at least the first backoff (0.2 s on the simulator) before the zone freed up.
    assert preemption["new_zone"] == V5E_OTHER and preemption["provisioning_s"] >= 0.2
    waits = [s for s in run["segments"] if s["kind"] == "recovering" and s["detail"].get("waiting_for")]
    assert len(waits) >= 1 and all(s["detail"]["waiting_for"] == "capacity" for s in waits)
    assert admin.status()["nodes"] == []


# --- docs/runs.md's "bring your own train.py" example -----------------------------------------------------


def test_the_documented_train_py_checkpoints_on_the_notice_and_loses_no_step(
    admin: SimAdminClient, cli: Cli, state_dir: Path
) -> None:
    """docs/examples/train.py, as docs/runs.md shows it: preempted with notice after 5 steps, it checkpoints
    at the step it stopped at, and the run goes on from there on a new slice with nothing recomputed."""
    example = REPO / "docs" / "examples" / "train.py"
    assert example.read_text() in (REPO / "docs" / "runs.md").read_text()  # the page shows this very file
    chaos = Chaos(admin, state_dir, [Preempt(1, 5, notice=True)]).start()
    try:
        result = cli("run", str(example), "--type", "v5e-4", "--spot", "--env", "STEPS=40", "-o", "json")
    finally:
        chaos.join(check=False)
    assert result.code == 0, result.stderr[-3000:]
    chaos.check()
    assert "done at step 40" in result.stderr
    run = cli("runs", "describe", result.json["run"]["run_id"], "-o", "json").json["run"]
    (preemption,) = run["recovery"]["preemptions"]
    assert preemption["kind"] == "notice" and preemption["checkpoint_step"] is not None
    assert preemption["restored_step"] == preemption["checkpoint_step"]
    assert run["recovery"]["steps_recomputed"] == 0 and run["recovery"]["steps_completed"] == 40
    assert run["recovery"]["goodput"] is not None
    assert admin.status()["nodes"] == []
    [group] = cli("cost", "report", "--group-by", "run", "-o", "json").json["groups"]
    assert group["waste_usd"] is not None and "steps_reported" not in group  # it reports steps


# --- a restart that restores less than was reported saved -------------------------------------------------

FORGETFUL = """\
import json, os, signal, sys, time

def emit(**event):
    print("TPUCTL_EVENT " + json.dumps(event), flush=True)

stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
restart = int(os.environ.get("TPUCTL_RESTART_COUNT", "0"))
emit(event="start", step=0, restored=None, skipped=[], restart_count=restart, steps=20)
for step in range(1, 21):
    time.sleep(0.1)
    emit(event="step", step=step, dt=0.1)
    if stop:  # says its checkpoint is saved, and saves nothing anywhere
        emit(event="preempted", step=step, checkpoint="saved")
        sys.exit(75)
"""


def test_a_restart_that_restores_nothing_after_a_reported_checkpoint_is_an_error_on_record(
    admin: SimAdminClient, cli: Cli, tmp_path: Path, state_dir: Path
) -> None:
    script = write(tmp_path / "proj" / "forgetful.py", FORGETFUL)
    chaos = Chaos(admin, state_dir, [Preempt(1, 3, notice=True)]).start()
    try:
        result = cli("run", str(script), "--no-runtime-deps", "--type", "v5e-4", "--spot")
    finally:
        chaos.join(check=False)
    chaos.check()
    assert result.code == 0, result.stderr[-3000:]
    assert "and its restart restored nothing (it starts again from step 0)" in result.stderr
    run_id = cli("runs", "list", "-o", "json").json["runs"][0]["run_id"]
    run = cli("runs", "describe", run_id, "-o", "json").json["run"]
    (lost,) = run["detail"]["lost_restores"]
    (preemption,) = run["recovery"]["preemptions"]
    assert lost["saved"] == preemption["checkpoint_step"] >= 3 and lost["restored"] is None
