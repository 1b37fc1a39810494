"""Suite-wide pytest options.

``--slow`` runs the cases marked ``@pytest.mark.slow`` (long benchmarks-as-tests, million-row ledgers);
without it they are skipped with a reason that says how to run them, so the default suite stays fast.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False, help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
