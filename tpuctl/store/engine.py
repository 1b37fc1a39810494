"""A SQLAlchemy engine for a ledger URL, on either engine: SQLite (a file) or PostgreSQL (psycopg 3).

SQLite connections get the settings the ledger has always set on its connection (``configure_sqlite``,
the same pragmas as ``Ledger._configure``, with the reasons in ``tpuctl.store.ledger``): WAL, fsync at
every commit, a 16 MiB page cache, foreign keys, a bounded WAL file; the file is created 0600 before
SQLite opens it, and its -wal and -shm files are tightened after. PostgreSQL connections are checked
before use (``pool_pre_ping``: a connection the server dropped in a restart is replaced, not handed
out), and a connection attempt gives up after ``connect_timeout`` seconds rather than hang on an
unreachable host.

SQLAlchemy is imported here, when an engine is made, never at tpuctl's start.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from tpuctl.store.paths import ensure_private_dir, private_file, tighten_file
from tpuctl.store.records import LedgerBusyError, LedgerError, LedgerUnavailableError
from tpuctl.store.url import DatabaseUrl

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["DEFAULT_BUSY_TIMEOUT_S", "configure_sqlite", "create_engine", "unreachable"]

#: How long a SQLite writer waits for another's lock (the ledger's default).
DEFAULT_BUSY_TIMEOUT_S: Final = 30.0
#: How long a PostgreSQL connection attempt may take, unless the URL says (``?connect_timeout=``).
DEFAULT_CONNECT_TIMEOUT_S: Final = 10
#: How tpuctl's connections are named in the server's ``pg_stat_activity`` (unless the URL says).
APPLICATION_NAME: Final = "tpuctl"
# Page cache, negative = KiB (SQLite's convention); the WAL file truncated back to 64 MiB.
_CACHE_KIB: Final = -16_384
_JOURNAL_SIZE_LIMIT: Final = 67_108_864
_WAL_SWITCH_WAIT_S: Final = 10.0


def create_engine(url: DatabaseUrl, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Engine:
    """An engine on the database at ``url``. Connects lazily: a database that cannot be reached fails
    at the first connection, not here."""
    if url.path is None:
        return _postgresql_engine(url)
    return _sqlite_engine(url, busy_timeout_s)


def _postgresql_engine(url: DatabaseUrl) -> Engine:
    import sqlalchemy

    given = {key for key, _ in url.query}
    connect_args: dict[str, Any] = {}
    if "connect_timeout" not in given:
        connect_args["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT_S
    if "application_name" not in given:
        connect_args["application_name"] = APPLICATION_NAME
    return sqlalchemy.create_engine(url.secret_url, pool_pre_ping=True, connect_args=connect_args)


def _sqlite_engine(url: DatabaseUrl, busy_timeout_s: float) -> Engine:
    import sqlalchemy
    from sqlalchemy import event

    path = url.path
    assert path is not None  # create_engine chose SQLite by it
    if not path.parent.exists():
        ensure_private_dir(path.parent)
    private_file(path)
    engine = sqlalchemy.create_engine(
        url.secret_url,
        # The driver's busy wait: a writer queues behind another's lock instead of failing at once.
        connect_args={"timeout": busy_timeout_s},
    )

    def on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        configure_sqlite(dbapi_connection, where=str(path))
        for suffix in ("-wal", "-shm"):
            tighten_file(f"{path}{suffix}")

    event.listen(engine, "connect", on_connect)
    return engine


def configure_sqlite(conn: sqlite3.Connection, *, where: str) -> None:
    """The ledger's settings on one SQLite connection (why each: ``tpuctl.store.ledger``'s docstring).
    The WAL switch is asked only of a file not in WAL yet (it needs an exclusive lock), waiting out
    another process opening the same fresh file."""
    if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        deadline = time.monotonic() + _WAL_SWITCH_WAIT_S
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                # SQLite can answer "locked" for the switch without going through the busy handler.
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        if str(mode).lower() != "wal":
            raise LedgerError(
                f"the ledger {where} cannot use WAL mode (got {mode!r})",
                fix="put the state dir on a local filesystem (WAL does not work over NFS)",
            )
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(f"PRAGMA cache_size = {_CACHE_KIB:d}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(f"PRAGMA journal_size_limit = {_JOURNAL_SIZE_LIMIT:d}")


@contextlib.contextmanager
def postgres_errors(where: str) -> Iterator[None]:
    """PostgreSQL's errors (as SQLAlchemy raises them) become ``LedgerError``s naming the ledger (``where``,
    its password hidden) and what to do, in this one place: ``LedgerUnavailableError`` (retryable) when
    the server is out of reach for now (``unreachable``), ``LedgerBusyError`` for a conflict with another
    transaction."""
    from sqlalchemy import exc as sa_exc

    try:
        yield
    except sa_exc.DBAPIError as exc:
        if unreachable(exc):
            raise LedgerUnavailableError(
                f"the ledger database {where} cannot be reached: {_first_line(exc.orig)}",
                fix="check that the database server is up and reachable from here, then retry",
            ) from exc
        if isinstance(exc, sa_exc.IntegrityError):
            raise LedgerError(f"ledger {where}: a write broke a constraint: {exc.orig}") from exc
        if isinstance(exc, (sa_exc.ProgrammingError, sa_exc.InterfaceError)):
            raise  # SQL this tpuctl got wrong, or a closed ledger: a bug to see as is
        if _sqlstate(exc) in _CONFLICT_STATES:
            raise LedgerBusyError(f"ledger {where}: {_first_line(exc.orig)}", fix="retry") from exc
        # The rest (a refused login, a database that does not exist): retrying would not help.
        raise LedgerError(f"ledger {where}: {_first_line(exc.orig)}") from exc


#: SQLSTATEs of a server going away or not taking connections yet (a restart), beside class 08 (the
#: connection itself): admin_shutdown, crash_shutdown, cannot_connect_now, too_many_connections.
_UNAVAILABLE_STATES: Final = frozenset({"57P01", "57P02", "57P03", "53300"})
#: The same, as the server words them when it turns a new connection away (PostgreSQL 12 to 17).
_UNAVAILABLE_PHRASES: Final = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is not yet accepting connections",
    "the database system is in recovery mode",
    "too many clients",
    "connection slots are reserved",
)
#: serialization_failure, deadlock_detected: the transaction lost to another; the same one may pass again.
_CONFLICT_STATES: Final = frozenset({"40001", "40P01"})


def unreachable(exc: Exception) -> bool:
    """Whether a PostgreSQL error (as SQLAlchemy raises it) says the server is out of reach for now, so
    that the same transaction may succeed later on a new connection: the connection was cut (SQLAlchemy
    invalidated it), could not be made (an operational error without a SQLSTATE: refused, reset, timed
    out; or class 08), or the server is shutting down or not taking connections yet."""
    from sqlalchemy import exc as sa_exc

    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    if not isinstance(exc, sa_exc.OperationalError):
        return False
    state = _sqlstate(exc)
    if state is None:
        # libpq gives no SQLSTATE for a failed connection attempt, only the text. A server that answered
        # with FATAL turned us away for good (a login refused, no such database) unless it said it is
        # starting, stopping or full; no FATAL at all is no answer (refused, reset, timed out).
        text = str(exc.orig)
        return "FATAL:" not in text or any(phrase in text for phrase in _UNAVAILABLE_PHRASES)
    return state.startswith("08") or state in _UNAVAILABLE_STATES


def _sqlstate(exc: Exception) -> str | None:
    state = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return state if isinstance(state, str) else None


def _first_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
