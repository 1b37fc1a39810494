"""Each UTC day's cost split by groupings the report's own scan does not split by: the dashboard's stacked
bars by workspace or user (with the report's groups from the same rows), and by run, slice or label (the
costliest groups shown, the rest as one "(other)" part).

The aggregate path's rollups are per day, zone, type, capacity and labels (``aggregate``), so a slice-fact
grouping splits in the report's own scan (``daily``); which run or slice a slice is, is not rolled up.

* **Workspace and user** (``keyed_report``): per (key, first billed day), each billed slice's time, USD
  (recorded price, else the catalog's, from ``cost_prices``) and on-demand USD, summed in SQL: the groups
  are the sums over the days, a day's cells the first days' shares. The slices closed within one UTC day
  of the window's whole days (most) come from the ledger's owner rollup (``cost_rollup_owner``: per day,
  workspace, principal, zone, type and capacity, kept by triggers); the others one by one, each set
  through its own index: those crossing midnight (the covering pods_crossing_owner; their days after the
  second midnight too), the open ones, those of the window's partial days, and the price-changed ones
  the rollup does not hold (their pieces). Then the quota held (the covering pods_preempted_owner) and
  the recomputed work (``recomputed_sql``, its stored figures off pods_rec_owner). The totals, per-day
  figures and counts are the aggregate path's, as for every grouping. The groups equal `cost report
  --group-by workspace|user`'s (``attributed``, which adds each slice's row rounded) to the rounding of
  their sums.
* **Many groups** (``top_day_cells``): the report's ``limit`` costliest groups (it ranks them; its totals
  and ``by_day`` cover all), each day's cells of those groups from their own slices (by index for runs
  and slices; a label's value needs every slice's labels), and each day's rest as ``OTHER_KEY``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any, Final

from tpuctl.services.cost import items
from tpuctl.services.cost.aggregate import Query
from tpuctl.services.cost.daily import DayCosts, day_costs
from tpuctl.services.cost.details import NONE_KEY, sorted_lines
from tpuctl.services.cost.item_report import ItemReport, prepared_totals
from tpuctl.services.cost.model import CostLine
from tpuctl.services.cost.scan import whole_days
from tpuctl.services.cost.scope import ATTRIBUTION_COLUMNS, owner_sql
from tpuctl.services.cost.sql_intervals import (
    ATTRS,
    IV_COLUMNS,
    SRC_CHANGED,
    UNCHANGED,
    aggregate_sql,
    billed_pod,
    change_ctes,
    changes_of_sql,
    day_split,
    first_days_sql,
    key_sql,
    recomputed_sql,
    rolled_in_days_sql,
    src_segment_runs,
)
from tpuctl.services.cost.subs import Sub, sub_rows, unnull
from tpuctl.services.cost.window import GroupBy
from tpuctl.store import cost_sql as sd
from tpuctl.store.billing import (
    DAY_S,
    crosses_midnight_sql,
    day_sql,
    midnight_after_sql,
    midnight_sql,
    multi_day_sql,
    preemptible_sql,
)
from tpuctl.store.shares_seen import shared_slice_sql
from tpuctl.store.sql import Dialect

#: The groupings ``keyed_report`` computes.
KEYED_KINDS: Final = ("workspace", "user")
#: The groupings ``top_day_cells`` splits (a group per run, slice or label value: thousands).
TOP_KINDS: Final = ("run", "slice", "label")
#: A slice's (alias p) group key, as ``items.slice_sql`` names it.
_SLICE_KEY: Final = "p.zone || '/' || p.name || '#' || p.incarnation"
#: The part of a day's bar that is not one of the groups shown.
OTHER_KEY: Final = "(other)"


def keyed_report(q: Query, group: GroupBy, *, with_days: bool = True) -> tuple[ItemReport, list[DayCosts]]:
    """The report's groups by workspace or user over every slice, and each day's USD split the same way
    (``with_days``: the report's own ``by_day`` too)."""
    if group.kind not in KEYED_KINDS:
        raise ValueError(f"not a grouping by whose the slices are: {group.name}")
    totals, by_day, counts, ctes = prepared_totals(q, with_days=with_days, item_pieces=False)
    d = q.reader.dialect
    by_key: dict[str, CostLine] = {}

    def lines(key: Any) -> CostLine:
        """The group of ``key`` (NULL as ``NONE_KEY``), made on first use."""
        name = NONE_KEY if key is None else str(key)
        if name not in by_key:
            by_key[name] = CostLine(name)
        return by_key[name]

    cells: dict[tuple[int, str], float] = defaultdict(float)
    params = {**q.params, **whole_days(q.params)}
    # Only the price-changed slices the owner rollup does not hold are read by piece.
    params = _changes_of(q, f"NOT {rolled_in_days_sql(d)}", params)
    for key, day, n, s, cs, usd_s, od_s, d0_s, d1_s in _billed_rows(q, group, params):
        found = lines(key)
        found.slices += int(n)
        found.billed_hours += s / 3600.0
        found.chip_hours += cs / 3600.0
        found.cost_usd += usd_s / 3600.0
        found.on_demand_usd += od_s / 3600.0
        found.spot_savings_usd += (od_s - usd_s) / 3600.0
        cells[(int(day), found.key)] += d0_s / 3600.0
        cells[(int(day) + 1, found.key)] += d1_s / 3600.0
    unrolled = change_ctes(d)  # those slices' pieces: a closed one's days need them too
    if q.changes:
        changed = _changed_source(sd.true(d))
        for sub in sub_rows(q.reader, aggregate_sql(changed, group, d, count=True, ctes=unrolled), params):
            found = lines(sub.key)
            q.pricer.add_billed(found, sub, q.warnings, sign=1.0)
            found.slices += sub.slices
        _add_days(q, cells, changed, group, unrolled, params)
    _add_days(q, cells, _later_days_source(sd.true(d), d), group, unrolled, params)
    for key, hcs, husd_s, held_only in q.reader.query(_held_sql(group, d), q.params):
        found = lines(key)
        found.quota_held_chip_hours += hcs / 3600.0
        found.quota_held_usd += husd_s / 3600.0
        found.slices += int(held_only)
    if q.segments:
        for key, usd_s in q.reader.query(_recomputed_sql(group, d, ctes), q.params):
            lines(key).recomputed_usd += usd_s / 3600.0
    out = sorted_lines(group, list(by_key.values()))
    for each in out:  # subtracting floats can leave -1e-13 where the truth is 0
        if abs(each.spot_savings_usd) < 1e-9:
            each.spot_savings_usd = 0.0
    report: ItemReport = ([each.to_dict() for each in out], len(out), by_day, counts, totals)
    return report, day_costs((_date(day), key, usd) for (day, key), usd in cells.items())


def top_day_cells(
    q: Query,
    group: GroupBy,
    keys: Sequence[str],
    by_day: Sequence[dict[str, Any]],
    *,
    none_first_days: Iterable[tuple[int, float, float]] | None = None,
) -> list[DayCosts]:
    """Each day's USD of the groups ``keys`` (the report's costliest, as it names them) and the rest of
    that day's ``by_day`` figure as ``OTHER_KEY``. ``none_first_days``: by run, "(none)"'s first two days
    per first billed day, as the report's own pass over its slices summed them (``items.none_sql``),
    rather than read again here."""
    d = q.reader.dialect
    cells: dict[tuple[int, str], float] = defaultdict(float)
    if group.kind in ("day", "total"):
        shown = [(day["day"], "total" if group.kind == "total" else day["day"], float(day["cost_usd"]))
                 for day in by_day]  # fmt: skip
        return day_costs(shown)
    if not q.reader.query("SELECT EXISTS (SELECT 1 FROM cost_prices)", {})[0][0]:
        # The slices' catalog prices (their time the ledger left unpriced): the slice and run groups
        # filled them; the aggregate groupings (a label) price per combination in Python.
        items.fill_prices(q.reader, items.combos(q.reader), q.pricer.combo_prices)
    named = [k for k in keys if k != NONE_KEY]
    params = {**q.params, "top_keys": json.dumps(named)}
    only = _only_sql(group, d, none=NONE_KEY in keys)
    # A run's slices and those no run created apart: each through its own index (pods_run, pods_norun),
    # where one condition with both would read every slice.
    scans = [(only, "pods AS p")]
    if group.kind == "run":
        scans = [(_only_sql(group, d, none=False), f"pods AS p {sd.indexed('pods_run', d)}")]
        if NONE_KEY in keys and none_first_days is None:
            scans.append(("p.run_id IS NULL", f"pods AS p {sd.indexed('pods_norun', d)}"))
    firsts = [row for part, source in scans
              for row in q.reader.query(_slices_sql(key_sql(group, "p", d), part, source, d, figures=False),
                                        params)]  # fmt: skip
    if group.kind == "run" and NONE_KEY in keys and none_first_days is not None:
        firsts += [(None, day, d0_s, d1_s) for day, d0_s, d1_s in none_first_days]
    for key, day, d0_s, d1_s in firsts:
        name = NONE_KEY if key is None else str(key)
        cells[(int(day), name)] += d0_s / 3600.0
        cells[(int(day) + 1, name)] += d1_s / 3600.0
    if q.changes:  # only the shown groups' slices are cut into pieces, not every changed one
        _add_days(q, cells, _changed_source(only), group, change_ctes(d), _changes_of(q, only, params))
    _add_days(q, cells, _later_days_source(only, d), group, change_ctes(d), params)
    if group.kind == "slice":  # the days come keyed by the slice's id, the groups by its name
        names = dict(q.reader.query(f"SELECT p.id, {_SLICE_KEY} FROM pods AS p WHERE {only}", params))
        cells = defaultdict(float, {(day, str(names[int(k)])): usd for (day, k), usd in cells.items()})
    if group.kind == "run" and q.shares:
        # A slice no run created is billed to the runs that ran on it, for the time they did; the rest of
        # its time stays with "(none)" (as the report's groups have it).
        wanted = set(named)
        shared = _changes_of(q, shared_slice_sql(d), q.params)
        for day, key, usd in _day_usd(q, src_segment_runs(d), group, change_ctes(d), shared):
            if key in wanted:
                cells[(day, key)] += usd
            if NONE_KEY in keys:
                cells[(day, NONE_KEY)] -= usd
    parts = [(_date(day), key, usd) for (day, key), usd in cells.items()]
    shown_by_day: dict[str, float] = defaultdict(float)
    for date, _key, usd in parts:
        shown_by_day[date] += usd
    for whole in by_day:
        rest = float(whole["cost_usd"]) - shown_by_day.get(whole["day"], 0.0)
        if rest > 5e-7:  # what the groups shown do not cover, to the rounding of the figures
            parts.append((whole["day"], OTHER_KEY, rest))
    return day_costs(parts)


def _billed_rows(q: Query, group: GroupBy, params: dict[str, Any]) -> Iterable[tuple[Any, ...]]:
    """Per (key, first billed day): slices, seconds, chip-seconds, USD x 3600, on-demand USD x 3600, and
    the first and second day's USD x 3600, of every billed slice whose price never changed and of the
    changed ones the owner rollup holds: the window's whole days from the rollup, the other slices one by
    one (``_unrolled_sql``)."""
    d = q.reader.dialect
    for sql in (_owner_rollup_sql(group, d), *_unrolled_sql(group, d)):
        yield from q.reader.query(sql, params)


@cache
def _unrolled_sql(group: GroupBy, d: Dialect) -> tuple[str, str]:
    """``_billed_rows``' passes over the slices the owner rollup does not hold, each set through its own
    index: the closed ones crossing midnight off pods_crossing_owner (which covers what the pass reads);
    the open ones, and the closed ones of the window's partial first and last days, by id."""
    key = key_sql(group, "p", d)
    crossing = f"p.ended_at IS NOT NULL AND p.ready_at IS NOT NULL AND {crosses_midnight_sql('p', d)}"
    crossing_source = f"pods AS p {sd.indexed('pods_crossing_owner', d)}"
    one_day = (
        f"SELECT id FROM pods {sd.indexed('pods_closed', d)} WHERE ended_at IS NOT NULL AND ready_at IS NOT "
        f"NULL AND NOT {crosses_midnight_sql('', d)} AND "
    )
    others = (
        "SELECT id FROM pods WHERE ended_at IS NULL"
        f" UNION ALL {one_day}ready_at < {midnight_sql(':d_lo', d)}"
        f" UNION ALL {one_day}ready_at >= {midnight_sql(':d_hi', d)}"
    )
    return (
        _slices_sql(key, crossing, crossing_source, d, figures=True),
        _slices_sql(key, f"p.id IN ({others})", "pods AS p", d, figures=True),
    )


@cache
def _recomputed_sql(group: GroupBy, d: Dialect, ctes: str) -> str:
    """Per key, the recomputed work's USD x 3600 (``recomputed_sql``'s rows per combination, the stored
    figures off pods_rec_owner), priced in SQL as the billed time is: thousands of rows by user."""
    rows = recomputed_sql(group, d, ctes, stored_from=f"pods AS p {sd.indexed('pods_rec_owner', d)}")
    return f"""
SELECT a.k, {sd.total("a.priced + a.unpriced * COALESCE(c.own, 0)", d)} FROM ({rows}) AS a
LEFT JOIN cost_prices AS c ON c.zone = a.zone AND c.atype = COALESCE(a.atype, :null_key)
     AND c.capacity = COALESCE(a.capacity, :null_key)
GROUP BY a.k"""


@cache
def _owner_rollup_sql(group: GroupBy, d: Dialect) -> str:
    """``_billed_rows``' figures of the slices the owner rollup (``cost_rollup_owner``) holds for the
    window's whole days, priced per combination in SQL (``cost_prices``: recorded USD, the catalog's own
    price for time with none, the on-demand price for spot time): such a slice's first day is all of it."""
    column = ATTRIBUTION_COLUMNS[group.kind][0]
    usd, od = items.ROLLUP_USD_SQL, items.ROLLUP_OD_SQL
    # Grouped in the rollup's key order (day, workspace, principal): streamed, where grouping by the key
    # computed would sort every row; a key's rows of one day may then come in several groups, which the
    # caller adds up.
    by = "r.day, r.workspace" + (", r.principal" if column == "principal" else "")
    return f"""
SELECT {owner_sql(group.kind, f"NULLIF(r.{column}, :null_key)")} AS k, r.day, SUM(r.slices), SUM(r.billed_s),
       SUM(r.billed_chip_s), {sd.total(usd, d)}, {sd.total(od, d)}, {sd.total(usd, d)}, 0.0
FROM cost_rollup_owner AS r {items.ROLLUP_PRICES}
WHERE r.day >= :d_lo AND r.day < :d_hi
GROUP BY {by}"""


def _changes_of(q: Query, slices: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with :price_changes only those of the slices ``slices`` picks (``changes_of_sql``)."""
    if not q.changes:
        return params
    changes = q.reader.query(changes_of_sql(slices, q.reader.dialect), params)[0][0] or "[]"
    return {**params, "price_changes": changes}


def _date(day: int) -> str:
    return datetime.fromtimestamp(day * DAY_S, UTC).date().isoformat()


def _add_days(
    q: Query,
    cells: dict[tuple[int, str], float],
    source: str,
    group: GroupBy,
    ctes: str,
    params: dict[str, Any] | None = None,
) -> None:
    for day, key, usd in _day_usd(q, source, group, ctes, q.params if params is None else params):
        cells[(day, key)] += usd


def _day_usd(
    q: Query, source: str, group: GroupBy, ctes: str, params: dict[str, Any]
) -> Iterable[tuple[int, str, float]]:
    """(day number, group key, USD) of an interval relation cut at UTC midnights."""
    for r in q.reader.query(_day_rows_sql(source, group, q.reader.dialect, ctes), params):
        sub = Sub(None, str(r[2]), unnull(r[3]), unnull(r[4]), 0, 0.0, 0.0, r[5], r[6])
        yield int(r[0]), NONE_KEY if r[1] is None else str(r[1]), q.pricer.usd(sub, q.warnings)


@cache
def _day_rows_sql(source: str, group: GroupBy, d: Dialect, ctes: str) -> str:
    """An interval relation (``IV_COLUMNS``) cut at UTC midnights, summed per (day, group key, zone, type,
    capacity): priced USD x 3600 and unpriced chip-seconds (the catalog prices them per combination)."""
    return f"""
WITH RECURSIVE {ctes},
src({IV_COLUMNS}) AS ({source}),
{day_split(d)}
SELECT {day_sql("iv.s", d)} AS day, {key_sql(group, "iv", d)} AS k, iv.zone, iv.atype, iv.capacity,
       {sd.total("iv.chips * (iv.e - iv.s) * iv.w * iv.price", d)},
       SUM(CASE WHEN iv.price IS NULL THEN iv.chips * (iv.e - iv.s) * iv.w ELSE 0 END)
FROM iv WHERE iv.e > iv.s
GROUP BY 1, 2, 3, 4, 5"""


def _window(d: Dialect) -> tuple[str, str]:
    """A slice's (alias p) billed interval in the window: its start and its end."""
    return d.greatest("p.ready_at", ":since"), d.least("COALESCE(p.ended_at, :now)", ":until")


@cache
def _slices_sql(key: str, only: str, source: str, d: Dialect, *, figures: bool) -> str:
    """The pass over the billed slices ``only`` picks (alias p, read from ``source``) whose price never
    changed: per (``key``, first billed day) the first day's and the second day's USD x 3600 (most slices
    end by then), and with ``figures`` before them the slices, seconds, chip-seconds, USD x 3600 and
    on-demand USD x 3600. Each slice's price and on-demand price are read once (the subquery is fenced:
    flattened, its columns would be evaluated once per use); GROUP BY, not an upsert: on SQLite the sort
    of a narrow key costs less."""
    b0, be = _window(d)
    day0, s0, s1 = first_days_sql(d)
    price = f"COALESCE(p.price_per_chip_hour, {items.OWN_PRICE_SQL}, 0)"
    # The on-demand price only where the figures need it (a look-up per spot slice).
    odp = (
        f",\n       CASE WHEN {preemptible_sql('p')} THEN {items.OD_PRICE_SQL} END AS odp" if figures else ""
    )
    slices = f"""
SELECT {key} AS k, {day0} AS day0, {be} - {b0} AS s, {s0} AS s0, {s1} AS s1, p.chips AS chips,
       {price} AS price{odp}
FROM {source}
WHERE {billed_pod(d)} AND {UNCHANGED} AND {only}
{sd.fence(d)}"""
    sums = (
        "COUNT(*), SUM(f.s), SUM(f.chips * f.s), SUM(f.chips * f.s * f.price), "
        "SUM(f.chips * f.s * COALESCE(f.odp, f.price)), "
        if figures
        else ""
    )
    return f"""
WITH RECURSIVE {change_ctes(d)}
SELECT f.k, f.day0, {sums}SUM(f.chips * f.s0 * f.price), SUM(f.chips * f.s1 * f.price)
FROM ({slices}) AS f
GROUP BY 1, 2"""


@cache
def _later_days_source(only: str, d: Dialect) -> str:
    """The billed time from the second midnight on of the slices ``only`` picks whose price never changed
    (the pass over the slices has their first two days): closed ones billed past a second midnight from
    their partial index pods_multiday (a few; a join to them read every slice on PostgreSQL, whose planner
    cannot tell how few), open ones from pods_open (a slice cut by the window crosses as much without the
    cut)."""
    b0, be = _window(d)
    later = f"{midnight_after_sql(b0, d)} + {DAY_S}.0"
    select = f"SELECT p.id, {later}, {be}, p.price_per_chip_hour, 1.0, NULL, {ATTRS}"
    rest = f"{billed_pod(d)} AND {UNCHANGED} AND {be} > {later} AND {only}"
    return f"""
{select} FROM pods AS p {sd.indexed("pods_multiday", d)} WHERE {multi_day_sql("p", d)} AND {rest}
UNION ALL
{select} FROM pods AS p {sd.indexed("pods_open", d)} WHERE p.ended_at IS NULL AND {rest}"""


def _changed_source(only: str) -> str:
    """The price pieces (``IV_COLUMNS``) of the price-changed slices ``only`` picks."""
    return f"{SRC_CHANGED} WHERE {only}"


@cache
def _held_sql(group: GroupBy, d: Dialect) -> str:
    """Per key: the quota preempted slices held in the window (chip-seconds, USD x 3600), and how many
    slices only held quota there (a group counts them, as ``items`` does)."""
    held_cs, _held_usd, held_only = items.held_sql(d)
    held = f"""
SELECT {key_sql(group, "p", d)} AS k, {held_cs} AS hcs,
       COALESCE(p.price_per_chip_hour, {items.OWN_PRICE_SQL}, 0) AS price,
       CASE WHEN {held_only} THEN 1 ELSE 0 END AS only_held
FROM pods AS p {sd.indexed("pods_preempted_owner", d)}
WHERE p.end_reason = 'preempted'
{sd.fence(d)}"""
    sums = "SUM(h.hcs), SUM(h.hcs * h.price), SUM(h.only_held)"
    return f"SELECT h.k, {sums} FROM ({held}) AS h WHERE h.hcs > 0 GROUP BY 1"


def _only_sql(group: GroupBy, d: Dialect, *, none: bool) -> str:
    """Whether a slice (alias p) is one of the groups in parameter ``:top_keys`` (``none``: or of
    "(none)")."""
    keys = sd.json_values(":top_keys", "TEXT", d)
    if group.kind == "slice":
        return f"({_SLICE_KEY} IN ({keys}))"
    column = "p.run_id" if group.kind == "run" else sd.label_value("p.labels", d)
    return f"({column} IN ({keys}){f' OR {column} IS NULL' if none else ''})"
