"""Placement attempts, runs and run segments."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.store import (
    UNSET,
    AttemptOutcome,
    EventKind,
    Ledger,
    LedgerError,
    RunStatus,
    SegmentKind,
)

Z1, Z2 = "us-central1-a", "europe-west4-b"


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger]) -> Iterator[Ledger]:
    with open_ledger(clock=lambda: 1000.0) as led:
        yield led


def test_attempts_are_rows_and_events(ledger: Ledger) -> None:
    first = ledger.record_attempt(
        "req-1",
        zone=Z1,
        outcome=AttemptOutcome.STOCKOUT,
        capacity=CapacityType.SPOT,
        message="There is no more capacity in the zone",
        duration_s=1.5,
        pod="p",
        accelerator_type="v5litepod-64",
        ts=10.0,
    )
    second = ledger.record_attempt(
        "req-1", zone=Z2, outcome=AttemptOutcome.CREATED, capacity=CapacityType.SPOT, pod="p", ts=20.0
    )
    ledger.record_attempt("req-2", zone=Z2, outcome="quota", ts=5.0)  # type: ignore[arg-type]
    attempts = ledger.attempts("req-1")
    assert [a.id for a in attempts] == [first, second]
    a = attempts[0]
    assert (a.zone, a.capacity, a.outcome, a.duration_s, a.pod) == (
        Z1,
        CapacityType.SPOT,
        "stockout",
        1.5,
        "p",
    )
    assert a.outcome is AttemptOutcome.STOCKOUT
    events = list(ledger.events(kinds=[EventKind.ATTEMPT]))
    assert [e.id for e in events if e.request_id == "req-1"] == [a.event_id for a in attempts]
    assert events[1].detail == {
        "outcome": "stockout",
        "message": "There is no more capacity in the zone",
        "duration_s": 1.5,
    }
    assert ledger.attempts("nope") == []
    assert ledger.list_pods() == []  # an attempt alone does not make a pod
    with pytest.raises(ValueError):
        ledger.record_attempt("r", zone=Z1, outcome="exploded")  # type: ignore[arg-type]


def test_run_lifecycle(ledger: Ledger) -> None:
    run = ledger.create_run(
        "run-1",
        script="train.py",
        args=["--steps", "10"],
        accelerator_type="v5litepod-16",
        capacity=CapacityType.SPOT,
        labels={"team": "ml"},
        ts=100.0,
    )
    assert (run.status, run.args, run.created_at, run.updated_at) == (
        RunStatus.PENDING,
        ("--steps", "10"),
        100.0,
        100.0,
    )
    assert (run.restarts, run.preemptions, run.steps, run.ended_at, run.labels) == (
        0,
        0,
        0,
        None,
        {"team": "ml"},
    )
    run = ledger.update_run("run-1", status=RunStatus.RUNNING, pod="p1", zone=Z1, ts=110.0)
    assert (run.status, run.pod, run.zone, run.updated_at, run.ended_at) == ("running", "p1", Z1, 110.0, None)
    run = ledger.update_run("run-1", preemptions=1, restarts=1, steps=7, detail={"ckpt": 6}, ts=120.0)
    assert (run.preemptions, run.restarts, run.steps, run.detail, run.pod) == (1, 1, 7, {"ckpt": 6}, "p1")
    run = ledger.update_run("run-1", pod=None, detail=None, ts=125.0)  # None clears, UNSET keeps
    assert (run.pod, run.detail, run.zone) == (None, None, Z1)
    run = ledger.update_run("run-1", status=RunStatus.SUCCEEDED, exit_code=0, steps=10, ts=130.0)
    assert (run.status, run.exit_code, run.ended_at) == (RunStatus.SUCCEEDED, 0, 130.0)
    assert ledger.get_run("run-1") == run
    assert ledger.get_run("nope") is None
    assert ledger.update_run("run-1", capacity=UNSET, ts=140.0).capacity is CapacityType.SPOT


def test_runs_errors_and_listing(ledger: Ledger) -> None:
    ledger.create_run("a", script="a.py", ts=1.0)
    ledger.create_run("b", script="b.py", ts=2.0, status=RunStatus.RUNNING)
    with pytest.raises(LedgerError, match="already exists"):
        ledger.create_run("a", script="again.py")
    with pytest.raises(LedgerError, match="no run"):
        ledger.update_run("zzz", steps=1)
    assert [r.run_id for r in ledger.list_runs()] == ["b", "a"]
    assert [r.run_id for r in ledger.list_runs(status=RunStatus.RUNNING)] == ["b"]
    assert [r.run_id for r in ledger.list_runs(limit=1)] == ["b"]
    # Ids around a fragment, only a workspace's when asked (a run without one is the local workspace's).
    ledger.create_run("x-a", script="a.py", ts=3.0, workspace="team-a")
    assert ledger.run_ids_around("a") == ["x-a", "a"]
    assert ledger.run_ids_around("a", workspaces={"team-a"}) == ["x-a"]
    assert ledger.run_ids_around("a", workspaces={"default"}) == ["a"]
    assert ledger.run_ids_around("a", workspaces=set()) == []


def test_segments_are_consecutive(ledger: Ledger) -> None:
    ledger.create_run("r", script="t.py", ts=0.0)
    prov = ledger.add_segment("r", SegmentKind.PROVISIONING, start=0.0, zone=Z1, capacity=CapacityType.SPOT)
    running = ledger.add_segment("r", SegmentKind.RUNNING, start=30.0, pod="p1", zone=Z1)
    closed = ledger.close_segment(running, end=100.0, steps_completed=50, detail={"ckpt": 50})
    assert (closed.end, closed.steps_completed, closed.duration_s, closed.detail) == (
        100.0,
        50,
        70.0,
        {"ckpt": 50},
    )
    ledger.add_segment("r", SegmentKind.PREEMPTED, start=100.0, pod="p1")
    ledger.add_segment("r", SegmentKind.RECOVERING, start=105.0)
    last = ledger.add_segment("r", SegmentKind.RUNNING, start=160.0, pod="p2", zone=Z2)
    ledger.close_segment(last, end=200.0, steps_completed=20, steps_recomputed=0)
    segs = ledger.segments("r")
    assert [(s.kind, s.start, s.end) for s in segs] == [
        (SegmentKind.PROVISIONING, 0.0, 30.0),  # closed when the next one opened
        (SegmentKind.RUNNING, 30.0, 100.0),
        (SegmentKind.PREEMPTED, 100.0, 105.0),
        (SegmentKind.RECOVERING, 105.0, 160.0),
        (SegmentKind.RUNNING, 160.0, 200.0),
    ]
    assert segs[0].id == prov and segs[0].capacity is CapacityType.SPOT
    assert segs[4].steps_recomputed == 0
    with pytest.raises(LedgerError, match="already closed"):
        ledger.close_segment(last)
    with pytest.raises(LedgerError, match="no run segment"):
        ledger.close_segment(9999)
    with pytest.raises(LedgerError, match="no run"):
        ledger.add_segment("ghost", SegmentKind.RUNNING)
    assert ledger.segments("ghost") == []
    assert ledger.integrity_check() == "ok"
