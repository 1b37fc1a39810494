"""The database under a ``Ledger``, one implementation per engine: its transactions, its errors and what
only it has. The ledger's SQL itself is the same on both (``tpuctl.store.sql``).

Both make every write transaction exclusive among the ledger's writers from its first statement, which
the ledger's writes rely on (ids allocated as max + 1, a pod row naming the event that changed it before
either is written, a lease's fence): SQLite with ``BEGIN IMMEDIATE`` (the file's write lock), PostgreSQL
with a transaction-scoped advisory lock that every tpuctl writer takes first. Reads see one snapshot per
transaction on both (SQLite: a read transaction; PostgreSQL: REPEATABLE READ, read only).

One kind of write is not exclusive on PostgreSQL: a lease's own claim, renewal and release
(``begin(write=True, row_locked=True)``) lock only the lease rows they touch (``Dialect.row_lock``), so
replicas claim and renew their runs side by side instead of queueing on the one lock. Why that stays
correct next to the exclusive writes: ``tpuctl.store.leases`` and docs/architecture.md ("Claims on
PostgreSQL"). On SQLite it is an ordinary write transaction (one writer at a time is all SQLite has).

A write transaction whose lease fence failed commits what it wrote before the failure (the loss, in the
lease history) and raises: ``Ledger._write`` calls ``commit`` itself, then raises.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from tpuctl.store import migrate, schema
from tpuctl.store.engine import postgres_errors
from tpuctl.store.paths import ensure_private_dir, private_file, tighten_file
from tpuctl.store.records import LedgerBusyError, LedgerError
from tpuctl.store.sql import POSTGRESQL, SqlAlchemyConnection, SqlConnection, SqliteConnection
from tpuctl.store.url import DatabaseUrl, sqlite_url

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

#: How long a transaction on a PostgreSQL ledger waits for a server out of reach to come back (unless
#: the opener says: ``open_database``'s busy timeout).
DEFAULT_RECONNECT_WAIT_S: Final = 30.0
# Backoff between connection attempts while it is away: quick at first (a restart takes well under a
# second on a small database), then once a second.
_RECONNECT_FIRST_DELAY_S: Final = 0.05
_RECONNECT_MAX_DELAY_S: Final = 1.0

#: The advisory lock every tpuctl write transaction on a PostgreSQL ledger takes first (any fixed
#: 64-bit number; "tpuctl" in ASCII), so writers queue as SQLite's do on its write lock.
PG_WRITE_LOCK: Final = 0x7470756374_6C


class Database(Protocol):
    """One ledger database. Not thread-safe: the ``Ledger`` serialises its threads' transactions."""

    #: Where the ledger is, as errors and ``doctor`` name it (a password never shown).
    where: str

    @property
    def url(self) -> DatabaseUrl: ...

    @property
    def max_replicas(self) -> int:
        """How many `tpuctl server` processes may use the ledger at once."""
        ...

    def begin(self, *, write: bool, row_locked: bool = False) -> SqlConnection:
        """Begin a transaction (``write``: exclusive among writers, waiting for the others; with
        ``row_locked`` a write that relies on the row locks it takes instead, where the engine has them:
        the module docstring)."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None:
        """End the transaction in progress without its writes (a no-op when none is)."""
        ...

    def translate(self) -> contextlib.AbstractContextManager[None]:
        """The engine's errors inside become ``LedgerError``s naming the ledger and what to do."""
        ...

    def schema_version(self) -> int: ...

    def integrity_problems(self) -> list[str]:
        """What the engine's own checks find wrong (SQLite: integrity and foreign keys); [] when none."""
        ...

    def bulk(self) -> contextlib.AbstractContextManager[None]:
        """Settings for one big write (a million-event import), restored after."""
        ...

    def close(self) -> None: ...


# -- SQLite ------------------------------------------------------------------------------------------

# Page cache sizes, negative = KiB (SQLite's convention). 16 MiB keeps a cost report over a large ledger
# in memory; a bulk write raises it while it runs (``bulk``).
_CACHE_KIB: Final = -16_384
_BULK_CACHE_KIB: Final = -262_144


