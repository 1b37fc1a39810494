"""The fast path's SQL (every grouping but slice and run): closed slices from the billing facts and the
rollups the ledger keeps (``tpuctl.store.schema``), the rest found through indexes.

The reference path (``sql_scan`` over every slice, ``CostService(fast=False)``) is the oracle these are
tested against: both must give the same figures.
"""

from __future__ import annotations

from typing import Final

from tpuctl.services.cost.reader import TempTable
from tpuctl.services.cost.sql_intervals import key_sql
from tpuctl.services.cost.sql_scan import GROUP_COLUMNS, upsert
from tpuctl.services.cost.window import GroupBy
from tpuctl.store.billing import (
    crosses_midnight_sql,
    end_day_sql,
    first_day_sql,
    free_if_preempted_sql,
    free_preemption_sql,
    midnight_after_sql,
    midnight_sql,
)


def _id_table(name: str) -> TempTable:
    """A set of slice ids (the pods rows a step of the fast path reads one by one)."""
    return TempTable(
        f"CREATE TEMP TABLE {name} (id INTEGER PRIMARY KEY)",
        f"CREATE TEMP TABLE {name} (id BIGINT PRIMARY KEY)",
    )


#: The fast path (every grouping but slice and run). A slice whose billing closed inside the window
#: contributes the billing facts the view function stored when it closed (``tpuctl.store.view``: billed
#: seconds, chip-seconds and USD at each price in force), summed in SQL straight from the covering index
#: ``pods_closed``. Only the rest -- slices still open, cut by --since/--until, and price-changed slices
#: crossing midnight (their per-day split needs their pieces) -- goes through the interval arithmetic,
#: found through indexes, never a scan of the pods rows.
REST_TABLE: Final = _id_table("cost_rest")
LATER_TABLE: Final = _id_table("cost_later")
REST_PODS_LATER: Final = "cost_later AS r CROSS JOIN pods AS p ON p.id = r.id"
CROSSES_MIDNIGHT: Final = crosses_midnight_sql("p")
CLOSED_CROSSING: Final = f"p.ended_at IS NOT NULL AND p.ready_at IS NOT NULL AND {CROSSES_MIDNIGHT}"
REST_OPEN: Final = (
    "INSERT OR IGNORE INTO cost_rest (id) SELECT id FROM pods "
    "WHERE ended_at IS NULL AND ready_at IS NOT NULL AND ready_at < :until"
)
#: ``cut``: the window bound; pods_ended's range after it holds every slice it cuts.
REST_CUT: Final = (
    "INSERT OR IGNORE INTO cost_rest (id) SELECT id FROM pods INDEXED BY pods_ended "
    "WHERE ended_at > :cut AND ready_at < :cut"
)
REST_CHANGED: Final = f"""
INSERT OR IGNORE INTO cost_rest (id)
SELECT p.id FROM json_each(:price_changes) AS j CROSS JOIN pods AS p
     ON p.id = CAST(json_extract(j.value, '$[0]') AS INTEGER)
WHERE {CLOSED_CROSSING} AND p.rolled = 0"""
#: The price changes of the slices in cost_rest (the others' facts already hold their pieces).
REST_PRICE_CHANGES: Final = """
SELECT json_group_array(json(j.value)) FROM json_each(:price_changes) AS j
WHERE CAST(json_extract(j.value, '$[0]') AS INTEGER) IN (SELECT id FROM cost_rest)"""
#: Billed, closed inside [since, until), not a free preemption, not in cost_rest.
CLOSED: Final = f"""p.ended_at IS NOT NULL AND p.ready_at IS NOT NULL
      AND p.ready_at >= :since AND p.ready_at < :until AND p.ended_at <= :until AND p.ended_at > :since
      AND p.chips IS NOT NULL
      AND NOT {free_preemption_sql("p")}
      AND p.id NOT IN (SELECT id FROM cost_rest)"""
