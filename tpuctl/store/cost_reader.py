"""A read-only connection to the ledger's database for a report's queries, refusing a schema it does not
know. One report reads one snapshot: every query sees the same ledger state.

The report's working tables (``TempTable``) are made with the snapshot: a PostgreSQL transaction that is
read only refuses even ``CREATE TEMP TABLE``, so there they are made first, dropped at the transaction's
end, and only then is the transaction made read only. The cost service (``tpuctl.services.cost``) holds
a ``LedgerReader`` and never asks which engine is behind it: its queries are written from
``tpuctl.store.cost_sql``'s fragments for ``LedgerReader.dialect``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from tpuctl.store.cost_sql import TempTable
from tpuctl.store.migrate import sqlite_user_version
from tpuctl.store.records import LedgerError
from tpuctl.store.sql import POSTGRESQL, SQLITE, Dialect, SqlAlchemyConnection
from tpuctl.store.url import DatabaseUrl

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from tpuctl.store.database import Database

#: A report's settings on PostgreSQL, for its transaction only. JIT off: the planner's cost of a query over
#: a big ledger passes ``jit_above_cost`` though it runs in milliseconds, and compiling it took longer
#: than running it. A bigger ``work_mem``: the per-day and per-run groupings hash and sort a row per
#: slice, which spilled to disk at the 4 MB default. Random reads costed as sequential ones nearly: the
#: report reads the ledger's hot pages, and at the default (4x) the planner walked a whole index in a
#: merge join to anti-join a few hundred price changes to their slices' ends, where SQLite looks each up.
_REPORT_SETTINGS: Final = (
    "SELECT set_config('jit', 'off', true), set_config('work_mem', '64MB', true), "
    "set_config('random_page_cost', '1.1', true)"
)
#: The working tables' buffers, per connection (``temp_buffers`` can only be set before the connection's
#: first temp table): the 8 MB default made the report's upserts write its working tables out and read
#: them back.
_TEMP_BUFFERS: Final = "SET temp_buffers = '64MB'"
_INSERT_INTO: Final = re.compile(r"\s*INSERT\s+INTO\s+(\w+)", re.IGNORECASE)

#: The ledger schema version these queries are written for: this tpuctl's newest (a report reads a ledger
#: its own tpuctl has brought up to date; one of another version may hold other columns).
KNOWN_SCHEMA: Final = sqlite_user_version()


class LedgerReader(Protocol):
    """The report's connection: queries inside ``snapshot``, on the engine's ``dialect``."""

    @property
    def dialect(self) -> Dialect: ...

    def query(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]: ...

    def execute(self, sql: str, params: Mapping[str, Any]) -> None: ...

    def execute_many(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """``sql`` once per parameter set in ``rows``, in one go (PostgreSQL: one round trip)."""
        ...

    def snapshot(self, tables: Sequence[TempTable] = ()) -> AbstractContextManager[None]:
        """One read transaction, with the report's working ``tables`` made empty in it."""
        ...

    def another(self) -> LedgerReader:
        """One more reader of the same database (a scan's parallel part: a connection of its own), whose
        snapshot is this one's where the engine can share it (PostgreSQL), called inside ``snapshot``."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> LedgerReader: ...

    def __exit__(self, *exc: object) -> None: ...


def open_reader(database: DatabaseUrl | Database) -> LedgerReader:
    """A reader of the ledger at ``database`` (a URL, or an open ``Database`` whose engine it shares)."""
    url = database if isinstance(database, DatabaseUrl) else database.url
    if url.path is not None:
        return SqliteReader(url.path)
    engine = None if isinstance(database, DatabaseUrl) else getattr(database, "engine", None)
    return PostgresReader(url, engine)


def _refuse_schema(where: str, version: int) -> LedgerError:
    return LedgerError(
        f"the ledger {where} has schema version {version}; cost reports know version {KNOWN_SCHEMA}",
        fix="use the tpuctl version that wrote this ledger",
    )


class SqliteReader:
    """A read-only SQLite connection to the ledger file."""

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
            raise _refuse_schema(str(self.path), version)

    @property
    def dialect(self) -> Dialect:
        return SQLITE

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

    def execute_many(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        try:
            self._conn.executemany(sql, [dict(row) for row in rows])
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path}: {exc}") from exc

    @contextmanager
    def snapshot(self, tables: Sequence[TempTable] = ()) -> Iterator[None]:
        self._conn.execute("BEGIN")
        try:
            for table in tables:
                self.execute(table.ddl(SQLITE), {})
            yield
        finally:
            if self._conn.in_transaction:
                self._conn.execute("COMMIT")
            # Temp tables outlive a transaction on SQLite: gone with the snapshot, as on PostgreSQL.
            for table in tables:
                self._conn.execute(f"DROP TABLE IF EXISTS temp.{table.name}")

    def another(self) -> SqliteReader:
        return SqliteReader(self.path)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SqliteReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _number(value: Decimal) -> int | float:
    """A NUMERIC as SQLite would have given it: the SUM of a BIGINT (a whole number) as an int, exact
    literals and what they touch as a float, so the report never meets a Decimal and its documents are
    the same on both engines (3 slices, not 3.0)."""
    exponent = value.as_tuple().exponent
    return int(value) if isinstance(exponent, int) and exponent >= 0 else float(value)


class PostgresReader:
    """A connection of the ledger database's pool, reading in one REPEATABLE READ, read-only transaction
    per snapshot. ``engine``: an open ``PostgresDatabase``'s, shared; else one made here and disposed of
    at ``close``."""

    def __init__(self, url: DatabaseUrl, engine: Engine | None = None, *, shared: str | None = None) -> None:
        from tpuctl.store import migrate
        from tpuctl.store.engine import create_engine

        self.url = url
        #: The exported snapshot this reader's transactions read (``another``), else their own.
        self._shared = shared
        self._own_engine = engine is None
        self._engine: Engine = create_engine(url) if engine is None else engine
        self._conn: SqlAlchemyConnection | None = None
        #: The working tables of the snapshot, those whose statistics are gathered (``statistics``),
        #: and those of them written since their statistics were gathered.
        self._tables: frozenset[str] = frozenset()
        self._analyzed: frozenset[str] = frozenset()
        self._unanalyzed: set[str] = set()
        with self._translate():
            version = migrate.postgres_schema_version(self._engine)
        if version != KNOWN_SCHEMA:
            self.close()
            raise _refuse_schema(url.text, version)

    @property
    def dialect(self) -> Dialect:
        return POSTGRESQL

    def query(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        rows = self._run(sql, params).fetchall()
        return [tuple(_number(v) if isinstance(v, Decimal) else v for v in row) for row in rows]

    def execute(self, sql: str, params: Mapping[str, Any]) -> None:
        self._run(sql, params)

    def execute_many(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if self._conn is None:
            raise LedgerError(f"ledger {self.url.text}: a report's query outside its snapshot")
        written = self._analyze_before(sql)
        with self._translate():
            self._conn.executemany(sql, rows)  # pipelined by the driver
        if written in self._analyzed:
            self._unanalyzed.add(written)

    def _run(self, sql: str, params: Mapping[str, Any]) -> Any:
        if self._conn is None:
            raise LedgerError(f"ledger {self.url.text}: a report's query outside its snapshot")
        written = self._analyze_before(sql)
        with self._translate():
            result = self._conn.execute(sql, dict(params))
        if written in self._analyzed:
            self._unanalyzed.add(written)
        return result

    def _analyze_before(self, sql: str) -> str | None:
        """Gather the statistics of the working tables ``sql`` reads that were written since (the
        planner otherwise takes a temp table for a few thousand rows, and joins a handful of slice ids
        to ``pods`` by reading all of it); the working table ``sql`` writes, if any."""
        insert = _INSERT_INTO.match(sql)
        target = insert.group(1) if insert is not None and insert.group(1) in self._tables else None
        body = sql if target is None else re.sub(rf"\b{target}\b", "", sql)
        for table in sorted(self._unanalyzed):
            if re.search(rf"\b{table}\b", body):
                self._unanalyzed.discard(table)
                assert self._conn is not None
                with self._translate():
                    self._conn.execute(f"ANALYZE {table}", {})  # a name of the report's own tables
        return target

    def _set_temp_buffers(self, conn: Connection) -> None:
        """``_TEMP_BUFFERS`` on a connection of the pool that has not had it (once: a setting of the
        session). One that made temp tables before refuses it, and keeps its buffers."""
        info = conn.connection.info
        if info.get("tpuctl_temp_buffers"):
            return
        info["tpuctl_temp_buffers"] = True
        try:
            with conn.begin_nested():
                self.execute(_TEMP_BUFFERS, {})
        except LedgerError:
            pass  # the default buffers: slower, not wrong

    @contextmanager
    def snapshot(self, tables: Sequence[TempTable] = ()) -> Iterator[None]:
        with self._translate():
            conn = self._engine.connect().execution_options(isolation_level="REPEATABLE READ")
            conn.begin()
        self._conn = SqlAlchemyConnection(conn, POSTGRESQL)
        try:
            if self._shared is not None:  # first, as PostgreSQL requires; an id it made, never user input
                self.execute(f"SET TRANSACTION SNAPSHOT '{self._shared}'", {})
            self._set_temp_buffers(conn)
            # One round trip for the tables and settings (a script of statements without parameters):
            # each is a few milliseconds' work, and on a loaded machine as much again to wait for the reply.
            script = [table.ddl(POSTGRESQL) + " ON COMMIT DROP" for table in tables]
            script += [_REPORT_SETTINGS, "SET TRANSACTION READ ONLY"]
            with self._translate():
                conn.exec_driver_sql(";\n".join(script))
            self._tables = frozenset(table.name for table in tables)
            self._analyzed = frozenset(table.name for table in tables if table.statistics)
            yield
        finally:
            self._conn = None
            self._tables = self._analyzed = frozenset()
            self._unanalyzed.clear()
            try:
                conn.rollback()  # nothing was written: rolling back ends the read and drops the tables
            finally:
                conn.close()

    def another(self) -> PostgresReader:
        # The parts of a scan read the very state this report reads, even with writers in between.
        (shared,) = self.query("SELECT pg_export_snapshot()", {})[0]
        return PostgresReader(self.url, self._engine, shared=str(shared))

    def _translate(self) -> AbstractContextManager[None]:
        from tpuctl.store.engine import postgres_errors

        return postgres_errors(self.url.text)

    def close(self) -> None:
        if self._own_engine:
            self._engine.dispose()

    def __enter__(self) -> PostgresReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
