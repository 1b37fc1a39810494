"""The pods scans' SQL: every billed slice's time in the window, its share of its first UTC day and its
later days, and the quota preempted slices held, summed per (group key, zone, type, capacity, first day) into
the temp table ``cost_agg`` (and ``cost_days``). The reference path runs these over every slice; the fast
path (``sql_fast``) over only the slices its rollups cannot answer.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Final

from tpuctl.services.cost.scope import scope_sql
from tpuctl.services.cost.sql_intervals import IN_WINDOW_PREEMPTION, PART, billed_pod, held_s, key_sql
from tpuctl.services.cost.window import GroupBy
from tpuctl.store import cost_sql as sd
from tpuctl.store.billing import DAY_S, day_sql, free_if_preempted_sql, midnight_after_sql
from tpuctl.store.cost_sql import TempTable
from tpuctl.store.sql import Dialect

AGG_TABLE: Final = TempTable(
    "cost_agg",
    "k KEY, zone TEXT, atype TEXT, capacity TEXT, day0 INT, slices INT DEFAULT 0, seen INT DEFAULT 0, "
    "bs REAL DEFAULT 0, cs REAL DEFAULT 0, priced REAL DEFAULT 0, unpriced REAL DEFAULT 0, "
    "d0s REAL DEFAULT 0, d0cs REAL DEFAULT 0, d0priced REAL DEFAULT 0, d0unpriced REAL DEFAULT 0, "
    "hcs REAL DEFAULT 0, hpriced REAL DEFAULT 0, hunpriced REAL DEFAULT 0",
    primary_key="k, zone, atype, capacity, day0",
    summed_by_key=True,
    statistics=False,
)
DAY_TABLE: Final = TempTable(
    "cost_days",
    "day INT, zone TEXT, atype TEXT, capacity TEXT, slices INT, s REAL, cs REAL, priced REAL, unpriced REAL",
    primary_key="day, zone, atype, capacity",
    summed_by_key=True,
    statistics=False,
)


def group_columns(key: str, d: Dialect) -> str:
    """A slice's (alias p) group key and attributes as the working tables key them (NULL as the
    sentinel: NULLs never conflict in a UNIQUE key)."""
    return (
        f"COALESCE({sd.key_text(key, d)}, :null_key), p.zone, COALESCE(p.accelerator_type, :null_key), "
        "COALESCE(p.capacity, :null_key)"
    )


def upsert(columns: Sequence[str], d: Dialect, table: TempTable = AGG_TABLE) -> str:
    """Add to the row already there with the same key (``cost_sql.add_to_rows``)."""
    return sd.add_to_rows(table, tuple(columns), d)


def own_sql(group: GroupBy, d: Dialect) -> str:
    """Whether a slice counts for its own group (1 or 0): always, except that with --group-by run a slice
    no run created counts for "(none)" only when no run ever ran on it (the runs that did get it through
    the segment query). NULLs are kept out of the list: NOT IN a list holding a NULL is NULL."""
    if group.kind != "run":
        return "1"
    # NOT EXISTS through run_segments_pod: a look-up for each slice no run created, where a NOT IN list
    # would be built from every segment on each use.
    return sd.as_int(
        "(p.run_id IS NOT NULL OR NOT EXISTS (SELECT 1 FROM run_segments AS rs "
        "WHERE rs.zone = p.zone AND rs.pod = p.name))",
        d,
    )


def all_pods(d: Dialect) -> str:
    """Where the scans read slices from: every pod (on SQLite a rowid range scan: its planner would walk
    an index for the key)."""
    return f"pods AS p {sd.not_indexed(d)}".rstrip()


def rest_pods(d: Dialect) -> str:
    """On the fast path, only the slices that need interval arithmetic (``cost_rest``)."""
    return f"cost_rest AS r {sd.cross_join(d)} pods AS p ON p.id = r.id"


@functools.cache
def pods_billed_sql(group: GroupBy, d: Dialect, source: str | None = None) -> str:
    """ONE scan of ``pods``: the billed time of every slice whose price never changed, and its share on
    the day it started, summed per (group key, zone, type, capacity, first billed day).

    Summed on SQLite by an UPSERT into a small keyed temp table rather than GROUP BY: SQLite groups by
    sorting every row, which costs more than the scan itself for a few hundred thousand slices.
    (PostgreSQL groups first, by hash: its UPSERT may not meet one key twice in a statement.) The
    predicate sits in the WHERE so the per-row expressions stay plain arithmetic. Price-changed slices are
    summed here at their last price like the rest and corrected afterwards from their pieces (excluding
    the few of them here would cost a lookup on every row)."""
    source = all_pods(d) if source is None else source
    b0 = d.greatest("p.ready_at", ":since")
    be = d.least("COALESCE(p.ended_at, :now)", ":until")
    day0 = day_sql(b0, d)
    d0 = f"({d.least(be, midnight_after_sql(b0, d))} - {b0})"
    columns = ("slices", "seen", "bs", "cs", "priced", "unpriced", "d0s", "d0cs", "d0priced", "d0unpriced")
    values = [
        own_sql(group, d),
        "1",
        f"{be} - {b0}",
        f"p.chips * ({be} - {b0})",
        f"COALESCE(p.chips * ({be} - {b0}) * p.price_per_chip_hour, 0)",
        f"CASE WHEN p.price_per_chip_hour IS NULL THEN p.chips * ({be} - {b0}) ELSE 0 END",
        d0,
        f"p.chips * {d0}",
        f"COALESCE(p.chips * {d0} * p.price_per_chip_hour, 0)",
        f"CASE WHEN p.price_per_chip_hour IS NULL THEN p.chips * {d0} ELSE 0 END",
    ]
    grouped = ""
    if sd.upsert_groups_first(d):
        values = [f"SUM({v})" for v in values]
        grouped = "\nGROUP BY 1, 2, 3, 4, 5"
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT {group_columns(key_sql(group, "p", d), d)}, {day0}, {values[0]}, {values[1]},
       {values[2]}, {values[3]}, {values[4]},
       {values[5]},
       {values[6]}, {values[7]}, {values[8]},
       {values[9]}
FROM {source}
WHERE {billed_pod(d)}{grouped}
{upsert(columns, d)}"""


