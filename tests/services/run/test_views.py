"""The Runs service's answers: typed fields read from the run's record, and the JSON form ``-o json``
prints, with the command's documented keys in their order."""

from __future__ import annotations

import time
from pathlib import Path

from tpuctl.catalog import CapacityType
from tpuctl.services.run.views import (
    Cancellation,
    CancelOutcome,
    Detached,
    LeaseHolder,
    RecoveryView,
    RunView,
)
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import RunStatus

RUN_KEYS = ["run_id", "status", "program", "args", "pod", "zone", "accelerator_type", "capacity",
            "exit_code", "created_at", "ended_at", "duration_s", "restarts", "preemptions", "workspace",
            "principal", "labels", "detail"]  # fmt: skip


def test_a_run_view_reads_the_record_and_keeps_the_json_keys(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    start = 1_790_000_000.0
    detail = {"hosts": 4, "executor": "ssh", "log_dir": "/s/runs/r", "checkpoint_dir": "gs://b/c"}
    ledger.create_run("r", script="train.py", args=["--lr", "3"], status=RunStatus.RUNNING, pod="p",
                      zone="us-central1-a", accelerator_type="v5litepod-16", capacity=CapacityType.SPOT,
                      labels={"team": "a"}, detail=detail, ts=start)  # fmt: skip
    ledger.update_run("r", status=RunStatus.SUCCEEDED, exit_code=0, ended_at=start + 12.3456)
    record = ledger.get_run("r")
    assert record is not None
    view = RunView.of(record)
    assert (view.hosts, view.executor, view.log_dir, view.checkpoint_dir, view.error) == (
        4, "ssh", "/s/runs/r", "gs://b/c", None,
    )  # fmt: skip
    data = view.to_dict()
    assert list(data) == RUN_KEYS
    assert data["status"] == "succeeded" and data["capacity"] == "spot" and data["args"] == ["--lr", "3"]
    assert data["created_at"] == "2026-09-21T14:13:20Z" and data["duration_s"] == 12.346
    assert data["labels"] == {"team": "a"} and data["detail"] == detail


def test_a_run_that_never_started_or_still_runs_has_no_duration(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.create_run("live", script="a.py", ts=time.time())
    ledger.create_run("never", script="a.py", detail={"never_started": True}, ts=time.time())
    ledger.update_run("never", status=RunStatus.CANCELLED, exit_code=130)
    for run_id in ("live", "never"):
        record = ledger.get_run(run_id)
        assert record is not None and RunView.of(record).duration_s is None


def test_a_lease_holder_says_what_the_lease_file_recorded() -> None:
    identity = {"pid": 42, "start_ticks": 7, "host": "m1", "since": 1.5}
    holder = LeaseHolder.of(identity)
    assert (holder.pid, holder.host, holder.start_ticks, holder.since) == (42, "m1", 7, 1.5)
    assert holder.to_dict() == identity
    assert LeaseHolder.of({}).to_dict() == {}  # an unreadable lease file: nothing made up


def test_the_recovery_record_is_typed_for_people_and_passed_through_for_json() -> None:
    record = {
        "steps_reported": True, "steps_completed": 40, "steps_recomputed": 3, "goodput": 0.91,
        "productive_step_s": 12.5, "wall_s": 20, "preemption_count": 1,
        "preemptions": [{"number": 1, "kind": "notice", "pod": "p", "zone": "z", "checkpoint_step": 30,
                         "detection_latency_s": 0.25, "recovery_s": 9.5, "new_zone": "z2", "new_pod": "p2",
                         "steps_recomputed": 3, "lost_slices": ["p-0"], "replaced_slices": ["p-0", "p-1"]}],
        "checkpoint_fallbacks": [{"restored": 20, "skipped": [{"step": 30, "reason": "incomplete"}]}],
    }  # fmt: skip
    view = RecoveryView.of(record)
    assert (view.steps_completed, view.steps_recomputed, view.goodput, view.wall_s) == (40, 3, 0.91, 20)
    (p,) = view.preemptions
    assert (p.number, p.kind, p.checkpoint_step, p.detection_latency_s, p.new_pod) == (
        1, "notice", 30, 0.25, "p2",
    )  # fmt: skip
    assert p.lost_slices == ("p-0",) and p.replaced_slices == ("p-0", "p-1")
    (fallback,) = view.checkpoint_fallbacks
    assert fallback.restored == 20 and [(s.step, s.reason) for s in fallback.skipped] == [(30, "incomplete")]
    assert view.record == record
    empty = RecoveryView.of({})
    assert empty.steps_reported is None and empty.preemptions == () and empty.checkpoint_fallbacks == ()


def test_a_cancellation_has_the_json_of_what_was_done() -> None:
    ended = Cancellation("r", CancelOutcome.ALREADY_ENDED, status="succeeded")
    assert not ended.cancelled and ended.note == "the run had already ended"
    assert ended.to_dict() == {"run_id": "r", "status": "succeeded", "cancelled": False,
                               "note": "the run had already ended"}  # fmt: skip
    by = Cancellation("r", CancelOutcome.BY_SUPERVISOR, status="cancelled", by="its supervisor (pid 9)")
    assert by.to_dict() == {"run_id": "r", "status": "cancelled", "cancelled": True,
                            "by": "its supervisor (pid 9)"}  # fmt: skip
    cleaned = Cancellation("r", CancelOutcome.CLEANED_UP, status="cancelled", hosts_killed=2, deleted="p")
    assert cleaned.to_dict() == {"run_id": "r", "status": "cancelled", "cancelled": True, "hosts_killed": 2,
                                 "deleted": "p"}  # fmt: skip


def test_a_detached_supervisor_says_when_it_had_not_taken_the_lease_yet(tmp_path: Path) -> None:
    log = tmp_path / "supervisor.log"
    assert Detached("r", 7, log, leased=True).to_dict() == {"pid": 7, "log": str(log)}
    assert Detached("r", 7, log, leased=False).to_dict() == {
        "pid": 7,
        "log": str(log),
        "lease": "not yet taken",
    }
