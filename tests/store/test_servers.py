"""The ledger's servers and submissions (``tpuctl.store.servers``): one server per embedded ledger, its
place renewed and given back; an idempotency key kept with the first run it made."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LeaseOwner
from tpuctl.store.servers import ReplicaLimitError
from tpuctl.testing.clock import wait_for


def owner(pid: int) -> LeaseOwner:
    return dataclasses.replace(LeaseOwner.of_this_process(), pid=pid)


def test_a_second_server_is_refused_naming_the_first_until_the_first_gives_its_place_back(
    tmp_path: Path,
) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        first = ledger.claim_replica(owner(101), "127.0.0.1:8471", 30)
        with pytest.raises(ReplicaLimitError) as caught:
            ledger.claim_replica(owner(102), "127.0.0.1:8472", 30)
        assert caught.value.exit_code == 2 and "pid 101" in caught.value.message
        assert "127.0.0.1:8471" in caught.value.message
        assert [r.owner.pid for r in caught.value.others] == [101]
        assert ledger.renew_replica(first.owner.owner_id, 30)
        ledger.release_replica(first.owner.owner_id)
        assert not ledger.renew_replica(first.owner.owner_id, 30)  # gone: no longer one of the ledger's
        ledger.claim_replica(owner(102), "127.0.0.1:8472", 30)
        assert [r.owner.pid for r in ledger.replicas()] == [102]


def test_an_expired_place_is_taken_and_a_proven_dead_one_replaced(open_ledger: Callable[..., Ledger]) -> None:
    with open_ledger() as ledger:
        dead = ledger.claim_replica(owner(101), "127.0.0.1:1", 0.05)
        assert ledger.replicas()[0].owner == dead.owner
        wait_for(lambda: ledger.replicas()[0].expired, timeout=10.0, interval=0.01, what="the claim's expiry")
        ledger.claim_replica(owner(102), "127.0.0.1:2", 30)  # the first expired
        assert [r.owner.pid for r in ledger.replicas()] == [102]
        live = ledger.replicas()[0].owner.owner_id
        ledger.claim_replica(owner(103), "127.0.0.1:3", 30, replacing=frozenset({live}))
        assert [r.owner.pid for r in ledger.replicas()] == [103]


def test_an_idempotency_key_keeps_the_first_run_it_named(open_ledger: Callable[..., Ledger]) -> None:
    with open_ledger() as ledger:
        assert ledger.submission("k1") is None
        first = ledger.remember_submission("k1", "run-a", "digest-a")
        again = ledger.remember_submission("k1", "run-b", "digest-b")
        assert (
            (first.run_id, first.request_sha256)
            == (again.run_id, again.request_sha256)
            == ("run-a", "digest-a")
        )
        assert ledger.submission("k1") == first
        ledger.forget_submission("k1", "run-b")  # not its run: kept
        assert ledger.submission("k1") == first
        ledger.forget_submission("k1", "run-a")  # its run was never recorded: a retry may try again
        assert ledger.submission("k1") is None


def test_a_postgresql_ledger_takes_several_servers(open_ledger: Callable[..., Ledger]) -> None:
    with open_ledger() as ledger:
        if ledger.url.path is not None:
            assert ledger.max_replicas == 1  # the embedded file: the test above
            return
        for pid in (101, 102, 103):
            ledger.claim_replica(owner(pid), f"127.0.0.1:{pid}", 30)
        assert [r.owner.pid for r in ledger.replicas()] == [101, 102, 103]
