"""Waste by run (revision 0005): ``run_waste``, what each run's slices wasted, as far as the ledger has
stored it: the quota its preempted slices held until they were deleted, and the recomputed work the
ledger keeps per closed slice (``pods.rec_*``).

The money page lists the runs that wasted most. Finding them summed those two facts over every preempted
slice and every slice that redid steps, grouped by run (tens of thousands of rows sorted at a million
events, a quarter of the page's time), on every request. This table holds those sums per run, so the
candidates are read from a row per run instead; what it cannot hold is added by the reader: the quota of
preempted slices not deleted yet (it grows with the clock).

Per run, over the slices it created (``pods.run_id``):

* ``held_usd_s``: the chip-seconds between a preempted slice's end and its deletion, times its recorded
  price per chip-hour (USD x 3600); ``held_unpriced_chip_s`` those chip-seconds of slices with no price;
* ``rec_priced``, ``rec_unpriced``: the sums of ``pods.rec_priced`` and ``pods.rec_unpriced``.

Triggers on ``pods`` keep it on both engines, in the transaction of the write: a slice inserted with
something to add adds it; an update that changes any fact these depend on (its run, end, deletion, chips,
price, end reason, recomputed work: the recomputed work changes when a segment does, through the ledger's
own triggers) takes the old row's share away from its old run and adds the new one's. A run whose shares
were all taken away keeps a row of zeros (float sums rarely come back to exactly zero): ``check_sql``
leaves such rows out on both sides.
"""

from __future__ import annotations

from typing import Final

from tpuctl.store.derived import row_trigger_statements
from tpuctl.store.sql import Dialect, SqlConnection

TABLE: Final = "run_waste"
SUMS: Final = ("held_usd_s", "held_unpriced_chip_s", "rec_priced", "rec_unpriced")
#: The facts of a slice its share depends on (an update of any of them moves it).
WATCHED: Final = (
    "run_id", "end_reason", "ended_at", "deleted_at", "chips", "price_per_chip_hour", "rec_priced",
    "rec_unpriced",
)  # fmt: skip
TRIGGERS: Final = ("pods_run_waste_insert", "pods_run_waste_update")
#: Below this in every sum a row is a run with nothing left (what subtracting floats leaves of zero).
EMPTY: Final = 1e-6


def _held_s(r: str) -> str:
    """The chip-seconds the slice ``r`` held after its preemption, until deleted (NULL if none)."""
    return (
        f"(CASE WHEN {r}.end_reason = 'preempted' AND {r}.deleted_at IS NOT NULL AND {r}.ended_at IS NOT NULL"
        f" THEN {r}.chips * ({r}.deleted_at - {r}.ended_at) END)"
    )


def _shares(r: str) -> list[str]:
    """The slice ``r``'s share of each of ``SUMS`` (never NULL)."""
    held = _held_s(r)
    return [
        f"COALESCE({held} * {r}.price_per_chip_hour, 0.0)",
        f"COALESCE(CASE WHEN {r}.price_per_chip_hour IS NULL THEN {held} END, 0.0)",
        f"{r}.rec_priced",
        f"{r}.rec_unpriced",
    ]


def _has_share(r: str) -> str:
    """Whether the slice ``r`` adds anything to its run's row."""
    return (
        f"({r}.run_id IS NOT NULL AND ({r}.rec_priced != 0 OR {r}.rec_unpriced != 0"
        f" OR ({r}.end_reason = 'preempted' AND {r}.deleted_at IS NOT NULL AND {r}.chips IS NOT NULL)))"
    )


def _add_sql(r: str) -> str:
    """A trigger's statement adding the slice ``r``'s shares to its run's row (if it has any)."""
    columns = ", ".join(("run_id", *SUMS))
    sums = ", ".join(f"{c} = {TABLE}.{c} + excluded.{c}" for c in SUMS)
    return (
        f"INSERT INTO {TABLE} ({columns}) SELECT {r}.run_id, {', '.join(_shares(r))} WHERE {_has_share(r)}\n"
        f"    ON CONFLICT (run_id) DO UPDATE SET {sums};"
    )


def _take_sql() -> str:
    """A trigger's statement taking the slice OLD's shares from its run's row."""
    less = ", ".join(f"{c} = {c} - {share}" for c, share in zip(SUMS, _shares("OLD"), strict=True))
    return f"UPDATE {TABLE} SET {less} WHERE run_id = OLD.run_id AND {_has_share('OLD')};"


def _changed(dialect: Dialect) -> str:
    differs = "IS NOT" if dialect.name == "sqlite" else "IS DISTINCT FROM"
    return "(" + " OR ".join(f"OLD.{c} {differs} NEW.{c}" for c in WATCHED) + ")"


def _triggers(dialect: Dialect) -> tuple[tuple[str, str, str, str], ...]:
    """(name, event, condition, body) of each trigger."""
    watched = ", ".join(WATCHED)
    return (
        (TRIGGERS[0], "INSERT ON pods", _has_share("NEW"), _add_sql("NEW")),
        (TRIGGERS[1], f"UPDATE OF {watched} ON pods",
         f"({_has_share('OLD')} OR {_has_share('NEW')}) AND {_changed(dialect)}",
         f"{_take_sql()}\n    {_add_sql('NEW')}"),
    )  # fmt: skip


def trigger_statements(dialect: Dialect) -> tuple[str, ...]:
    """The statements creating the triggers on ``dialect``'s engine, in order."""
    return row_trigger_statements(_triggers(dialect), dialect)


def _select_sql() -> str:
    sums = ", ".join(f"SUM({share})" for share in _shares("p"))
    return f"SELECT p.run_id, {sums} FROM pods AS p WHERE {_has_share('p')} GROUP BY p.run_id"


def check_sql() -> str:
    """What ``run_waste`` must hold, recomputed from ``pods`` (rows by run id)."""
    return f"{_select_sql()} ORDER BY 1"


def stored_sql() -> str:
    """``run_waste``'s rows as ``check_sql`` gives them: the runs with something left, by run id."""
    kept = " OR ".join(f"ABS({c}) >= {EMPTY}" for c in SUMS)
    return f"SELECT run_id, {', '.join(SUMS)} FROM {TABLE} WHERE {kept} ORDER BY 1"


def create(conn: SqlConnection) -> None:
    """Revision 0005's statements after its table: the triggers, then the rows of the slices already
    recorded (in the migration's transaction: no write can come between them)."""
    for statement in trigger_statements(conn.dialect):
        conn.execute(statement)
    conn.execute(f"INSERT INTO {TABLE} (run_id, {', '.join(SUMS)})\n{_select_sql()}")
