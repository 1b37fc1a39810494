"""The fast path's SQL (every grouping but slice and run): closed slices from the billing facts and the
rollups the ledger keeps (``tpuctl.store.schema``), the rest found through indexes.

The reference path (``sql_scan`` over every slice, ``CostService(fast=False)``) is the oracle these are
tested against: both must give the same figures.

The fast path (every grouping but slice and run). A slice whose billing closed inside the window
contributes the billing facts the view function stored when it closed (``tpuctl.store.view``: billed
seconds, chip-seconds and USD at each price in force), summed in SQL straight from the covering index
``pods_closed``. Only the rest -- slices still open, cut by --since/--until, and price-changed slices
crossing midnight (their per-day split needs their pieces) -- goes through the interval arithmetic,
found through indexes, never a scan of the pods rows.
"""

from __future__ import annotations

import functools
from typing import Final

from tpuctl.services.cost.sql_intervals import changed_pods, key_sql
from tpuctl.services.cost.sql_scan import days_upsert, group_columns, upsert
from tpuctl.services.cost.window import GroupBy
from tpuctl.store import cost_sql as sd
from tpuctl.store.billing import (
    crosses_midnight_sql,
    end_day_sql,
    first_day_sql,
    free_if_preempted_sql,
    free_preemption_sql,
    midnight_after_sql,
    midnight_sql,
)
from tpuctl.store.cost_sql import TempTable
from tpuctl.store.sql import Dialect

cache = functools.cache


def _id_table(name: str) -> TempTable:
    """A set of slice ids (the pods rows a step of the fast path reads one by one)."""
    return TempTable(name, "id INT", primary_key="id")


REST_TABLE: Final = _id_table("cost_rest")
LATER_TABLE: Final = _id_table("cost_later")
XREST_TABLE: Final = _id_table("cost_xrest")
HREST_TABLE: Final = _id_table("cost_hrest")


def _ids_of(table: str, d: Dialect) -> str:
    """The pods rows of the ids in ``table`` (alias p)."""
    return f"{table} AS r {sd.cross_join(d)} pods AS p ON p.id = r.id"


def rest_pods_later(d: Dialect) -> str:
    return _ids_of("cost_later", d)


def hrest_pods(d: Dialect) -> str:
    return _ids_of("cost_hrest", d)


def _crossing(d: Dialect) -> str:
    return crosses_midnight_sql("p", d)


def _closed_crossing(d: Dialect) -> str:
    return f"p.ended_at IS NOT NULL AND p.ready_at IS NOT NULL AND {_crossing(d)}"


@cache
def rest_open(d: Dialect) -> str:
    return sd.insert_ignore(
        "cost_rest (id)",
        "SELECT id FROM pods WHERE ended_at IS NULL AND ready_at IS NOT NULL AND ready_at < :until",
        d,
    )


@cache
def rest_cut(d: Dialect) -> str:
    """``cut``: the window bound; pods_ended's range after it holds every slice it cuts."""
    return sd.insert_ignore(
        "cost_rest (id)",
        f"SELECT id FROM pods {sd.indexed('pods_ended', d)} WHERE ended_at > :cut AND ready_at < :cut",
        d,
    )


@cache
def rest_changed(d: Dialect) -> str:
    pod_id = sd.json_int("j.value", 0, d)
    return sd.insert_ignore(
        "cost_rest (id)",
        f"""
SELECT p.id FROM {sd.json_elements(":price_changes", "j", d)} {sd.cross_join(d)} {changed_pods(d)} AS p
     ON p.id = {pod_id}
WHERE {_closed_crossing(d)} AND p.rolled = 0""",
        d,
    ).replace("INTO cost_rest (id) \n", "INTO cost_rest (id)\n")


@cache
def rest_price_changes(d: Dialect) -> str:
    """The price changes of the slices in cost_rest (the others' facts already hold their pieces)."""
    return f"""
SELECT {sd.json_array_agg("j.value", d)} FROM {sd.json_elements(":price_changes", "j", d)}
WHERE {sd.json_int("j.value", 0, d)} IN (SELECT id FROM cost_rest)"""


@cache
def closed(d: Dialect) -> str:
    """Billed, closed inside [since, until), not a free preemption, not in cost_rest."""
    return f"""p.ended_at IS NOT NULL AND p.ready_at IS NOT NULL
      AND p.ready_at >= :since AND p.ready_at < :until AND p.ended_at <= :until AND p.ended_at > :since
      AND p.chips IS NOT NULL
      AND NOT {free_preemption_sql("p", d)}
      AND p.id NOT IN (SELECT id FROM cost_rest)"""


