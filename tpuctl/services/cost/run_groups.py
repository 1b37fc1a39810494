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

from collections.abc import Sequence
from typing import Any

from tpuctl.services.cost import items
from tpuctl.services.cost import sql_fast as fsql
from tpuctl.services.cost.aggregate import Query
from tpuctl.services.cost.item_report import _prepare_pieces
from tpuctl.services.cost.sql_intervals import aggregate_sql, change_ctes, recomputed_sql, src_segment_runs
from tpuctl.services.cost.window import GroupBy
from tpuctl.store.cost_sql import cross_join, true

_RUN = GroupBy("run")


def run_groups(q: Query, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The group of each run in ``run_ids`` that has one (billed or holding quota in the window), in
    ``run_ids``' order."""
    wanted = list(dict.fromkeys(run_ids))
    if not wanted:
        return []
    d = q.reader.dialect
    combos = q.reader.query(
        "SELECT DISTINCT zone, COALESCE(accelerator_type, :null_key), COALESCE(capacity, :null_key) "
        "FROM pods",
        q.params,
    )
    items.fill_prices(q.reader, [(str(z), str(t), str(c)) for z, t, c in combos], q.pricer.combo_prices)
    ctes = _prepare_pieces(q) if q.changes else change_ctes(d)
    _rest(q)
    q.reader.execute_many(
        "INSERT INTO cost_top_runs (k, n, groups) VALUES (:k, :n, :groups)",
        [{"k": run_id, "n": n, "groups": len(wanted)} for n, run_id in enumerate(wanted)],
    )
    if q.segments:
        shares = aggregate_sql(src_segment_runs(d), _RUN, d, count=True, ctes=ctes)
        q.reader.execute(f"INSERT INTO cost_seg {shares}", q.params)
        q.reader.execute(items.adj_sql("SELECT * FROM cost_seg", d, recomputed=False), q.params)
        q.reader.execute(items.adj_sql("SELECT * FROM cost_seg", d, recomputed=False, sign="-"), q.params)
        recomputed = recomputed_sql(
            _RUN,
            d,
            ctes,
            only="COALESCE(p.run_id, rs.run_id) IN (SELECT k FROM cost_top_runs)",
            only_stored=true(d),
            stored_from=f"cost_top_runs AS t {cross_join(d)} pods AS p ON p.run_id = t.k",
        )
        q.reader.execute(items.adj_sql(recomputed, d, recomputed=True), q.params)
    return items.run_records(q.reader.query(items.run_sql(d, ranked=True), {**q.params, "limit": -1}))


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
