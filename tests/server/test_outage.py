"""`tpuctl server` when its PostgreSQL goes away, one host and a tiny program on the served simulator, the
database a cluster of this module's own (these tests restart and stop it):

- (``--slow``) restarted mid-run (``pg_ctl restart``): the server reconnects and carries the run to its
  end; one slice created, the last one deleted, every line of the program in the ledger once;
- (``--slow``) down for longer than the lease, with two replicas, just as the program ends and its slice
  is due for deletion: both say not ready meanwhile; no create or delete reaches the cloud from a
  replica past its lease's local deadline (the simulator's request log against the lease history); when
  the database is back one replica carries the run on; no slice created or deleted twice.

And, without a server: the readiness probe answers in bounded time while the ledger does not.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx
import pytest
from server_place import WORLD, Place, make_place, output

from tpuctl.server.app import LedgerProbe
from tpuctl.services.run.fencing import loss_margin
from tpuctl.sim import SimAdminClient
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LeaseAction, LeaseHistoryRecord, RunStatus
from tpuctl.testing.clock import wait_for
from tpuctl.testing.ports import unused_port
from tpuctl.testing.postgres import PostgresCluster

LEASE_S, RENEW_EVERY_S = 3.0, 0.5
LINES = 20
#: A quarter second a line (5 s: time to act on the database mid-run on a loaded machine).
PROGRAM = f"""
import os, time
attempt = os.environ.get("TPUCTL_RESTART_COUNT", "0")
for i in range({LINES}):
    print(f"attempt {{attempt}} line {{i}}", flush=True)
    time.sleep(0.25)
"""


@pytest.fixture(scope="module")
def outage_cluster() -> Iterator[PostgresCluster]:
    with PostgresCluster.start() as cluster:
        yield cluster


def node_mutations(place: Place, method: str) -> list[float]:
    """When each create (POST) or delete (DELETE) of a node reached the cloud."""
    return [
        float(m["at"])
        for m in place.admin.mutations()
        if m["method"] == method and "/nodes" in m["path"] and ":" not in m["path"].rsplit("/", 1)[-1]
    ]


def another_server(place: Place) -> tuple[subprocess.Popen[bytes], str]:
    """One more server on the place's ledger, at an address of its own; it and its URL."""
    elsewhere = dataclasses.replace(place, url=f"http://127.0.0.1:{unused_port()}")
    return elsewhere.start_server(), elsewhere.url


@pytest.fixture
def place(
    tmp_path: Path, serve_sim: Callable[..., SimAdminClient], outage_cluster: PostgresCluster
) -> Iterator[Place]:
    """A place (``server_place``) on a database of the module's cluster, which its test may stop."""
    name = f"outage_{os.urandom(6).hex()}"
    database = outage_cluster.create_database(name)
    lease = {"TPUCTL_LEASE_DURATION": f"{LEASE_S:g}", "TPUCTL_LEASE_RENEW_EVERY": f"{RENEW_EVERY_S:g}"}
    try:
        yield from make_place(tmp_path, serve_sim, database, world=WORLD, program=PROGRAM, server_env=lease)
    finally:
        if outage_cluster.pid is None:
            outage_cluster.start_again()
        outage_cluster.drop_database(name)


