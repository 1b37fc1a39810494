"""The connection the ledger's SQL runs on, whichever engine holds the ledger.

A statement is written once, with named parameters (``:name``), in the SQL both engines take (upserts,
``RETURNING``, ``NOT EXISTS``, window functions). Where the engines differ the statement asks the
connection's ``Dialect`` for the fragment: the database's clock, a field of a JSON text column, the
larger or smaller of two values. ``SqliteConnection`` hands statements to sqlite3 as they are (sqlite3
takes ``:name`` itself, so SQLite pays nothing for the indirection); the PostgreSQL connection runs them
through SQLAlchemy's ``text()``, which turns ``:name`` into the driver's placeholders.

Statements still written with ``?`` placeholders run on SQLite only: the PostgreSQL connection refuses
positional parameters, so a statement not yet written for both engines fails loudly there instead of
being guessed at.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

EngineName = Literal["sqlite", "postgresql"]
#: How strongly ``Dialect.row_lock`` locks: ``update`` excludes every other lock; ``share`` excludes only
#: ``update`` (and writes), so two sharers may hold a row at once.
RowLock = Literal["update", "share"]

#: Parameters of one statement: named (both engines) or positional (SQLite only, see the module doc).
Params = Mapping[str, Any] | Sequence[Any]


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the engines, as SQL fragments. Build with ``SQLITE`` or ``POSTGRESQL``."""

    name: EngineName

    @property
    def now_epoch(self) -> str:
        """An expression for the database's clock in epoch seconds, read when evaluated.

        SQLite: Julian days since noon UTC 4714 BC, whose epoch (1970-01-01) is Julian day 2440587.5;
        millisecond resolution. PostgreSQL: ``clock_timestamp()``, not ``now()``, which is the
        transaction's start and would make a long transaction's leases look younger than they are.
        """
        if self.name == "sqlite":
            return "((julianday('now') - 2440587.5) * 86400.0)"
        return "(extract(epoch FROM clock_timestamp())::double precision)"

    def greatest(self, first: str, second: str) -> str:
        """The larger of two values (SQLite's two-argument ``max``; both give NULL if either is NULL on
        SQLite, while PostgreSQL's ``GREATEST`` skips NULLs, so callers pass non-NULL values)."""
        return f"max({first}, {second})" if self.name == "sqlite" else f"GREATEST({first}, {second})"

    def least(self, first: str, second: str) -> str:
        """The smaller of two values (see ``greatest`` on NULLs)."""
        return f"min({first}, {second})" if self.name == "sqlite" else f"LEAST({first}, {second})"

    def any_changed(self, columns: Sequence[str]) -> str:
        """In a row trigger, whether any of ``columns`` differs between OLD and NEW, NULLs compared as
        values (SQLite's ``IS NOT``, PostgreSQL's ``IS DISTINCT FROM``)."""
        differs = "IS NOT" if self.name == "sqlite" else "IS DISTINCT FROM"
        return "(" + " OR ".join(f"OLD.{c} {differs} NEW.{c}" for c in columns) + ")"

    def row_lock(self, strength: RowLock, *, of: str | None = None, skip_locked: bool = False) -> str:
        """The clause a ``SELECT`` ends with to lock the rows it returns until the transaction ends:
        ``update`` (to change them; excludes every other lock) or ``share`` (to keep them as they are
        while the transaction writes elsewhere), of table (alias) ``of`` only, ``skip_locked``: rows
        another transaction has locked are left out instead of waited for. Empty on SQLite, whose write
        transactions already exclude each other from their first statement (``BEGIN IMMEDIATE``)."""
        if self.name == "sqlite":
            return ""
        clause = " FOR UPDATE" if strength == "update" else " FOR SHARE"
        if of is not None:
            clause += f" OF {of}"
        return clause + (" SKIP LOCKED" if skip_locked else "")

    def json_text(self, column: str, key: str) -> str:
        """The text of top-level field ``key`` of the JSON object held in text column ``column`` (NULL
        when absent). ``key`` is a fixed identifier of tpuctl's, never user input."""
        if not key.replace("_", "").isalnum():
            raise ValueError(f"not a plain JSON key: {key!r}")
        if self.name == "sqlite":
            return f"json_extract({column}, '$.{key}')"
        return f"(({column})::jsonb ->> '{key}')"


