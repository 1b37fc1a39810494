"""Bringing a ledger's schema to the newest revision of its history (``tpuctl.store.migrations``).

Opening a ledger asks one question first, without importing Alembic: is ``alembic_version`` at
``migrations.HEAD``? Only when it is not does tpuctl take the database's write lock, ask again (another
process may have migrated meanwhile) and run Alembic, in that one transaction: a tpuctl killed half way
leaves the old schema, and two opening a new ledger at once create it once.

SQLite ledgers from before the history (``PRAGMA user_version`` 1-10, made by the hand-written
migrations in ``tpuctl.store.schema``) are adopted without loss: brought to version 10 by those
migrations, then stamped with the history's baseline, whose schema they then have (a test holds the two
equal, table by table and index by index). A new SQLite ledger gets ``user_version`` 10 as well, so an
older tpuctl, which knows only ``user_version``, still opens it; a revision after the baseline that
changes the schema raises ``user_version`` past 10, so an older tpuctl refuses the ledger ("newer than
this tpuctl understands") rather than misread it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from collections.abc import Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from tpuctl.store import migrations, schema
from tpuctl.store.records import LedgerError
from tpuctl.store.url import DatabaseUrl

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext, MigrationInfo
    from sqlalchemy.engine import Engine

#: Where Alembic finds the history (a package resource: works from a wheel as from a checkout).
SCRIPT_LOCATION: Final = "tpuctl.store:migrations"
#: Alembic's version table, as Alembic creates it on SQLite.
ALEMBIC_VERSION_TABLE_SQL: Final = (
    "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL, "
    "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
)


def sqlite_is_current(raw: sqlite3.Connection) -> bool:
    """Whether the SQLite ledger on ``raw`` is at ``migrations.HEAD`` and its ``user_version`` says so
    too (two cheap reads; no Alembic). Either one off sends the open down the slow path, which refuses a
    newer ledger and finishes an older one."""
    if schema.schema_version(raw) != sqlite_user_version():
        return False
    try:
        row = raw.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return False
        raise
    return row is not None and row[0] == migrations.HEAD


def sqlite_user_version() -> int:
    """``PRAGMA user_version`` of a SQLite ledger at ``migrations.HEAD``: the hand-written migrations'
    count (10, the baseline), plus one per revision after it (see the module docstring)."""
    return user_version_at(migrations.HEAD)


def user_version_at(revision: str) -> int:
    """``PRAGMA user_version`` of a SQLite ledger at ``revision`` of the history."""
    return schema.SCHEMA_VERSION + migrations.KNOWN.index(revision)


def migrate_sqlite(raw: sqlite3.Connection, *, where: str) -> None:
    """Bring the SQLite ledger on ``raw`` (autocommit mode: the transaction is ours) to
    ``migrations.HEAD``; a no-op when it is there already. ``where`` names the ledger in errors."""
    if sqlite_is_current(raw):
        return
    if schema.schema_version(raw) > sqlite_user_version():
        schema.refuse_newer(schema.schema_version(raw), where, sqlite_user_version())
    # Up to the baseline by the hand-written migrations (a new file: all ten, in ~15 ms; an adopted one:
    # what it lacks); what they make is the baseline's schema exactly (tests/store/test_migrate.py). Only
    # the revisions after the baseline need Alembic, and SQLAlchemy's import (~0.3 s, once per new
    # ledger: a command that opens a current ledger imports neither).
    if schema.schema_version(raw) < schema.SCHEMA_VERSION:
        # Another process may finish the whole history meanwhile: the hand-written migrations then
        # leave the ledger as it is (up to this tpuctl's newest), as this one does below.
        schema.migrate(raw, where=where, newest=sqlite_user_version())
    with _write_lock(raw):
        _refuse_newer_sqlite(raw, where)
        if not _has_version_table(raw):
            _stamp_baseline(raw)
        if _revision(raw) == migrations.HEAD:
            raw.execute(f"PRAGMA user_version = {sqlite_user_version():d}")
            return
    _upgrade_sqlite(raw, where)


@contextlib.contextmanager
def _write_lock(raw: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction, committed when the block ends (rolled back if it raises)."""
    raw.execute("BEGIN IMMEDIATE")
    try:
        yield
        if raw.in_transaction:
            raw.execute("COMMIT")
    except BaseException:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise


def _revision(raw: sqlite3.Connection) -> str | None:
    row = raw.execute("SELECT version_num FROM alembic_version").fetchone()
    return None if row is None else str(row[0])


def _has_version_table(raw: sqlite3.Connection) -> bool:
    row = raw.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
    ).fetchone()
    return row is not None


def _stamp_baseline(raw: sqlite3.Connection) -> None:
    """What ``alembic stamp`` writes for the baseline (the same table and row; a test compares them),
    without importing Alembic."""
    raw.execute(ALEMBIC_VERSION_TABLE_SQL)
    raw.execute("INSERT INTO alembic_version (version_num) VALUES (?)", (migrations.BASELINE,))


def _upgrade_sqlite(raw: sqlite3.Connection, where: str) -> None:
    """Run the revisions after the ledger's, all in one ``BEGIN IMMEDIATE`` transaction: Alembic's
    commit is the end of it, its rollback undoes every revision of the upgrade. The transaction begins
    after SQLAlchemy has connected (its first connect ends any transaction open on ``raw``)."""
    from alembic import command
    from sqlalchemy.exc import DBAPIError

    with _sqlalchemy_on(raw) as conn, _write_lock(raw):
        _refuse_newer_sqlite(raw, where)
        if _revision(raw) != migrations.HEAD:  # another process may have upgraded meanwhile
            try:
                command.upgrade(_config(conn), migrations.HEAD)
            except DBAPIError as exc:
                # The engine's own error, as the ledger's boundary translates it (``Database.translate``).
                raise (exc.orig or exc) from exc


