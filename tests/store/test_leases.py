"""Runs' leases: claim, renew and release by the ledger's clock; the refusal that names the holder; the fence
every write passes; the history; cancel requests; two processes racing for one expired lease."""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ledger_sql import other_machine, table_contents, undo_history, write_by_hand

from tpuctl.errors import EXIT_LEASE_HELD, LeaseHeldError, LeaseLostError
from tpuctl.store import (
    SCHEMA_VERSION,
    EventKind,
    IntentAction,
    LeaseAction,
    LeaseClaim,
    LeaseOwner,
    Ledger,
    LedgerError,
    NewEvent,
    RunStatus,
    SegmentKind,
    SliceRef,
)
from tpuctl.store.database import open_database
from tpuctl.store.migrate import sqlite_user_version
from tpuctl.store.migrations import KNOWN
from tpuctl.store.records import AttemptOutcome
from tpuctl.store.secrets import SecretKey, generate_key
from tpuctl.store.url import parse_database_url
from tpuctl.testing.clock import FakeClock, wait_for
from tpuctl.testing.lease_holds import assert_one_holder_at_a_time
from tpuctl.testing.postgres import PostgresCluster
from tpuctl.timefmt import iso

RUN = "r-lease"
A = LeaseOwner("owner-aaaa", "host-a", 1111, 501)
B = LeaseOwner("owner-bbbb", "host-b", 2222, 602)
LONG = 300.0  # a ttl no test outlives
SHORT = 0.4  # a ttl tests wait out (through the ledger's clock, polled)


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger]) -> Iterator[Ledger]:
    with open_ledger() as opened:
        opened.create_run(RUN, script="train.py")
        yield opened


def claim_when_free(ledger: Ledger, owner: LeaseOwner, ttl_s: float = LONG) -> LeaseClaim:
    """Claim as soon as the current lease has expired by the ledger's clock (bounded, in real time)."""

    def attempt() -> LeaseClaim | None:
        try:
            return ledger.claim_lease(RUN, owner, ttl_s)
        except LeaseHeldError:
            return None

    claim = wait_for(attempt, timeout=20.0, what="the lease to expire")
    assert claim is not None  # wait_for returns only a true value
    return claim


def test_claim_renew_release(ledger: Ledger) -> None:
    before = ledger.db_now()
    claim = ledger.claim_lease(RUN, A, 30.0)
    assert (claim.run_id, claim.owner, claim.generation, claim.cancel) == (RUN, A, 1, None)
    assert before + 30.0 <= claim.expires_at <= ledger.db_now() + 30.0
    assert claim.token not in repr(claim)  # the token is its holder's alone, never printed

    holder = ledger.lease_of(RUN)
    assert holder is not None
    assert (holder.owner, holder.generation, holder.expires_at) == (A, 1, claim.expires_at)
    assert not holder.expired and 29.0 < holder.expires_in_s <= 30.0

    renewed = ledger.renew_lease(claim, 60.0)
    assert (renewed.generation, renewed.token) == (1, claim.token)
    assert renewed.expires_at > claim.expires_at + 29.0

    assert ledger.release_lease(renewed) is True
    assert ledger.lease_of(RUN) is None
    assert ledger.release_lease(renewed) is False  # no longer its own: nothing more happens

    again = ledger.claim_lease(RUN, B, 30.0)  # free at once after a release: no wait
    assert again.generation == 2 and again.token != claim.token


