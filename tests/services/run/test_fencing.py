"""A supervisor's hold on its run without a cloud or hosts: the lease kept renewed, a loss or a cancel
request seen at renewal, the cloud's mutations refused once the lease is lost (before the request is
sent), and an executor that lets its hosts go unsignalled once lost."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from tpuctl.cloud.base import NodeRequest, TpuCloud
from tpuctl.errors import LeaseLostError
from tpuctl.hosts.base import Executor, HostEvent
from tpuctl.services.run.fencing import FencedCloud, LeaseBoundExecutor, LeaseKeeper
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import CancelRequest, IntentAction, LeaseAction, LeaseClaim, LeaseOwner
from tpuctl.testing.clock import wait_for

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
