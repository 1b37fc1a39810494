"""The Runs service over a ledger and a state dir, with no cloud: the one "no such run" error, reading a
run back (describe, logs, liveness), and what resume and cancel refuse or do without a supervisor or a
slice to act on. Starting, resuming and cancelling for real are the CLI tests' (tests/cli)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest

from tpuctl.errors import EXIT_NOT_FOUND, LeaseHeldError, UsageError
from tpuctl.runtime.preemption import EVENT_PREFIX
from tpuctl.services.run.lookup import RunNotFoundError
from tpuctl.services.run.rundir import RunDir
from tpuctl.services.run.service import Runs
from tpuctl.services.run.views import CancelOutcome
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LeaseClaim, LeaseOwner, RunStatus, SegmentKind
from tpuctl.teams.actor import Actor, local_actor

if TYPE_CHECKING:
    from tpuctl.services.session import Session

START = 1_790_000_000.0
IDS = ["run-20260921-141320-ab16", "run-20260921-141321-cd16"]
OWNER = LeaseOwner("owner-b1", "host-b", 4242, 77)


@dataclass
class LedgerOnly:
    """What these calls use of a session: its ledger and state dir (nothing here asks the cloud), and who
    acts (this machine's user, seeing every run)."""

    ledger: Ledger
    state_dir: Path
    actor: Actor = field(default_factory=local_actor)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path)
    for i, run_id in enumerate(IDS):
        ledger.create_run(run_id, script="train.py", ts=START + i,
                          detail={"hosts": 2, "log_dir": str(RunDir.of(tmp_path, run_id).root)})  # fmt: skip
    return ledger


@pytest.fixture
def runs(ledger: Ledger, tmp_path: Path) -> Runs:
    return Runs(cast("Session", LedgerOnly(ledger, tmp_path)))


@pytest.fixture
def held(ledger: Ledger) -> Iterator[LeaseClaim]:
    """IDS[0]'s ledger lease, held as a live supervisor on another machine would hold it."""
    claim = ledger.claim_lease(IDS[0], OWNER, 300.0)
    yield claim
    ledger.release_lease(claim)


def test_get_takes_an_id_its_end_or_latest(runs: Runs) -> None:
    assert runs.get(IDS[0]).run_id == IDS[0]
    assert runs.get("ab16").run_id == IDS[0]
    assert runs.get("latest").run_id == IDS[1] and runs.get(None).run_id == IDS[1]


def test_no_such_run_is_one_error_with_its_fix_and_exit_11(runs: Runs) -> None:
    for call in (runs.get, runs.describe, runs.logs, runs.cancel, runs.resume, runs.reload):
        with pytest.raises(RunNotFoundError) as info:
            call("zz99")
        error = info.value
        assert isinstance(error, UsageError) and error.exit_code == EXIT_NOT_FOUND
        assert error.message == "no run 'zz99'"
        assert (
            error.fix
            == "`tpuctl runs list` shows the runs; a unique start or end of an id, or `latest`, will do"
        )
        assert (error.field, error.value) == ("RUN", "zz99")


def test_list_runs_is_newest_first_and_limited(runs: Runs) -> None:
    assert [v.run_id for v in runs.list_runs(limit=5)] == [IDS[1], IDS[0]]
    assert [v.run_id for v in runs.list_runs(limit=1)] == [IDS[1]]


