"""The saved request is written atomically and durably: 0600, data and directory fsynced, and a write that
fails half way leaves the previous request whole and no temporary file behind; a background supervisor
that did not start fails the run, unless another supervisor holds it."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest

from tpuctl.errors import EXIT_LEASE_HELD, LeaseHeldError
from tpuctl.services.run.control import _not_started, load_request, save_request
from tpuctl.services.run.model import RecoveryPolicy, RunRequest
from tpuctl.services.run.rundir import RunDir
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LeaseOwner, RunStatus
from tpuctl.store.secrets import load_secret_key

if TYPE_CHECKING:
    from tpuctl.services.session import Session


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


def test_the_requirements_text_travels_in_the_ledger_and_is_written_where_the_run_is_resumed(
    tmp_path: Path,
) -> None:
    from tpuctl.services.run.control import (
        REQUIREMENTS_TEXT,
        parse_request,
        record_request,
        saved_payload,
        with_saved_requirements,
    )
    from tpuctl.store.ledger import Ledger

    given = tmp_path / "one" / "proj" / "requirements.txt"
    request = RunRequest(example="lm", requirements=str(given))
    key = load_secret_key(env_key=None, key_file=tmp_path / "secret.key")
    with Ledger(tmp_path / "shared") as ledger:
        ledger.create_run("run-x", script="example:lm")
        one = RunDir.of(tmp_path / "one", "run-x")
        record_request(ledger, one, request, run_id="run-x", budget_usd=None, policy=RecoveryPolicy(),
                       key=key, requirements_text="numpy==2.1.0\n")  # fmt: skip
        # A later save without it (resume's new budget) keeps it.
        record_request(ledger, one, request, run_id="run-x", budget_usd=3.0, policy=RecoveryPolicy(), key=key)
        two = RunDir.of(tmp_path / "two", "run-x")
        payload = saved_payload(ledger, "run-x", two)
    assert payload[REQUIREMENTS_TEXT] == "numpy==2.1.0\n" and payload["budget_usd"] == 3.0
    resumed = with_saved_requirements(parse_request(payload).request, payload, two)
    assert resumed.requirements is not None and not given.exists()  # machine one's file is not needed
    written = Path(resumed.requirements)
    assert written.parent == two.root and written.read_text() == "numpy==2.1.0\n"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    # A run without --requirements gets none, whatever the payload says.
    assert with_saved_requirements(RunRequest(example="lm"), payload, two).requirements is None


def test_env_values_travel_encrypted_and_come_back_only_with_the_key(tmp_path: Path) -> None:
    from tpuctl.services.run.control import parse_request, record_request, saved_payload
    from tpuctl.store.ledger import Ledger

    secret = "SENTINEL-env-value-7f3a"
    request = RunRequest(example="lm", env=(f"API_TOKEN={secret}", "MODE=fast"))
    key = load_secret_key(env_key=None, key_file=tmp_path / "secret.key")
    with Ledger(tmp_path / "shared") as ledger:
        ledger.create_run("run-x", script="example:lm")
        one = RunDir.of(tmp_path / "one", "run-x")
        record_request(
            ledger, one, request, run_id="run-x", budget_usd=None, policy=RecoveryPolicy(), key=key
        )
        two = RunDir.of(tmp_path / "two", "run-x")
        with_key = parse_request(saved_payload(ledger, "run-x", two, lambda: key)).request
        without = parse_request(saved_payload(ledger, "run-x", two)).request
    assert with_key.env == request.env  # another machine with the team's key restarts with the same --env
    assert without.env == ()  # a reader without the key gets none of them
    stored = b"".join(p.read_bytes() for p in (tmp_path / "shared").iterdir() if p.is_file())
    assert secret.encode() not in stored and b"MODE=fast" not in stored


def test_a_supervisor_that_found_the_lease_held_fails_nothing(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.create_run("r1", script="train.py")
    session = cast("Session", SimpleNamespace(ledger=ledger))
    other = ledger.claim_lease("r1", LeaseOwner("owner-o", "host-o", 77, 1), 300.0)
    error = _not_started(session, "r1", "exited at once (status 9)", tmp_path / "log", returncode=9)
    assert isinstance(error, LeaseHeldError) and error.pid == 77 and error.exit_code == EXIT_LEASE_HELD
    ledger.release_lease(other)  # held when the child looked, released since: still not this one's to fail
    error = _not_started(session, "r1", "exited at once (status 9)", tmp_path / "log", returncode=9)
    assert "another supervisor held its lease" in error.message
    record = ledger.get_run("r1")
    assert record is not None and record.status == RunStatus.PENDING.value
    _not_started(session, "r1", "exited at once (status 1)", tmp_path / "log", returncode=1)
    record = ledger.get_run("r1")
    assert record is not None and record.status == RunStatus.FAILED.value


def test_the_runs_deadline_travels_with_its_request_and_is_kept_by_a_resume(tmp_path: Path) -> None:
    """``run --max-hours``: fixed once, when the run was first prepared; another machine's resume
    prepares the same moment, not a new one H hours from then."""
    from tpuctl.services.run.control import load_request

    request = RunRequest(example="lm", max_hours=1.5, deadline_at=1_800_005_400.0)
    run_dir = RunDir.of(tmp_path, "run-x")
    save_request(run_dir, request, run_id="run-x", budget_usd=None, policy=RecoveryPolicy())
    again = load_request(run_dir).request
    assert (again.max_hours, again.deadline_at) == (1.5, 1_800_005_400.0)


def test_a_job_files_fields_travel_with_the_saved_request(tmp_path: Path) -> None:
    """A shell command, other slice types, secret names (never values) and the runtime version come
    back as they were saved, as the same types: a resume prepares the run the job file asked for."""
    from tpuctl.services.placement_choices import PlacementChoices

    request = RunRequest(
        command='python3 -m x "$@"', args=("--lr", "3"), accelerator_type="v5e-16",
        other_accelerator_types=("v6e-8",), type_preference="cheapest", secret_names=("HF_TOKEN",),
        priority=5, workspace="ml", placement=PlacementChoices(runtime_version="v2-alpha-tpuv5-lite"),
    )  # fmt: skip
    run_dir = RunDir.of(tmp_path, "run-x")
    save_request(run_dir, request, run_id="run-x", budget_usd=None, policy=RecoveryPolicy())
    assert load_request(run_dir).request == dataclasses.replace(request, run_id="run-x")


def test_a_cancel_on_another_machine_reaches_the_hosts_as_the_run_did(tmp_path: Path) -> None:
    """The saved request's ProxyCommand (hosts without external IPs: the only way in) and remote root
    are what a cancel from another machine stops the run's programs with; defaults without a request."""
    from tpuctl.services.run.control import _host_access, record_request
    from tpuctl.services.run.hosts import HostAccess

    proxy = "gcloud compute start-iap-tunnel %n %p --listen-on-stdin --zone=%z"
    request = RunRequest(example="lm", ssh_proxy_command=proxy, ssh_remote_root="/opt/t")
    key = load_secret_key(env_key=None, key_file=tmp_path / "secret.key")
    with Ledger(tmp_path / "shared") as ledger:
        ledger.create_run("run-x", script="example:lm")
        record_request(ledger, RunDir.of(tmp_path / "one", "run-x"), request, run_id="run-x",
                       budget_usd=None, policy=RecoveryPolicy(), key=key)  # fmt: skip
        elsewhere = RunDir.of(tmp_path / "two", "run-x")
        assert _host_access(ledger, "run-x", elsewhere) == HostAccess("/opt/t", proxy)
        ledger.create_run("run-y", script="example:lm")
        assert _host_access(ledger, "run-y", RunDir.of(tmp_path / "two", "run-y")) == HostAccess(".tpuctl")
