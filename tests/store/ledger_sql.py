"""Reaching under a ledger in tests, on either engine: a write no tpuctl code makes (someone editing the
database by hand), every row of every table, another machine's ledger on the same database."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuctl.store import Ledger
from tpuctl.store.database import open_database


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
