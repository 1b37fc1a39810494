"""Slice and run groups on the fast path: the groups computed in SQL (``items``), their totals, per-day
spend and counts from the aggregate fast path grouped by nothing (``aggregate``), so that they are the same
figures every other grouping shows."""

from __future__ import annotations

import json
from typing import Any, Final

from tpuctl.services.cost import items
from tpuctl.services.cost.aggregate import Query, aggregate_lines
from tpuctl.services.cost.model import FIGURES, CostLine
from tpuctl.services.cost.scan import whole_days
from tpuctl.services.cost.sql_intervals import (
    STORED_CHANGE_CTES,
    aggregate_sql,
    change_ctes,
    pieces_needed_sql,
    recomputed_sql,
    recomputing_changes_sql,
    src_segment_runs,
    stored_pieces_sql,
)
from tpuctl.services.cost.subs import sub_rows
from tpuctl.services.cost.window import GroupBy
from tpuctl.store.cost_sql import cross_join, true

#: The fewest runs a limited report by run ranks exactly (``_rank_runs``): the ``limit`` costliest are
#: nearly always among the first few by their bound, so the first try is the last.
RUN_CANDIDATES: Final = 32
#: Past this many candidates, every run is ranked (``items.run_rank_sql``): a window whose costliest runs
#: the bounds cannot tell apart.
RUN_CANDIDATES_MAX: Final = 5000

#: (groups, how many in all, by_day, (preemptions, free preemptions, distinct slices), totals)
ItemReport = tuple[list[dict[str, Any]], int, list[dict[str, Any]], tuple[int, int, int], CostLine]


def item_report(
    q: Query,
    group: GroupBy,
    *,
    with_days: bool,
    limit: int | None,
    scoped: bool = False,
    summed_by: str | None = None,
) -> ItemReport:
    """The slice or run groups of a report. The aggregate pass grouped by nothing leaves its temp tables
    (the combinations priced, the price pieces) for the groups' one pass over ``pods``. ``scoped``: only
    the slices of the report's scope (``scope.CostScope``; slices only, every one of them: the totals,
    per-day figures and counts are then still the whole ledger's, for the caller to replace).
    ``summed_by``: the slices' rows summed per this key (SQL over the slice, alias p) instead of listed:
    ``{"key", FIGURES...}`` per key, unordered."""
    totals, by_day, counts, ctes = prepared_totals(q, with_days=with_days)
    d = q.reader.dialect
    if q.shares and group.kind == "run":
        # Slices no run created are billed to the runs that ran on them, for the time they did;
        # the rest of their time stays with "(none)".
        runs = aggregate_sql(src_segment_runs(d), group, d, count=True, ctes=ctes)
        q.reader.execute(f"INSERT INTO cost_seg {runs}", q.params)
        q.reader.execute(items.adj_sql("SELECT * FROM cost_seg", d, recomputed=False), q.params)
        q.reader.execute(items.adj_sql("SELECT * FROM cost_seg", d, recomputed=False, sign="-"), q.params)
    if group.kind == "slice":
        groups = _slice_groups(q, group, ctes, limit, scoped=scoped, summed_by=summed_by)
        # One group per slice billed or holding quota in the window: what the aggregate pass counted.
        total = counts[2]
    else:
        groups, total = _run_groups(q, group, ctes, limit)
    return groups, total, by_day, counts, totals


def prepared_totals(
    q: Query, *, with_days: bool, item_pieces: bool = True
) -> tuple[CostLine, list[dict[str, Any]], tuple[int, int, int], str]:
    """The totals, per-day spend and counts of every slice (the aggregate pass grouped by nothing, its
    recomputed work from the few per-combination rows), with ``cost_prices`` filled for the groups' pass
    over the slices; and the CTEs of the price pieces that pass reads. ``item_pieces``: the pieces a pass
    over slices or runs needs (``_prepare_pieces``); else only those of the slices some segment redid
    steps on, all that recomputed work reads (a caller that reads no other)."""
    # Recomputed work is added per group by the caller; the total's comes from the same rows.
    lines, by_day, counts, _ = aggregate_lines(q, GroupBy("total"), with_days=with_days, recomputed=False)
    totals = lines[0] if lines else CostLine("total")
    items.fill_prices(q.reader, items.combos(q.reader), q.pricer.combo_prices)
    d = q.reader.dialect
    ctes = change_ctes(d)
    if q.changes:
        ctes = _prepare_pieces(q) if item_pieces else _prepare_pieces_of(q, recomputing_changes_sql(d))
    if q.segments:
        for sub in sub_rows(q.reader, recomputed_sql(GroupBy("total"), d, ctes), q.params):
            totals.recomputed_usd += q.pricer.usd(sub, q.warnings)
    return totals, by_day, counts, ctes