def test_a_live_lease_is_refused_naming_its_holder_and_when_it_expires(ledger: Ledger) -> None:
    claim = ledger.claim_lease(RUN, A, 120.0)
    with pytest.raises(LeaseHeldError) as info:
        other_machine(ledger).claim_lease(RUN, B, 120.0)
    err = info.value
    assert err.exit_code == EXIT_LEASE_HELD == 9
    for part in ("host-a", "pid 1111", "owner-aaaa", iso(claim.expires_at), "by the ledger's clock"):
        assert part in err.message, part
    assert 115.0 < err.expires_in_s <= 120.0
    assert f"in {err.expires_in_s:.1f} s" in err.message
    assert f"tpuctl runs cancel {RUN}" in (err.fix or "") and "wait" in (err.fix or "")
    doc = err.to_dict()
    assert doc["error"] == "lease_held" and doc["exit_code"] == 9
    assert doc["owner"] == {"owner_id": "owner-aaaa", "host": "host-a", "pid": 1111}
    assert doc["expires_at"] == claim.expires_at
    with pytest.raises(LeaseHeldError):
        ledger.claim_lease(RUN, A, 120.0)  # its own holder claiming twice is refused too
    assert [h.action for h in ledger.lease_history(RUN)] == [LeaseAction.CLAIM]  # refusals write nothing


def test_expiry_is_judged_by_the_ledgers_clock_not_the_callers(ledger: Ledger) -> None:
    # B's own clock runs ten days ahead: by it, A's lease would be long expired. It still waits.
    skewed = other_machine(ledger, clock=FakeClock(time.time() + 10 * 86400))
    claim = ledger.claim_lease(RUN, A, SHORT)
    assert abs(claim.expires_at - (time.time() + SHORT)) < 5.0  # the database's time, not a fake one
    with pytest.raises(LeaseHeldError):
        skewed.claim_lease(RUN, B, LONG)
    taken = claim_when_free(skewed, B)
    assert taken.generation == 2
    history = ledger.lease_history(RUN)
    assert [h.action for h in history] == [LeaseAction.CLAIM, LeaseAction.TAKEOVER]
    takeover = history[1]
    assert takeover.at >= claim.expires_at  # not before A's lease expired
    assert takeover.owner == B and takeover.generation == 2
    assert takeover.detail == {
        "previous_owner": {"owner_id": A.owner_id, "host": "host-a", "pid": 1111, "start_ticks": 501},
        "previous_generation": 1,
        "previous_expired_at": claim.expires_at,
    }
    with pytest.raises(LeaseLostError) as info:
        ledger.renew_lease(claim, LONG)
    assert "host-b, pid 2222 (owner owner-bbbb) claimed it since (generation 2)" in info.value.message
    assert info.value.exit_code == 9 and info.value.generation == 1


def test_generation_grows_with_every_claim(ledger: Ledger) -> None:
    generations = []
    for owner in (A, B, A):
        claim = ledger.claim_lease(RUN, owner, LONG)
        generations.append(claim.generation)
        ledger.release_lease(claim)
    short = ledger.claim_lease(RUN, A, SHORT)
    generations.append(short.generation)
    generations.append(claim_when_free(ledger, B).generation)  # a takeover counts as well
    assert generations == [1, 2, 3, 4, 5]


def test_an_expired_lease_is_lost_even_when_nobody_took_it(ledger: Ledger) -> None:
    claim = ledger.claim_lease(RUN, A, SHORT)
    wait_for(lambda: (h := ledger.lease_of(RUN)) is not None and h.expired, timeout=20.0, what="expiry")
    with pytest.raises(LeaseLostError) as info:
        ledger.renew_lease(claim, LONG)
    assert "it expired at" in info.value.message and "ago by the ledger's clock" in info.value.message
    with pytest.raises(LeaseLostError):
        ledger.fenced(claim).update_run(RUN, status=RunStatus.RUNNING)
    record = ledger.get_run(RUN)
    assert record is not None and record.status == RunStatus.PENDING
    again = ledger.claim_lease(RUN, A, LONG)  # its own expired lease: a claim, not a takeover
    actions = [(h.action, h.generation) for h in ledger.lease_history(RUN)]
    assert actions == [(LeaseAction.CLAIM, 1), (LeaseAction.LOST, 1), (LeaseAction.CLAIM, 2)]
    assert again.generation == 2


