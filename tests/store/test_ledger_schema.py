"""Opening the ledger: permissions, pragmas, schema creation, migrations, bad files."""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.store import EventKind, Ledger, LedgerError
from tpuctl.store.database import SqliteDatabase
from tpuctl.store.migrate import sqlite_user_version

TABLES = {"events", "pods", "attempts", "runs", "run_segments"}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_fresh_state_dir_is_0700_and_files_0600(tmp_path: Path, loose_umask: None) -> None:
    state = tmp_path / "nested" / "state"
    with Ledger(state) as ledger:
        ledger.record_event(EventKind.GC)  # make sure the WAL has content
        db = state / "ledger.db"
        assert ledger.path == db
        assert mode(state) == 0o700
        for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm"):
            assert (state / name).exists(), name
            assert mode(state / name) == 0o600, name


def test_existing_loose_dir_and_files_are_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Ledger(state) as ledger:
        ledger.record_event(EventKind.GC)
    state.chmod(0o755)
    (state / "ledger.db").chmod(0o644)
    with Ledger(state) as ledger:
        assert mode(state) == 0o700
        assert mode(state / "ledger.db") == 0o600
        assert mode(state / "ledger.db-wal") == 0o600
        assert len(list(ledger.events())) == 1


def test_file_path_leaves_an_existing_parent_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with Ledger(shared / "custom.db") as ledger:
        assert ledger.path == shared / "custom.db"
    assert mode(shared) == 0o755
    assert mode(shared / "custom.db") == 0o600
    with Ledger(tmp_path / "new-parent" / "x.db"):
        pass
    assert mode(tmp_path / "new-parent") == 0o700


def test_pragmas(tmp_path: Path) -> None:
    with Ledger(tmp_path) as ledger:
        conn = _raw(ledger)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000


def test_schema_from_an_empty_file_and_idempotent_reopen(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    db.touch()  # a zero-byte file is an empty SQLite database
    with Ledger(tmp_path) as ledger:
        assert ledger.schema_version == sqlite_user_version()
        ledger.record_event(EventKind.REQUESTED, pod="p", zone="us-central1-a", ts=1.0)
    assert tables(db) >= TABLES
    for _ in range(3):
        with Ledger(tmp_path) as ledger:
            assert ledger.schema_version == sqlite_user_version()
            assert [p.name for p in ledger.list_pods()] == ["p"]
            assert ledger.integrity_check() == "ok"


def test_a_newer_ledger_is_refused(tmp_path: Path) -> None:
    with Ledger(tmp_path):
        pass
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        conn.execute(f"PRAGMA user_version = {sqlite_user_version() + 5}")
    with pytest.raises(LedgerError, match="newer than this tpuctl") as info:
        Ledger(tmp_path)
    assert "upgrade tpuctl" in (info.value.fix or "")


def test_a_corrupt_file_gives_a_ledger_error(tmp_path: Path) -> None:
    (tmp_path / "ledger.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(LedgerError) as info:
        Ledger(tmp_path)
    assert info.value.fix is not None and "move it aside" in info.value.fix


def test_close_and_context_manager(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.close()
    ledger.close()  # idempotent
    with pytest.raises(sqlite3.ProgrammingError):  # use after close is a bug, not a corrupt ledger
        ledger.record_event(EventKind.GC)


def test_each_ledger_has_its_own_random_identity(tmp_path: Path) -> None:
    with Ledger(tmp_path / "a") as a, Ledger(tmp_path / "b") as b:
        assert a.identity != b.identity
        assert re.fullmatch(r"[0-9a-f]{16}", a.identity)  # a valid GCP label value
        first = a.identity
    with Ledger(tmp_path / "a") as again:
        assert again.identity == first  # made once, with the ledger


def _raw(ledger: Ledger) -> sqlite3.Connection:
    """The SQLite connection under ``ledger`` (for what only SQLite has: query plans, PRAGMAs)."""
    assert isinstance(ledger._db, SqliteDatabase)
    return ledger._db.raw