def test_describe_reads_the_record_the_segments_and_host_0s_steps(
    runs: Runs, ledger: Ledger, tmp_path: Path
) -> None:
    run_id = IDS[0]
    recovery = {
        "steps_reported": True,
        "steps_completed": 3,
        "preemptions": [{"number": 1, "detected_at": START}],
    }
    before = ledger.get_run(run_id)
    assert before is not None
    detail = {**(before.detail or {}), "exit_codes": {"1": 137, "0": 0}, "failed_worker": 1,
              "reason": "host 1 was killed", "recovery": recovery}  # fmt: skip
    ledger.update_run(run_id, status=RunStatus.FAILED, exit_code=137, detail=detail, ended_at=START + 10)
    segment = ledger.add_segment(run_id, SegmentKind.RUNNING, start=START, pod="p", zone="z")
    ledger.close_segment(segment, end=START + 8, steps_completed=3)
    log = RunDir.of(tmp_path, run_id).make().host_log(0)
    steps = [{"event": "step", "step": s, "dt": 0.5 * s, "loss": 4.0 - s} for s in (1, 2, 3)]
    log.write_text("hello\n" + "".join(f"{EVENT_PREFIX}{json.dumps(e)}\n" for e in steps))

    described = runs.describe("ab16")
    assert described.run.run_id == run_id and described.run.status == "failed"
    assert described.supervisor is None and described.supervisor_state == "none (the run ended)"
    assert described.reason == "host 1 was killed"
    assert [(e.worker, e.exit_code, e.failed) for e in described.host_exits] == [
        (0, 0, False),
        (1, 137, True),
    ]
    assert described.host_exits[1].how == "exited with status 137"
    assert described.series.step_time_s == (0.5, 1.0, 1.5) and described.series.loss == (3.0, 2.0, 1.0)
    (seg,) = described.segments
    assert (seg.kind, seg.duration_s, seg.open, seg.steps_completed) == ("running", 8.0, False, 3)
    (bar,) = described.timeline
    assert (bar.offset, bar.width) == (0, 60)
    assert described.recovery.steps_completed == 3
    data = described.to_dict()
    assert list(data)[:2] == ["run_id", "status"] and list(data)[-11:] == [
        "detail", "segments", "timeline", "recovery", "supervisor_state", "supervisor", "reason",
        "host_exits", "series", "lease_history", "queue",
    ]  # fmt: skip
    assert data["queue"] is None  # a run without a server never waited in its queue
    assert data["recovery"]["preemptions"][0]["detected_at"] == "2026-09-21T14:13:20.000Z"  # times in ISO
    assert data["series"] == {"step_time_s": [0.5, 1.0, 1.5], "loss": [3.0, 2.0, 1.0]}


def test_describe_draws_the_step_series_from_the_ledgers_lines_with_no_local_log(
    runs: Runs, ledger: Ledger, held: LeaseClaim
) -> None:
    """A run supervised on another machine: host 0's lines are in the ledger only (no worker-0.log in
    this state dir), and the sparkline reads them there."""
    steps = [{"event": "step", "step": s, "dt": 0.25 * s, "loss": 9.0 - s} for s in (1, 2)]
    lines = [(START, "hello")] + [(START + i, f"{EVENT_PREFIX}{json.dumps(e)}") for i, e in enumerate(steps)]
    ledger.append_log_lines(held, 0, 0, lines)
    ledger.append_log_lines(held, 1, 0, [(START, f"{EVENT_PREFIX}{json.dumps({**steps[0], 'dt': 99.0})}")])
    described = runs.describe(IDS[0])
    assert described.series.step_time_s == (0.25, 0.5) and described.series.loss == (8.0, 7.0)


def test_describe_names_a_live_supervisor_and_a_gone_one(runs: Runs, held: LeaseClaim) -> None:
    live = runs.describe(IDS[0])
    assert live.supervisor is not None
    assert live.supervisor_state.startswith("alive (pid 4242 on host-b; lease generation 1 expires in ")
    assert [(e.action, e.pid) for e in live.lease_history] == [("claim", 4242)]
    shown = live.to_dict()["supervisor"]
    assert (shown["pid"], shown["host"], shown["owner_id"], shown["generation"]) == (
        4242,
        "host-b",
        "owner-b1",
        1,
    )
    assert 299.0 < shown["expires_in_s"] <= 300.0 and shown["expires_at"].endswith("Z")
    gone = runs.describe(IDS[1])  # unfinished, and nobody holds it
    assert gone.supervisor_state == f"gone: take over with `tpuctl runs resume {IDS[1]}`"


def test_logs_are_every_hosts_or_one_and_read_back_in_order(runs: Runs, tmp_path: Path) -> None:
    run_dir = RunDir.of(tmp_path, IDS[0]).make()
    run_dir.host_log(1).write_text("from one\n")
    logs = runs.logs(IDS[0])
    assert logs.files == ((0, run_dir.host_log(0)), (1, run_dir.host_log(1)))
    assert runs.logs(IDS[0], worker=1).files == ((1, run_dir.host_log(1)),)
    assert [(line.worker, line.text) for line in runs.read_logs(logs)] == [(1, "from one")]
    with pytest.raises(UsageError) as info:
        runs.logs(IDS[0], worker=2)
    assert info.value.message == f"run {IDS[0]} has workers 0..1, not 2" and info.value.field == "worker"