def test_a_stolen_lease_fails_renewal_and_every_fenced_write_and_writes_nothing(
    ledger: Ledger, tmp_path: Path
) -> None:
    claim = ledger.claim_lease(RUN, A, LONG)
    fenced = ledger.fenced(claim)
    assert fenced.fence == claim and ledger.fence is None
    # While it holds, a fenced write is an ordinary write.
    fenced.update_run(RUN, status=RunStatus.RUNNING)
    segment = fenced.add_segment(RUN, SegmentKind.RUNNING, pod="p1", zone="us-central1-a")
    ledger.record_intent(claim, IntentAction.CREATE, "p1", "us-central1-a")
    record = ledger.get_run(RUN)
    assert record is not None and record.status == RunStatus.RUNNING

    # someone rewrites the token by hand
    write_by_hand(ledger, "UPDATE run_leases SET token = 'stolen' WHERE run_id = :run", {"run": RUN})
    before = table_contents(ledger, skip=("run_lease_history",))
    key = SecretKey(generate_key(), "test")
    writes: dict[str, Callable[[], object]] = {
        "update_run": lambda: fenced.update_run(RUN, status=RunStatus.FAILED),
        "add_segment": lambda: fenced.add_segment(RUN, SegmentKind.RECOVERING),
        "close_segment": lambda: fenced.close_segment(segment, steps_completed=5),
        "update_segment": lambda: fenced.update_segment(segment, pod="p2"),
        "record_event": lambda: fenced.record_event(EventKind.DELETED, pod="p1", zone="us-central1-a"),
        "record_events_bulk": lambda: fenced.record_events_bulk(
            [NewEvent(EventKind.REQUESTED, pod="p3", zone="us-central1-a")]
        ),
        "record_attempt": lambda: fenced.record_attempt("req", zone="z-a", outcome=AttemptOutcome.STOCKOUT),
        "record_intent": lambda: ledger.record_intent(claim, IntentAction.DELETE, "p1", "us-central1-a"),
        "update_run_state": lambda: ledger.update_run_state(claim, phase="recovering", attempt=2),
        "append_log_lines": lambda: ledger.append_log_lines(claim, 0, 0, [(1.0, "a line")]),
        "save_bundle": lambda: fenced.save_bundle(RUN, b"bundle"),
        "save_run_request": lambda: fenced.save_run_request(RUN, "{}"),
        "put_secret": lambda: fenced.put_secret(RUN, "ssh", b"key", key),
        "request_cancel": lambda: fenced.request_cancel(RUN, "someone"),
        "renew_lease": lambda: ledger.renew_lease(claim, LONG),
    }
    for name, write in writes.items():
        with pytest.raises(LeaseLostError) as info:
            write()
        assert "its token was changed by someone else" in info.value.message, name
    assert table_contents(ledger, skip=("run_lease_history",)) == before  # not one row written
    lost = [h for h in ledger.lease_history(RUN) if h.action == LeaseAction.LOST]
    assert len(lost) == 1  # once per claim, however often its holder tries
    assert lost[0].owner == A and lost[0].generation == 1 and lost[0].detail is not None
    assert lost[0].detail["during"] == "write"
    # The same writes, unfenced, still work: the ledger itself is not locked by a lost lease.
    ledger.update_run(RUN, status=RunStatus.FAILED)


def test_a_fenced_view_shares_the_ledgers_connection(ledger: Ledger) -> None:
    claim = ledger.claim_lease(RUN, A, LONG)
    with ledger.fenced(claim) as fenced:
        fenced.update_run(RUN, steps=3)
    # Closing the view closed nothing: the ledger it came from still reads and writes.
    record = ledger.get_run(RUN)
    assert record is not None and record.steps == 3
    ledger.update_run(RUN, steps=4)


