"""The saved request is written atomically and durably: 0600, data and directory fsynced, and a write that
fails half way leaves the previous request whole and no temporary file behind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tpuctl.services.run.control import load_request, save_request
from tpuctl.services.run.model import RecoveryPolicy, RunRequest
from tpuctl.services.run.rundir import RunDir


def _save(run_dir: RunDir, budget: float | None) -> Path:
    return save_request(
        run_dir, RunRequest(example="lm", env=("TOKEN=s3cret",)), run_id="run-x", budget_usd=budget,
        policy=RecoveryPolicy(max_preemptions=3),
    )  # fmt: skip


def test_the_saved_request_is_private_in_a_private_directory(tmp_path: Path) -> None:
    run_dir = RunDir.of(tmp_path, "run-x")
    path = _save(run_dir, 5.0)
    assert path == run_dir.request_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(run_dir.root.stat().st_mode) == 0o700
    assert sorted(p.name for p in run_dir.root.iterdir()) == ["request.json"]  # no temporary file left
    saved = load_request(run_dir)
    assert saved.budget_usd == 5.0 and saved.policy.max_preemptions == 3
    assert saved.request.run_id == "run-x" and saved.request.env == ("TOKEN=s3cret",)


def test_the_data_and_the_directory_entry_are_fsynced_before_save_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = RunDir.of(tmp_path, "run-x").make()
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        # What was synced: a regular file (the data) or a directory (the rename's entry).
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _save(run_dir, None)
    assert synced == ["file", "dir"]


def test_a_save_that_fails_half_way_keeps_the_old_request_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = RunDir.of(tmp_path, "run-x")
    _save(run_dir, 1.0)
    before = run_dir.request_file.read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        _save(run_dir, 2.0)
    assert run_dir.request_file.read_bytes() == before
    assert json.loads(before)["budget_usd"] == 1.0
    assert sorted(p.name for p in run_dir.root.iterdir()) == ["request.json"]