@cache
def closed_edge_day(d: Dialect) -> str:
    """The single-day closed slices cost_rollup does not answer: those of the window's partial first and
    last days (a ready_at range of pods_closed; the ones crossing midnight are below, closed_xrest). (The
    window's own ready_at bounds are kept off the index with a unary +: the day's range is the tight one,
    and the planner would otherwise walk the whole window.)"""
    unindexed_window = closed(d).replace(
        "p.ready_at >= :since AND p.ready_at < :until", "+p.ready_at >= :since AND +p.ready_at < :until"
    )
    first_day = first_day_sql("p", d)
    return f"""{sd.indexed("pods_closed", d)}
WHERE {unindexed_window}
      AND NOT {_crossing(d)}
      AND p.ready_at >= :b_lo AND p.ready_at < :b_hi
      AND NOT ({first_day} >= :d_lo AND {first_day} < :d_hi)"""


def _x_inside(d: Dialect) -> str:
    """Closed slices crossing midnight that the rollups (schema v8: cost_rollup_x, cost_rollup_xdays) hold
    for the window: rolled, and every day they were billed in is a whole day of the window."""
    first_day = first_day_sql("p", d)
    end_day = end_day_sql("p", d)
    return f"p.rolled = 1 AND {first_day} >= :d_lo AND {end_day} <= :d_hi"


@cache
def xrest_fill(d: Dialect) -> tuple[str, ...]:
    """The candidates for the other closed slices crossing midnight, found by index: beginning before the
    window's first whole day, ending after its last, or not rolled up at all (price-changed, free, long)."""
    return tuple(
        sd.insert_ignore(
            "cost_xrest (id)",
            f"SELECT p.id FROM pods AS p {sd.indexed(index, d)} WHERE {_closed_crossing(d)} AND {where}",
            d,
        )
        for index, where in (
            ("pods_crossing", f"p.ready_at < {midnight_sql(':d_lo', d)}"),
            ("pods_ended", f"p.ended_at > {midnight_sql(':d_hi', d)}"),
            ("pods_unrolled_crossing", "p.rolled = 0"),
        )
    )


@cache
def closed_xrest(d: Dialect) -> str:
    return (
        f"WHERE p.id IN (SELECT id FROM cost_xrest) AND {closed(d)} AND {_crossing(d)} "
        f"AND NOT ({_x_inside(d)})"
    )


@cache
def later_closed(d: Dialect) -> str:
    return sd.insert_ignore("cost_later (id)", f"\nSELECT p.id FROM pods AS p {closed_xrest(d)}", d).replace(
        "INTO cost_later (id) \n", "INTO cost_later (id)\n"
    )


def _rollup_key(group: GroupBy, d: Dialect) -> str:
    """A rollup row's (alias r) group key, as the working tables key it."""
    return f"COALESCE({sd.key_text(key_sql(group, 'r', d), d)}, :null_key)"


def _rollup_groups(group: GroupBy, leading: str) -> str:
    """A rollup's GROUP BY: in its primary key's order (``leading``: its key's columns before the zone),
    which SQLite streams without sorting the rows, where the group key is a function of the zone, type and
    capacity; a label's value needs the labels, grouped by the key as written (the working table's upsert
    adds up groups that come out split either way)."""
    if group.kind == "label":
        return "GROUP BY 1, 2, 3, 4, 5"
    return f"GROUP BY {leading}, r.zone, r.accelerator_type, r.capacity"


_FACTS: Final = ("slices", "seen", "bs", "cs", "priced", "unpriced", "d0s", "d0cs", "d0priced", "d0unpriced")


@cache
def rollup_x_sql(group: GroupBy, d: Dialect) -> str:
    """The rolled-up slices crossing midnight inside the window's whole days, from ``cost_rollup_x``: their
    stored facts and first day's share, per first day."""
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(_FACTS)})
SELECT {_rollup_key(group, d)}, r.zone, r.accelerator_type, r.capacity, \
r.first_day,
       SUM(r.slices), SUM(r.slices), SUM(r.billed_s), SUM(r.billed_chip_s), SUM(r.billed_usd_s),
       SUM(r.billed_unpriced_chip_s), SUM(r.d0_s), SUM(r.d0_chip_s), SUM(r.d0_usd_s),
       SUM(r.d0_unpriced_chip_s)
FROM cost_rollup_x AS r
WHERE r.first_day >= :d_lo AND r.end_day <= :d_hi
{_rollup_groups(group, "r.first_day, r.end_day")}
{upsert(_FACTS, d)}"""


@cache
def rollup_xdays_sql(d: Dialect) -> str:
    """Their days after the first, from ``cost_rollup_xdays``, into cost_days."""
    return f"""
