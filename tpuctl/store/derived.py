"""What a new ledger holds besides its tables (``tpuctl.store.tables``), per engine: the triggers that keep
the cost rollups and each closed slice's recomputed work, the rows of ``cost_day_offsets``, and the
ledger's random identity.

SQLite's triggers are the ones the hand-written migrations created (``tpuctl.store.schema``, where each is
explained), taken from there so that a new ledger and an adopted one hold the very same statements.

PostgreSQL's are the same eleven triggers, in the same order, with the same conditions and statements
written for PostgreSQL (``schema``'s SQL with ``dialect=POSTGRESQL``): each a PL/pgSQL function and an
``AFTER ... FOR EACH ROW`` trigger calling it. Where SQLite's ``WHEN`` holds a subquery (whether a slice
ever had a price change), PostgreSQL's ``WHEN``, which takes none, keeps the rest and the function checks
the subquery first. The engines run a row trigger at different moments (SQLite right after the row is
written, PostgreSQL at the end of the statement), which changes nothing here: each trigger reads only
its own row and other tables, and the ledger writes a slice with one statement per row.

The triggers that write ``pods`` themselves (marking a slice rolled, re-deriving recomputed work) end
without recursion on both engines, by their conditions alone: such an update sets only ``rolled`` or
``rec_*``, of a slice already closed, so no ``OLD.ended_at IS NULL`` or ``OLD.deleted_at IS NULL``
condition holds for it and ``pods_rec_update`` (``UPDATE OF`` the columns recomputed work depends on)
is not fired by it. (SQLite would not re-enter a running trigger anyway: recursive triggers are off.)
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from tpuctl.store import schema
from tpuctl.store.sql import POSTGRESQL, Dialect, SqlConnection


def statements(dialect: Dialect) -> tuple[str, ...]:
    """The triggers and fixed rows of a new ledger on ``dialect``'s engine, in order."""
    if dialect.name == "sqlite":
        return (*_legacy("CREATE TRIGGER"), *_legacy("INSERT INTO cost_day_offsets"))
    return (
        *(statement for trigger in _postgresql_triggers() for statement in trigger.statements()),
        f"INSERT INTO cost_day_offsets (n) SELECT generate_series(0, {schema.ROLLUP_MAX_DAYS:d})",
    )


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


@dataclass(frozen=True)
class PgTrigger:
    """One PostgreSQL row trigger (these, and those of ``slice_rollup`` and ``run_sums``): ``event`` as CREATE
    TRIGGER spells it ("INSERT ON pods"), the ``when`` it fires under (no subquery), a ``guard`` its
    function checks first (may hold one), and the ``body``: statements, each ending in ``;``."""

    name: str
    event: str
    when: str | None
    body: str
    guard: str | None = None

    def statements(self) -> tuple[str, str]:
        body = self.body if self.guard is None else f"IF {self.guard} THEN\n    {self.body}\n    END IF;"
        # An AFTER trigger's result is ignored; NULL says so.
        function = (
            f"CREATE FUNCTION {self.name}() RETURNS trigger LANGUAGE plpgsql AS $$\nBEGIN\n    {body}\n"
            "    RETURN NULL;\nEND\n$$"
        )
        when = "" if self.when is None else f"\n    WHEN ({self.when})"
        trigger = (
            f"CREATE TRIGGER {self.name} AFTER {self.event} FOR EACH ROW{when}\n"
            f"    EXECUTE FUNCTION {self.name}()"
        )
        return function, trigger


class RowTrigger(NamedTuple):
    """A row trigger of a revision's table (``run_sums``, ``slice_rollup``, ``shares_seen``): ``event`` as
    CREATE TRIGGER spells it, the ``when`` it fires under (no subquery), its ``body`` (statements, each
    ending in ``;``), and a ``guard`` that may hold a subquery (SQLite's ``WHEN`` takes it too;
    PostgreSQL's function checks it first)."""

    name: str
    event: str
    when: str
    body: str
    guard: str | None = None


def row_trigger_statements(triggers: Iterable[RowTrigger], dialect: Dialect) -> tuple[str, ...]:
    """The statements creating ``triggers`` on ``dialect``'s engine, in order: SQLite's ``CREATE TRIGGER
    ... WHEN``, PostgreSQL's function and trigger each (``PgTrigger``)."""
    if dialect.name == "sqlite":
        return tuple(
            f"CREATE TRIGGER {t.name} AFTER {t.event} WHEN {t.when}"
            f"{'' if t.guard is None else f' AND {t.guard}'}\n    BEGIN {t.body} END"
            for t in triggers
        )
    return tuple(
        statement
        for t in triggers
        for statement in PgTrigger(t.name, t.event, t.when, t.body, guard=t.guard).statements()
    )


def _postgresql_triggers() -> tuple[PgTrigger, ...]:
    """SQLite's eleven triggers (``schema``'s migrations v4, v7, v8), in the order they were made."""
    pg = POSTGRESQL
    rollup_add = schema.rollup_add_sql(pg)

    def rec(zone: str, name: str) -> str:
        return schema.rec_update_sql(zone, name, pg)

    roll_x, roll_held = schema.roll_x_sql(pg), schema.roll_held_sql(pg)
    crossing, held = schema.crossing_billed_sql("NEW", pg), schema.held_final_sql("NEW")
    never_repriced = schema.price_never_changed_sql("NEW")
    watched = ", ".join(schema.REC_WATCHED_COLUMNS)
    return (
        PgTrigger("pods_rollup_insert", "INSERT ON pods", schema.rolled_sql("NEW", pg), rollup_add),
        PgTrigger("pods_rollup_close", "UPDATE ON pods",
                 f"OLD.ended_at IS NULL AND {schema.rolled_sql('NEW', pg)}", rollup_add),
        PgTrigger("pods_rec_insert", "INSERT ON pods", "NEW.ended_at IS NOT NULL",
                 rec("NEW.zone", "NEW.name")),
        PgTrigger("pods_rec_update", f"UPDATE OF {watched} ON pods", "NEW.ended_at IS NOT NULL",
                 rec("NEW.zone", "NEW.name")),
        PgTrigger("run_segments_rec_insert", "INSERT ON run_segments", "NEW.pod IS NOT NULL",
                 rec("NEW.zone", "NEW.pod")),
        PgTrigger("run_segments_rec_update", "UPDATE ON run_segments", None,
                 f"{rec('NEW.zone', 'NEW.pod')}\n    {rec('OLD.zone', 'OLD.pod')}"),
        PgTrigger("run_segments_rec_delete", "DELETE ON run_segments", "OLD.pod IS NOT NULL",
                 rec("OLD.zone", "OLD.pod")),
        PgTrigger("pods_rollup_x_insert", "INSERT ON pods", crossing, roll_x, guard=never_repriced),
        PgTrigger("pods_rollup_x_close", "UPDATE ON pods", f"OLD.ended_at IS NULL AND {crossing}", roll_x,
                 guard=never_repriced),
        PgTrigger("pods_rollup_held_insert", "INSERT ON pods", held, roll_held),
        PgTrigger("pods_rollup_held_delete", "UPDATE ON pods", f"OLD.deleted_at IS NULL AND {held}",
                 roll_held),
    )  # fmt: skip
