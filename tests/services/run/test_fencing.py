"""A supervisor's hold on its run without a cloud or hosts: the lease kept renewed, a loss or a cancel
request seen at renewal, the loss declared on the local clock before the lease could expire when renewals
fail, the cloud's mutations refused once the lease is lost (before the request is sent), and an executor
that lets its hosts go unsignalled once lost."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from tpuctl.cloud.base import NodeRequest, TpuCloud
from tpuctl.errors import LeaseLostError
from tpuctl.hosts.base import Executor, HostEvent
from tpuctl.services.run.fencing import FencedCloud, LeaseBoundExecutor, LeaseKeeper, loss_margin
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import (
    CancelRequest,
    IntentAction,
    LeaseAction,
    LeaseClaim,
    LeaseOwner,
    LedgerUnavailableError,
)
from tpuctl.testing.clock import FakeClock, wait_for

RUN = "r-fenced"
A = LeaseOwner("owner-aaaa", "host-a", 1111, 501)
LONG = 300.0


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(tmp_path / "state") as opened:
        opened.create_run(RUN, script="train.py")
        yield opened


def steal(ledger: Ledger) -> None:
    """Someone rewrites the lease's token by hand (the acceptance's stolen lease)."""
    with sqlite3.connect(ledger.path) as raw:
        raw.execute("UPDATE run_leases SET token = 'stolen' WHERE run_id = ?", (RUN,))


@dataclass
class Seen:
    lost: list[LeaseLostError] = field(default_factory=list)
    cancels: list[CancelRequest] = field(default_factory=list)


def keeper(ledger: Ledger, seen: Seen, *, ttl_s: float = LONG, every_s: float = 0.05) -> LeaseKeeper:
    claim = ledger.claim_lease(RUN, A, ttl_s)
    return LeaseKeeper(
        ledger,
        claim,
        ttl_s=ttl_s,
        renew_every_s=every_s,
        on_lost=seen.lost.append,
        on_cancel=seen.cancels.append,
    )


def test_the_keeper_renews_the_lease_and_releases_it(ledger: Ledger) -> None:
    seen = Seen()
    kept = keeper(ledger, seen, ttl_s=2.0)
    first = kept.claim.expires_at
    kept.start()
    wait_for(lambda: kept.claim.expires_at > first, timeout=10.0, what="a renewal")
    kept.release()
    assert ledger.lease_of(RUN) is None
    actions = [h.action for h in ledger.lease_history(RUN)]
    assert actions[0] is LeaseAction.CLAIM and LeaseAction.RENEW in actions
    assert actions[-1] is LeaseAction.RELEASE
    assert seen.lost == [] and seen.cancels == []


def test_a_stolen_lease_is_seen_at_the_next_renewal_once_and_nothing_is_released(ledger: Ledger) -> None:
    seen = Seen()
    kept = keeper(ledger, seen)
    kept.start()
    steal(ledger)
    wait_for(lambda: seen.lost, timeout=10.0, what="the loss")
    assert kept.lost is seen.lost[0] and len(seen.lost) == 1
    assert kept.lost.exit_code == 9 and RUN in kept.lost.message
    kept.release()  # lost: writes nothing
    actions = [h.action for h in ledger.lease_history(RUN)]
    assert actions.count(LeaseAction.LOST) == 1 and LeaseAction.RELEASE not in actions


def test_a_renewal_that_keeps_failing_is_a_loss_once_the_lease_would_have_expired(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(claim: LeaseClaim, ttl_s: float) -> LeaseClaim:
        raise RuntimeError("disk I/O error")

    seen = Seen()
    kept = keeper(ledger, seen, ttl_s=0.5)
    monkeypatch.setattr(ledger, "renew_lease", broken)
    kept.start()
    wait_for(lambda: seen.lost, timeout=10.0, what="the loss")
    assert kept.lost is seen.lost[0] and len(seen.lost) == 1
    assert "could not be renewed" in kept.lost.message and "disk I/O error" in kept.lost.message
    kept.stop()


TTL, EVERY = 60.0, 15.0  # the defaults: the loss is declared 45 s after the last good renewal began


def clocked_keeper(ledger: Ledger, seen: Seen, clock: FakeClock) -> LeaseKeeper:
    """A keeper on ``clock`` whose renewals a test makes one by one (its threads never started)."""
    claimed_at = clock()
    claim = ledger.claim_lease(RUN, A, TTL)
    return LeaseKeeper(
        ledger,
        claim,
        ttl_s=TTL,
        renew_every_s=EVERY,
        on_lost=seen.lost.append,
        on_cancel=seen.cancels.append,
        claimed_at=claimed_at,
        clock=clock,
    )


def unreachable(claim: LeaseClaim, ttl_s: float) -> LeaseClaim:
    raise LedgerUnavailableError("the ledger database cannot be reached: connection refused")


def test_the_margin_leaves_one_failed_renewal_alone_and_declares_the_loss_before_expiry() -> None:
    assert loss_margin(60.0, 15.0) == 15.0
    assert loss_margin(3.0, 0.5) == 0.5
    assert loss_margin(100.0, 1.0) == pytest.approx(10.0)
    for ttl, every in ((60.0, 15.0), (3.0, 0.5), (10.0, 5.0), (100.0, 1.0)):
        assert 0 < loss_margin(ttl, every) <= ttl - every  # every <= ttl / 2, as settings enforce


def test_the_loss_is_declared_on_the_local_clock_before_the_lease_could_expire(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, seen = FakeClock(start=1000.0), Seen()
    kept = clocked_keeper(ledger, seen, clock)
    monkeypatch.setattr(ledger, "renew_lease", unreachable)
    for _ in range(2):  # two renewals in a row fail: still ours
        clock.advance(EVERY)
        kept.renew()
        assert kept.lost is None and seen.lost == []
    clock.advance_to(1000.0 + TTL - EVERY - 0.001)
    assert kept.lost is None
    clock.advance(0.001)  # 45 s after the claim was sent; the ledger's expiry is 60 s after, or later
    lost = kept.lost
    assert lost is not None and seen.lost == [lost]
    assert "could not be renewed in time" in lost.message and "connection refused" in lost.message
    assert kept.deadline == 1000.0 + TTL - loss_margin(TTL, EVERY) < 1000.0 + TTL
    kept.renew()  # a renewal after the loss is not tried: the run is no longer ours
    assert seen.lost == [lost]


def test_renewals_that_succeed_keep_the_lease_indefinitely(ledger: Ledger) -> None:
    clock, seen = FakeClock(start=1000.0), Seen()
    kept = clocked_keeper(ledger, seen, clock)
    for _ in range(40):  # ten minutes of renewals, each one interval after the last
        clock.advance(EVERY)
        started = clock()
        kept.renew()
        assert kept.deadline == started + TTL - EVERY
    clock.advance(EVERY)
    assert kept.lost is None and seen.lost == []


def test_a_slow_renewal_counts_from_its_start_and_one_slower_than_the_deadline_is_a_loss(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, seen = FakeClock(start=1000.0), Seen()
    kept = clocked_keeper(ledger, seen, clock)
    renew = ledger.renew_lease
    taking: list[float] = []

    def slow(claim: LeaseClaim, ttl_s: float) -> LeaseClaim:
        clock.advance(taking.pop(0))  # the request is under way this long
        return renew(claim, ttl_s)

    monkeypatch.setattr(ledger, "renew_lease", slow)
    clock.advance(EVERY)
    started = clock()
    taking.append(25.0)  # returns at 40 s, inside the first deadline (45 s)
    kept.renew()
    assert kept.lost is None
    assert kept.deadline == started + TTL - EVERY  # from when it was sent, not when it came back
    clock.advance(EVERY)
    taking.append(kept.deadline - clock() + 1.0)  # comes back a second past the deadline
    kept.renew()
    assert kept.lost is not None and len(seen.lost) == 1


def test_the_loss_is_declared_at_the_deadline_while_a_renewal_is_stuck(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def stuck(claim: LeaseClaim, ttl_s: float) -> LeaseClaim:
        release.wait(30.0)  # a database that does not answer
        raise LedgerUnavailableError("timed out")

    seen = Seen()
    kept = keeper(ledger, seen, ttl_s=0.4, every_s=0.1)  # given up 0.3 s after the claim
    monkeypatch.setattr(ledger, "renew_lease", stuck)
    kept.start()
    try:
        wait_for(lambda: seen.lost, timeout=10.0, what="the loss at the deadline")
        assert kept.lost is seen.lost[0] and not release.is_set()  # the renewal still hangs
    finally:
        release.set()
        kept.stop()


def test_a_supervisor_that_cannot_write_its_ledger_gives_the_run_up_as_on_a_loss(ledger: Ledger) -> None:
    seen = Seen()
    kept = keeper(ledger, seen)
    kept.start()
    lost = kept.give_up(LedgerUnavailableError("the ledger database cannot be reached: server closed"))
    assert kept.lost is lost and seen.lost == [lost] and lost.exit_code == 9
    assert "could not be written" in lost.message and "server closed" in lost.message
    assert kept.give_up(RuntimeError("again")) is lost and len(seen.lost) == 1  # once
    kept.release()  # lost: the lease is left to expire for the next owner, not given back
    assert ledger.lease_of(RUN) is not None
    assert LeaseAction.RELEASE not in [h.action for h in ledger.lease_history(RUN)]


def test_a_cancel_request_reaches_the_keeper_once(ledger: Ledger) -> None:
    seen = Seen()
    kept = keeper(ledger, seen)
    kept.start()
    ledger.request_cancel(RUN, "runs cancel on host-b")
    wait_for(lambda: seen.cancels, timeout=10.0, what="the cancel request")
    wait_for(lambda: kept.claim.cancel is not None, timeout=10.0, what="a renewal after it")
    kept.release()
    assert [c.requested_by for c in seen.cancels] == ["runs cancel on host-b"]


@dataclass
class RecordingCloud:
    """What reached the cloud."""

    calls: list[str] = field(default_factory=list)

    def create_node(self, request: NodeRequest, **kwargs: Any) -> Any:
        self.calls.append(f"create {request.name}")

    def delete_node(self, zone: str, name: str, **kwargs: Any) -> None:
        self.calls.append(f"delete {name}")

    def get_node(self, zone: str, name: str) -> Any:
        self.calls.append(f"get {name}")


def test_the_fenced_cloud_records_the_intent_first_and_sends_nothing_once_lost(ledger: Ledger) -> None:
    claim = ledger.claim_lease(RUN, A, LONG)
    inner = RecordingCloud()
    fenced_ledger = ledger.fenced(claim)
    cloud = FencedCloud(cast("TpuCloud", inner), fenced_ledger, claim)
    request = NodeRequest(
        name="slice-1", zone="us-central1-a", accelerator_type="v5litepod-8", runtime_version="v"
    )
    cloud.create_node(request)
    cloud.delete_node("us-central1-a", "slice-1")
    intents = [(i.action, i.pod, i.zone, i.generation) for i in ledger.intents(RUN)]
    assert intents == [
        (IntentAction.CREATE, "slice-1", "us-central1-a", claim.generation),
        (IntentAction.DELETE, "slice-1", "us-central1-a", claim.generation),
    ]
    steal(ledger)
    for mutate in (lambda: cloud.create_node(request), lambda: cloud.delete_node("us-central1-a", "slice-1")):
        with pytest.raises(LeaseLostError):
            mutate()
    cloud.get_node("us-central1-a", "slice-1")  # reading is no act on the run
    assert inner.calls == ["create slice-1", "delete slice-1", "get slice-1"]
    assert len(ledger.intents(RUN)) == 2


def test_the_fenced_cloud_sends_nothing_past_the_keepers_deadline(ledger: Ledger) -> None:
    claim = ledger.claim_lease(RUN, A, LONG)
    inner = RecordingCloud()
    loss = LeaseLostError("the deadline passed", run_id=RUN, generation=claim.generation)
    answers: list[LeaseLostError | None] = []

    def lost() -> LeaseLostError | None:
        return answers.pop(0)

    cloud = FencedCloud(cast("TpuCloud", inner), ledger.fenced(claim), claim, lost=lost)
    answers += [loss]  # lost before: not even the intent is written
    with pytest.raises(LeaseLostError):
        cloud.delete_node("us-central1-a", "slice-1")
    assert ledger.intents(RUN) == []
    answers += [None, loss]  # the intent's write waited on the ledger past the deadline: still not sent
    with pytest.raises(LeaseLostError):
        cloud.delete_node("us-central1-a", "slice-1")
    assert len(ledger.intents(RUN)) == 1
    assert inner.calls == [] and answers == []


@dataclass
class RecordingExecutor:
    calls: list[str] = field(default_factory=list)

    def next_event(self, timeout_s: float) -> HostEvent | None:
        self.calls.append("next_event")
        return None

    def stop(self, grace_s: float = 5.0) -> None:
        self.calls.append("stop")

    def close(self) -> None:
        self.calls.append("close")

    def abandon(self) -> None:
        self.calls.append("abandon")


def test_an_executor_bound_to_a_lost_lease_signals_no_host() -> None:
    inner = RecordingExecutor()
    lost: list[LeaseLostError] = []
    executor = LeaseBoundExecutor(cast("Executor", inner), lambda: lost[0] if lost else None)
    executor.next_event(0.0)
    executor.stop(1.0)
    assert inner.calls == ["next_event", "stop"]
    lost.append(LeaseLostError("gone", run_id=RUN, generation=1))
    with pytest.raises(LeaseLostError):
        executor.next_event(0.0)
    executor.stop(1.0)
    executor.close()
    assert inner.calls == ["next_event", "stop", "abandon"]
