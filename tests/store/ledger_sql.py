"""Reaching under a ledger in tests, on either engine: a write no tpuctl code makes (someone editing the
database by hand), every row of every table, another machine's ledger on the same database, a ledger
taken back to before the Alembic history, a ledger left at an earlier revision."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tpuctl.store import Ledger, owner_rollup, shares_seen
from tpuctl.store.database import open_database
from tpuctl.store.norun_rollup import NORUN
from tpuctl.store.owner_rollup import OWNER
from tpuctl.store.run_closed_time import CLOSED_TIME
from tpuctl.store.run_sums import RunSums
from tpuctl.store.run_waste import WASTE
from tpuctl.store.tables import ATTRIBUTED_TABLES, MULTI_DAY_INDEX, attribution_columns, run_queue_columns


def write_by_hand(ledger: Ledger, sql: str, params: Mapping[str, Any] | None = None) -> None:
    """Run ``sql`` in a write transaction of its own on ``ledger``'s database (named parameters)."""
    with ledger._write() as conn:
        conn.execute(sql, dict(params or {}))


def table_contents(ledger: Ledger, *, skip: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Every row of every table of the ledger (but ``skip``), to compare before and after."""
    with ledger._read() as conn:
        if conn.dialect.name == "sqlite":
            listing = "SELECT name FROM sqlite_master WHERE type = 'table'"
        else:
            listing = "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        names = [str(r[0]) for r in conn.execute(listing)]
        return {
            n: sorted(repr(tuple(r)) for r in conn.execute(f"SELECT * FROM {n}"))
            for n in names
            if n not in skip
        }


def other_machine(ledger: Ledger, **kwargs: Any) -> Ledger:
    """Another process's ledger on the same database (another machine, in effect)."""
    return Ledger(open_database(ledger.url), **kwargs)


def undo_history(conn: sqlite3.Connection) -> None:
    """Take a SQLite ledger back to the baseline of the Alembic history (the hand-written migrations' v10)
    with no record of the history: what the revisions after the baseline added is gone (servers and
    submissions; attribution, queue columns and the audit log; the owner rollup, its triggers and
    indexes; the waste and closed time by run, the rollup of slices no run created, and their triggers;
    the index of slices billed past a second midnight; the row and triggers of the shares seen)."""
    triggers = (
        *OWNER.triggers,
        *WASTE.triggers,
        *CLOSED_TIME.triggers,
        *NORUN.triggers,
        *shares_seen.TRIGGERS,
    )
    for trigger in triggers:
        conn.execute(f"DROP TRIGGER {trigger}")
    for index in (*owner_rollup.OWNER_INDEXES, MULTI_DAY_INDEX):
        conn.execute(f"DROP INDEX {index}")
    conn.execute("DELETE FROM ledger_meta WHERE key = ?", (shares_seen.KEY,))
    dropped = ("server_replicas", "run_submissions", "alembic_version", "audit_log", OWNER.table)
    for table in (*dropped, WASTE.table, CLOSED_TIME.table, NORUN.table):
        conn.execute(f"DROP TABLE {table}")
    for index in ("runs_workspace", "runs_queued"):
        conn.execute(f"DROP INDEX {index}")
    for table in ATTRIBUTED_TABLES:
        for column in attribution_columns():
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column.name}")
    for column in run_queue_columns():
        conn.execute(f"ALTER TABLE runs DROP COLUMN {column.name}")


def ledger_at_revision(path: Path, revision: str, writes: Sequence[tuple[str, Mapping[str, Any]]]) -> Ledger:
    """A SQLite ledger at ``path`` migrated up to ``revision`` only, with ``writes`` (SQL and its named
    parameters) made in that migration's transaction, as that revision's tpuctl left it; opened, so
    migrated to the newest revision."""
    from alembic import command

    from tpuctl.store import migrate
    from tpuctl.store.engine import create_engine
    from tpuctl.store.sql import SqlAlchemyConnection
    from tpuctl.store.url import parse_database_url

    url = parse_database_url(f"sqlite:///{path}")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(migrate._config(conn), revision)
            sql = SqlAlchemyConnection.of(conn)
            for statement, params in writes:
                sql.execute(statement, dict(params))
    finally:
        engine.dispose()
    return Ledger(open_database(url))


def kept_run_sums(ledger: Ledger, sums: RunSums) -> dict[str, tuple[float, ...]]:
    """A table of sums per run: its runs with something left, which equal its check and in which
    ``check_view`` finds nothing wrong; each run's sums."""
    import pytest

    with ledger._read() as conn:
        have = [tuple(r) for r in conn.execute(sums.stored_sql()).fetchall()]
        want = [tuple(r) for r in conn.execute(sums.check_sql()).fetchall()]
    assert [r[0] for r in have] == [r[0] for r in want]
    assert [r[1:] for r in have] == [pytest.approx(r[1:]) for r in want]
    assert [p for p in ledger.check_view() if p.startswith(sums.table)] == []
    return {str(r[0]): tuple(float(v) for v in r[1:]) for r in have}
