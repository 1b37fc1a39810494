"""Revision 0008, ids in the covering indexes: a PostgreSQL ledger made at the revision before gets every
index of ``tables.COVERING_WITH_ID`` with ``id`` included, so that a pass reading a slice's id and the
columns an index covers reads the index alone (an index-only scan, no table page); both engines get the
partial index of the slices billed past a second midnight, and it holds exactly those."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ledger_sql import ledger_at_revision

from tpuctl.store import Ledger
from tpuctl.store.billing import DAY_S, multi_day_sql
from tpuctl.store.database import open_database
from tpuctl.store.sql import POSTGRESQL, SQLITE
from tpuctl.store.tables import COVERING_WITH_ID, MULTI_DAY_INDEX
from tpuctl.store.url import parse_database_url

BEFORE = "0007_cost_without_a_run"
D0 = 1_790_000_000 - 1_790_000_000 % DAY_S  # a midnight
_POD = """INSERT INTO pods (id, zone, name, incarnation, accelerator_type, chips, capacity, state,
    requested_at, ready_at, ended_at, end_reason, updated_at, last_event_id)
VALUES (:id, 'z', :name, 0, 'v5e-8', 8, 'on-demand', 'DELETED', :ready, :ready, :end, 'deleted', :ready, 0)"""
#: (name, READY, end): within a day, across one midnight, across two, open.
_SLICES = (
    ("day", D0 + 3600, D0 + 7200),
    ("one-midnight", D0 + 80_000, D0 + DAY_S + 3600),
    ("two-midnights", D0 + 80_000, D0 + 2 * DAY_S + 3600),
    ("open", D0 + 100, None),
)


def _pods() -> list[tuple[str, dict[str, Any]]]:
    return [(_POD, {"id": i + 1, "name": n, "ready": r, "end": e}) for i, (n, r, e) in enumerate(_SLICES)]


_INDEX_DEFS = "SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN ('pods', 'events')"


@pytest.fixture
def before_on_postgresql(postgres_url: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A PostgreSQL ledger made at ``BEFORE`` with ``_SLICES`` in it: its URL, and its indexes' text."""
    from alembic import command

    from tpuctl.store import migrate
    from tpuctl.store.engine import create_engine
    from tpuctl.store.sql import SqlAlchemyConnection

    engine = create_engine(parse_database_url(postgres_url))
    try:
        with engine.begin() as conn:
            command.upgrade(migrate._config(conn), BEFORE)
            sql = SqlAlchemyConnection.of(conn)
            for statement, params in _pods():
                sql.execute(statement, params)
            defs = {str(name): str(text) for name, text in sql.execute(_INDEX_DEFS).fetchall()}
            # Before: the ids come from the table's rows, though the index covers the other columns.
            assert _rec_scan(sql)[0] == "Index Scan"
    finally:
        engine.dispose()
    yield postgres_url, defs


def _index_defs(ledger: Ledger) -> dict[str, str]:
    with ledger._read() as conn:
        return {str(name): str(text) for name, text in conn.execute(_INDEX_DEFS).fetchall()}


def _rec_scan(conn: Any) -> tuple[str, str]:
    """How PostgreSQL reads the slices that redid steps, by id and two columns their index covers (the
    table's other paths off: a few rows, which the planner would otherwise read from the table)."""
    conn.execute("SET LOCAL enable_seqscan = off")
    conn.execute("SET LOCAL enable_bitmapscan = off")
    (plan,) = conn.execute(
        "EXPLAIN (FORMAT JSON) SELECT p.id, p.zone, p.rec_priced FROM pods AS p "
        "WHERE p.rec_priced != 0 OR p.rec_unpriced != 0"
    ).fetchone()
    node = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return str(node["Node Type"]), str(node.get("Index Name"))


def _multi_day_names(ledger: Ledger, condition: str) -> list[str]:
    with ledger._read() as conn:
        return [str(r[0]) for r in conn.execute(f"SELECT name FROM pods WHERE {condition} ORDER BY name")]


def test_on_postgresql_the_covering_indexes_hold_the_id_and_are_read_alone(
    before_on_postgresql: tuple[str, dict[str, str]],
) -> None:
    url, before = before_on_postgresql
    assert not any("INCLUDE" in text for text in before.values())
    assert set(COVERING_WITH_ID) <= set(before) and MULTI_DAY_INDEX not in before
    with Ledger(open_database(parse_database_url(url))) as ledger:  # opened: migrated to the newest
        defs = _index_defs(ledger)
        for name in (*COVERING_WITH_ID, MULTI_DAY_INDEX):
            assert " INCLUDE (id)" in defs[name], defs[name]
        assert _multi_day_names(ledger, multi_day_sql("pods", POSTGRESQL)) == ["two-midnights"]
        with ledger._write() as conn:
            conn.execute("UPDATE pods SET rec_priced = 1.0 WHERE name = 'day'")
        with ledger._read() as conn:
            assert _rec_scan(conn) in (("Index Only Scan", "pods_rec"), ("Index Only Scan", "pods_rec_owner"))


def test_on_sqlite_the_multi_day_index_holds_the_slices_past_a_second_midnight(tmp_path: Path) -> None:
    with ledger_at_revision(tmp_path / "ledger.db", BEFORE, _pods()) as ledger:
        with ledger._read() as conn:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (MULTI_DAY_INDEX,)
            ).fetchall()
        assert found == [(1,)]
        condition = multi_day_sql("p", SQLITE)
        names = _multi_day_names(ledger, condition.replace("p.", "pods."))
        assert names == ["two-midnights"]
        with ledger._read() as conn:
            rows = conn.execute(
                f"SELECT p.name FROM pods AS p INDEXED BY {MULTI_DAY_INDEX} WHERE {condition}"
            )
            assert [r[0] for r in rows] == ["two-midnights"]