@functools.cache
def pods_held_sql(group: GroupBy, d: Dialect, source: str | None = None) -> str:
    """Quota held after preemption (preempted until deleted, or until now), per group; a slice only
    holding quota in the window (not billed in it) counts as a slice of its group here.

    Grouped before the UPSERT: one upsert per preempted slice cost more than the rest of the query (tens
    of thousands of them), and pods_preempted hands the rows over in (zone, type, capacity) order."""
    source = all_pods(d) if source is None else source
    held = f"({held_s(d)})"
    columns = ("slices", "seen", "hcs", "hpriced", "hunpriced")
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT {group_columns(key_sql(group, "p", d), d)}, -1,
       SUM(CASE WHEN {billed_pod(d)} THEN 0 ELSE {own_sql(group, d)} END),
       SUM(CASE WHEN {billed_pod(d)} THEN 0 ELSE 1 END),
       SUM(p.chips * {held}), SUM(COALESCE(p.chips * {held} * p.price_per_chip_hour, 0)),
       SUM(CASE WHEN p.price_per_chip_hour IS NULL THEN p.chips * {held} ELSE 0 END)
FROM {source}
WHERE {PART} AND p.end_reason = 'preempted' AND p.chips IS NOT NULL AND {held} > 0
GROUP BY 1, 2, 3, 4
{upsert(columns, d)}"""


@functools.cache
def preemptions_sql(d: Dialect) -> str:
    """Preemptions in the window, and those within the first minute (not billed): totals, no grouping."""
    free = f"{IN_WINDOW_PREEMPTION} AND {free_if_preempted_sql('p')}"
    return f"""
SELECT COALESCE(SUM({sd.as_int(IN_WINDOW_PREEMPTION, d)}), 0),
       COALESCE(SUM({sd.as_int(free, d)}), 0)
FROM pods AS p WHERE {PART} AND p.end_reason = 'preempted'"""


@functools.cache
def preemption_kinds_sql(d: Dialect, *, scoped: bool = False) -> str:
    """The preemptions in the window by kind (``PreemptionKind``: what the run's program did with each,
    from the first ``preempted`` event of the slice that names one; NULL where none does, e.g. a slice no
    run was on, or one the listing found preempted). A few rows: preempted slices only, their events by
    index."""
    kind = d.json_text("e.detail", "kind")
    scope = f" AND {scope_sql('p', d)}" if scoped else ""  # only the report's scope (``scope``)
    return f"""