#: The single-day closed slices cost_rollup does not answer: those of the window's partial first and last
#: days (a ready_at range of pods_closed; the ones crossing midnight are below, CLOSED_XREST).
#: (The window's own ready_at bounds are kept off the index with a unary +: the day's range is the tight
#: one, and the planner would otherwise walk the whole window.)
UNINDEXED_WINDOW: Final = CLOSED.replace(
    "p.ready_at >= :since AND p.ready_at < :until", "+p.ready_at >= :since AND +p.ready_at < :until"
)
CLOSED_EDGE_DAY: Final = f"""INDEXED BY pods_closed
WHERE {UNINDEXED_WINDOW}
      AND NOT {CROSSES_MIDNIGHT}
      AND p.ready_at >= :b_lo AND p.ready_at < :b_hi
      AND NOT ({first_day_sql("p")} >= :d_lo AND {first_day_sql("p")} < :d_hi)"""


#: Closed slices crossing midnight that the rollups (schema v8: cost_rollup_x, cost_rollup_xdays) hold
#: for the window: rolled, and every day they were billed in is a whole day of the window.
X_INSIDE: Final = f"p.rolled = 1 AND {first_day_sql('p')} >= :d_lo AND {end_day_sql('p')} <= :d_hi"
#: The candidates for the other closed slices crossing midnight, found by index: beginning before the
#: window's first whole day, ending after its last, or not rolled up at all (price-changed, free, long).
XREST_TABLE: Final = _id_table("cost_xrest")
XREST_FILL: Final = tuple(
    f"INSERT OR IGNORE INTO cost_xrest (id) SELECT p.id FROM pods AS p INDEXED BY {index} "
    f"WHERE {CLOSED_CROSSING} AND {where}"
    for index, where in (
        ("pods_crossing", f"p.ready_at < {midnight_sql(':d_lo')}"),
        ("pods_ended", f"p.ended_at > {midnight_sql(':d_hi')}"),
        ("pods_unrolled_crossing", "p.rolled = 0"),
    )
)
CLOSED_XREST: Final = (
    f"WHERE p.id IN (SELECT id FROM cost_xrest) AND {CLOSED} AND {CROSSES_MIDNIGHT} AND NOT ({X_INSIDE})"
)
LATER_CLOSED: Final = f"""
INSERT OR IGNORE INTO cost_later (id)
SELECT p.id FROM pods AS p {CLOSED_XREST}"""


def rollup_x_sql(group: GroupBy) -> str:
    """The rolled-up slices crossing midnight inside the window's whole days, from ``cost_rollup_x``: their
    stored facts and first day's share, per first day."""
    columns = ("slices", "seen", "bs", "cs", "priced", "unpriced", "d0s", "d0cs", "d0priced", "d0unpriced")
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT COALESCE({key_sql(group, "r")}, :null_key), r.zone, r.accelerator_type, r.capacity, r.first_day,
       SUM(r.slices), SUM(r.slices), SUM(r.billed_s), SUM(r.billed_chip_s), SUM(r.billed_usd_s),
       SUM(r.billed_unpriced_chip_s), SUM(r.d0_s), SUM(r.d0_chip_s), SUM(r.d0_usd_s),
       SUM(r.d0_unpriced_chip_s)
FROM cost_rollup_x AS r
WHERE r.first_day >= :d_lo AND r.end_day <= :d_hi
GROUP BY 1, 2, 3, 4, 5
{upsert(columns)}"""


#: Their days after the first, from ``cost_rollup_xdays``, into cost_days.
ROLLUP_XDAYS_SQL: Final = """
INSERT INTO cost_days (day, zone, atype, capacity, slices, s, cs, priced, unpriced)
SELECT r.day, r.zone, r.accelerator_type, r.capacity, SUM(r.slices), SUM(r.s), SUM(r.chip_s), SUM(r.usd_s),
       SUM(r.unpriced_chip_s)