def _readiness(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/readyz", timeout=10).status_code
    except httpx.TransportError:
        return None


def _printed(place: Place, run_id: str, lines: int) -> int | None:
    """The pid of the server holding the run once it has ``lines`` lines in the ledger."""
    with place.ledger() as ledger:
        held = ledger.lease_of(run_id)
        stored = ledger.log_lines(run_id, worker=0)
    return held.owner.pid if held is not None and len(stored) >= lines else None


def _ended(place: Place, run_id: str, servers: list[subprocess.Popen[bytes]]) -> RunStatus:
    def ended() -> RunStatus | None:
        for server in servers:
            assert server.poll() is None, output(server)
        with place.ledger() as ledger:
            record = ledger.get_run(run_id)
        assert record is not None
        status = RunStatus(record.status)
        return status if status.finished else None

    status = wait_for(ended, timeout=120.0, interval=0.2, what=f"run {run_id} to end")
    assert status is not None
    return status


def _attempts(place: Place, run_id: str) -> set[str]:
    """The attempts whose lines reached the ledger ("0", "1", ...)."""
    with place.ledger() as ledger:
        return {
            line.text.split()[1]
            for line in ledger.log_lines(run_id, worker=0)
            if line.text.startswith("attempt ")
        }


def _lines_once(place: Place, run_id: str) -> None:
    """Every line of the last attempt in the ledger, and no line of any attempt twice."""
    with place.ledger() as ledger:
        texts = [line.text for line in ledger.log_lines(run_id, worker=0)]
    printed = [t for t in texts if t.startswith("attempt ")]
    assert len(printed) == len(set(printed)), printed
    last = printed[-1].split()[1]
    assert [f"attempt {last} line {i}" for i in range(LINES)] == [t for t in printed if t.split()[1] == last]


# ~20 s (a server, a slice, a program): slow. The same restart under one ledger is in the default suite
# (tests/store/test_database.py).
@pytest.mark.slow
def test_a_database_restart_mid_run_is_waited_out_and_the_run_carries_on(
    place: Place, outage_cluster: PostgresCluster
) -> None:
    server, url = place.start_server(), place.url
    run_id = place.submit_detached()
    wait_for(lambda: _printed(place, run_id, 3), timeout=120.0, interval=0.1, what="the run to print")

    outage_cluster.restart()  # every connection the server holds is dropped

    assert _ended(place, run_id, [server]) is RunStatus.SUCCEEDED
    assert _readiness(url) == 200  # reconnected
    # One slice per attempt (one attempt, unless a loaded machine let the lease lapse and the server took
    # its own run over), each deleted once, the last one too.
    attempts = _attempts(place, run_id)
    assert len(node_mutations(place, "POST")) == len(node_mutations(place, "DELETE")) == len(attempts)
    deleted = [d["name"] for d in place.admin.deletions()]
    assert len(deleted) == len(set(deleted)) and place.admin.status()["nodes"] == []
    _lines_once(place, run_id)
    with place.ledger() as ledger:
        owners = {h.owner.pid for h in ledger.lease_history(run_id)}
    assert owners == {server.pid}


@dataclass(frozen=True)
class Held:
    """One generation of the run's lease as the ledger recorded it: from its claim to its release or its
    last expiry (``until``), and the keeper's local deadline at or before that (``acting_until``)."""

    generation: int
    pid: int
    since: float
    until: float
    acting_until: float


def _held(history: list[LeaseHistoryRecord]) -> list[Held]:
    margin = loss_margin(LEASE_S, RENEW_EVERY_S)
    spans: dict[int, Held] = {}
    for entry in history:
        span = spans.get(entry.generation)
        if span is None:
            until = entry.expires_at or entry.at
            spans[entry.generation] = Held(entry.generation, entry.owner.pid, entry.at, until, until - margin)
        elif entry.action is LeaseAction.RELEASE:
            spans[entry.generation] = dataclasses.replace(span, until=entry.at)
        elif entry.expires_at is not None:
            until = max(span.until, entry.expires_at)
            spans[entry.generation] = dataclasses.replace(span, until=until, acting_until=until - margin)
    return sorted(spans.values(), key=lambda held: held.since)


@pytest.mark.slow
def test_a_database_down_past_the_lease_stops_every_replica_acting_and_one_carries_the_run_on(
    place: Place, outage_cluster: PostgresCluster
) -> None:
    a, a_url = place.start_server(), place.url
    b, b_url = another_server(place)
    run_id = place.submit_detached()  # through A
    # Down just before the program's end, so that its slice falls due for deletion in the outage.
    holder_pid = wait_for(
        lambda: _printed(place, run_id, LINES - 8), timeout=120.0, interval=0.05, what="the run near its end"
    )
    outage_cluster.stop()
    down_at = time.time()
    try:
        for url in (a_url, b_url):  # each says so within its probe's time and an HTTP round trip
            began = time.monotonic()
            assert _readiness(url) == 503
            assert time.monotonic() - began < 5.0
        wait_for(lambda: time.time() - down_at > 2.5 * LEASE_S, timeout=30.0, interval=0.1)
    finally:
        outage_cluster.start_again()

    assert _ended(place, run_id, [a, b]) is RunStatus.SUCCEEDED
    with place.ledger() as ledger:
        history = ledger.lease_history(run_id)
    said = "\n".join(
        f"{h.at:.3f} {h.action} g{h.generation} pid {h.owner.pid} -> {h.expires_at}" for h in history
    )
    held = _held(history)
    at_outage = [span for span in held if span.since <= down_at][-1]  # (a loaded machine may lose one before)
    assert at_outage.pid == holder_pid and at_outage.until > down_at - LEASE_S, said
    for before, after in itertools.pairwise(held):  # never two holders at once
        assert after.since >= before.until, said
    # Someone carried the run on after the outage, under a new generation claimed once the holder's lease
    # had expired (a TAKEOVER by the other replica, or a CLAIM by the same one taking its run back).
    carried = [h for h in history if h.action in (LeaseAction.CLAIM, LeaseAction.TAKEOVER)]
    assert any(h.generation > at_outage.generation and h.at >= at_outage.until for h in carried), said
    creates, deletes = node_mutations(place, "POST"), node_mutations(place, "DELETE")
    for at in creates + deletes:  # each sent inside a lease, before its holder's local deadline
        assert any(span.since <= at < span.acting_until for span in held), f"{at}\n{said}"
    # A takeover runs the program again on a slice of its own (as after a crash): one per attempt, each
    # created once and deleted once, the last one too.
    attempts = _attempts(place, run_id)
    assert len(creates) == len(attempts) and len(deletes) == len(attempts), said
    deleted = [d["name"] for d in place.admin.deletions()]
    assert len(deleted) == len(set(deleted)) and place.admin.status()["nodes"] == []
    _lines_once(place, run_id)
    for server in (a, b):
        assert _readiness(a_url if server is a else b_url) == 200


@dataclass
class SlowLedger:
    """A ledger whose database does not answer until released."""

    released: threading.Event = dataclasses.field(default_factory=threading.Event)
    asked: int = 0

    def db_now(self) -> float:
        self.asked += 1
        self.released.wait(30.0)
        return time.time()


def test_the_readiness_probe_answers_in_bounded_time_while_the_ledger_does_not() -> None:
    ledger = SlowLedger()
    probe = LedgerProbe(cast("Ledger", ledger), timeout_s=0.2)
    try:
        began = time.monotonic()
        assert probe.answers() is False and probe.answers() is False
        assert time.monotonic() - began < 5.0
        assert ledger.asked == 1  # the second probe waited on the first question, not a new thread
    finally:
        ledger.released.set()
    wait_for(probe.answers, timeout=5.0, what="the ledger to answer again")