SELECT (SELECT {kind} FROM events AS e
        WHERE e.pod_id = p.id AND e.kind = 'preempted' AND {kind} IS NOT NULL
        ORDER BY e.id LIMIT 1) AS kind,
       COUNT(*)
FROM pods AS p {sd.indexed("pods_preemptions", d)}
WHERE p.end_reason = 'preempted' AND p.ended_at >= :since AND p.ended_at < :until{scope}
GROUP BY 1 ORDER BY 1"""


def later_days_sql(d: Dialect, source: str) -> str:
    """The days after the first of every billed interval that crosses midnight (UTC), for the per-day
    figures: seeded only with those intervals (of the slices in ``source``), so the recursion touches
    few rows."""
    b0 = d.greatest("p.ready_at", ":since")
    be = d.least("COALESCE(p.ended_at, :now)", ":until")
    midnight = midnight_after_sql(b0, d)
    return f"""
WITH RECURSIVE x AS (
    SELECT p.zone, p.accelerator_type AS atype, p.capacity, p.chips, p.price_per_chip_hour AS price,
           {midnight} AS s,
           {be} AS e
    FROM {source}
    WHERE {billed_pod(d)}
      AND {be}
          > {midnight}
),
days(zone, atype, capacity, chips, price, s, e, pe) AS (
    SELECT zone, atype, capacity, chips, price, s, {d.least("e", f"s + {DAY_S}.0")}, e FROM x
    UNION ALL
    SELECT zone, atype, capacity, chips, price, e, {d.least("pe", f"e + {DAY_S}.0")}, pe
    FROM days WHERE e < pe
)
INSERT INTO cost_days (day, zone, atype, capacity, slices, s, cs, priced, unpriced)
SELECT {day_sql("s", d)}, zone, COALESCE(atype, :null_key),
       COALESCE(capacity, :null_key),
       COUNT(*), SUM(e - s), SUM(chips * (e - s)),
       -- TOTAL, not SUM: a day's unpriced piece must not make its priced sum NULL
       {sd.total("chips * (e - s) * price", d)}, SUM(CASE WHEN price IS NULL THEN chips * (e - s) ELSE 0 END)
FROM days WHERE {sd.true(d)}
-- Grouped before the UPSERT: one upsert per day of every midnight-crossing slice cost more than the
-- recursion itself.
GROUP BY 1, 2, 3, 4
{days_upsert(d)}"""


def days_upsert(d: Dialect) -> str:
    return upsert(("slices", "s", "cs", "priced", "unpriced"), d, DAY_TABLE)


#: The per-day rows' column a day's spend is split by, per grouping (``day_usd_sql``): the key itself, or
#: the zone a region is derived from.
SPLIT_COLUMNS: Final = {"zone": "zone", "region": "zone", "type": "atype", "capacity": "capacity"}


@functools.cache
def day_usd_sql(d: Dialect, split: str | None = None) -> str:
    """The per-day spend of the fast path without a per-day grouping (the chart's figures): each
    interval's first day (cost_agg) and its later days (cost_days), summed per day in SQL rather than as
    thousands of per-day x zone x type x capacity rows in Python; with ``split`` (one of
    ``SPLIT_COLUMNS``' values), per day and that column (the dashboard's stacked bars). Unpriced time
    comes per combination (the catalog prices it), usually none."""
    columns = ", ".join(c if c == split else "NULL" for c in ("zone", "atype", "capacity"))
    by = "day" if split is None else f"day, {split}"
    return f"""
WITH d AS (
    SELECT day0 AS day, zone, atype, capacity, d0priced AS priced, d0unpriced AS unpriced
    FROM cost_agg WHERE day0 >= 0
    UNION ALL
    SELECT day, zone, atype, capacity, priced, unpriced FROM cost_days
)
SELECT day, {columns}, {sd.total("priced", d)}, 0.0 FROM d GROUP BY {by}
UNION ALL
SELECT day, zone, atype, capacity, 0.0, SUM(unpriced) FROM d WHERE unpriced != 0 GROUP BY 1, 2, 3, 4"""
