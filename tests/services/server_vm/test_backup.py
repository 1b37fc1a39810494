"""The ledger's copies: taken with SQLite's online backup while another connection writes, uploaded to
the storage emulator through the bucket client, the newest restored."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tpuctl.backends.sim import SIM_CLIENTS
from tpuctl.cloud.buckets import BucketClient
from tpuctl.services.server_vm.backup import LedgerBackups, backup_every
from tpuctl.sim import default_world
from tpuctl.sim.storage import DEFAULT_BUCKET, StorageEmulator

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


@pytest.fixture
def buckets(tmp_path: Path) -> Iterator[BucketClient]:
    emulator = StorageEmulator(default_world, tmp_path / "gcs")
    url = emulator.start()
    try:
        with httpx.Client(trust_env=False) as http:
            yield BucketClient(url, SIM_CLIENTS.credentials, http)  # as every simulator client calls
    finally:
        emulator.stop()


def _ledger(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, note TEXT NOT NULL)")
    return conn


def _rows(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM events ORDER BY id")]
    finally:
        conn.close()


def test_copies_taken_while_the_server_writes_are_consistent(buckets: BucketClient, tmp_path: Path) -> None:
    database = tmp_path / "ledger.db"
    writer = _ledger(database)
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            # Two rows per transaction: a torn copy would show an odd count.
            writer.execute("BEGIN")
            writer.execute("INSERT INTO events (note) VALUES ('a')")
            writer.execute("INSERT INTO events (note) VALUES ('b')")
            writer.execute("COMMIT")

    thread = threading.Thread(target=write)
    thread.start()
    backups = LedgerBackups(buckets, DEFAULT_BUCKET, "tpuctl-server/srv")
    try:
        taken = [backups.take(database, T0 + timedelta(minutes=i)) for i in range(3)]
    finally:
        stop.set()
        thread.join()
    assert [c.name for c in backups.copies()] == [c.name for c in taken]
    sizes = []
    for copy in taken:
        restored = tmp_path / f"{copy.taken_at:%H%M}.db"
        restored.write_bytes(buckets.get_object(DEFAULT_BUCKET, copy.name))
        ids = _rows(restored)
        assert len(ids) % 2 == 0 and ids == list(range(1, len(ids) + 1))
        sizes.append(len(ids))
    assert sizes == sorted(sizes) and sizes[-1] > 0


def test_restore_takes_the_newest_copy(buckets: BucketClient, tmp_path: Path) -> None:
    database = tmp_path / "ledger.db"
    conn = _ledger(database)
    backups = LedgerBackups(buckets, DEFAULT_BUCKET, "tpuctl-server/srv")
    assert backups.restore_newest(tmp_path / "nothing.db") is None
    assert not (tmp_path / "nothing.db").exists()
    conn.execute("INSERT INTO events (note) VALUES ('first')")
    first = backups.take(database, T0)
    conn.execute("INSERT INTO events (note) VALUES ('second')")
    newest = backups.take(database, T0 + timedelta(minutes=1))
    conn.close()
    restored_to = tmp_path / "vm2" / "ledger.db"
    assert backups.restore_newest(restored_to) == newest
    assert _rows(restored_to) == [1, 2]
    # Beyond the newest `keep`, the oldest copies are deleted from the bucket.
    kept = LedgerBackups(buckets, DEFAULT_BUCKET, "tpuctl-server/srv", keep=1)
    assert [c.name for c in kept.prune()] == [first.name]
    assert kept.copies() == [newest]
    # Another server's copies under another prefix are not this one's.
    assert LedgerBackups(buckets, DEFAULT_BUCKET, "tpuctl-server/other").newest() is None


def test_the_loop_reports_a_failed_copy_and_goes_on(tmp_path: Path) -> None:
    class Flaky:
        def __init__(self) -> None:
            self.puts: list[str] = []

        def put_object(self, bucket: str, name: str, data: bytes) -> None:
            if not self.puts:
                self.puts.append("refused")
                raise OSError("bucket unreachable")
            self.puts.append(name)

        def list_objects(self, bucket: str, prefix: str) -> list[object]:
            return []

        def get_object(self, bucket: str, name: str) -> bytes:
            raise AssertionError("not read")

        def delete_object(self, bucket: str, name: str) -> None:
            raise AssertionError("nothing to prune")

    database = tmp_path / "ledger.db"
    _ledger(database).close()
    store = Flaky()
    errors: list[Exception] = []
    minutes = iter(range(10))

    class StopAfterThreePuts(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:  # no real minute goes by
            assert timeout == 60.0
            return len(store.puts) >= 3

    stop = StopAfterThreePuts()
    backup_every(
        LedgerBackups(store, "b", "p"),
        database,
        every_s=60.0,
        clock=lambda: T0 + timedelta(minutes=next(minutes)),
        stop=stop,
        on_copy=lambda copy: None,
        on_error=errors.append,
    )
    assert [str(e) for e in errors] == ["bucket unreachable"]
    assert store.puts[1:] == ["p/ledger-20261127T120100Z.sqlite", "p/ledger-20261127T120200Z.sqlite"]
