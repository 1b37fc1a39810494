"""Rollups of the slices ``cost_rollup`` sums under another key, kept by triggers on ``pods``: what
``cost_rollup_owner`` and ``cost_rollup_norun`` hold.

Such a table sums the very slices ``cost_rollup`` sums (``schema.rolled_sql``: closed, billed, within one
UTC day, not a free preemption), those of them its ``only`` picks, per its key. A NULL in a key is keyed
as ``billing.null_key_sql`` (a NULL never conflicts in a key). Triggers keep it, on both engines, in the
transaction of the write (single events, bulk writes, replayed copies alike):

* a row inserted already rolled (a bulk write that holds a slice's whole life), or
* a row whose billing closes (``ended_at`` was NULL): its sums are added at its key, as ``cost_rollup``'s
  own triggers do;
* a rolled slice one of whose ``moved_by`` columns changes (its owner or its run: unlike every other
  billing fact, those can change after it closed: ``tpuctl.store.view`` takes them from a slice's first
  event, which may come late, and tools attribute existing slices with plain updates): its sums move from
  the old key to the new one (taken where the old row was picked, added where the new one is), and a row
  left with no slice is deleted: the table always equals ``check_sql``, with no row of zeros.

SQLite's triggers are plain ``CREATE TRIGGER``s; PostgreSQL's a PL/pgSQL function and a row trigger each
(``derived.PgTrigger``), with the same conditions and statements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpuctl.store import schema
from tpuctl.store.derived import RowTrigger, row_trigger_statements
from tpuctl.store.sql import Dialect, SqlConnection


@dataclass(frozen=True)
class SliceRollup:
    """A rollup of the rolled slices ``only`` picks, keyed by ``key``.

    ``key_values(r, dialect)``: the SQL of each of ``key``'s columns for the slice ``r`` ("NEW", "OLD",
    "p"); ``only(r)``: which slices it holds (None: every rolled one); ``moved_by``: the columns whose
    change moves a rolled slice; ``triggers``: the insert, close and move triggers' names."""

    table: str
    key: tuple[str, ...]
    key_values: Callable[[str, Dialect], list[str]]
    only: Callable[[str], str] | None
    moved_by: tuple[str, ...]
    triggers: tuple[str, str, str]

    def key_sql(self, r: str, dialect: Dialect) -> str:
        """The key of the slice ``r``."""
        return ", ".join(self.key_values(r, dialect))

    def check_sql(self, dialect: Dialect) -> str:
        """What the table must hold, recomputed from ``pods`` (rows in key order)."""
        return f"{self._select_sql(dialect)} ORDER BY {self._positions()}"

    def trigger_statements(self, dialect: Dialect) -> tuple[str, ...]:
        """The statements creating the triggers on ``dialect``'s engine, in order."""
        add = self._add_sql(dialect)
        rolled = self._picked("NEW", schema.rolled_sql("NEW", dialect))
        moved = dialect.any_changed(self.moved_by)
        return row_trigger_statements(
            (
                RowTrigger(self.triggers[0], "INSERT ON pods", rolled, add),
                RowTrigger(self.triggers[1], "UPDATE ON pods", f"OLD.ended_at IS NULL AND {rolled}", add),
                RowTrigger(self.triggers[2], f"UPDATE OF {', '.join(self.moved_by)} ON pods",
                           f"{schema.rolled_sql('OLD', dialect)}\n    AND {moved}",
                           self._move_sql(dialect)),
            ),
            dialect,
        )  # fmt: skip

    def create(self, conn: SqlConnection) -> None:
        """The revision's statements after its table: the triggers, then the backfill from the slices
        already recorded (in the migration's transaction: no write can come between them)."""
        for statement in self.trigger_statements(conn.dialect):
            conn.execute(statement)
        conn.execute(f"INSERT INTO {self.table} ({self._columns()})\n{self._select_sql(conn.dialect)}")

    def _columns(self) -> str:
        return ", ".join((*self.key, *schema.ROLLUP_SUMS))

    def _positions(self) -> str:
        return ", ".join(str(i) for i in range(1, len(self.key) + 1))

    def _picked(self, r: str, condition: str) -> str:
        return condition if self.only is None else f"{condition} AND {self.only(r)}"

    def _select_sql(self, dialect: Dialect) -> str:
        return f"""SELECT {self.key_sql("p", dialect)}, COUNT(*), SUM(p.billed_s), SUM(p.billed_chip_s),
    SUM(p.billed_usd_s), SUM(p.billed_unpriced_chip_s)
FROM pods AS p WHERE {self._picked("p", schema.rolled_sql("p", dialect))} GROUP BY {self._positions()}"""

    def _add_sql(self, dialect: Dialect, *, unless_rolled: bool = False) -> str:
        """A trigger's statement adding the slice NEW at its key (``unless_rolled``: only if it is rolled
        and picked, conditions on NEW the trigger's own WHEN does not hold)."""
        values = f"{self.key_sql('NEW', dialect)}, 1, NEW.billed_s, NEW.billed_chip_s, NEW.billed_usd_s, " \
                 "NEW.billed_unpriced_chip_s"  # fmt: skip
        source = (
            f"SELECT {values} WHERE {self._picked('NEW', schema.rolled_sql('NEW', dialect))}"
            if unless_rolled
            else f"VALUES ({values})"
        )
        sums = ", ".join(f"{c} = {self.table}.{c} + excluded.{c}" for c in schema.ROLLUP_SUMS)
        return (
            f"INSERT INTO {self.table} ({self._columns()}) {source}\n"
            f"    ON CONFLICT ({', '.join(self.key)}) DO UPDATE SET {sums};"
        )

    def _move_sql(self, dialect: Dialect) -> str:
        """A trigger's statements moving the rolled slice OLD to NEW's key: take it from OLD's row (if
        picked; the row deleted when no slice is left in it), add NEW (if still rolled and picked)."""
        at = " AND ".join(
            f"{c} = {v}" for c, v in zip(self.key, self.key_values("OLD", dialect), strict=True)
        )
        at = at if self.only is None else f"{at} AND {self.only('OLD')}"
        less = ", ".join(f"{c} = {c} - OLD.{c}" for c in schema.ROLLUP_SUMS[1:])
        return (
            f"UPDATE {self.table} SET slices = slices - 1, {less}\n    WHERE {at};\n"
            f"    DELETE FROM {self.table} WHERE {at} AND slices = 0;\n"
            f"    {self._add_sql(dialect, unless_rolled=True)}"
        )
