"""Cost by owner (revision 0004): ``cost_rollup_owner``, the billed slices of ``cost_rollup`` keyed by
whose they are instead of by labels.

Cost grouped by workspace or principal read every slice (``cost_rollup`` is keyed by day, zone, type,
capacity and labels: no owner in it), a quarter of a million rows at a million events. This table sums
the very slices ``cost_rollup`` sums (``schema.rolled_sql``: closed, billed, within one UTC day, not a
free preemption) per first day, workspace, principal, zone, type and capacity, so such a report reads a
row per owner and day. A NULL workspace, principal, type or capacity is keyed as
``billing.null_key_sql`` (a NULL never conflicts in a key).

Triggers on ``pods`` keep it, on both engines, in the transaction of the write (single events, bulk
writes, replayed copies alike):

* a row inserted already rolled (a bulk write that holds a slice's whole life), or
* a row whose billing closes (``ended_at`` was NULL): its sums are added at its key, as ``cost_rollup``'s
  own triggers do;
* a rolled slice whose principal or workspace changes: unlike every other billing fact, a slice's owner
  can change after it closed (it is the first event's that says, ``tpuctl.store.view``, which may come
  late; and tools attribute existing slices with plain updates), so its sums move from the old key to
  the new one, and a row left with no slice is deleted: the table always equals ``check_sql``, with no
  row of zeros.

SQLite's triggers are plain ``CREATE TRIGGER``s; PostgreSQL's a PL/pgSQL function and a row trigger each
(``derived.PgTrigger``), with the same conditions and statements.
"""

from __future__ import annotations

from typing import Final

from tpuctl.store import billing, schema
from tpuctl.store.derived import row_trigger_statements
from tpuctl.store.sql import Dialect, SqlConnection

TABLE: Final = "cost_rollup_owner"
#: The key, in the primary key's order.
KEY: Final = ("day", "workspace", "principal", "zone", "accelerator_type", "capacity")
SUMS: Final = ("slices", "billed_s", "billed_chip_s", "billed_usd_s", "billed_unpriced_chip_s")
#: Covering indexes of the slices a report by owner reads one by one (``tables._cost_by_owner`` defines
#: them; their rows are wide, and a look-up each was most of those passes): the preempted ones (the quota
#: held), those crossing midnight (the rollup holds only slices closed within a day), and those that
#: redid steps (their stored recomputed work).
OWNER_INDEXES: Final = ("pods_preempted_owner", "pods_crossing_owner", "pods_rec_owner")
_COLUMNS: Final = ", ".join((*KEY, *SUMS))
#: The triggers, in creation order.
TRIGGERS: Final = ("pods_owner_rollup_insert", "pods_owner_rollup_close", "pods_owner_rollup_move")


def key_sql(r: str, dialect: Dialect) -> str:
    """The key of the slice ``r`` (an alias of a pods row: "p", "NEW", "OLD")."""
    return ", ".join(_key_values(r, dialect))


def _key_values(r: str, dialect: Dialect) -> list[str]:
    null = billing.null_key_sql(dialect)
    return [billing.first_day_sql(r, dialect), f"COALESCE({r}.workspace, {null})",
            f"COALESCE({r}.principal, {null})", f"{r}.zone", f"COALESCE({r}.accelerator_type, {null})",
            f"COALESCE({r}.capacity, {null})"]  # fmt: skip


def _select_sql(dialect: Dialect) -> str:
    return f"""SELECT {key_sql("p", dialect)}, COUNT(*), SUM(p.billed_s), SUM(p.billed_chip_s),
    SUM(p.billed_usd_s), SUM(p.billed_unpriced_chip_s)
FROM pods AS p WHERE {schema.rolled_sql("p", dialect)} GROUP BY 1, 2, 3, 4, 5, 6"""


def owner_rollup_check_sql(dialect: Dialect) -> str:
    """What ``cost_rollup_owner`` must hold, recomputed from ``pods`` (rows in key order)."""
    return f"{_select_sql(dialect)} ORDER BY 1, 2, 3, 4, 5, 6"


def backfill_sql(dialect: Dialect) -> str:
    """Fill the (empty) table from the slices already in ``pods``."""
    return f"INSERT INTO {TABLE} ({_COLUMNS})\n{_select_sql(dialect)}"


def _add_sql(dialect: Dialect, *, unless_rolled: bool = False) -> str:
    """A trigger's statement adding the slice NEW at its key (``unless_rolled``: only if it is rolled,
    a condition on NEW the trigger's own WHEN does not hold)."""
    values = f"{key_sql('NEW', dialect)}, 1, NEW.billed_s, NEW.billed_chip_s, NEW.billed_usd_s, " \
             "NEW.billed_unpriced_chip_s"  # fmt: skip
    source = f"SELECT {values} WHERE {schema.rolled_sql('NEW', dialect)}" if unless_rolled else (
        f"VALUES ({values})")  # fmt: skip
    sums = ", ".join(f"{c} = {TABLE}.{c} + excluded.{c}" for c in SUMS)
    return (
        f"INSERT INTO {TABLE} ({_COLUMNS}) {source}\n    ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET {sums};"
    )


def _at_key(r: str, dialect: Dialect) -> str:
    return " AND ".join(f"{c} = {v}" for c, v in zip(KEY, _key_values(r, dialect), strict=True))


def _move_sql(dialect: Dialect) -> str:
    """A trigger's statements moving the rolled slice OLD to NEW's key: take it from OLD's row (deleted
    when no slice is left in it), add NEW (if still rolled, as it is unless other facts changed too)."""
    at = _at_key("OLD", dialect)
    less = ", ".join(f"{c} = {c} - OLD.{c}" for c in SUMS[1:])
    return (
        f"UPDATE {TABLE} SET slices = slices - 1, {less}\n    WHERE {at};\n"
        f"    DELETE FROM {TABLE} WHERE {at} AND slices = 0;\n"
        f"    {_add_sql(dialect, unless_rolled=True)}"
    )


def _owner_changed(dialect: Dialect) -> str:
    differs = "IS NOT" if dialect.name == "sqlite" else "IS DISTINCT FROM"
    return f"(OLD.principal {differs} NEW.principal OR OLD.workspace {differs} NEW.workspace)"


def _triggers(dialect: Dialect) -> tuple[tuple[str, str, str, str], ...]:
    """(name, event, condition, body) of each trigger."""
    add = _add_sql(dialect)
    closed_now = f"OLD.ended_at IS NULL AND {schema.rolled_sql('NEW', dialect)}"
    was_rolled = schema.rolled_sql("OLD", dialect)  # closed already (its first condition)
    return (
        (TRIGGERS[0], "INSERT ON pods", schema.rolled_sql("NEW", dialect), add),
        (TRIGGERS[1], "UPDATE ON pods", closed_now, add),
        (TRIGGERS[2], "UPDATE OF principal, workspace ON pods",
         f"{was_rolled}\n    AND {_owner_changed(dialect)}", _move_sql(dialect)),
    )  # fmt: skip


def trigger_statements(dialect: Dialect) -> tuple[str, ...]:
    """The statements creating the triggers on ``dialect``'s engine, in order."""
    return row_trigger_statements(_triggers(dialect), dialect)


def create(conn: SqlConnection) -> None:
    """Revision 0004's statements after its table and index: the triggers, then the backfill (in the
    migration's transaction: no write can come between them)."""
    for statement in trigger_statements(conn.dialect):
        conn.execute(statement)
    conn.execute(backfill_sql(conn.dialect))
