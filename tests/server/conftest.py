"""Fixtures of the server tests: a ``Place`` (``server_place``) on a SQLite ledger or on a PostgreSQL
database that several servers share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from server_place import Place, make_place

from tpuctl.sim import SimAdminClient


@pytest.fixture
def place(tmp_path: Path, serve_sim: Callable[..., SimAdminClient]) -> Iterator[Place]:
    yield from make_place(tmp_path, serve_sim, f"sqlite:///{tmp_path / 'team' / 'ledger.db'}")


@pytest.fixture
def team_place(
    tmp_path: Path, serve_sim: Callable[..., SimAdminClient], postgres_url: str
) -> Iterator[Place]:
    """A place whose ledger is a PostgreSQL database, for servers that share it."""
    yield from make_place(tmp_path, serve_sim, postgres_url)
