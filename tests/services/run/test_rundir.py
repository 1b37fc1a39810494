"""A run's directory: every per-run path made in one place, the directory the run's record names, and
the directory created private."""

from __future__ import annotations

import stat
import time
from pathlib import Path

from tpuctl.services.run.lease import LOCK_FILE, Lease, lease_holder
from tpuctl.services.run.rundir import RunDir
from tpuctl.store.ledger import Ledger


def test_every_path_of_a_run_is_under_its_directory(tmp_path: Path) -> None:
    run_dir = RunDir.of(tmp_path, "run-20261124-150900-ab16")
    root = tmp_path / "runs" / "run-20261124-150900-ab16"
    assert run_dir.root == root
    assert run_dir.request_file == root / "request.json"
    assert run_dir.supervisor_log == root / "supervisor.log"
    assert run_dir.host_log(3) == root / "worker-3.log"
    assert run_dir.host_logs(range(2)) == [(0, root / "worker-0.log"), (1, root / "worker-1.log")]
    assert run_dir.host_logs([5]) == [(5, root / "worker-5.log")]


def test_the_lock_file_is_the_one_the_lease_takes(tmp_path: Path) -> None:
    run_dir = RunDir.of(tmp_path, "run-x")
    assert run_dir.lock_file == run_dir.root / LOCK_FILE
    lease = Lease.acquire(run_dir.lock_file)
    assert lease is not None
    try:
        holder = lease_holder(run_dir.root)
        assert holder is not None and "pid" in holder
    finally:
        lease.release()


def test_the_recorded_directory_wins_over_the_state_dirs(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    elsewhere = tmp_path / "moved" / "run-a"
    ledger.create_run("run-a", script="a.py", detail={"log_dir": str(elsewhere)}, ts=time.time())
    ledger.create_run("run-b", script="b.py", ts=time.time())  # a record from before log_dir was kept
    record_a, record_b = ledger.get_run("run-a"), ledger.get_run("run-b")
    assert record_a is not None and record_b is not None
    assert RunDir.recorded(tmp_path / "state", record_a) == RunDir(elsewhere)
    assert RunDir.recorded(tmp_path / "state", record_b) == RunDir.of(tmp_path / "state", "run-b")


def test_make_creates_the_directory_and_the_runs_folder_private(tmp_path: Path) -> None:
    run_dir = RunDir.of(tmp_path, "run-x")
    assert not run_dir.root.exists()  # a value: nothing is made until asked
    assert run_dir.make() == run_dir
    for path in (run_dir.root, run_dir.root.parent):
        assert path.is_dir() and stat.S_IMODE(path.stat().st_mode) == 0o700
    run_dir.make()  # again: nothing to do, no error