INSERT INTO cost_days (day, zone, atype, capacity, slices, s, cs, priced, unpriced)
SELECT r.day, r.zone, r.accelerator_type, r.capacity, SUM(r.slices), SUM(r.s), SUM(r.chip_s), SUM(r.usd_s),
       SUM(r.unpriced_chip_s)
FROM cost_rollup_xdays AS r
WHERE r.first_day >= :d_lo AND r.end_day <= :d_hi
GROUP BY 1, 2, 3, 4
{days_upsert(d)}"""


@cache
def hrest_fill(d: Dialect) -> tuple[str, ...]:
    """Quota held: the preempted slices deleted inside the window's days (preempted after the day holding
    :since began, deleted by the end of its last whole day) from ``cost_rollup_held``; the rest -- still
    held, deleted later, or preempted before that -- slice by slice (pods_held finds them)."""
    held = f"SELECT id FROM pods {sd.indexed('pods_held', d)} WHERE end_reason = 'preempted' AND "
    return tuple(
        sd.insert_ignore("cost_hrest (id)", held + where, d)
        for where in (
            "deleted_at IS NULL",
            f"deleted_at > {midnight_sql(':d_hi', d)}",
            f"deleted_at > :since AND ended_at < {midnight_sql(':h_lo', d)}",
        )
    )


@cache
def rollup_held_sql(group: GroupBy, d: Dialect) -> str:
    columns = ("slices", "seen", "hcs", "hpriced", "hunpriced")
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT {_rollup_key(group, d)}, r.zone, r.accelerator_type, r.capacity, -1,
       SUM(r.slices), SUM(r.slices), SUM(r.held_chip_s), SUM(r.held_usd_s), SUM(r.held_unpriced_chip_s)
FROM cost_rollup_held AS r
WHERE r.end_day >= :h_lo AND r.deleted_day <= :d_hi
GROUP BY 1, 2, 3, 4
{upsert(columns, d)}"""


@cache
def rollup_sql(group: GroupBy, d: Dialect) -> str:
    """The closed single-day slices of the days wholly inside the window, from ``cost_rollup`` (a few
    rows per day), in the pods scan's shape: for a single-day slice its first day's share is the whole."""
    sums = "SUM(r.billed_s), SUM(r.billed_chip_s), SUM(r.billed_usd_s), SUM(r.billed_unpriced_chip_s)"
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(_FACTS)})
SELECT {_rollup_key(group, d)}, r.zone, r.accelerator_type, r.capacity, r.day,
       SUM(r.slices), SUM(r.slices), {sums}, {sums}
FROM cost_rollup AS r
WHERE r.day >= :d_lo AND r.day < :d_hi
{_rollup_groups(group, "r.day")}
{upsert(_FACTS, d)}"""


@cache
def closed_billed_sql(group: GroupBy, d: Dialect, where: str) -> str:
    """The closed slices' stored facts, summed per (group key, zone, type, capacity, first day); the
    first day's share is the whole for a slice within one UTC day (most), else cut at midnight at its one
    price (a price-changed slice crossing midnight is in cost_rest)."""
    day0 = first_day_sql("p", d)
    one = f"NOT {_crossing(d)}"
    d0 = f"({midnight_after_sql('p.ready_at', d)} - p.ready_at)"
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(_FACTS)})
SELECT {group_columns(key_sql(group, "p", d), d)}, {day0} AS d, COUNT(*), COUNT(*),
       SUM(p.billed_s), SUM(p.billed_chip_s), SUM(p.billed_usd_s), SUM(p.billed_unpriced_chip_s),
       SUM(CASE WHEN {one} THEN p.billed_s ELSE {d0} END),
       SUM(CASE WHEN {one} THEN p.billed_chip_s ELSE p.chips * {d0} END),
       SUM(CASE WHEN {one} THEN p.billed_usd_s ELSE COALESCE(p.chips * {d0} * p.price_per_chip_hour, 0) END),
       SUM(CASE WHEN {one} THEN p.billed_unpriced_chip_s
                WHEN p.price_per_chip_hour IS NULL THEN p.chips * {d0} ELSE 0 END)
FROM pods AS p {where}
GROUP BY 1, 2, 3, 4, 5
{upsert(_FACTS, d)}"""


@cache
def preemptions_fast_sql(d: Dialect) -> str:
    """The same on the fast path (one range, every id): the window's range of the narrow
    pods_preemptions."""
    return f"""
SELECT COUNT(*), COALESCE(SUM({sd.as_int(free_if_preempted_sql("p"), d)}), 0)
FROM pods AS p {sd.indexed("pods_preemptions", d)}
WHERE p.end_reason = 'preempted' AND p.ended_at >= :since AND p.ended_at < :until"""
