"""The pods scans: every slice's billed time, first-day share and held quota summed per group in SQL, by
the fast path (closed slices from the ledger's rollups and stored facts, the rest slice by slice) or by its
reference oracle (interval arithmetic over every slice, in parallel id ranges), side by side."""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from tpuctl.services.cost import sql_fast as fsql
from tpuctl.services.cost import sql_scan as ssql
from tpuctl.services.cost.sql_intervals import (
    CHANGED_PODS,
    SRC_CHANGED,
    SRC_CHANGED_TEMP,
    SRC_CHANGED_WHOLE_TEMP,
    change_ctes,
    copy_changed_pods_sql,
    src_changed_whole,
)
from tpuctl.services.cost.subs import Partial, Sub, floats, subs, unnull
from tpuctl.services.cost.window import GroupBy
from tpuctl.store.billing import DAY_S
from tpuctl.store.cost_reader import LedgerReader
from tpuctl.store.cost_sql import TempTable


def _intervals_table(name: str) -> TempTable:
    """Billed intervals (``IV_COLUMNS``), computed once and read several times."""
    return TempTable(
        name,
        "id INT, s NUM, e NUM, price NUM, w NUM, run KEY, zone KEY, name KEY, atype KEY, capacity KEY, "
        "chips WHOLE, run_id KEY, labels KEY",
    )


#: The working tables of one scan (each reader of a parallel scan makes its own).
SCAN_TABLES: Final = (
    CHANGED_PODS,
    ssql.AGG_TABLE,
    ssql.DAY_TABLE,
    fsql.REST_TABLE,
    fsql.LATER_TABLE,
    fsql.XREST_TABLE,
    fsql.HREST_TABLE,
    _intervals_table("cost_pieces"),
    _intervals_table("cost_whole"),
)

#: Below this many pods one scan is quicker than starting threads and connections.
_PARALLEL_MIN_PODS: Final = 20_000


def partitions(lo: int, hi: int, workers: int) -> list[tuple[int, int]]:
    """Split the id range [lo, hi) into ``workers`` ranges (one when the table is small)."""
    if workers <= 1 or hi - lo < _PARALLEL_MIN_PODS:
        return [(lo, hi)]
    step = -(-(hi - lo) // workers)
    return [(start, min(start + step, hi)) for start in range(lo, hi, step)]


def copy_changed_pods(reader: LedgerReader, params: Mapping[str, Any]) -> None:
    """Copy the rows of the slices of ``params``' :price_changes into ``CHANGED_PODS``, on an engine whose
    queries read them from a copy (``sql_intervals.changed_pods``); nothing on the others."""
    sql = copy_changed_pods_sql(reader.dialect)
    if sql is not None:
        reader.execute(sql, params)


def scan_all(
    reader: LedgerReader,
    main: GroupBy,
    group: GroupBy,
    params: Mapping[str, Any],
    *,
    need_days: bool,
    fast: bool,
    changes: bool,
    workers: int,
    split: GroupBy | None = None,
) -> list[Partial]:
    """Every slice scanned: in one range on the fast path (it reads few rows), else in ``workers`` id
    ranges, each on a connection of its own to the same ledger. ``split``: the fast path also sums each
    day's spend split by that grouping (``Partial.split_rows``; one of ``daily.DAY_SPLIT_GROUPINGS``)."""
    # Two subqueries: SQLite reads MIN or MAX of the rowid from the B-tree's ends only when each is
    # the query's sole aggregate (both in one SELECT scan the table).
    lo, hi = reader.query(
        "SELECT COALESCE((SELECT MIN(id) FROM pods), 0), COALESCE((SELECT MAX(id) FROM pods), 0) + 1", {}
    )[0]
    parts = [(int(lo), int(hi))] if fast else partitions(int(lo), int(hi), workers)
    if len(parts) == 1:
        bounds = {**params, "lo": lo, "hi": hi}
        return [scan(reader, main, group, bounds, need_days, fast=fast, changes=changes, split=split)]

    def scan_range(bounds: tuple[int, int]) -> Partial:
        # The database driver releases the GIL while a statement runs: one connection per thread scans
        # its range of pods on its own core.
        with reader.another() as part_reader, part_reader.snapshot(SCAN_TABLES):
            part_params = {**params, "lo": bounds[0], "hi": bounds[1]}
            if changes:  # the working tables are the connection's own: the copy too
                copy_changed_pods(part_reader, part_params)
            return scan(part_reader, main, group, part_params, need_days, fast=False, changes=changes)

    with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="tpuctl-cost") as pool:
        return list(pool.map(scan_range, parts))


