"""The run queue's transaction on both engines: admission and claim together, reasons written, queued runs
never taken up as orphans, and two replicas racing for room for one run admitting exactly one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.server.admission import Admission
from tpuctl.services.cost.monthly_spend import MonthSpend, Spend
from tpuctl.store import LeaseOwner, Ledger, RunStatus
from tpuctl.store.queue import QueueDecision, QueueSnapshot
from tpuctl.teams.workspaces import Workspaces

A = LeaseOwner("replica-aaaa", "host-a", 1111, 501)
B = LeaseOwner("replica-bbbb", "host-b", 2222, 602)
LONG = 300.0
TEAM_A = Workspaces.model_validate({"workspaces": {"team-a": {"chips": {"v5e": 32}, "usd_per_month": 50}}})


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger]) -> Iterator[Ledger]:
    with open_ledger() as opened:
        yield opened


def add_run(
    ledger: Ledger,
    run_id: str,
    *,
    status: RunStatus = RunStatus.QUEUED,
    principal: str = "a1@example.com",
    accelerator_type: str = "v5litepod-16",
) -> None:
    """A run of team-a as a submission records it (its request saved, so a replica could take it up)."""
    ledger.create_run(
        run_id,
        script="train.py",
        status=status,
        accelerator_type=accelerator_type,
        capacity=CapacityType.SPOT,
        detail={"slices": 1, "created_pod": True},
        principal=principal,
        workspace="team-a",
        priority="batch",
        queue_reason="submitted" if status is RunStatus.QUEUED else None,
    )
    ledger.save_run_request(run_id, '{"job": {}}')


def admission(room: int = 10, spend: MonthSpend | None = None) -> Callable[[QueueSnapshot], QueueDecision]:
    return Admission(TEAM_A, Catalog.load(), spend or MonthSpend("2026-11"), room=room).decide


def test_admits_what_fits_claims_it_and_says_why_the_rest_waits(ledger: Ledger) -> None:
    for run_id in ("q1", "q2", "q3"):
        add_run(ledger, run_id)
    claims = ledger.admit_queued(A, LONG, decide=admission(), limit=10)
    assert [c.run_id for c in claims] == ["q1", "q2"]
    assert all(c.owner == A and c.generation == 1 for c in claims)
    first, third = ledger.get_run("q1"), ledger.get_run("q3")
    assert first is not None and third is not None
    assert (first.status, first.queue_reason) == (RunStatus.PROVISIONING, None)
    assert first.admitted_at is not None and first.queued_at is not None
    assert first.admitted_at >= first.queued_at
    assert (third.status, third.admitted_at) == (RunStatus.QUEUED, None)
    assert third.queue_reason == "workspace team-a: 32 of 32 v5e chips in use"
    assert ledger.lease_of("q1") is not None and ledger.lease_of("q3") is None

    # Nothing more fits: a second tick admits nothing and leaves the reason as it was.
    assert ledger.admit_queued(B, LONG, decide=admission(), limit=10) == []
    ledger.update_run("q1", status=RunStatus.SUCCEEDED)
    claims = ledger.admit_queued(B, LONG, decide=admission(), limit=10)
    assert [c.run_id for c in claims] == ["q3"]
    after = ledger.get_run("q3")
    assert after is not None and after.status is RunStatus.PROVISIONING and after.queue_reason is None


def test_a_queued_run_is_no_orphan(ledger: Ledger) -> None:
    add_run(ledger, "q1")
    assert ledger.orphans() == []
    assert ledger.claim_orphans(A, LONG, limit=10) == []


def test_the_replicas_room_limits_admissions_and_says_so(ledger: Ledger) -> None:
    add_run(ledger, "q1", accelerator_type="v5litepod-4")
    add_run(ledger, "q2", accelerator_type="v5litepod-4")
    claims = ledger.admit_queued(A, LONG, decide=admission(room=1), limit=1)
    assert [c.run_id for c in claims] == ["q1"]
    waiting = ledger.get_run("q2")
    assert waiting is not None
    assert waiting.queue_reason == "fits workspace team-a; waiting for a replica with room to supervise it"


def test_a_run_someone_is_cancelling_is_not_admitted(ledger: Ledger) -> None:
    add_run(ledger, "q1", accelerator_type="v5litepod-4")
    cancelling = ledger.claim_lease("q1", B, LONG)  # `runs cancel` claims a run nobody holds to clean up
    assert ledger.admit_queued(A, LONG, decide=admission(), limit=10) == []
    still = ledger.get_run("q1")
    assert still is not None and still.status is RunStatus.QUEUED
    ledger.release_lease(cancelling)


def test_two_replicas_never_admit_past_the_limit(open_ledger: Callable[..., Ledger]) -> None:
    """Two ledgers on one database (two replicas), three queued runs, room for one: exactly one admitted,
    whichever replica got it. Each decision waits a moment inside the transaction, so the two overlap;
    and the replicas read the month's spend at different moments, so each would pick another run first
    (the per-run claims alone would not keep them from admitting one each)."""
    with open_ledger() as setup:
        add_run(setup, "held", status=RunStatus.RUNNING)
        for run_id, principal in (
            ("q1", "a1@example.com"),
            ("q2", "a3@example.com"),
            ("q3", "a1@example.com"),
        ):
            add_run(setup, run_id, principal=principal)
    start = threading.Barrier(2)
    got: dict[str, list[str]] = {}
    spent_more = {A: "a1@example.com", B: "a3@example.com"}

    def replica(owner: LeaseOwner) -> None:
        decide = admission(
            spend=MonthSpend("2026-11", by_principal={("team-a", spent_more[owner]): Spend(5.0)})
        )

        def slow(snapshot: QueueSnapshot) -> QueueDecision:
            threading.Event().wait(0.4)  # widen the window between the read and the admission
            return decide(snapshot)

        with open_ledger() as mine:
            start.wait()
            got[owner.owner_id] = [c.run_id for c in mine.admit_queued(owner, LONG, decide=slow, limit=10)]

    threads = [threading.Thread(target=replica, args=(owner,)) for owner in (A, B)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    admitted = [run for runs in got.values() for run in runs]
    assert len(admitted) == 1 and admitted[0] in ("q1", "q2")
    with open_ledger() as check:
        statuses = {r.run_id: r.status for r in check.list_runs()}
    assert sorted(statuses.values()) == sorted(
        [RunStatus.RUNNING, RunStatus.PROVISIONING, RunStatus.QUEUED, RunStatus.QUEUED]
    )


def test_a_run_without_its_saved_request_is_not_admitted(ledger: Ledger) -> None:
    ledger.create_run("half", script="x", status=RunStatus.QUEUED, workspace="team-a", queue_reason="x")
    assert ledger.run_request("half") is None
    assert ledger.admit_queued(A, LONG, decide=admission(), limit=10) == []
