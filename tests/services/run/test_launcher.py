"""The launcher service on the simulator with plain Python programs: Ctrl-C and --timeout stop every host
and are recorded; a host killed from outside (as a hard preemption would) fails the run naming it;
--env validation; the plan is side-effect free."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.errors import InterruptedByUser, RunFailedError, UsageError
from tpuctl.hosts.base import REDACTED
from tpuctl.params import flag
from tpuctl.services.run.launcher import Launcher
from tpuctl.services.run.model import PhaseUpdate, RecoveryPolicy, RunRequest, RunResult
from tpuctl.services.run.prepare import parse_env
from tpuctl.services.run.provision import renamed, run_slice_name
from tpuctl.services.run.service import Runs
from tpuctl.services.session import Session, open_session
from tpuctl.settings import load_settings
from tpuctl.sim import SimServer
from tpuctl.sim.world import world_from_data

WORLD = {
    "speed": 1000,
    "zones": {"us-central1-a": {"v5e": {"on_demand": 256, "preemptible": 256}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    # A killed host is confirmed preempted or not within the grace (+2 s): keep the wait short.
    "durations": {"preemption_grace_s": 2},
}

SLEEPER = """\
import os, time
print("pid", os.getpid(), flush=True)
time.sleep(300)
"""


@pytest.fixture
def session(state_dir: Path) -> Iterator[Session]:
    state_dir.mkdir(parents=True, exist_ok=True)
    server = SimServer(state_dir, world_from_data(WORLD, "test world"))
    url = server.start()
    sess = open_session(load_settings({"backend": "sim", "sim_url": url, "state_dir": state_dir}))
    try:
        yield sess
    finally:
        sess.close()
        server.stop()


class Recorder:
    """An observer that keeps what it is told, optionally acting on a line."""

    def __init__(self, on_line: object = None) -> None:
        self.lines: list[tuple[int, str]] = []
        self.statuses: list[str] = []
        self.on_line = on_line

    def line(self, worker: int, text: str) -> None:
        self.lines.append((worker, text))
        if callable(self.on_line):
            self.on_line(self)

    def status(self, text: str) -> None:
        self.statuses.append(text)

    def phase(self, update: PhaseUpdate) -> None:
        self.statuses.append(update.title + (f": {update.outcome}" if update.ended else ""))

    def detail(self, worker: int | None, text: str) -> None:
        pass

    def pids(self) -> list[int]:
        return [int(t.split()[1]) for _, t in self.lines if t.startswith("pid ")]


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def run_without_recovery(session: Session, observer: Recorder, request: RunRequest) -> RunResult:
    """A run as ``bench step`` makes one: supervised, with recovery off, so the first failure ends it."""
    runs = Runs(session)
    return runs.start(runs.prepare(request), observer=observer, policy=RecoveryPolicy.off()).run


def program(tmp_path: Path, text: str) -> str:
    work = tmp_path / "proj"
    work.mkdir(exist_ok=True)
    path = work / "prog.py"
    path.write_text(text)
    return str(path)


def test_ctrl_c_stops_every_host_and_records_the_run_cancelled(session: Session, tmp_path: Path) -> None:
    def interrupt_when_all_started(rec: Recorder) -> None:
        if len(rec.pids()) == 4:
            raise KeyboardInterrupt  # what the terminal's Ctrl-C raises in the main thread

    rec = Recorder(interrupt_when_all_started)
    with pytest.raises(InterruptedByUser):
        run_without_recovery(
            session,
            rec,
            RunRequest(
                script=program(tmp_path, SLEEPER), accelerator_type="v5e-16", grace_s=2.0, runtime_deps=False
            ),
        )
    pids = rec.pids()
    assert len(pids) == 4
    assert [p for p in pids if not gone(p)] == []
    assert "interrupted: stopping every host" in rec.statuses
    (record,) = session.ledger.list_runs()
    assert record.status == "cancelled" and record.exit_code == 130
    # The slice made for the run was deleted all the same.
    assert session.cloud.list_nodes(None) == []


def test_timeout_stops_the_run(session: Session, tmp_path: Path) -> None:
    rec = Recorder()
    started = time.monotonic()
    with pytest.raises(RunFailedError) as info:
        run_without_recovery(
            session,
            rec,
            RunRequest(
                script=program(tmp_path, SLEEPER),
                accelerator_type="v5e-8",
                timeout_s=2.0,
                grace_s=1.0,
                runtime_deps=False,  # a stdlib program: the image's python3, nothing to install
            ),
        )
    # Far below the program's 300 s (the exact figure is provisioning, SSH and the grace: load-bound).
    assert time.monotonic() - started < 60
    assert "exceeded --timeout 2 s" in info.value.message and info.value.returncode == 124
    assert all(gone(p) for p in rec.pids())
    (record,) = session.ledger.list_runs()
    assert record.status == "failed" and record.exit_code == 124


def test_a_host_killed_from_outside_fails_the_run_naming_it(session: Session, tmp_path: Path) -> None:
    def kill_host_3_once_all_started(rec: Recorder) -> None:
        pids = dict((w, int(t.split()[1])) for w, t in rec.lines if t.startswith("pid "))
        if len(pids) == 4 and not getattr(rec, "killed", False):
            rec.killed = True  # type: ignore[attr-defined]
            # As the simulator does at the end of a hard preemption: SIGKILL, no notice.
            threading.Timer(0.2, os.kill, (pids[3], signal.SIGKILL)).start()

    rec = Recorder(kill_host_3_once_all_started)
    with pytest.raises(RunFailedError) as info:
        run_without_recovery(
            session,
            rec,
            RunRequest(
                script=program(tmp_path, SLEEPER), accelerator_type="v5e-16", grace_s=1.0, runtime_deps=False
            ),
        )
    assert info.value.worker == 3 and info.value.returncode == -signal.SIGKILL
    assert "host 3 was killed by SIGKILL" in info.value.message
    assert all(gone(p) for p in rec.pids())
    (record,) = session.ledger.list_runs()
    assert record.exit_code == 128 + 9
    assert any(re.match(r"host 3 was killed by SIGKILL: stopping the other hosts", s) for s in rec.statuses)


def test_env_pairs_are_validated_and_kept_verbatim() -> None:
    assert parse_env(["A=1", "B=x=y", "C=", "D=$(rm -rf ~)"]) == {
        "A": "1",
        "B": "x=y",
        "C": "",
        "D": "$(rm -rf ~)",
    }
    cases = [("A", "A"), ("=1", "=..."), ("A-B=s3cr3t", "A-B=..."), ("PYTHONPATH=/x", "PYTHONPATH=..."),
             ("TPUCTL_WORKER_ID=3", "TPUCTL_WORKER_ID=...")]  # fmt: skip
    for bad, shown in cases:
        with pytest.raises(UsageError) as info:
            parse_env([bad])
        assert info.value.field == "env" and flag(info.value.field) == "--env" and info.value.value == shown
        assert "s3cr3t" not in str(info.value)  # the name, never the value


def test_plan_has_no_side_effects(session: Session, tmp_path: Path) -> None:
    launcher = Launcher(session)
    prepared = launcher.prepare(
        RunRequest(script=program(tmp_path, SLEEPER), accelerator_type="v5e-16", env=("API_KEY=zzz",))
    )
    plan = launcher.plan(prepared)
    assert [h["env"]["API_KEY"] for h in plan["hosts"]] == [REDACTED] * 4
    assert plan["target"]["create"]["chosen"]["zone"] == "us-central1-a"
    assert session.cloud.list_nodes(None) == []
    assert session.ledger.list_runs() == []
    assert not (session.state_dir / "sim-hosts").exists()


def test_a_runs_slices_are_named_after_the_run_each_time_it_is_prepared(
    session: Session, tmp_path: Path
) -> None:
    """`runs resume` prepares the run again: its slices keep the run's name (not a new random one), each
    later slice with its own `-r<restart>` (a node name is unique in its zone; the old one may be
    deleting)."""
    launcher = Launcher(session)
    request = RunRequest(script=program(tmp_path, SLEEPER), accelerator_type="v5e-16", run_id="run-x1")
    first, again = launcher.prepare(request), launcher.prepare(request)
    assert first.target.name == again.target.name == "run-x1"
    assert first.target.placement is not None and again.target.placement is not None
    assert first.target.placement.request_id != again.target.placement.request_id
    assert [renamed(again, 2, tries).target.name for tries in (1, 3)] == ["run-x1-r2", "run-x1-r2-3"]
    # Within the API's 63 characters with a multislice's -<i>, never ending with a dash.
    assert run_slice_name("r" * 59 + "-abc", 1) == "r" * 59 + "-abc"
    assert run_slice_name("r" * 59 + "-abc", 12) == "r" * 59