def on_revision_applied(
    ctx: MigrationContext, step: MigrationInfo, heads: Collection[Any], run_args: Mapping[str, Any]
) -> None:
    """Alembic's hook after each revision, in its transaction: a SQLite ledger's ``user_version``
    follows the revision (``sqlite_user_version``), so an older tpuctl refuses the newer schema."""
    del step, run_args
    assert ctx.connection is not None  # env.py always hands Alembic a connection
    if ctx.connection.dialect.name != "sqlite":
        return
    (head,) = heads
    ctx.connection.exec_driver_sql(f"PRAGMA user_version = {user_version_at(head):d}")


def _refuse_newer_sqlite(raw: sqlite3.Connection, where: str) -> None:
    revision = _revision(raw) if _has_version_table(raw) else None
    if revision is not None and revision not in migrations.KNOWN:
        raise LedgerError(
            f"the ledger at {where} is at schema revision {revision}, newer than this tpuctl understands "
            f"({migrations.HEAD})",
            fix="upgrade tpuctl, or point --state-dir at another directory",
        )


@contextlib.contextmanager
def _sqlalchemy_on(raw: sqlite3.Connection) -> Iterator[Any]:
    """A SQLAlchemy connection over ``raw`` itself, inside the transaction its caller began: Alembic's
    statements run under the caller's write lock, and its commit is the caller's (the pool never resets
    or closes ``raw``)."""
    import sqlalchemy
    from sqlalchemy.pool import StaticPool

    engine = sqlalchemy.create_engine(
        "sqlite://", creator=lambda: raw, poolclass=StaticPool, pool_reset_on_return=None
    )
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose(close=False)


def _config(conn: Any) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes["connection"] = conn
    return config


# -- PostgreSQL ---------------------------------------------------------------------------------------

#: The advisory lock a PostgreSQL ledger's migration holds ("tpumig" in ASCII): two tpuctl processes
#: opening a new database at once create the schema once; the second finds it done.
PG_MIGRATE_LOCK: Final = 0x7470756D6967


def migrate_engine(engine: Engine, *, where: str) -> None:
    """Bring the PostgreSQL ledger ``engine`` connects to to ``migrations.HEAD``, under an advisory lock,
    in one transaction; a no-op (one query) when it is there. ``where`` names the ledger in errors."""
    import sqlalchemy

    with engine.connect() as conn:
        if _pg_revision(conn) == migrations.HEAD:
            return
        conn.rollback()  # end the read's own (auto-begun) transaction: the migration's is one of its own
        with conn.begin():
            conn.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATE_LOCK})
            found = _pg_revision(conn)
            if found is not None and found not in migrations.KNOWN:
                raise LedgerError(
                    f"the ledger at {where} is at schema revision {found}, newer than this tpuctl "
                    f"understands ({migrations.HEAD})",
                    fix="upgrade tpuctl, or point --database at another database",
                )
            if found != migrations.HEAD:
                from alembic import command

                command.upgrade(_config(conn), migrations.HEAD)


def postgres_schema_version(engine: Engine) -> int:
    """The schema version of a PostgreSQL ledger, counted as a SQLite one's (``sqlite_user_version``)."""
    with engine.connect() as conn:
        found = _pg_revision(conn)
    return 0 if found is None else user_version_at(found)


def _pg_revision(conn: Any) -> str | None:
    import sqlalchemy

    if conn.execute(sqlalchemy.text("SELECT to_regclass('alembic_version')")).scalar() is None:
        return None
    row = conn.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).fetchone()
    return None if row is None else str(row[0])


# -- where a ledger stands, without changing it ---------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SchemaState:
    """Where a ledger's schema stands against this tpuctl's history (``schema_state``)."""

    #: The ledger's revision of the history; None for a new database or one from before the history.
    revision: str | None
    #: The hand-written migrations' version of a SQLite ledger (``PRAGMA user_version``); None for
    #: PostgreSQL, which never had them.
    legacy_version: int | None
    #: The revisions opening the ledger would run, oldest first (all of them for a new database).
    pending: tuple[str, ...]
    #: Whether the ledger is newer than this tpuctl (it refuses to open it).
    newer: bool


def schema_state(url: DatabaseUrl) -> SchemaState:
    """Where the ledger at ``url`` stands, read without migrating or creating anything (a missing SQLite
    file reads as a new database)."""
    if url.path is None:
        from tpuctl.store.engine import create_engine, postgres_errors

        engine = create_engine(url)
        try:
            with postgres_errors(url.text), engine.connect() as conn:
                return _state(_pg_revision(conn), None)
        finally:
            engine.dispose()
    if not url.path.exists():
        return _state(None, 0)
    raw = sqlite3.connect(url.path.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        legacy = schema.schema_version(raw)
        revision = _revision(raw) if _has_version_table(raw) else None
    finally:
        raw.close()
    return _state(revision, legacy)


def _state(revision: str | None, legacy: int | None) -> SchemaState:
    if revision is not None and revision not in migrations.KNOWN:
        return SchemaState(revision, legacy, (), newer=True)
    newer = legacy is not None and legacy > sqlite_user_version()
    start = 0 if revision is None else migrations.KNOWN.index(revision) + 1
    if revision is None and legacy:  # adopted: stamped with the baseline, not run
        start = 1
    return SchemaState(revision, legacy, migrations.KNOWN[start:], newer)