def scan(
    reader: LedgerReader,
    main: GroupBy,
    group: GroupBy,
    params: Mapping[str, Any],
    need_days: bool,
    *,
    fast: bool = False,
    changes: bool = False,
    split: GroupBy | None = None,
) -> Partial:
    """The pods scans over one id range (its bounds in ``params``), in one read transaction; ``fast``:
    closed slices from their stored facts, the rest (``cost_rest``) by interval arithmetic; ``changes``:
    whether the ledger holds price changes (their slices are billed by piece)."""
    if fast:
        params = _billed_fast(reader, main, params, changes=changes)
    else:
        _billed_reference(reader, main, params)
    # Summed here rather than row by row in Python: cost_agg holds a row per day as well (tens of
    # thousands on a big ledger), which the groups do not need and the per-day figures need apart.
    rows = reader.query(
        "SELECT k, zone, atype, capacity, SUM(slices), SUM(seen), SUM(bs), SUM(cs), SUM(priced), "
        "SUM(unpriced), SUM(hcs), SUM(hpriced), SUM(hunpriced) FROM cost_agg GROUP BY 1, 2, 3, 4",
        {},
    )
    # The fast path sums the days in SQL unless the groups are the days themselves (none, unless asked).
    sql_days = fast and need_days and group.kind != "day"
    first_days = (
        []
        if sql_days or not need_days
        else reader.query(
            "SELECT day0, zone, atype, capacity, SUM(slices), SUM(d0s), SUM(d0cs), SUM(d0priced), "
            "SUM(d0unpriced) FROM cost_agg WHERE day0 >= 0 GROUP BY 1, 2, 3, 4",
            {},
        )
    )
    d = reader.dialect
    preemptions_sql = fsql.preemptions_fast_sql(d) if fast else ssql.preemptions_sql(d)
    preemptions, free = (int(v) for v in reader.query(preemptions_sql, params)[0])
    part = Partial(rows=rows, first_days=first_days, preemptions=preemptions, free=free)
    changed = changes and _materialize_changed(reader, params)
    if changed and group.kind != "day":
        part.changed_subs = subs(reader, SRC_CHANGED_TEMP, group, params)
        part.changed_whole = subs(reader, SRC_CHANGED_WHOLE_TEMP, group, params)
    if need_days:
        _scan_days(reader, part, params, fast=fast, sql_days=sql_days, changed=changed, split=split)
    return part


def whole_days(params: Mapping[str, Any]) -> dict[str, int]:
    """The UTC days wholly inside the window ``params`` bounds (``:since``, ``:until``), as ``:d_lo``
    (the first) and ``:d_hi`` (the day after the last): what the rollups answer for."""
    return {"d_lo": math.ceil(params["since"] / DAY_S), "d_hi": math.floor(params["until"] / DAY_S)}


def _billed_reference(reader: LedgerReader, main: GroupBy, params: Mapping[str, Any]) -> None:
    """The reference path: every slice of the range through the interval arithmetic."""
    reader.execute(ssql.pods_billed_sql(main, reader.dialect), params)
    reader.execute(ssql.pods_held_sql(main, reader.dialect), params)