def test_the_history_has_every_step_with_the_ledgers_time_and_never_the_token(ledger: Ledger) -> None:
    first = ledger.claim_lease(RUN, A, SHORT)
    # Renewed for longer than it was claimed: the ledger's clock has millisecond steps, so a
    # renewal within the same millisecond with the same ttl would give the same expiry.
    first = ledger.renew_lease(first, 2 * SHORT)
    second = claim_when_free(ledger, B)
    with pytest.raises(LeaseLostError):
        ledger.renew_lease(first, LONG)
    ledger.release_lease(second)
    third = ledger.claim_lease(RUN, A, LONG)
    history = ledger.lease_history(RUN)
    assert [(h.action, h.owner.owner_id, h.generation) for h in history] == [
        (LeaseAction.CLAIM, A.owner_id, 1),
        (LeaseAction.RENEW, A.owner_id, 1),
        (LeaseAction.TAKEOVER, B.owner_id, 2),
        (LeaseAction.LOST, A.owner_id, 1),
        (LeaseAction.RELEASE, B.owner_id, 2),
        (LeaseAction.CLAIM, A.owner_id, 3),
    ]
    times = [h.at for h in history]
    assert times == sorted(times) and abs(times[-1] - time.time()) < 5.0
    claimed_until, renewed_until = history[0].expires_at, history[1].expires_at
    assert claimed_until is not None and renewed_until is not None and renewed_until > claimed_until
    assert history[4].expires_at is None  # a release leaves no expiry
    history_rows = table_contents(ledger)["run_lease_history"]
    for claim in (first, second, third):
        assert claim.token not in "\n".join(history_rows)


def test_consecutive_renewals_are_one_history_row_with_the_latest_expiry(ledger: Ledger) -> None:
    claim = ledger.claim_lease(RUN, A, LONG)
    for ttl in (LONG + 1, LONG + 2, LONG + 3, LONG + 4, LONG + 5):
        claim = ledger.renew_lease(claim, ttl)
    ledger.release_lease(claim)
    again = ledger.claim_lease(RUN, A, LONG)
    ledger.renew_lease(again, LONG)
    history = ledger.lease_history(RUN)
    assert [(h.action, h.generation) for h in history] == [
        (LeaseAction.CLAIM, 1),
        (LeaseAction.RENEW, 1),
        (LeaseAction.RELEASE, 1),
        (LeaseAction.CLAIM, 2),
        (LeaseAction.RENEW, 2),
    ]
    renewed = history[1]
    assert renewed.detail == {"renewals": 5}
    assert renewed.expires_at == claim.expires_at  # the last renewal's
    assert history[4].detail == {"renewals": 1}


def test_a_cancel_asked_from_another_machine_reaches_the_owner(ledger: Ledger) -> None:
    claim = ledger.claim_lease(RUN, A, LONG)
    laptop = other_machine(ledger)  # holds no lease
    request = laptop.request_cancel(RUN, "bob@laptop")
    assert request.requested_by == "bob@laptop" and abs(request.requested_at - time.time()) < 5.0
    assert laptop.request_cancel(RUN, "carol@ci") == request  # the first request stands
    renewed = ledger.renew_lease(claim, LONG)
    assert renewed.cancel == request
    assert ledger.cancel_requested(RUN) == request
    with pytest.raises(LedgerError, match="no run 'nope'"):
        laptop.request_cancel("nope", "bob")


def test_only_the_leases_holder_clears_a_cancel_request(ledger: Ledger) -> None:
    claim = ledger.claim_lease(RUN, A, LONG)
    laptop = other_machine(ledger)
    laptop.request_cancel(RUN, "bob@laptop")
    stale = LeaseClaim(RUN, B, "not-the-token", claim.generation, claim.expires_at, None)
    with pytest.raises(LeaseLostError):
        ledger.clear_cancel(stale)
    assert ledger.cancel_requested(RUN) is not None
    ledger.clear_cancel(claim)
    assert ledger.cancel_requested(RUN) is None
    assert laptop.request_cancel(RUN, "carol@ci").requested_by == "carol@ci"  # a new one stands again


def test_a_claim_needs_a_run_and_a_positive_ttl(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="no run 'nope'"):
        ledger.claim_lease("nope", A, LONG)
    for ttl in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="ttl"):
            ledger.claim_lease(RUN, A, ttl)
    assert ledger.lease_of(RUN) is None and ledger.lease_history(RUN) == []