def test_a_run_is_live_while_unfinished_or_held(runs: Runs, ledger: Ledger, held: LeaseClaim) -> None:
    assert runs.is_live(IDS[1])  # unfinished
    ledger.update_run(IDS[1], status=RunStatus.SUCCEEDED)
    assert not runs.is_live(IDS[1])
    ledger.update_run(IDS[0], status=RunStatus.CANCELLED)
    assert runs.is_live(IDS[0])  # ended in the ledger, but its supervisor still holds it
    assert not runs.is_live("run-unknown")


def test_cancelling_a_finished_run_does_nothing(runs: Runs, ledger: Ledger) -> None:
    ledger.update_run(IDS[0], status=RunStatus.SUCCEEDED, exit_code=0)
    result = runs.cancel(IDS[0])
    assert result.outcome is CancelOutcome.ALREADY_ENDED and result.status == "succeeded"
    after = ledger.get_run(IDS[0])
    assert after is not None and after.status == RunStatus.SUCCEEDED


def test_a_cancel_that_finds_the_run_ended_once_it_holds_the_lease_changes_nothing(
    ledger: Ledger, tmp_path: Path
) -> None:
    settings = SimpleNamespace(lease_duration=300.0, lease_renew_every=100.0)
    runs = Runs(
        cast(
            "Session",
            SimpleNamespace(ledger=ledger, state_dir=tmp_path, settings=settings, actor=local_actor()),
        )
    )
    stale = runs.get(IDS[0])  # read while the run was going
    ledger.update_run(IDS[0], status=RunStatus.SUCCEEDED, exit_code=0)  # its supervisor finished since
    result = runs._clean_up(stale, runs.dir_of(stale))
    assert result.outcome is CancelOutcome.ALREADY_ENDED and result.status == "succeeded"
    assert runs.get(IDS[0]).status == "succeeded"
    assert ledger.lease_of(IDS[0]) is None  # given back


def test_resume_refuses_a_succeeded_run_and_a_supervised_one(
    runs: Runs, ledger: Ledger, held: LeaseClaim
) -> None:
    before = ledger.get_run(IDS[0])
    with pytest.raises(LeaseHeldError) as info:
        runs.resume(IDS[0])
    assert info.value.exit_code == 9
    assert info.value.message.startswith(
        f"run {IDS[0]} is supervised by host host-b, pid 4242 (owner owner-b1, lease generation 1); "
        "its lease expires at "
    )
    assert ledger.get_run(IDS[0]) == before  # refused before anything was written
    ledger.update_run(IDS[1], status=RunStatus.SUCCEEDED, exit_code=0)
    with pytest.raises(UsageError, match="already succeeded; there is nothing to resume"):
        runs.resume(IDS[1])


def test_resume_writes_nothing_when_a_supervisor_takes_the_run_while_it_prepares(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuctl.services.run import control, prepare

    ledger.update_run(IDS[0], status=RunStatus.FAILED, exit_code=1)
    before = ledger.get_run(IDS[0])
    taken: list[LeaseClaim] = []

    def prepared_while_another_took_it(*args: object) -> SimpleNamespace:
        taken.append(ledger.claim_lease(IDS[0], OWNER, 300.0))  # after the first check passed
        return SimpleNamespace(policy=None, budget_usd=None, prepared=None)

    monkeypatch.setattr(control, "prepare_again", prepared_while_another_took_it)
    monkeypatch.setattr(prepare, "with_budget", lambda *args: None)  # its price is not what is tested
    settings = SimpleNamespace(lease_duration=60.0)
    runs = Runs(
        cast(
            "Session",
            SimpleNamespace(ledger=ledger, state_dir=tmp_path, settings=settings, actor=local_actor()),
        )
    )
    with pytest.raises(LeaseHeldError, match="is supervised by host host-b, pid 4242"):
        runs.resume(IDS[0], budget_usd=5.0)
    assert taken and ledger.get_run(IDS[0]) == before  # still FAILED: no RECOVERING, no new budget
    holder = ledger.lease_of(IDS[0])
    assert holder is not None and holder.owner == OWNER  # the supervisor's lease is untouched


def test_resume_without_a_saved_request_changes_nothing(runs: Runs, ledger: Ledger) -> None:
    ledger.update_run(IDS[1], status=RunStatus.FAILED, exit_code=1)
    with pytest.raises(UsageError, match="cannot read the saved request of this run"):
        runs.resume(IDS[1], budget_usd=5.0)
    record = ledger.get_run(IDS[1])
    assert record is not None and record.status == RunStatus.FAILED and record.exit_code == 1