def _prepare_pieces(q: Query) -> str:
    """The pieces of the price-changed slices that need them, once (the groups and both segment queries
    read them): those still open or cut by the window, and those segments ran on (their recomputed work,
    or a run's share of a slice it did not create, is priced piece by piece). For the other ones, billed
    wholly inside the window, the stored facts are the bill. Returns the CTEs that read them back."""
    d = q.reader.dialect
    ctes = _prepare_pieces_of(q, pieces_needed_sql(d))
    q.reader.execute(items.pieces_sql(d), {})
    q.reader.execute(stored_pieces_sql(d), q.params)
    return ctes


def _prepare_pieces_of(q: Query, needed_sql: str) -> str:
    """The pieces of the price-changed slices whose changes ``needed_sql`` gives (as JSON), into
    cost_all_pieces; returns the CTEs that read them back."""
    d = q.reader.dialect
    needed = q.reader.query(needed_sql, q.params)[0][0] or "[]"
    pieces = f"WITH {change_ctes(d)} SELECT id, s, e, price FROM pieces"
    q.reader.execute(f"INSERT INTO cost_all_pieces {pieces}", {**q.params, "price_changes": needed})
    return STORED_CHANGE_CTES


def _slice_groups(
    q: Query,
    group: GroupBy,
    ctes: str,
    limit: int | None,
    *,
    scoped: bool = False,
    summed_by: str | None = None,
) -> list[dict[str, Any]]:
    """The slices ranked into cost_top (only the ``limit`` costliest, if given), then their records."""
    d = q.reader.dialect
    bound = {**q.params, "limit": limit if limit is not None else -1}
    if summed_by is not None:
        q.reader.execute(items.slice_all_sql(d, scoped=scoped), bound)
    elif scoped:
        assert limit is None, "a scoped report ranks every slice of its scope"
        q.reader.execute(items.slice_rank_all_sql(d, scoped=True), bound)
    elif limit is not None:
        bar, found = q.reader.query(items.slice_bar_sql(d), bound)[0]
        if found == limit and bar is not None and bar > items.BAR_MARGIN_USD_S:
            # Only slices that can be among the costliest: closed ones down to the bar, and those
            # the stored facts cannot rank (open, cut by the window, unpriced).
            q.reader.execute(items.slice_rank_above_sql(d), {**bound, "bar": bar - items.BAR_MARGIN_USD_S})
        else:  # fewer than `limit` closed slices cost anything: rank them all
            q.reader.execute(items.slice_rank_sql(d), bound)
    else:
        q.reader.execute(items.slice_rank_all_sql(d), bound)
    if q.segments:
        shown = recomputed_sql(
            group,
            d,
            ctes,
            only="p.id IN (SELECT k FROM cost_top)",
            stored_from=f"cost_top AS t {cross_join(d)} pods AS p ON p.id = t.k",
        )
        q.reader.execute(items.adj_sql(shown, d, recomputed=True), q.params)
        q.reader.execute(items.rec_sql(d), {})
    if summed_by is not None:
        rows = q.reader.query(items.slice_groups_sql(d, summed_by), bound)
        return [dict(zip(("key", *FIGURES), row, strict=True)) for row in rows]
    return items.slice_records(q.reader.query(items.slice_sql(d), bound))


def _run_groups(q: Query, group: GroupBy, ctes: str, limit: int | None) -> tuple[list[dict[str, Any]], int]:
    """The run groups ("(none)" included), ranked when there is a ``limit``; and how many there are."""
    d = q.reader.dialect
    bound = {**q.params, "limit": limit if limit is not None else -1}
    ranked = limit is not None
    for statement in items.none_sql(d, shares=q.shares):
        q.reader.execute(statement, {**bound, **whole_days(q.params)})
    if limit is not None:
        _rank_runs(q, limit, bound)
    if q.segments:
        # Recomputed work is not part of the ranking: only the runs shown need it.
        rec = (
            recomputed_sql(
                group,
                d,
                ctes,
                only="COALESCE(p.run_id, rs.run_id) IN (SELECT k FROM cost_top_runs)",
                only_stored=true(d),
                stored_from=f"cost_top_runs AS t {cross_join(d)} pods AS p ON p.run_id = t.k",
                shares=q.shares,
            )
            if ranked
            else recomputed_sql(group, d, ctes, shares=q.shares)
        )
        q.reader.execute(items.adj_sql(rec, d, recomputed=True), q.params)
    groups = items.run_records(q.reader.query(items.run_sql(d, ranked=ranked), bound))
    total = len(groups)
    if ranked:  # every group, counted when they were ranked (none: no row, so no count)
        total = int(q.reader.query("SELECT COALESCE(MAX(groups), 0) FROM cost_top_runs", {})[0][0])
    return groups, total