def test_an_owner_of_this_process_is_unique_and_names_it() -> None:
    import os

    one, two = LeaseOwner.of_this_process(), LeaseOwner.of_this_process()
    assert one.pid == os.getpid() and one.host == os.uname().nodename
    assert one.owner_id != two.owner_id  # random per supervisor process, not derived from the pid
    assert one.start_ticks is None or one.start_ticks > 0


def test_a_v9_ledger_gains_the_lease_tables_and_keeps_its_runs(tmp_path: Path) -> None:
    with Ledger(tmp_path / "s") as ledger:
        ledger.create_run("old", script="train.py")
        db = ledger.path
    with sqlite3.connect(db) as raw:
        for table in ("run_leases", "run_lease_history", "run_cancel_requests", "run_intents"):
            raw.execute(f"DROP TABLE {table}")
        for table in ("run_state", "run_blobs", "run_secrets", "run_log_lines"):
            raw.execute(f"DROP TABLE {table}")
        # ... and what came after the hand-written migrations: a ledger from before the history.
        undo_history(raw)
        raw.execute("PRAGMA user_version = 9")
    with Ledger(tmp_path / "s") as ledger:
        assert ledger.schema_version == sqlite_user_version() == SCHEMA_VERSION + len(KNOWN) - 1
        assert ledger.get_run("old") is not None
        claim = ledger.claim_lease("old", A, LONG)
        ledger.update_run_state(claim, phase="running", slices=[SliceRef("p", "us-central1-a")])
        assert ledger.integrity_check() == "ok"


# -- two processes racing ----------------------------------------------------------------------------


def _race_to_claim(db: str, owner_id: str, go: Any, results: Any) -> None:  # runs in a child process
    """A racer (another process): open the ledger, say so, wait for the start, claim once (a short lease,
    so the next round can begin soon), report."""
    owner = LeaseOwner(owner_id, "racer", 0, None)
    try:
        with _open(db) as ledger:
            results.put(("ready", owner_id, None))
            go.wait(60)
            try:
                claim = ledger.claim_lease(RUN, owner, SHORT)
                results.put(("won", owner_id, claim.generation))
            except LeaseHeldError as exc:
                results.put(("held", owner_id, exc.owner_id))
    except BaseException as exc:  # reported, so the test fails with the reason instead of a timeout
        results.put(("error", owner_id, repr(exc)))


