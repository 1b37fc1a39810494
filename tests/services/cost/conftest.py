"""Fixtures for the cost report's tests on both engines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.store import Ledger, parse_database_url
from tpuctl.store.database import open_database

#: Opens the test's ledger (again: each call is another process's ledger on the same database).
OpenLedger = Callable[..., Ledger]


@pytest.fixture(params=["sqlite", "postgresql"])
def open_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> OpenLedger:
    """The test's ledger on each engine: a SQLite file, or a fresh database of the session's PostgreSQL
    (the reports read it by its URL, as the CLI's do)."""
    if request.param == "sqlite":
        state = tmp_path / "state"
        return lambda **kwargs: Ledger(state, **kwargs)
    url = parse_database_url(str(request.getfixturevalue("postgres_url")))

    def on_postgresql(**kwargs: Any) -> Ledger:
        return Ledger(open_database(url), **kwargs)

    return on_postgresql
