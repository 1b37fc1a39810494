"""Some runs' groups of ``cost report --group-by run``, by run id, without the report's other groups: the
same SQL as the report's (``items.run_sql``, ranked, over the runs asked for instead of the costliest), so
each figure is the one the report's JSON gives, at the cost of those runs' slices rather than every run's
(a page that shows 50 runs of 150,000 asks for 50).

What the report computes for every run and these rows need too is done the same way: the catalog prices
of every (zone, type, capacity) the ledger holds, the price pieces, the slices whose stored figures are not
their bill in the window (``cost_rest``), and the runs' shares of slices they ran on without creating
them. "(none)" is never one of them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from tpuctl.services.cost import items
from tpuctl.services.cost import sql_fast as fsql
from tpuctl.services.cost.aggregate import Query
from tpuctl.services.cost.item_report import _prepare_pieces
from tpuctl.services.cost.scan import copy_changed_pods
from tpuctl.services.cost.sql_intervals import (
    aggregate_sql,
    change_ctes,
    recomputed_sql,
    src_segment_runs,
)
from tpuctl.services.cost.window import GroupBy
from tpuctl.store import cost_sql as sd
from tpuctl.store.cost_sql import cross_join, true
from tpuctl.store.sql import Dialect

_RUN = GroupBy("run")


def run_groups(q: Query, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The group of each run in ``run_ids`` that has one (billed or holding quota in the window), in
    ``run_ids``' order."""
    wanted = list(dict.fromkeys(run_ids))
    if not wanted:
        return []
    d = q.reader.dialect
    q.reader.execute_many(
        "INSERT INTO cost_top_runs (k, n, groups) VALUES (:k, :n, :groups)",
        [{"k": run_id, "n": n, "groups": len(wanted)} for n, run_id in enumerate(wanted)],
    )
    if q.changes:  # only these runs' slices are read: the pieces of every other one are not
        touched = q.reader.query(_touched_changes_sql(d), q.params)[0][0] or "[]"
        q = replace(q, params={**q.params, "price_changes": touched})
        copy_changed_pods(q.reader, q.params)  # their rows only (``CostService`` copied none)
    ctes = _prepare_pieces(q) if q.changes else change_ctes(d)
    _rest(q)
    if q.segments:
        # The runs' shares only: what the report takes from "(none)" for them is not asked for.
        shares = aggregate_sql(src_segment_runs(d, top_runs=True), _RUN, d, count=True, ctes=ctes)
        q.reader.execute(f"INSERT INTO cost_seg {shares}", q.params)
        q.reader.execute(items.adj_sql("SELECT * FROM cost_seg", d, recomputed=False), q.params)
        recomputed = recomputed_sql(
            _RUN,
            d,
            ctes,
            only="COALESCE(p.run_id, rs.run_id) IN (SELECT k FROM cost_top_runs)",
            only_stored=true(d),
            stored_from=f"cost_top_runs AS t {cross_join(d)} pods AS p ON p.run_id = t.k",
            shares=q.shares,
        )
        q.reader.execute(items.adj_sql(recomputed, d, recomputed=True), q.params)
    # The catalog prices the rows read: of the runs' own slices and of the shares and recomputed work
    # added to them (the report prices what its aggregate pass saw: a superset of these).
    combos = q.reader.query(
        f"""SELECT DISTINCT p.zone, COALESCE(p.accelerator_type, :null_key), COALESCE(p.capacity, :null_key)
FROM cost_top_runs AS t {cross_join(d)} pods AS p {sd.indexed("pods_run", d)} ON p.run_id = t.k
UNION SELECT zone, atype, capacity FROM cost_item_adj""",
        q.params,
    )
    items.fill_prices(q.reader, [(str(z), str(t), str(c)) for z, t, c in combos], q.pricer.combo_prices)
    return items.run_records(q.reader.query(items.run_sql(d, ranked=True), {**q.params, "limit": -1}))


def _touched_changes_sql(d: Dialect) -> str:
    """The price changes (as JSON, like :price_changes) of the slices the runs in cost_top_runs created
    (pods_run) or ran on without creating them (their segments, to pods_norun)."""
    join, pod_id = cross_join(d), sd.json_int("j.value", 0, d)
    return f"""
SELECT {sd.json_array_agg("j.value", d)} FROM {sd.json_elements(":price_changes", "j", d)}
WHERE {pod_id} IN (
    SELECT p.id FROM cost_top_runs AS t {join} pods AS p {sd.indexed("pods_run", d)} ON p.run_id = t.k
    UNION
    SELECT p.id FROM cost_top_runs AS t {join} run_segments AS rs {sd.indexed("run_segments_run", d)}
        ON rs.run_id = t.k {join} pods AS p {sd.indexed("pods_norun", d)}
        ON p.zone = rs.zone AND p.name = rs.pod
    WHERE p.run_id IS NULL
)"""


def _rest(q: Query) -> None:
    """cost_rest as the aggregate pass fills it (``scan._billed_fast``'s first steps): the slices still
    open, cut by the window, or price-changed across midnight, whose stored figures are not their bill
    in the window, so their recomputed work is computed from their segments, as the report does."""
    d = q.reader.dialect
    q.reader.execute(fsql.rest_open(d), q.params)
    for cut in (q.params["since"], q.params["until"]):
        if cut > -1e17:  # no --since: nothing is cut at the start
            q.reader.execute(fsql.rest_cut(d), {"cut": cut})
    if q.changes:
        q.reader.execute(fsql.rest_changed(d), q.params)


