"""A server's place among its ledger's servers: a live first server is never replaced; one that ran on this
host and whose process is provably gone is replaced at once, without waiting for its claim to expire."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuctl.processes import process_start_ticks
from tpuctl.server import membership
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LeaseOwner
from tpuctl.store.servers import ReplicaLimitError


def test_a_live_server_keeps_its_place(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        membership.join(ledger, LeaseOwner.of_this_process(), "127.0.0.1:1", 60)  # this very process
        with pytest.raises(ReplicaLimitError) as caught:
            membership.join(ledger, LeaseOwner.of_this_process(), "127.0.0.1:2", 60)
        assert f"pid {os.getpid()}" in caught.value.message


def test_a_dead_server_on_this_host_is_replaced_at_once(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = process_start_ticks(gone.pid)
    gone.wait()
    dead = dataclasses.replace(LeaseOwner.of_this_process(), pid=gone.pid, start_ticks=ticks or 1)
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.claim_replica(dead, "127.0.0.1:1", 60)
        me = LeaseOwner.of_this_process()
        membership.join(ledger, me, "127.0.0.1:2", 60)
        assert [r.owner for r in ledger.replicas()] == [me]


def test_a_server_on_another_host_is_never_judged_dead_from_here(tmp_path: Path) -> None:
    elsewhere = dataclasses.replace(LeaseOwner.of_this_process(), host="another-host", pid=1)
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.claim_replica(elsewhere, "127.0.0.1:1", 60)
        with pytest.raises(ReplicaLimitError):
            membership.join(ledger, LeaseOwner.of_this_process(), "127.0.0.1:2", 60)
