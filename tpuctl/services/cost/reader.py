"""A read-only connection to the ledger file for a report's queries, refusing a schema it does not know."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from tpuctl.store.records import LedgerError

#: The ledger schema version these queries are written for.
KNOWN_SCHEMA: Final = 11  # v9 the ledger identity, v10 the run leases, v11 the servers: reports read none


class LedgerReader:
    """A read-only SQLite connection to the ledger file, for the report's aggregate queries."""

    def __init__(self, path: Path, *, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise LedgerError(f"no ledger at {self.path}", fix="run a tpuctl command to create it")
        try:
            self._conn = sqlite3.connect(
                self.path.resolve().as_uri() + "?mode=ro",
                uri=True,
                timeout=timeout_s,
                check_same_thread=False,
            )
            version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
            # The report's temp tables and sorts stay in memory (a few tens of MB for a million events).
            self._conn.execute("PRAGMA temp_store = MEMORY")
            self._conn.execute("PRAGMA cache_size = -65536")
            # A report is a new connection in a new process: every page it reads is a first read. Mapped,
            # those are memory reads rather than a read() call each (13% of a 1,000,000-event report).
            # Safe here: the connection only reads, and the ledger file never shrinks (WAL, no VACUUM),
            # which is what makes a mapping fault.
            self._conn.execute("PRAGMA mmap_size = 1073741824")
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {exc}") from None
        if version != KNOWN_SCHEMA:
            self._conn.close()
            raise LedgerError(
                f"the ledger {self.path} has schema version {version}; cost reports know version "
                f"{KNOWN_SCHEMA}",
                fix="use the tpuctl version that wrote this ledger",
            )

    def query(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql, dict(params)).fetchall()
        except sqlite3.OperationalError as exc:
            raise LedgerError(
                f"ledger {self.path}: {exc}", fix="retry; run `tpuctl doctor` if it persists"
            ) from exc
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"the ledger {self.path} is unreadable: {exc}") from exc

    def execute(self, sql: str, params: Mapping[str, Any]) -> None:
        try:
            self._conn.execute(sql, dict(params))
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path}: {exc}") from exc

    def snapshot(self) -> Snapshot:
        return Snapshot(self._conn)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> LedgerReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Snapshot:
    """One read transaction: every query of a report sees the same ledger state."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN")

    def __exit__(self, *exc: object) -> None:
        if self._conn.in_transaction:
            self._conn.execute("COMMIT")