class SqliteDatabase:
    """A ledger file. The file is created 0600 (its parent 0700 when tpuctl makes it), put in WAL mode,
    and brought to the newest schema (``migrate``). Why each setting: ``tpuctl.store.ledger``."""

    #: One server: a file has one machine's writers, and two servers on it would both adopt every
    #: orphaned run they see, serialised on one lock, for nothing.
    max_replicas: Final = 1

    def __init__(self, path: Path, *, busy_timeout_s: float, private_parent: bool) -> None:
        if private_parent or not path.parent.exists():
            ensure_private_dir(path.parent)
        self.path = path
        self.where = str(path)
        private_file(path)
        try:
            self.raw = sqlite3.connect(
                path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open the ledger {path}: {exc}") from None
        self._sql = SqliteConnection(self.raw)
        try:
            with self.translate():
                from tpuctl.store.engine import configure_sqlite

                configure_sqlite(self.raw, where=self.where)
                migrate.migrate_sqlite(self.raw, where=self.where)
        except BaseException:
            self.raw.close()
            raise
        for suffix in ("-wal", "-shm"):
            tighten_file(f"{path}{suffix}")

    @property
    def url(self) -> DatabaseUrl:
        return sqlite_url(self.path)

    def begin(self, *, write: bool, row_locked: bool = False) -> SqlConnection:
        # No row locks in SQLite: a row-locked write is exclusive like any other.
        self.raw.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        return self._sql

    def commit(self) -> None:
        if self.raw.in_transaction:
            self.raw.execute("COMMIT")

    def rollback(self) -> None:
        # Some errors (disk full, I/O) have already rolled the transaction back.
        if self.raw.in_transaction:
            self.raw.execute("ROLLBACK")

    @contextlib.contextmanager
    def translate(self) -> Iterator[None]:
        """sqlite3 errors become LedgerError here, in one place, with what to do about them."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            text = str(exc)
            if "locked" in text or "busy" in text:
                raise LedgerBusyError(
                    f"the ledger {self.where} stayed locked by another tpuctl process: {text}",
                    fix="wait for the other tpuctl command to finish and retry",
                ) from exc
            raise LedgerError(f"ledger {self.where}: {text}") from exc
        except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise  # misuse (a closed ledger, a bad binding): a bug to see as is, not a corrupt file
        except sqlite3.IntegrityError as exc:
            raise LedgerError(f"ledger {self.where}: a write broke a constraint: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise LedgerError(
                f"the ledger {self.where} is unreadable or inconsistent: {exc}",
                fix="run `tpuctl doctor`; if the file is corrupt, move it aside (a new one is created)",
            ) from exc

    def schema_version(self) -> int:
        return schema.schema_version(self.raw)

    def integrity_problems(self) -> list[str]:
        problems = [str(r[0]) for r in self.raw.execute("PRAGMA integrity_check")]
        if problems == ["ok"]:
            problems = []
        for table, rowid, parent, _fk in self.raw.execute("PRAGMA foreign_key_check"):
            problems.append(f"{table} row {rowid}: missing {parent} row")
        return problems

    @contextlib.contextmanager
    def bulk(self) -> Iterator[None]:
        # A big page cache for the duration: index inserts land all over the B-trees (run ids sort as
        # text), and with the 16 MiB default a million-event import spends half its time re-reading
        # pages. Memory is only taken as pages are used, and given back after.
        self.raw.execute(f"PRAGMA cache_size = {_BULK_CACHE_KIB:d}")
        try:
            yield
        finally:
            self.raw.execute(f"PRAGMA cache_size = {_CACHE_KIB:d}")

    def close(self) -> None:
        self.raw.close()


# -- PostgreSQL --------------------------------------------------------------------------------------


class PostgresDatabase:
    """A ledger in a PostgreSQL database. Each transaction takes a pooled connection (checked before use:
    one the server dropped in a restart is replaced, not handed out) and gives it back at its end.

    A transaction that cannot get a connection because the server is out of reach (``unreachable``: a
    restart, an outage) waits for it to come back, trying again with backoff for up to
    ``reconnect_wait_s``, then fails with ``LedgerUnavailableError``: a restart then costs the ledger's
    users a pause, not an error. Only a server this ledger has reached is waited for: opening one that
    does not answer fails at once (a wrong address is not an outage). A transaction the restart cut in
    the middle fails (``LedgerUnavailableError``); what it wrote was rolled back."""

    #: Servers share the runs through their leases; the bound only catches a runaway deployment.
    max_replicas: Final = 64

    def __init__(self, url: DatabaseUrl, *, reconnect_wait_s: float = DEFAULT_RECONNECT_WAIT_S) -> None:
        from tpuctl.store.engine import create_engine

        self._url = url
        self.where = url.text
        self.engine: Engine = create_engine(url)
        self._conn: Connection | None = None
        self._reconnect_wait_s = reconnect_wait_s
        with self.translate():
            migrate.migrate_engine(self.engine, where=self.where)

    @property
    def url(self) -> DatabaseUrl:
        return self._url

    def begin(self, *, write: bool, row_locked: bool = False) -> SqlConnection:
        from sqlalchemy import exc as sa_exc

        from tpuctl.store.engine import unreachable

        give_up_at: float | None = None
        delay = _RECONNECT_FIRST_DELAY_S
        while True:
            try:
                return self._begin(write=write, row_locked=row_locked)
            except sa_exc.DBAPIError as exc:
                if not unreachable(exc):
                    raise
                now = time.monotonic()
                give_up_at = now + self._reconnect_wait_s if give_up_at is None else give_up_at
                if now >= give_up_at:
                    raise
            time.sleep(min(delay, give_up_at - now))  # a last try at the end of the wait
            delay = min(delay * 2, _RECONNECT_MAX_DELAY_S)

    def _begin(self, *, write: bool, row_locked: bool) -> SqlConnection:
        import sqlalchemy

        conn = self.engine.connect()
        try:
            if write:
                conn.begin()  # READ COMMITTED, PostgreSQL's default: a row lock re-reads what it locked
                if not row_locked:
                    conn.execute(
                        sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_WRITE_LOCK}
                    )
            else:
                conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
                conn.begin()
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return SqlAlchemyConnection(conn, POSTGRESQL)

    def commit(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.commit()
            finally:
                conn.close()

    def rollback(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.rollback()
            finally:
                conn.close()

    def translate(self) -> contextlib.AbstractContextManager[None]:
        """The driver's errors (as SQLAlchemy raises them) become LedgerError here (``postgres_errors``)."""
        return postgres_errors(self.where)

    def schema_version(self) -> int:
        return migrate.postgres_schema_version(self.engine)

    def integrity_problems(self) -> list[str]:
        # PostgreSQL checks every constraint as it writes (deferred foreign keys at commit) and its pages
        # carry their own checks: nothing a ledger-level scan would add.
        return []

    @contextlib.contextmanager
    def bulk(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        self.rollback()
        self.engine.dispose()


def open_database(url: DatabaseUrl, *, busy_timeout_s: float = 30.0) -> Database:
    """The database at ``url``, opened and brought to the newest schema, on its engine."""
    if url.path is None:
        # Waiting for a restarted server is PostgreSQL's kind of busy: the same patience as SQLite's lock.
        return PostgresDatabase(url, reconnect_wait_s=busy_timeout_s)
    return SqliteDatabase(url.path, busy_timeout_s=busy_timeout_s, private_parent=False)