def _rank_runs(q: Query, limit: int, bound: dict[str, Any]) -> None:
    """The ``limit`` costliest run groups into cost_top_runs, as ``items.run_rank_sql`` ranks every one,
    from few candidates: the runs with the highest bounds on their cost (``items.run_bound_sql``) and
    those a bound may miss, ranked exactly. Once the ``limit``-th of them costs more than the next bound
    (or every run with a slice in the window was one), no other run can be among the costliest: each
    costs at most its bound, or nothing (one that only held quota). Else more candidates, and past
    ``RUN_CANDIDATES_MAX``, or where the limit reaches the groups that cost nothing, every run. Every
    group is counted apart (``items.run_groups_count_sql``). At 1,000,000 events this ranks a few dozen of
    158,216 runs instead of computing and ranking each one's cost (0.39 s). Where the ledger's closed time
    by run holds the window (``items.run_sums_hold``), the bounds and the count of runs read a row per run
    (``run_closed_time``) and the open slices, not every slice runs created."""
    d = q.reader.dialect
    stored = items.run_sums_hold(q.reader, bound)
    in_window = int(q.reader.query(items.runs_in_window_sql(d, stored=stored), bound)[0][0])
    groups = int(q.reader.query(items.run_groups_count_sql(d), {**bound, "runs_in_window": in_window})[0][0])
    top_price = q.reader.query("SELECT MAX(own) FROM cost_prices", {})[0][0]
    count = max(RUN_CANDIDATES, limit)
    while count <= RUN_CANDIDATES_MAX:
        params = {**bound, "top_price": float(top_price or 0.0), "candidates": count + 1}
        bounds = _stored_bounds(q, params) if stored else q.reader.query(items.run_bound_sql(d), params)
        keys = [str(r[0]) for r in bounds[:count]]
        q.reader.execute(items.run_candidates_sql(d), {**bound, "bounded": json.dumps(keys)})
        for statement in items.run_rank_candidates_sql(d):
            q.reader.execute(statement, {**bound, "groups": groups})
        ranked, bar = q.reader.query(items.run_bar_sql(d), {})[0]
        every = len(bounds) <= count
        # The next bound in USD, with room for the float error of sums taken in another order; strictly
        # below the limit-th cost as rounded: no other run can equal it and come first by its key.
        above = 1e-6 if every else float(bounds[count][1] or 0.0) / 3600.0 * (1 + 1e-9) + 1e-6
        if ranked == limit and bar is not None and float(bar) > above:
            return
        for table in ("cost_run_cands", "cost_runs", "cost_top_runs"):
            q.reader.execute(f"DELETE FROM {table}", {})
        if every:
            break  # the limit reaches runs that cost nothing: those that only held quota are not candidates
        count *= 16
    for statement in items.run_rank_sql(d):
        q.reader.execute(statement, bound)


def _stored_bounds(q: Query, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """``items.run_bound_sql``'s rows where the ledger's closed time by run holds the window: the
    ``:candidates`` runs whose closed slices bound most, and each run with an open slice there, with its
    open slices' bound added to its closed ones'; the highest ``:candidates`` of those. A run that is
    neither bounds at most the last of the first (its bound is its closed slices')."""
    top, open_sql, of_runs = items.stored_run_bound_sql(q.reader.dialect)
    bounds = {str(run): float(b) for run, b in q.reader.query(top, params)}
    opened = {str(run): float(b or 0.0) for run, b in q.reader.query(open_sql, params)}
    if opened:
        ids = {**params, "ids": json.dumps(sorted(opened))}
        bounds.update({str(run): float(b) for run, b in q.reader.query(of_runs, ids)})
    for run, b in opened.items():
        bounds[run] = bounds.get(run, 0.0) + b
    ranked = sorted(bounds.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked[: int(params["candidates"])]
