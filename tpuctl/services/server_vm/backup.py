"""The ledger's copies in the team bucket, for a server whose ledger is SQLite on its VM's disk.

Each copy is taken with SQLite's online backup API (https://www.sqlite.org/backup.html, Python's
``sqlite3.Connection.backup``): a consistent snapshot of the database while the server keeps writing to
it, which copying the file (and its WAL) is not. The copy goes to the bucket as
``<prefix>/ledger-<UTC time>.sqlite``: names sort by time, so the newest is the last one listed, and a
new VM restores it (``restore_newest``). Only the newest ``keep`` copies stay.
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol

#: How often the server VM's backup unit copies the ledger by default.
BACKUP_EVERY_S: Final = 60.0
#: Copies kept in the bucket: two hours at one a minute.
KEEP_COPIES: Final = 120
_NAME_STAMP: Final = "%Y%m%dT%H%M%SZ"


class StoredCopy(Protocol):
    @property
    def name(self) -> str: ...


class ObjectStore(Protocol):
    """What the backups need of Cloud Storage (``tpuctl.cloud.buckets.BucketClient`` has it)."""

    def put_object(self, bucket: str, name: str, data: bytes) -> Any: ...

    def list_objects(self, bucket: str, prefix: str) -> list[Any]: ...

    def get_object(self, bucket: str, name: str) -> bytes: ...

    def delete_object(self, bucket: str, name: str) -> None: ...


@dataclass(frozen=True)
class LedgerCopy:
    """One copy in the bucket: its object name and when it was taken."""

    bucket: str
    name: str
    taken_at: datetime

    @property
    def url(self) -> str:
        return f"gs://{self.bucket}/{self.name}"

    def to_dict(self) -> dict[str, str]:
        return {"url": self.url, "taken_at": self.taken_at.isoformat()}


def online_copy(database: Path, destination: Path) -> None:
    """A consistent copy of the SQLite database at ``database`` into ``destination`` while others may be
    writing to it. All pages in one step: a copy taken page by page restarts whenever another connection
    writes, and the server writes every second."""
    source = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        target = sqlite3.connect(destination)
        try:
            source.backup(target)
        finally:
            target.close()
    finally:
        source.close()


class LedgerBackups:
    """The copies of one server's ledger under ``gs://bucket/prefix/``."""

    def __init__(self, store: ObjectStore, bucket: str, prefix: str, *, keep: int = KEEP_COPIES) -> None:
        self._store = store
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._keep = keep

    def take(self, database: Path, now: datetime) -> LedgerCopy:
        """Copy ``database`` now and upload the copy."""
        name = f"{self.prefix}/ledger-{now.astimezone(UTC).strftime(_NAME_STAMP)}.sqlite"
        with tempfile.TemporaryDirectory(prefix="tpuctl-backup-") as scratch:
            copy = Path(scratch) / "ledger.sqlite"
            online_copy(database, copy)
            self._store.put_object(self.bucket, name, copy.read_bytes())
        return LedgerCopy(self.bucket, name, now.astimezone(UTC).replace(microsecond=0))

    def copies(self) -> list[LedgerCopy]:
        """Every copy, oldest first."""
        out: list[LedgerCopy] = []
        for item in self._store.list_objects(self.bucket, f"{self.prefix}/ledger-"):
            taken = _taken_at(str(item.name).rsplit("/", 1)[-1])
            if taken is not None:
                out.append(LedgerCopy(self.bucket, str(item.name), taken))
        return sorted(out, key=lambda c: c.taken_at)

    def newest(self) -> LedgerCopy | None:
        found = self.copies()
        return found[-1] if found else None

    def restore_newest(self, destination: Path) -> LedgerCopy | None:
        """The newest copy written to ``destination`` (None, and nothing written, when there is none).
        Written beside it first and renamed over it: a half-written ledger is never left in its place."""
        newest = self.newest()
        if newest is None:
            return None
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(destination.name + ".restoring")
        partial.write_bytes(self._store.get_object(self.bucket, newest.name))
        _check_integrity(partial)
        partial.replace(destination)
        return newest

    def prune(self) -> list[LedgerCopy]:
        """Delete the copies beyond the newest ``keep``; the ones deleted."""
        found = self.copies()
        doomed = found[: max(0, len(found) - self._keep)]
        for copy in doomed:
            self._store.delete_object(self.bucket, copy.name)
        return doomed


def backup_every(
    backups: LedgerBackups,
    database: Path,
    *,
    every_s: float,
    clock: Callable[[], datetime],
    stop: threading.Event,
    on_copy: Callable[[LedgerCopy], None],
    on_error: Callable[[Exception], None],
) -> None:
    """Take a copy every ``every_s`` until ``stop``; a failed copy is reported and the next one tried
    (a bucket that is down for a minute costs one copy, not the backups)."""
    while True:
        try:
            on_copy(backups.take(database, clock()))
            backups.prune()
        except Exception as exc:  # reported; the loop goes on
            on_error(exc)
        if stop.wait(every_s):
            return


def _taken_at(base_name: str) -> datetime | None:
    stamp = base_name.removeprefix("ledger-").removesuffix(".sqlite")
    try:
        return datetime.strptime(stamp, _NAME_STAMP).replace(tzinfo=UTC)
    except ValueError:
        return None  # not one of ours


def _check_integrity(path: Path) -> None:
    from tpuctl.errors import TpuctlError

    conn = sqlite3.connect(path)
    try:
        result = conn.execute("PRAGMA integrity_check").fetchone()
    finally:
        conn.close()
    if not result or result[0] != "ok":
        raise TpuctlError(f"the restored ledger copy {path.name} fails SQLite's integrity check: {result}")