SQLITE: Final = Dialect("sqlite")
POSTGRESQL: Final = Dialect("postgresql")


class Result(Protocol):
    """The rows of one statement: tuples, read once."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class SqlConnection(Protocol):
    """One database connection inside a transaction its owner (the ``Ledger``) began and will end.

    ``execute`` runs one statement and returns its rows; ``executemany`` runs one statement per
    parameter set and returns how many rows they changed in all. Errors are the engine's own; the
    ledger translates them at its boundary (``Ledger._translate``), in one place.
    """

    @property
    def dialect(self) -> Dialect: ...

    def execute(self, sql: str, params: Params = ()) -> Result: ...

    def executemany(self, sql: str, params: Iterable[Params]) -> int: ...


class SqliteConnection:
    """``SqlConnection`` over a sqlite3 connection (``raw``, for what only SQLite has: PRAGMAs)."""

    __slots__ = ("raw",)

    def __init__(self, raw: sqlite3.Connection) -> None:
        self.raw = raw

    @property
    def dialect(self) -> Dialect:
        return SQLITE

    def execute(self, sql: str, params: Params = ()) -> sqlite3.Cursor:
        return self.raw.execute(sql, params)

    def executemany(self, sql: str, params: Iterable[Params]) -> int:
        # sqlite3 sums the modifications of every parameter set into rowcount.
        return max(self.raw.executemany(sql, params).rowcount, 0)

    @property
    def in_transaction(self) -> bool:
        return self.raw.in_transaction


class SqlAlchemyConnection:
    """``SqlConnection`` over a SQLAlchemy connection (PostgreSQL's, and either engine's under Alembic).

    Statements go through ``text()``, which turns ``:name`` into the driver's placeholders; each text is
    compiled once and kept (the ledger runs the same few dozen statements over and over).
    """

    __slots__ = ("_conn", "_dialect")

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self._conn = conn  # a sqlalchemy.engine.Connection (not imported here: tpuctl's start stays light)
        self._dialect = dialect

    @classmethod
    def of(cls, conn: Any) -> SqlAlchemyConnection:
        """``conn`` (a SQLAlchemy connection: a migration's bind) with its engine's dialect."""
        return cls(conn, SQLITE if conn.dialect.name == "sqlite" else POSTGRESQL)

    @property
    def dialect(self) -> Dialect:
        return self._dialect

    def execute(self, sql: str, params: Params = ()) -> Result:
        if not isinstance(params, Mapping):
            if params:
                raise TypeError(f"positional parameters are SQLite's alone; name them: {sql[:80]!r}")
            params = {}
        result: Result = self._conn.execute(_text(sql), params)
        return result

    def executemany(self, sql: str, params: Iterable[Params]) -> int:
        rows = [dict(p) if isinstance(p, Mapping) else _refuse_positional(sql) for p in params]
        if not rows:
            return 0
        # The driver's executemany (psycopg pipelines it); its rowcount is the sum over the rows, which
        # callers rely on (log lines: how many were new). tests/store/test_sql.py checks it on both engines.
        return max(int(self._conn.execute(_text(sql), rows).rowcount), 0)


def in_list(name: str, values: Iterable[str], params: dict[str, Any]) -> str:
    """The inside of ``IN (...)`` for ``values`` as named parameters ``:name0, :name1, ...`` (added to
    ``params``); ``NULL`` for none, so that ``x IN (NULL)`` holds for no row on either engine."""
    keys = []
    for i, value in enumerate(values):
        params[f"{name}{i}"] = value
        keys.append(f":{name}{i}")
    return ", ".join(keys) or "NULL"


@functools.lru_cache(maxsize=512)
def _text(sql: str) -> Any:
    import sqlalchemy

    return sqlalchemy.text(sql)


def _refuse_positional(sql: str) -> dict[str, Any]:
    raise TypeError(f"positional parameters are SQLite's alone; name them: {sql[:80]!r}")
