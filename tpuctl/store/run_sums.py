"""Sums per run kept by triggers on ``pods``: a table with a row per run of the sums of a share each of the
slices the run created (``pods.run_id``) contributes, what ``run_waste`` and ``run_closed_time`` hold.

Triggers keep such a table on both engines, in the transaction of the write (single events, bulk writes,
writes by hand alike): a slice inserted with a share adds it; an update that changes any fact its share
depends on (``watched``) takes the old row's share away from its old run and adds the new one's. A run
whose shares were all taken away keeps a row of zeros (float sums rarely come back to exactly zero):
``check_sql`` leaves such rows out on both sides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tpuctl.store.derived import RowTrigger, row_trigger_statements
from tpuctl.store.sql import Dialect, SqlConnection

#: Below this in every sum a row is a run with nothing left (what subtracting floats leaves of zero).
EMPTY: Final = 1e-6


@dataclass(frozen=True)
class RunSums:
    """A table of sums per run over the slices each run created.

    ``shares(r)``: the SQL of the slice ``r``'s ("NEW", "OLD", "p") share of each of ``sums``, never NULL;
    ``has_share(r)``: whether it adds anything (its run named, and the facts the shares read present);
    ``watched``: the slice's columns the shares and that condition read; ``triggers``: the insert and
    update triggers' names."""

    table: str
    sums: tuple[str, ...]
    watched: tuple[str, ...]
    triggers: tuple[str, str]
    shares: Callable[[str], list[str]]
    has_share: Callable[[str], str]

    def trigger_statements(self, dialect: Dialect) -> tuple[str, ...]:
        """The statements creating the triggers on ``dialect``'s engine, in order."""
        watched = ", ".join(self.watched)
        changed = dialect.any_changed(self.watched)
        return row_trigger_statements(
            (
                RowTrigger(self.triggers[0], "INSERT ON pods", self.has_share("NEW"), self._add_sql("NEW")),
                RowTrigger(self.triggers[1], f"UPDATE OF {watched} ON pods",
                           f"({self.has_share('OLD')} OR {self.has_share('NEW')}) AND {changed}",
                           f"{self._take_sql()}\n    {self._add_sql('NEW')}"),
            ),
            dialect,
        )  # fmt: skip

    def check_sql(self) -> str:
        """What the table must hold, recomputed from ``pods`` (rows by run id)."""
        return f"{self._select_sql()} ORDER BY 1"

    def stored_sql(self) -> str:
        """The table's rows as ``check_sql`` gives them: the runs with something left, by run id."""
        kept = " OR ".join(f"ABS({c}) >= {EMPTY}" for c in self.sums)
        return f"SELECT run_id, {', '.join(self.sums)} FROM {self.table} WHERE {kept} ORDER BY 1"

    def create(self, conn: SqlConnection) -> None:
        """The revision's statements after its table: the triggers, then the rows of the slices already
        recorded (in the migration's transaction: no write can come between them)."""
        for statement in self.trigger_statements(conn.dialect):
            conn.execute(statement)
        conn.execute(f"INSERT INTO {self.table} (run_id, {', '.join(self.sums)})\n{self._select_sql()}")

    def _add_sql(self, r: str) -> str:
        """A trigger's statement adding the slice ``r``'s shares to its run's row (if it has any)."""
        columns = ", ".join(("run_id", *self.sums))
        sums = ", ".join(f"{c} = {self.table}.{c} + excluded.{c}" for c in self.sums)
        return (
            f"INSERT INTO {self.table} ({columns}) SELECT {r}.run_id, {', '.join(self.shares(r))} "
            f"WHERE {self.has_share(r)}\n    ON CONFLICT (run_id) DO UPDATE SET {sums};"
        )

    def _take_sql(self) -> str:
        """A trigger's statement taking the slice OLD's shares from its run's row."""
        less = ", ".join(
            f"{c} = {c} - {share}" for c, share in zip(self.sums, self.shares("OLD"), strict=True)
        )
        return f"UPDATE {self.table} SET {less} WHERE run_id = OLD.run_id AND {self.has_share('OLD')};"

    def _select_sql(self) -> str:
        sums = ", ".join(f"SUM({share})" for share in self.shares("p"))
        return f"SELECT p.run_id, {sums} FROM pods AS p WHERE {self.has_share('p')} GROUP BY p.run_id"