def _open(where: str) -> Ledger:
    """The ledger at ``where``: a SQLite file's path, or a PostgreSQL database's URL."""
    if where.startswith("postgresql"):
        return Ledger(open_database(parse_database_url(where)))
    return Ledger(where)


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_two_processes_racing_for_an_expired_lease_one_wins(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    # Forked racers (a spawned one would take a second to import): no connection may be open in this
    # process when it forks (SQLite's per-file lock state, a PostgreSQL socket would be copied into the
    # child), so the ledger is opened here only between the forks. On PostgreSQL the racers' claims run
    # over concurrent connections of one server.
    db = str(tmp_path / "state" / "ledger.db")
    if engine == "postgresql":
        db = str(request.getfixturevalue("postgres_ledger_url"))
    with _open(db) as ledger:
        ledger.create_run(RUN, script="train.py")
        expired = ledger.claim_lease(RUN, A, SHORT)
    context = multiprocessing.get_context("fork")
    winners: list[str] = []
    for round_ in range(2):
        if round_:  # A takes the lease back from the last winner, and lets it expire again
            with _open(db) as ledger:
                expired = claim_when_free(ledger, A, SHORT)
        go, results = context.Event(), context.Queue()
        names = [f"racer-{round_}-{i}" for i in range(3)]
        procs = [context.Process(target=_race_to_claim, args=(db, n, go, results)) for n in names]
        for proc in procs:
            proc.start()
        try:
            ready = [results.get(timeout=60) for _ in names]
            assert all(r[0] == "ready" for r in ready), ready
            with _open(db) as ledger:
                wait_for(lambda: (h := ledger.lease_of(RUN)) is not None and h.expired, timeout=20.0)
            go.set()
            outcomes = [results.get(timeout=60) for _ in names]
        except queue.Empty:
            pytest.fail("a racing process did not report in 60 s")
        finally:
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.kill()
        won = [o for o in outcomes if o[0] == "won"]
        assert len(won) == 1, outcomes
        assert all(o[0] == "held" and o[2] == won[0][1] for o in outcomes if o is not won[0]), outcomes
        assert won[0][2] == expired.generation + 1
        winners.append(str(won[0][1]))
        with _open(db) as ledger:
            holder = ledger.lease_of(RUN)
            assert holder is not None and holder.owner.owner_id == winners[-1]
    with _open(db) as ledger:
        takeovers = [h.owner.owner_id for h in ledger.lease_history(RUN) if h.action == LeaseAction.TAKEOVER]
    assert takeovers == [winners[0], A.owner_id, winners[1]]


def test_orphans_are_the_unfinished_resumable_runs_nobody_holds(open_ledger: Callable[..., Ledger]) -> None:
    with open_ledger() as ledger:
        for run_id in ("held", "expired", "released", "never", "finished", "unsaved"):
            ledger.create_run(run_id, script="train.py")
            if run_id != "unsaved":
                ledger.save_run_request(run_id, "{}")
        ledger.update_run("finished", status=RunStatus.SUCCEEDED)
        ledger.claim_lease("held", A, LONG)
        short = ledger.claim_lease("expired", A, SHORT)
        ledger.release_lease(ledger.claim_lease("released", B, LONG))
        wait_for(lambda: ledger.db_now() > short.expires_at, timeout=20.0, what="the short lease's expiry")
        assert ledger.orphans() == ["expired", "released", "never"]
        assert ledger.orphans(limit=1) == ["expired"]

        # A server claims them in one go, oldest first, skipping what it is told to (its own, its back-offs).
        ledger.request_cancel("released", "a test")
        assert ledger.claim_orphans(B, LONG, limit=0) == []
        first = ledger.claim_orphans(B, LONG, limit=1, excluding=["expired"])
        assert [(c.run_id, c.generation, c.cancel) for c in first] == [("released", 2, first[0].cancel)]
        assert first[0].cancel is not None and first[0].cancel.requested_by == "a test"  # read with the claim
        rest = ledger.claim_orphans(B, LONG, limit=10)
        assert [(c.run_id, c.generation, c.owner) for c in rest] == [("expired", 2, B), ("never", 1, B)]
        assert ledger.orphans() == [] and ledger.claim_orphans(A, LONG, limit=10) == []
        assert [h.action for h in ledger.lease_history("expired")] == [
            LeaseAction.CLAIM,
            LeaseAction.TAKEOVER,
        ]


# -- claims over concurrent PostgreSQL connections -------------------------------------------------------
#
# SQLite has one writer at a time, so these run on PostgreSQL alone, where a lease's claim, renewal and
# release lock its row instead of the ledger-wide write lock. Each thread has its own ledger (its own
# connection). A race that needs one side paused inside its transaction is paused on a lock the test holds
# from a connection of its own on the run's row (the history's and the run's writes need it), and released
# once the other side is seen waiting in the server (``pg_stat_activity``): no sleep decides the order.

RACERS = 4
RACED_RUNS = 12
RACE_TTL = 0.6  # a lease a race outlives the start of, then waits out (through the ledger's clock)


@pytest.fixture(scope="module")
def raced_url(postgres_cluster: PostgresCluster, postgres_ledger_template: str) -> Iterator[str]:
    """One PostgreSQL ledger for the races below (each on runs of its own): a new one per test would
    cost more than the races themselves."""
    with postgres_cluster.scratch_database("races", template=postgres_ledger_template) as url:
        yield url


def _race(
    ledgers: list[Ledger], attempts: list[Callable[[Ledger], list[LeaseClaim]]]
) -> list[list[LeaseClaim]]:
    """Run each attempt on a thread of its own with a ledger of its own (its connection), started
    together."""
    go = threading.Barrier(len(attempts))
    won: list[list[LeaseClaim]] = [[] for _ in attempts]
    failed: list[BaseException] = []

    def racer(i: int) -> None:
        try:
            go.wait(timeout=30)
            won[i] = attempts[i](ledgers[i])
        except BaseException as exc:  # reported below, in the test's thread
            failed.append(exc)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(len(attempts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failed, failed
    assert not any(t.is_alive() for t in threads), "a racer did not finish in 60 s"
    return won


def _each_one(owner: LeaseOwner, run_ids: list[str], ttl_s: float) -> Callable[[Ledger], list[LeaseClaim]]:
    """A racer that claims the runs one by one (``claim_lease``), in an order of its own."""

    def attempt(ledger: Ledger) -> list[LeaseClaim]:
        won = []
        for run_id in random.Random(owner.owner_id).sample(run_ids, len(run_ids)):
            with contextlib.suppress(LeaseHeldError):
                won.append(ledger.claim_lease(run_id, owner, ttl_s))
        return won

    return attempt


def _orphans(owner: LeaseOwner, ttl_s: float) -> Callable[[Ledger], list[LeaseClaim]]:
    """A racer that claims the runs nobody holds a few at a time until none is left, as a server's ticks
    do (``claim_orphans``)."""

    def attempt(ledger: Ledger) -> list[LeaseClaim]:
        won: list[LeaseClaim] = []
        while claims := ledger.claim_orphans(owner, ttl_s, limit=3):
            won.extend(claims)
        return won

    return attempt


def test_many_claimers_racing_for_many_runs_claim_each_run_once(raced_url: str) -> None:
    run_ids = [f"race-{i:02d}" for i in range(RACED_RUNS)]
    owners = [LeaseOwner(f"racer-{i}", f"host-{i}", 100 + i, None) for i in range(RACERS)]
    with contextlib.ExitStack() as opened:
        ledgers = [opened.enter_context(_open(raced_url)) for _ in owners]
        for run_id in run_ids:
            ledgers[0].create_run(run_id, script="train.py")
            ledgers[0].save_run_request(run_id, "{}")
        for round_ in (1, 2):  # runs never claimed (no lease row yet), then every lease released
            attempts = [
                _orphans(o, LONG) if i % 2 else _each_one(o, run_ids, LONG) for i, o in enumerate(owners)
            ]
            claims = [c for by_one in _race(ledgers, attempts) for c in by_one]
            assert sorted(c.run_id for c in claims) == run_ids  # every run once: no run twice, none missed
            assert {c.generation for c in claims} == {round_}
            assert all(ledgers[0].release_lease(c) for c in claims)
        found = assert_one_holder_at_a_time(ledgers[0].lease_history(r) for r in run_ids)
    assert len(found) == 2 * RACED_RUNS


@contextlib.contextmanager
def _run_row_locked(url: str, run_id: str) -> Iterator[Callable[[int], None]]:
    """Hold a lock on the run's row from a connection of the test's own (a write under the run, or a new
    lease-history row, waits for it); yields a wait for ``n`` of the database's sessions to be waiting on
    a lock. The lock goes when the block ends."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1 FROM runs WHERE run_id = :r FOR UPDATE"), {"r": run_id})

            def waiting(n: int) -> None:
                def count() -> bool:
                    with engine.connect() as probe:
                        found = probe.execute(
                            sqlalchemy.text(
                                "SELECT count(*) FROM pg_stat_activity "
                                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                            )
                        ).scalar_one()
                    return int(found) >= n

                wait_for(count, timeout=20.0, interval=0.02, what=f"{n} sessions waiting on a lock")

            yield waiting
            conn.rollback()
    finally:
        engine.dispose()


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``call`` on a thread; its result (or the exception it raised) in the list once it ends."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _ended(thread: threading.Thread, outcome: list[Any]) -> Any:
    thread.join(timeout=30)
    assert not thread.is_alive() and len(outcome) == 1, "the racer did not end"
    return outcome[0]


def test_a_renewal_racing_a_takeover_wins_when_its_lock_came_first(raced_url: str) -> None:
    run = "renewed-first"
    with _open(raced_url) as a, _open(raced_url) as b, _open(raced_url) as server:
        a.create_run(run, script="train.py")
        a.save_run_request(run, "{}")
        claim = a.claim_lease(run, A, RACE_TTL)
        with _run_row_locked(raced_url, run) as waiting:
            # A renews before its lease expires; the renewal's history row waits on the test's lock, so
            # A's transaction holds the lease row, renewed but not committed, past the old expiry.
            renewing = _in_thread(lambda: a.renew_lease(claim, LONG))
            waiting(1)
            wait_for(lambda: b.db_now() > claim.expires_at, timeout=20.0, what="the old expiry")
            # A server's tick skips the locked lease rather than wait for it ...
            assert run not in [c.run_id for c in server.claim_orphans(B, LONG, limit=100)]
            # ... and B's claim, which sees only the committed (expired) lease, waits for A to commit.
            taking = _in_thread(lambda: b.claim_lease(run, B, LONG))
            waiting(2)
            assert taking[0].is_alive()
        renewed = _ended(*renewing)
        refused = _ended(*taking)
        assert isinstance(renewed, LeaseClaim) and renewed.expires_at > claim.expires_at + LONG / 2
        assert isinstance(refused, LeaseHeldError) and refused.owner_id == A.owner_id
        assert [h.action for h in a.lease_history(run)] == [LeaseAction.CLAIM, LeaseAction.RENEW]
        assert_one_holder_at_a_time([a.lease_history(run)])


def test_a_fenced_write_racing_a_takeover_lands_before_it(raced_url: str) -> None:
    run = "written-first"
    with _open(raced_url) as a, _open(raced_url) as b:
        a.create_run(run, script="train.py")
        claim = a.claim_lease(run, A, RACE_TTL)
        with _run_row_locked(raced_url, run) as waiting:
            # A's write passed its fence and waits on the run's row, holding its lease row for share.
            writing = _in_thread(lambda: a.fenced(claim).update_run(run, status=RunStatus.RUNNING))
            waiting(1)
            wait_for(lambda: b.db_now() > claim.expires_at, timeout=20.0, what="the lease's expiry")
            taking = _in_thread(lambda: b.claim_lease(run, B, LONG))
            waiting(2)  # the takeover waits for the write: it cannot commit between fence and write
            assert taking[0].is_alive()
        assert not isinstance(_ended(*writing), BaseException)
        taken = _ended(*taking)
        assert isinstance(taken, LeaseClaim) and taken.generation == 2
        with pytest.raises(LeaseLostError):  # and after the takeover, A's next write is refused
            a.fenced(claim).update_run(run, status=RunStatus.FAILED)
        record = b.get_run(run)
        assert record is not None and record.status == RunStatus.RUNNING
        actions = [h.action for h in b.lease_history(run)]
        assert actions == [LeaseAction.CLAIM, LeaseAction.TAKEOVER, LeaseAction.LOST]


def test_a_fenced_write_racing_a_takeover_that_locked_first_is_refused(raced_url: str) -> None:
    run = "taken-first"
    with _open(raced_url) as a, _open(raced_url) as b:
        a.create_run(run, script="train.py")
        claim = a.claim_lease(run, A, 0.05)
        wait_for(lambda: b.db_now() > claim.expires_at, timeout=20.0, what="the lease's expiry")
        with _run_row_locked(raced_url, run) as waiting:
            # B's takeover holds the lease row, its history row waiting on the test's lock ...
            taking = _in_thread(lambda: b.claim_lease(run, B, LONG))
            waiting(1)
            # ... and A's write waits at its fence for B to commit or not.
            writing = _in_thread(lambda: a.fenced(claim).update_run(run, status=RunStatus.RUNNING))
            waiting(2)
            assert writing[0].is_alive()
        assert isinstance(_ended(*taking), LeaseClaim)
        assert isinstance(_ended(*writing), LeaseLostError)
        record = b.get_run(run)
        assert record is not None and record.status == RunStatus.PENDING  # nothing of A's write
