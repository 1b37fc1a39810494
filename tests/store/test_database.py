"""A PostgreSQL ledger through its server's restarts and outages: a transaction after a restart gets a
fresh connection, one begun while the server is away waits for it to come back (up to the ledger's busy
timeout), one the restart cut in the middle fails with a retryable error and leaves nothing half
written, and errors that waiting would not cure are not called retryable.

These stop and restart the session's cluster, always starting it again (as tests/testing/test_postgres.py
does): a test's process runs its tests one at a time, so no other test sees it down."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from tpuctl.store.database import PostgresDatabase, open_database
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LedgerBusyError, LedgerError, LedgerUnavailableError
from tpuctl.store.url import parse_database_url
from tpuctl.testing.postgres import PostgresCluster


@pytest.fixture
def cluster(postgres_cluster: PostgresCluster, postgres_url: str) -> Iterator[PostgresCluster]:
    """The session's cluster, running again after the test whatever the test left it as (before the
    test's database is dropped: hence after ``postgres_url`` here)."""
    try:
        yield postgres_cluster
    finally:
        if postgres_cluster.pid is None:
            postgres_cluster.start_again()


def opened(url: str, *, wait_s: float = 30.0) -> Ledger:
    return Ledger(open_database(parse_database_url(url), busy_timeout_s=wait_s))


def test_a_restart_goes_unnoticed_an_outage_is_waited_out_and_a_longer_one_is_a_retryable_error(
    cluster: PostgresCluster, postgres_url: str
) -> None:
    with opened(postgres_url, wait_s=10.0) as ledger, opened(postgres_url, wait_s=0.3) as impatient:
        ledger.create_run("r-1", script="train.py")
        cluster.restart()  # every pooled connection dies with the old server
        ledger.create_run("r-2", script="train.py")

        cluster.stop()  # a transaction begun while it is away waits for it
        back = threading.Timer(0.3, cluster.start_again)
        back.start()
        try:
            began = time.monotonic()
            ledger.create_run("r-3", script="train.py")
            waited = time.monotonic() - began
        finally:
            back.join()
        assert waited >= 0.25  # it did wait, and then wrote

        cluster.stop()  # away for longer than the wait
        began = time.monotonic()
        with pytest.raises(LedgerUnavailableError) as raised:
            impatient.create_run("r-4", script="train.py")
        assert 0.2 <= time.monotonic() - began < 5.0
        assert isinstance(raised.value, LedgerBusyError)  # what callers retry
        assert "cannot be reached" in raised.value.message and raised.value.fix
        cluster.start_again()
        impatient.create_run("r-4", script="train.py")  # and the same ledger carries on
        assert [r.run_id for r in ledger.list_runs()] == ["r-4", "r-3", "r-2", "r-1"]


def test_a_transaction_cut_in_the_middle_fails_retryably_and_writes_nothing(
    cluster: PostgresCluster, postgres_url: str
) -> None:
    db = open_database(parse_database_url(postgres_url))
    assert isinstance(db, PostgresDatabase)
    with Ledger(db) as ledger:
        ledger.create_run("r-1", script="train.py")
        with pytest.raises(LedgerUnavailableError), db.translate():
            conn = db.begin(write=True)
            try:
                conn.execute("UPDATE runs SET script = 'half' WHERE run_id = 'r-1'")
                _terminate_backends(cluster, postgres_url)  # as a fast shutdown does
                conn.execute("UPDATE runs SET args = '[]' WHERE run_id = 'r-1'")
            except BaseException:
                db.rollback()
                raise
        record = ledger.get_run("r-1")  # the next transaction gets a fresh connection
        assert record is not None and record.script == "train.py"


def test_an_error_waiting_would_not_cure_is_not_retryable(
    cluster: PostgresCluster, postgres_url: str
) -> None:
    missing = postgres_url.rsplit("/", 1)[0] + "/no_such_database"
    began = time.monotonic()
    with pytest.raises(LedgerError) as raised:
        open_database(parse_database_url(missing))
    assert not isinstance(raised.value, LedgerBusyError)
    assert "no_such_database" in raised.value.message
    assert time.monotonic() - began < 5.0


def test_opening_a_ledger_on_a_server_that_is_down_fails_at_once(
    cluster: PostgresCluster, postgres_url: str
) -> None:
    cluster.stop()
    began = time.monotonic()
    with pytest.raises(LedgerUnavailableError):
        open_database(parse_database_url(postgres_url))  # a wrong address is no outage to wait out
    assert time.monotonic() - began < 5.0


def _terminate_backends(cluster: PostgresCluster, url: str) -> None:
    database = url.rsplit("/", 1)[1]
    conninfo = f"host=127.0.0.1 port={cluster.port} user=postgres dbname=postgres"
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,)
        )