def _billed_fast(
    reader: LedgerReader, main: GroupBy, params: Mapping[str, Any], *, changes: bool
) -> dict[str, Any]:
    """The fast path into cost_agg: the whole UTC days inside the window from the rollups, the closed
    slices of its edge days from their stored facts, and only the rest (cost_rest: open, cut by the
    window, price-changed across midnight) by interval arithmetic. Returns the parameters the later
    queries take (the price changes of cost_rest's slices only, the window's whole days)."""
    params = dict(params)
    d = reader.dialect
    reader.execute(fsql.rest_open(d), params)
    for cut in (params["since"], params["until"]):
        if cut > -1e17:  # no --since: nothing is cut at the start
            reader.execute(fsql.rest_cut(d), {"cut": cut})
    if changes:
        reader.execute(fsql.rest_changed(d), params)
        params["price_changes"] = reader.query(fsql.rest_price_changes(d), params)[0][0] or "[]"
    reader.execute(ssql.pods_billed_sql(main, d, ssql.rest_pods(d)), params)
    # Whole UTC days inside the window come from the rollup; the rest slice by slice.
    days = whole_days(params)
    d_lo, d_hi = days["d_lo"], days["d_hi"]
    reader.execute(fsql.rollup_sql(main, d), {**params, **days})
    reader.execute(fsql.rollup_x_sql(main, d), {**params, **days})
    for statement in fsql.xrest_fill(d):
        reader.execute(statement, days)
    reader.execute(fsql.closed_billed_sql(main, d, fsql.closed_xrest(d)), {**params, **days})
    for edge in {d_lo - 1, d_hi}:
        bounds = {"b_lo": float(edge * DAY_S), "b_hi": float((edge + 1) * DAY_S)}
        reader.execute(fsql.closed_billed_sql(main, d, fsql.closed_edge_day(d)), {**params, **days, **bounds})
    # Held quota: rolled up when preempted after the day holding :since began (so the slice
    # ended after :since, as being billed in the window asks) and deleted by :d_hi.
    held_days = {"d_hi": d_hi, "h_lo": math.floor(params["since"] / DAY_S) + 1}
    reader.execute(fsql.rollup_held_sql(main, d), {**params, **held_days})
    for statement in fsql.hrest_fill(d):
        reader.execute(statement, {**params, **held_days})
    reader.execute(ssql.pods_held_sql(main, d, fsql.hrest_pods(d)), params)
    params["d_lo"], params["d_hi"] = d_lo, d_hi  # for the later days
    return params


def _scan_days(
    reader: LedgerReader,
    part: Partial,
    params: Mapping[str, Any],
    *,
    fast: bool,
    sql_days: bool,
    changed: bool,
    split: GroupBy | None,
) -> None:
    """Per day: each interval's first day (in the rows), the days after it for those crossing midnight,
    and the price-changed slices' pieces cut at midnight."""
    d = reader.dialect
    source = ssql.all_pods(d)
    if fast:
        reader.execute("INSERT INTO cost_later (id) SELECT id FROM cost_rest", {})
        reader.execute(fsql.later_closed(d), params)
        source = fsql.rest_pods_later(d)
    reader.execute(ssql.later_days_sql(d, source), params)
    if fast:
        reader.execute(fsql.rollup_xdays_sql(d), params)
    if sql_days:
        part.day_rows = reader.query(ssql.day_usd_sql(d), {})
        if split is not None:
            part.split_rows = reader.query(ssql.day_usd_sql(d, ssql.SPLIT_COLUMNS[split.kind]), {})
    else:
        part.later = [
            Sub(r[0], r[1], unnull(r[2]), unnull(r[3]), int(r[4]), *floats(r[5:9]))
            for r in reader.query(
                "SELECT day, zone, atype, capacity, slices, s, cs, priced, unpriced FROM cost_days", {}
            )
        ]
    if changed:
        day = GroupBy("day")
        part.changed_days = subs(reader, SRC_CHANGED_TEMP, day, params)
        part.changed_days_whole = subs(reader, SRC_CHANGED_WHOLE_TEMP, day, params)


def _materialize_changed(reader: LedgerReader, params: Mapping[str, Any]) -> bool:
    """The price-changed slices of this range, cut into pieces, in temp tables read four times
    (per group and per day, pieces and whole); False when this range has none."""
    ctes = change_ctes(reader.dialect)
    reader.execute(f"INSERT INTO cost_pieces WITH {ctes} {SRC_CHANGED}", params)
    reader.execute(f"INSERT INTO cost_whole WITH {ctes} {src_changed_whole(reader.dialect)}", params)
    return bool(reader.query("SELECT EXISTS (SELECT 1 FROM cost_whole)", {})[0][0])