FROM cost_rollup_xdays AS r
WHERE r.first_day >= :d_lo AND r.end_day <= :d_hi
GROUP BY 1, 2, 3, 4
ON CONFLICT (day, zone, atype, capacity) DO UPDATE SET slices = slices + excluded.slices, s = s + excluded.s,
    cs = cs + excluded.cs, priced = priced + excluded.priced, unpriced = unpriced + excluded.unpriced"""

#: Quota held: the preempted slices deleted inside the window's days (preempted after the day holding
#: :since began, deleted by the end of its last whole day) from ``cost_rollup_held``; the rest -- still
#: held, deleted later, or preempted before that -- slice by slice (pods_held finds them).
HREST_TABLE: Final = _id_table("cost_hrest")
HREST_FILL: Final = (
    "INSERT OR IGNORE INTO cost_hrest (id) SELECT id FROM pods INDEXED BY pods_held "
    "WHERE end_reason = 'preempted' AND deleted_at IS NULL",
    "INSERT OR IGNORE INTO cost_hrest (id) SELECT id FROM pods INDEXED BY pods_held "
    f"WHERE end_reason = 'preempted' AND deleted_at > {midnight_sql(':d_hi')}",
    "INSERT OR IGNORE INTO cost_hrest (id) SELECT id FROM pods INDEXED BY pods_held "
    f"WHERE end_reason = 'preempted' AND deleted_at > :since AND ended_at < {midnight_sql(':h_lo')}",
)
HREST_PODS: Final = "cost_hrest AS r CROSS JOIN pods AS p ON p.id = r.id"


def rollup_held_sql(group: GroupBy) -> str:
    columns = ("slices", "seen", "hcs", "hpriced", "hunpriced")
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT COALESCE({key_sql(group, "r")}, :null_key), r.zone, r.accelerator_type, r.capacity, -1,
       SUM(r.slices), SUM(r.slices), SUM(r.held_chip_s), SUM(r.held_usd_s), SUM(r.held_unpriced_chip_s)
FROM cost_rollup_held AS r
WHERE r.end_day >= :h_lo AND r.deleted_day <= :d_hi
GROUP BY 1, 2, 3, 4
{upsert(columns)}"""


def rollup_sql(group: GroupBy) -> str:
    """The closed single-day slices of the days wholly inside the window, from ``cost_rollup`` (a few
    rows per day), in the pods scan's shape: for a single-day slice its first day's share is the whole."""
    columns = ("slices", "seen", "bs", "cs", "priced", "unpriced", "d0s", "d0cs", "d0priced", "d0unpriced")
    sums = "SUM(r.billed_s), SUM(r.billed_chip_s), SUM(r.billed_usd_s), SUM(r.billed_unpriced_chip_s)"
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT COALESCE({key_sql(group, "r")}, :null_key), r.zone, r.accelerator_type, r.capacity, r.day,
       SUM(r.slices), SUM(r.slices), {sums}, {sums}
FROM cost_rollup AS r
WHERE r.day >= :d_lo AND r.day < :d_hi
GROUP BY 1, 2, 3, 4, 5
{upsert(columns)}"""


def closed_billed_sql(group: GroupBy, where: str) -> str:
    """The closed slices' stored facts, summed per (group key, zone, type, capacity, first day); the
    first day's share is the whole for a slice within one UTC day (most), else cut at midnight at its one
    price (a price-changed slice crossing midnight is in cost_rest)."""
    day0 = first_day_sql("p")
    one = f"NOT {CROSSES_MIDNIGHT}"
    d0 = f"({midnight_after_sql('p.ready_at')} - p.ready_at)"
    columns = ("slices", "seen", "bs", "cs", "priced", "unpriced", "d0s", "d0cs", "d0priced", "d0unpriced")
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT {GROUP_COLUMNS.format(k=key_sql(group, "p"))}, {day0} AS d, COUNT(*), COUNT(*),
       SUM(p.billed_s), SUM(p.billed_chip_s), SUM(p.billed_usd_s), SUM(p.billed_unpriced_chip_s),
       SUM(CASE WHEN {one} THEN p.billed_s ELSE {d0} END),
       SUM(CASE WHEN {one} THEN p.billed_chip_s ELSE p.chips * {d0} END),
       SUM(CASE WHEN {one} THEN p.billed_usd_s ELSE COALESCE(p.chips * {d0} * p.price_per_chip_hour, 0) END),
       SUM(CASE WHEN {one} THEN p.billed_unpriced_chip_s
                WHEN p.price_per_chip_hour IS NULL THEN p.chips * {d0} ELSE 0 END)
FROM pods AS p {where}
GROUP BY 1, 2, 3, 4, 5
{upsert(columns)}"""


#: The same on the fast path (one range, every id): the window's range of the narrow pods_preemptions.
PREEMPTIONS_FAST_SQL: Final = f"""
SELECT COUNT(*), COALESCE(SUM({free_if_preempted_sql("p")}), 0)
FROM pods AS p INDEXED BY pods_preemptions
WHERE p.end_reason = 'preempted' AND p.ended_at >= :since AND p.ended_at < :until"""
