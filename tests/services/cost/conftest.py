"""Fixtures for the cost report's tests on both engines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.store import Ledger, parse_database_url
from tpuctl.store.database import open_database


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow_on_postgresql: the test's PostgreSQL run is slow (a repeat of another's on a random ledger)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The PostgreSQL runs of tests marked ``slow_on_postgresql`` are ``slow`` (the SQLite ones are not):
    a few cases on a random ledger keep both engines in the default suite, the rest run with --slow."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_postgresql = callspec is not None and callspec.params.get("open_ledger") == "postgresql"
        if on_postgresql and item.get_closest_marker("slow_on_postgresql") is not None:
            item.add_marker(pytest.mark.slow)


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
