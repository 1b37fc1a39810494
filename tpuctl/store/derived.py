"""What a new ledger holds besides its tables (``tpuctl.store.tables``), per engine: the triggers that keep
the cost rollups and each closed slice's recomputed work, the rows of ``cost_day_offsets``, and the
ledger's random identity.

SQLite's triggers are the ones the hand-written migrations created (``tpuctl.store.schema``, where each is
explained), taken from there so that a new ledger and an adopted one hold the very same statements.
PostgreSQL's are not written yet: the cost rollups are the part of the ledger not yet on both engines,
and a PostgreSQL ledger is refused to users (``tpuctl.store.ledger.ledger_file``) until they are.
"""

from __future__ import annotations

import secrets

from tpuctl.store import schema
from tpuctl.store.sql import Dialect, SqlConnection


def statements(dialect: Dialect) -> tuple[str, ...]:
    """The triggers and fixed rows of a new ledger on ``dialect``'s engine, in order."""
    if dialect.name == "sqlite":
        return (*_legacy("CREATE TRIGGER"), *_legacy("INSERT INTO cost_day_offsets"))
    # The rollups' triggers are not written for PostgreSQL yet: its ledger is refused to users until
    # they are (``tpuctl.store.ledger.ledger_file``); the run records work without them.
    return (f"INSERT INTO cost_day_offsets (n) SELECT generate_series(0, {schema.ROLLUP_MAX_DAYS:d})",)


def seed_identity(conn: SqlConnection) -> None:
    """Stamp a new ledger with its random identity (why random: ``schema._new_identity``)."""
    conn.execute(
        "INSERT INTO ledger_meta (key, value) VALUES ('identity', :value)", {"value": secrets.token_hex(8)}
    )


def _legacy(prefix: str) -> tuple[str, ...]:
    return tuple(
        statement
        for migration in schema.MIGRATIONS
        for statement in migration.statements
        if statement.lstrip().startswith(prefix)
    )
