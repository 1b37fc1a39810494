"""Fixtures for the cost report's tests on both engines."""

from __future__ import annotations

import pytest


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