#: Runs considered for each one shown by waste (candidates by their stored facts, ranked exactly after).
CANDIDATES_PER_RUN: Final = 5
#: USD per chip-hour assumed for time the ledger has no price for, when choosing candidates only: above
#: any list price, so such a run is considered rather than missed.
UNPRICED_GUESS_USD: Final = 100.0


def waste_candidates(q: Query, count: int) -> list[dict[str, Any]]:
    """The groups (exact figures: ``run_groups``) of the runs among which the ``count`` that wasted most
    (recomputed work and quota held) are, chosen from the slices' stored facts:
    the runs whose closed slices' recomputed work and held quota come to most (every window's slice
    counted whole: an overestimate), and every run whose recomputed work the stored facts do not hold
    (steps redone on a slice still open, or on one no run created)."""
    if count <= 0:
        return []
    d = q.reader.dialect
    params = {**q.params, "guess": UNPRICED_GUESS_USD}
    limit = int(count * CANDIDATES_PER_RUN)
    estimated = _stored_estimates(q, params, limit)
    if estimated is None:
        estimated = q.reader.query(_estimates_sql(d, limit), params)
    # A slice's recomputed work goes to the run that created it (``key_sql``), whichever run's segment
    # redid the steps: what the stored facts miss is that of slices still open (to their run, else the
    # segment's) and of slices no run created (to the segment's run). Both from their partial indexes to
    # the recomputing segments, rather than every recomputing segment to its slice's row.
    join, segments = sd.cross_join(d), f"run_segments AS rs {sd.indexed('run_segments_recomputed', d)}"
    recomputing = (
        "rs.steps_recomputed > 0 AND rs.started_at < :until AND COALESCE(rs.ended_at, :now) > :since"
    )
    unstored = q.reader.query(
        f"""SELECT COALESCE(p.run_id, rs.run_id) FROM pods AS p {sd.indexed("pods_open", d)}
{join} {segments} ON rs.zone = p.zone AND rs.pod = p.name
WHERE p.ended_at IS NULL AND {recomputing}
UNION
SELECT rs.run_id FROM {segments} {join} pods AS p {sd.indexed("pods_norun", d)}
    ON p.zone = rs.zone AND p.name = rs.pod
WHERE p.run_id IS NULL AND {recomputing}""",
        q.params,
    )
    candidates = [str(r[0]) for r in estimated] + sorted(str(r[0]) for r in unstored)
    return run_groups(q, candidates)


def _estimates_sql(d: Dialect, limit: int) -> str:
    """The ``limit`` runs whose slices' held quota and stored recomputed work in the window come to most
    (each slice counted whole), from the slices. The partial indexes of the preempted slices and of those
    that redid steps cover every column read (SQLite would otherwise walk every ended slice by the
    window's bound)."""
    return f"""SELECT run_id, SUM(w) AS w FROM (
    SELECT run_id, (COALESCE(deleted_at, :now) - ended_at) * chips * COALESCE(price_per_chip_hour, :guess)
           / 3600.0 AS w
    FROM pods {sd.indexed("pods_preempted", d)} WHERE end_reason = 'preempted' AND run_id IS NOT NULL
      AND ended_at < :until AND COALESCE(deleted_at, :now) > :since
    UNION ALL
    SELECT run_id, (rec_priced + rec_unpriced * :guess) / 3600.0 AS w
    FROM pods {sd.indexed("pods_rec", d)} WHERE (rec_priced != 0 OR rec_unpriced != 0) AND run_id IS NOT NULL
      AND ready_at < :until AND COALESCE(ended_at, :now) > :since
) AS c GROUP BY run_id ORDER BY w DESC, run_id LIMIT {limit}"""


def _stored_estimates(q: Query, params: dict[str, Any], limit: int) -> list[tuple[str, float]] | None:
    """``_estimates_sql``'s runs, from the ledger's waste by run (``run_waste``) where it holds the same
    sums: a window from the first slice (no --since) that every slice ended before. Its runs whose stored
    sums come to most, and those with quota still held (not deleted yet: the clock makes theirs), each
    with both, ranked; a run ranked in by its total is ranked at least as high by its stored sums alone,
    so the first ``limit`` are the slices' own. None where the table does not hold the window's sums."""
    d = q.reader.dialect
    if not items.run_sums_hold(q.reader, params):
        return None
    stored = "(w.held_usd_s + w.rec_priced + (w.held_unpriced_chip_s + w.rec_unpriced) * :guess) / 3600.0"
    held = f"""SELECT p.run_id, SUM((:now - p.ended_at) * p.chips * COALESCE(p.price_per_chip_hour, :guess))
       / 3600.0
FROM pods AS p {sd.indexed("pods_held", d)}
WHERE p.end_reason = 'preempted' AND p.deleted_at IS NULL AND p.run_id IS NOT NULL GROUP BY p.run_id"""
    live = {str(r): float(w or 0.0) for r, w in q.reader.query(held, params)}
    top = f"SELECT w.run_id, {stored} AS s FROM run_waste AS w ORDER BY s DESC, w.run_id LIMIT {limit}"
    totals = {str(r): float(s) for r, s in q.reader.query(top, params)}
    if live:
        ids = {**params, "ids": json.dumps(sorted(live))}
        among = sd.json_values(":ids", "TEXT", d)
        held_runs = f"SELECT w.run_id, {stored} FROM run_waste AS w WHERE w.run_id IN ({among})"
        totals.update({str(r): float(s) for r, s in q.reader.query(held_runs, ids)})
    for run_id, w in live.items():
        totals[run_id] = totals.get(run_id, 0.0) + w
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
