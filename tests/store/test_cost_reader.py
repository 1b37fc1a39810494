"""The report's connection on either engine: one snapshot per report, its working tables its own, nothing
written to the ledger, and a database of another schema refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.services.cost.service import REPORT_TABLES
from tpuctl.store import Ledger, parse_database_url
from tpuctl.store.cost_reader import KNOWN_SCHEMA, open_reader
from tpuctl.store.database import open_database
from tpuctl.store.records import EventKind, LedgerError
from tpuctl.store.url import sqlite_url

T0 = 1_800_000_000.0


def _requested(ledger: Ledger, name: str) -> None:
    ledger.record_event(
        EventKind.REQUESTED, pod=name, zone="us-central1-a", accelerator_type="v5litepod-8", chips=8,
        capacity=CapacityType.SPOT, price_per_chip_hour=0.245, ts=T0, backend="sim",
    )  # fmt: skip


def test_a_report_reads_one_snapshot_of_the_ledger(open_ledger: Callable[..., Ledger]) -> None:
    with open_ledger() as ledger:
        _requested(ledger, "a")
        with open_reader(ledger.url) as reader:
            with reader.snapshot(REPORT_TABLES):
                before = reader.query("SELECT COUNT(*) FROM pods", {})
                _requested(ledger, "b")  # another connection writes while the report reads
                assert reader.query("SELECT COUNT(*) FROM pods", {}) == before == [(1,)]
            with reader.snapshot(REPORT_TABLES):  # the next report: the new state, its tables made anew
                assert reader.query("SELECT COUNT(*) FROM pods", {}) == [(2,)]
                assert reader.query("SELECT COUNT(*) FROM cost_agg", {}) == [(0,)]


def test_a_report_writes_only_its_working_tables(open_ledger: Callable[..., Ledger]) -> None:
    with open_ledger() as ledger, open_reader(ledger.url) as reader, reader.snapshot(REPORT_TABLES):
        reader.execute("INSERT INTO cost_rest (id) VALUES (7)", {})
        assert reader.query("SELECT id FROM cost_rest", {}) == [(7,)]
        with pytest.raises(LedgerError):  # SQLite's connection is read only; PostgreSQL's transaction
            reader.execute("INSERT INTO ledger_meta (key, value) VALUES ('k', 'v')", {})


def test_postgresql_reads_in_a_repeatable_read_read_only_transaction(postgres_ledger_url: str) -> None:
    url = parse_database_url(postgres_ledger_url)
    with Ledger(open_database(url)), open_reader(url) as reader, reader.snapshot(REPORT_TABLES):
        assert reader.dialect.name == "postgresql"
        settings = "SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')"
        assert reader.query(settings, {}) == [("repeatable read", "on")]


def test_a_database_without_the_ledgers_schema_is_refused(tmp_path: Path, postgres_url: str) -> None:
    with pytest.raises(LedgerError, match=f"schema version 0; cost reports know version {KNOWN_SCHEMA}"):
        open_reader(parse_database_url(postgres_url))  # an empty database: never a ledger
    with pytest.raises(LedgerError, match="no ledger at"):
        open_reader(sqlite_url(tmp_path / "ledger.db"))


def test_a_parallel_part_on_postgresql_reads_the_reports_own_snapshot(postgres_ledger_url: str) -> None:
    """A scan's parts are connections of their own: on PostgreSQL they import the report's snapshot, so a
    write between the report's start and a part's sees neither."""
    url = parse_database_url(postgres_ledger_url)
    with Ledger(open_database(url)) as ledger, open_reader(url) as reader:
        _requested(ledger, "a")
        with reader.snapshot(REPORT_TABLES):
            assert reader.query("SELECT COUNT(*) FROM pods", {}) == [(1,)]
            _requested(ledger, "b")
            with reader.another() as part, part.snapshot(REPORT_TABLES):
                assert part.query("SELECT COUNT(*) FROM pods", {}) == [(1,)]
                settings = "SELECT current_setting('transaction_read_only')"
                assert part.query(settings, {}) == [("on",)]


def test_a_postgresql_report_runs_with_its_own_settings(postgres_ledger_url: str) -> None:
    """JIT off and a bigger work_mem for the report's transaction alone; bigger temp buffers for its
    connection (settable only before the connection's first temp table)."""
    url = parse_database_url(postgres_ledger_url)
    names = "SELECT current_setting('jit'), current_setting('work_mem'), current_setting('temp_buffers')"
    with Ledger(open_database(url)), open_reader(url) as reader:
        with reader.snapshot(REPORT_TABLES):
            assert reader.query(names, {}) == [("off", "64MB", "64MB")]
            assert reader.query("SELECT COUNT(*) FROM cost_agg", {}) == [(0,)]
        with reader.snapshot(REPORT_TABLES):  # the same pooled connection: its buffers already made
            assert reader.query(names, {})[0][:2] == ("off", "64MB")


def test_postgresql_gathers_a_working_tables_statistics_before_reading_it(postgres_ledger_url: str) -> None:
    """The planner would otherwise take a few slice ids in a temp table for thousands of rows and read
    every slice to join them."""
    url = parse_database_url(postgres_ledger_url)
    rows_known = "SELECT reltuples FROM pg_class WHERE relname = :name AND relpersistence = 't'"
    with Ledger(open_database(url)), open_reader(url) as reader, reader.snapshot(REPORT_TABLES):
        reader.execute("INSERT INTO cost_rest (id) SELECT generate_series(1, 7)", {})
        assert reader.query(rows_known, {"name": "cost_rest"}) == [(-1.0,)]  # never analyzed
        assert reader.query("SELECT COUNT(*) FROM cost_rest", {}) == [(7,)]
        assert reader.query(rows_known, {"name": "cost_rest"}) == [(7.0,)]


def test_postgresql_gathers_no_statistics_of_a_table_the_report_only_sums(postgres_ledger_url: str) -> None:
    """The first-day sums are read by one GROUP BY: their statistics would cost more than the sum."""
    from tpuctl.services.cost.sql_scan import AGG_TABLE

    assert not AGG_TABLE.statistics
    url = parse_database_url(postgres_ledger_url)
    rows_known = "SELECT reltuples FROM pg_class WHERE relname = :name AND relpersistence = 't'"
    with Ledger(open_database(url)), open_reader(url) as reader, reader.snapshot(REPORT_TABLES):
        reader.execute("INSERT INTO cost_agg (k, zone, day0) SELECT 'k', 'z', generate_series(1, 7)", {})
        assert reader.query("SELECT k, COUNT(*) FROM cost_agg GROUP BY k", {}) == [("k", 7)]
        assert reader.query(rows_known, {"name": "cost_agg"}) == [(-1.0,)]


def test_an_instant_prints_its_truncated_second_on_both_engines(open_ledger: Callable[..., Ledger]) -> None:
    from tpuctl.store.cost_sql import iso

    with open_ledger() as ledger, open_reader(ledger.url) as reader, reader.snapshot(()):
        instant = "CAST(:t AS DOUBLE PRECISION)"  # a column's type (both engines know the name)
        sql = (
            f"SELECT {iso(instant, reader.dialect)}, {iso('CAST(NULL AS DOUBLE PRECISION)', reader.dialect)}"
        )
        # Just short of a second: SQLite's strftime alone rounds it up to the next one.
        assert reader.query(sql, {"t": T0 + 42.9996}) == [("2027-01-15T08:00:42Z", None)]


def test_among_picks_the_ids_a_subquery_gives_on_both_engines(open_ledger: Callable[..., Ledger]) -> None:
    from tpuctl.store.cost_sql import among

    with open_ledger() as ledger, open_reader(ledger.url) as reader, reader.snapshot(REPORT_TABLES):
        picked = f"""WITH t(n) AS (VALUES (1), (2), (3), (4), (5))
SELECT n FROM t WHERE {among("n", "SELECT id FROM cost_rest", reader.dialect)} ORDER BY n"""
        assert reader.query(picked, {}) == []
        reader.execute("INSERT INTO cost_rest (id) VALUES (5), (1), (3), (9)", {})
        assert reader.query(picked, {}) == [(1,), (3,), (5,)]
