"""The groups of ``cost report --group-by slice`` and ``--group-by run``, computed in SQL.

Why a path of their own: one group per slice or per run is hundreds of thousands of groups on a big
ledger (230k slices, 158k runs for 1,000,000 events). Building each in Python (a line object, catalog
look-ups, ten roundings, a dict) took 16 s for the slices. Here the database computes every group's figures,
catalog prices included (``cost_prices``: the few zone x type x capacity combinations in the window),
and Python only zips the rows it gets into dicts. With a ``limit`` (the table's default) the groups are
first ranked on their cost alone, one cheap pass (for runs, over the few candidates whose bound on their
cost may put them among the costliest: ``run_bound_sql``), and the full figures computed and formatted
only for the ``limit`` shown. Totals, per-day figures and preemption counts are not computed here:
``CostService`` takes them from the aggregate fast path (the report as if grouped by nothing), so they are
the same figures every other grouping shows.

The figures are the reference path's (``CostService(fast=False)``, which the tests hold this to): a
slice is billed for its time in the window at its recorded price (a slice with no recorded price at the
catalog's), a slice whose price changed from its price pieces (``cost_item_pieces``, made from the few
``price_change`` events), quota held after preemption at its last price, recomputed work per segment
(``cost_item_adj``, made by ``sql_intervals``); a run's group sums the slices it created plus its
share of slices it ran on without creating them, taken from "(none)".
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Final, Protocol

from tpuctl.services.cost.model import FIGURES
from tpuctl.services.cost.scope import PRINCIPAL_OF_P, WORKSPACE_OF_P, scope_sql
from tpuctl.services.cost.sql_intervals import (
    billed_in_window,
    billed_s,
    changed_pods,
    first_days_sql,
    held_s,
    rolled_in_days_sql,
)
from tpuctl.store import cost_sql as sd
from tpuctl.store.billing import day_sql, free_preemption_sql, preemptible_sql
from tpuctl.store.cost_sql import TempTable
from tpuctl.store.sql import Dialect

_A_SPOT: Final = preemptible_sql("a")

SLICE_INFO: Final = (
    "name",
    "zone",
    "incarnation",
    "accelerator_type",
    "chips",
    "capacity",
    "state",
    "run_id",
    "ready_at",
    "ended_at",
    "end_reason",
    "deleted_at",
    "price_per_chip_hour",
    "labels",
    "workspace",
    "principal",
)
RUN_INFO: Final = ("status", "created_at", "ended_at", "restarts", "preemptions", "steps", "program")


class Reader(Protocol):
    @property
    def dialect(self) -> Dialect: ...

    def query(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]: ...

    def execute(self, sql: str, params: Mapping[str, Any]) -> None: ...

    def execute_many(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None: ...


# --- per-slice expressions (alias p: pods; x: its price pieces, LEFT JOINed) -------------------------


class _Slice:
    """A slice's (alias p) expressions on one engine."""

    def __init__(self, d: Dialect) -> None:
        self.d = d
        #: Billed in the window, and its billed seconds there (the aggregate paths' own expressions).
        self.billed = f"({billed_in_window(d)})"
        self.seconds = f"({billed_s(d)})"
        #: Quota a preempted slice held in the window (until deleted, or until now), in chip-seconds; else 0.
        held = f"({held_s(d)})"
        self.held_cs = f"""(CASE WHEN p.end_reason = 'preempted' AND p.chips IS NOT NULL AND {held} > 0
      THEN p.chips * {held} ELSE 0 END)"""
        #: Held quota in the window but not billed in it: such a slice still counts as a slice of its
        #: group. Found through the narrow partial index of preempted slices, not a scan of every pods row.
        self.held_only = f"p.end_reason = 'preempted' AND NOT {self.billed} AND {self.held_cs} > 0"
        self.preempted = f"pods AS p {sd.indexed('pods_preempted', d)}"
        #: Billed USD of a billed slice: its pieces if its price changed, else its time at its recorded
        #: price or, with none recorded, the catalog's (0 where neither has one). COALESCE evaluates the
        #: catalog look-up only for an unpriced slice. The same text ranks and reports, so a limit keeps
        #: exactly the costliest.
        self.usd = f"""((CASE WHEN x.id IS NOT NULL THEN x.priced + x.unpriced * COALESCE({OWN_PRICE_SQL}, 0)
       ELSE p.chips * {self.seconds} * COALESCE(p.price_per_chip_hour, {OWN_PRICE_SQL}, 0) END) / 3600.0)"""
        self.held_usd = f"({self.held_cs} * COALESCE(p.price_per_chip_hour, {OWN_PRICE_SQL}, 0) / 3600.0)"
        self.billed_or_held = f"({self.billed} OR (p.end_reason = 'preempted' AND {self.held_cs} > 0))"
        #: Per slice shown, what its figures are made of, each evaluated once: billed in the window (b),
        #: seconds in the window (s), chips, the price its time is billed at (price: recorded, else the
        #: catalog's, else 0), its price pieces' USD x 3600 if its price changed (xusd), the on-demand
        #: price its spot time compares with (odp, NULL if not spot or none known), held chip-seconds
        #: (hcs), recomputed USD.
        self.parts = f"""{self.billed} AS b, {self.seconds} AS s, p.chips AS chips,
       COALESCE(p.price_per_chip_hour, {OWN_PRICE_SQL}, 0) AS price,
       CASE WHEN x.id IS NOT NULL THEN x.priced + x.unpriced * COALESCE({OWN_PRICE_SQL}, 0) END AS xusd,
       CASE WHEN {_SPOT} THEN {OD_PRICE_SQL} END AS odp, {self.held_cs} AS hcs"""


@functools.cache
def _slice(d: Dialect) -> _Slice:
    return _Slice(d)


_SPOT: Final = preemptible_sql("p")
_PIECES_JOIN: Final = "LEFT JOIN cost_item_pieces AS x ON x.id = p.id"
#: A catalog price of the slice's combination (a primary-key look-up in a few dozen rows).
_CATALOG: Final = (
    "(SELECT c.{0} FROM cost_prices AS c WHERE c.zone = p.zone "
    "AND c.atype = COALESCE(p.accelerator_type, :null_key) AND c.capacity = COALESCE(p.capacity, :null_key))"
)
#: A slice's (alias p) catalog prices per chip-hour: its own capacity's, and on demand (cost_prices).
OWN_PRICE_SQL: Final = _CATALOG.format("own")
OD_PRICE_SQL: Final = _CATALOG.format("od")
#: A row of a rollup by combination (alias r) joined to its combination's catalog prices (c), and its
#: USD x 3600 (recorded; the time with none at the catalog's own price) and on-demand USD x 3600 (its
#: spot time at the on-demand price, where the catalog has one): such a row's slices were billed whole.
ROLLUP_PRICES: Final = (
    "LEFT JOIN cost_prices AS c ON c.zone = r.zone AND c.atype = r.accelerator_type "
    "AND c.capacity = r.capacity"
)
ROLLUP_USD_SQL: Final = "r.billed_usd_s + r.billed_unpriced_chip_s * COALESCE(c.own, 0)"
ROLLUP_OD_SQL: Final = (
    f"CASE WHEN {preemptible_sql('r')} AND c.od IS NOT NULL THEN r.billed_chip_s * c.od "
    f"ELSE {ROLLUP_USD_SQL} END"
)


def held_sql(d: Dialect) -> tuple[str, str, str]:
    """A slice's (alias p) quota held in the window: chip-seconds, USD, and whether it only held quota
    there (not billed: it still counts as a slice of its group)."""
    e = _slice(d)
    return e.held_cs, e.held_usd, e.held_only


def _own(kind: str) -> str:
    """Whether a slice counts as a slice of its group (``sql_scan.own_sql``): for runs, a slice no run created
    counts for "(none)" only when no run ran on it (those runs count it through their segments)."""
    if kind != "run":
        return "1"
    return (
        "(CASE WHEN p.run_id IS NOT NULL OR NOT EXISTS (SELECT 1 FROM run_segments AS rs "
        "WHERE rs.zone = p.zone AND rs.pod = p.name) THEN 1 ELSE 0 END)"
    )


def _slice_figures(kind: str, recomputed: str, d: Dialect) -> list[tuple[str, str]]:
    """(name, expression) of a slice p's figures (billed or holding quota in the window): slices, bs
    (seconds), cs (chip-seconds), usd, od (on-demand USD), sav, rec, hcs (held chip-seconds), husd."""
    e = _slice(d)
    od_usd = f"(p.chips * {e.seconds} * {OD_PRICE_SQL} / 3600.0)"
    spot_od = f"({_SPOT} AND {OD_PRICE_SQL} IS NOT NULL)"
    return [
        ("slices", _own(kind)),
        ("bs", f"CASE WHEN {e.billed} THEN {e.seconds} ELSE 0 END"),
        ("cs", f"CASE WHEN {e.billed} THEN p.chips * {e.seconds} ELSE 0 END"),
        ("usd", f"CASE WHEN {e.billed} THEN {e.usd} ELSE 0 END"),
        ("od", f"CASE WHEN NOT {e.billed} THEN 0 WHEN {spot_od} THEN {od_usd} ELSE {e.usd} END"),
        ("sav", f"CASE WHEN {e.billed} AND {spot_od} THEN {od_usd} - {e.usd} ELSE 0 END"),
        ("rec", recomputed),
        ("hcs", e.held_cs),
        ("husd", e.held_usd),
    ]


def _sums(figures: list[tuple[str, str]]) -> str:
    return ",\n       ".join(f"SUM({expr}) AS {name}" for name, expr in figures)


_NAMES: Final = "slices, bs, cs, usd, od, sav, rec, hcs, husd"


def _round(expr: str, d: Dialect) -> str:
    """``expr`` (columns: it is evaluated three times) to 6 decimals like ``billing.round_usd``, half away
    from zero.

    Integer arithmetic rather than ROUND(): SQLite's ROUND goes through printf (twice the cost of the
    rest of a figure) and disagreed with Python's round() on 47 of 241k bench values, this on none; the
    integer 0 it gives for a tiny negative is 0.0, not -0.0, as _r wants. Beyond 1e12 (no bill is) the
    product would overflow an integer: ROUND there (PostgreSQL rounds only exact numbers)."""
    x = f"({expr})"
    big = sd.round_exact(x, d)
    whole = sd.trunc_int(f"{x} * 1e6 + (CASE WHEN {x} < 0 THEN -0.5 ELSE 0.5 END)", d)
    return f"(CASE WHEN ABS({x}) < 1e12 THEN {whole} / 1e6 ELSE {big} END)"


def _rounded_figures(a: str, d: Dialect) -> str:
    return ", ".join(_rounded_figure_list(a, d))


def _rounded_figure_list(a: str, d: Dialect) -> list[str]:
    """``FIGURES``' expressions over a row of figures ``a``, each rounded as a group record's."""
    return [
        f"{a}.slices",
        _round(f"{a}.bs / 3600.0", d),
        _round(f"{a}.cs / 3600.0", d),
        _round(f"{a}.usd", d),
        _round(f"{a}.od", d),
        _round(f"{a}.sav", d),
        _round(f"{a}.rec", d),
        _round(f"{a}.hcs / 3600.0", d),
        _round(f"{a}.husd", d),
        _round(f"{a}.rec + {a}.husd", d),
    ]


@functools.cache
def slice_groups_sql(d: Dialect, key: str) -> str:
    """The slices in cost_top summed per ``key`` (an expression over the slice, alias p): each group the
    sum of its slices' rows as ``slice_sql`` gives them (rounded), in ``FIGURES`` order after the key."""
    figures = _figures_from_parts(_slice_parts(d), d)
    names = [f"x{i}" for i in range(len(FIGURES))]
    rounded = ", ".join(
        f"{expr} AS {name}" for expr, name in zip(_rounded_figure_list("f", d), names, strict=True)
    )
    sums = ", ".join(f"SUM(g.{name})" for name in names)
    return f"""
SELECT g.k, {sums} FROM (
    SELECT {key} AS k, {rounded}
    FROM ({figures}) AS f {sd.cross_join(d)} pods AS p ON p.id = f.id
) AS g GROUP BY g.k"""


# --- slices -------------------------------------------------------------------------------------------

_RANK_ORDER: Final = "ORDER BY ru DESC, ready_at IS NULL, ready_at, id"


def _ranked(candidates: str, d: Dialect, *, limited: bool) -> str:
    """cost_top's rows (id, rank) from ``candidates`` (id, ready_at, usd), the ``:limit`` costliest first
    when ``limited``."""
    cut = f"\n    {_RANK_ORDER} {sd.limit(':limit', d)}" if limited else ""
    return f"""SELECT id, ROW_NUMBER() OVER ({_RANK_ORDER}) FROM (
    SELECT id, ready_at, {_round("usd", d)} AS ru FROM (
{candidates}
    ) AS c{cut}
) AS ranked"""


def _all_candidates(d: Dialect, *, scoped: bool = False) -> str:
    """Every slice billed or holding quota in the window; ``scoped``: only those of the report's scope
    (``attributed.scope_sql``: some workspaces, one principal)."""
    e = _slice(d)
    scope = f" AND {scope_sql('p', d)}" if scoped else ""
    return f"""        SELECT p.id AS id, p.ready_at AS ready_at, {e.usd} AS usd
        FROM pods AS p {_PIECES_JOIN} WHERE {e.billed}{scope}
        UNION ALL
        SELECT p.id, p.ready_at, 0.0 FROM {e.preempted} WHERE {e.held_only}{scope}"""


@functools.cache
def slice_rank_sql(d: Dialect) -> str:
    """The ``:limit`` costliest slices (then by READY time and id), numbered, into cost_top."""
    return f"INSERT INTO cost_top (k, n)\n{_ranked(_all_candidates(d), d, limited=True)}"


def _closed_inside(d: Dialect) -> str:
    """A closed slice billed inside the window: its stored facts are its bill (pods_cost's columns)."""
    return f"""p.ended_at IS NOT NULL AND p.ready_at IS NOT NULL
      AND p.ready_at >= :since AND p.ended_at <= :until AND {_slice(d).billed}"""


@functools.cache
def slice_bar_sql(d: Dialect) -> str:
    """The ``:limit``-th highest stored USD (x 3600) of a closed slice inside the window, and how many
    were found: pods_cost walked from the top, so it reads ``:limit`` entries when the window holds the
    costliest slices (and at most the index when it holds none of them)."""
    return f"""
SELECT MIN(usd_s), COUNT(*) FROM (
    SELECT p.billed_usd_s AS usd_s FROM pods AS p {sd.indexed("pods_cost", d)}
    WHERE {_closed_inside(d)}
    ORDER BY p.billed_usd_s DESC {sd.limit(":limit", d)}
) AS top"""


#: How far below the bar (USD x 3600) candidates still count: two millionths of a dollar, so that float
#: noise between the stored facts and the ranking's own sum cannot keep a slice out.
BAR_MARGIN_USD_S: Final = 3600 * 2e-6


@functools.cache
def slice_rank_above_sql(d: Dialect) -> str:
    """slice_rank_sql over the only slices that can rank among the ``:limit`` costliest once ``:limit``
    closed slices cost at least ``:bar``: closed ones from the bar up (pods_cost), and those whose stored
    USD is not their bill: open or cut by the window (cost_rest, from the aggregate pass) or with unpriced
    time (pods_unpriced). Everything else costs less than ``:limit`` slices already found."""
    e = _slice(d)
    pods_cost = sd.indexed("pods_cost", d)
    candidates = f"""    SELECT p.id AS id, p.ready_at AS ready_at, {e.usd} AS usd
    FROM pods AS p {_PIECES_JOIN}
    WHERE p.id IN (
        SELECT p.id FROM pods AS p {pods_cost} WHERE {_closed_inside(d)} AND p.billed_usd_s >= :bar
        UNION SELECT id FROM cost_rest
        UNION SELECT id FROM pods {sd.indexed("pods_unpriced", d)} WHERE billed_unpriced_chip_s > 0
    ) AND {e.billed}"""
    return f"INSERT INTO cost_top (k, n)\n{_ranked(candidates, d, limited=True)}"


def _slice_parts(d: Dialect) -> str:
    return f"""
SELECT t.n AS n, p.id AS id, 1 AS own, {_slice(d).parts},
       COALESCE((SELECT r.rec FROM cost_item_rec AS r WHERE r.k = p.id), 0) AS rec
FROM cost_top AS t {sd.cross_join(d)} pods AS p ON p.id = t.k {_PIECES_JOIN}
{sd.fence(d)}"""


def _figures_from_parts(parts: str, d: Dialect, more: str = "") -> str:
    """The same figures as _slice_figures, from the parts' columns (USD x 3600 until the last division;
    ``own``: whether the slice counts as a slice of its group); ``more``: further columns, from q."""
    return f"""
SELECT q.n AS n, q.id AS id, q.own AS slices,
       CASE WHEN q.b THEN q.s ELSE 0 END AS bs,
       CASE WHEN q.b THEN q.chips * q.s ELSE 0 END AS cs,
       CASE WHEN q.b THEN COALESCE(q.xusd, q.chips * q.s * q.price) / 3600.0 ELSE 0 END AS usd,
       CASE WHEN NOT q.b THEN 0 WHEN q.odp IS NOT NULL THEN q.chips * q.s * q.odp / 3600.0
            ELSE COALESCE(q.xusd, q.chips * q.s * q.price) / 3600.0 END AS od,
       CASE WHEN q.b AND q.odp IS NOT NULL
            THEN q.chips * q.s * q.odp / 3600.0 - COALESCE(q.xusd, q.chips * q.s * q.price) / 3600.0
            ELSE 0 END AS sav,
       q.rec AS rec, q.hcs AS hcs, q.hcs * q.price / 3600.0 AS husd{more}
FROM ({parts}) AS q
{sd.fence(d)}"""


@functools.cache
def slice_rank_all_sql(d: Dialect, *, scoped: bool = False) -> str:
    """Every slice billed or holding quota in the window (of the report's scope when ``scoped``), numbered
    most expensive first, into cost_top (what the unlimited report lists, in that order)."""
    return f"INSERT INTO cost_top (k, n)\n{_ranked(_all_candidates(d, scoped=scoped), d, limited=False)}"


@functools.cache
def slice_all_sql(d: Dialect, *, scoped: bool = False) -> str:
    """``slice_rank_all_sql`` unnumbered (each numbered by its id, the table's key): for groups summed
    from the slices, which need no order (sorting every slice by cost was a third of such a report)."""
    candidates = _all_candidates(d, scoped=scoped)
    return f"INSERT INTO cost_top (k, n)\nSELECT c.id, c.id FROM (\n{candidates}\n) AS c"


@functools.cache
def slice_sql(d: Dialect) -> str:
    """The rows of the slices in cost_top (rank, key, facts, figures). Unordered: cost_top is scanned in
    rank order and the caller sorts by rank, which costs nothing on rows already in order, where an ORDER
    BY here would sort hundreds of thousands of wide rows.

    Each level is kept from being flattened into the next (``sql_dialect.fence``): flattening copies an
    expression into every use of it (the cost into the on-demand figure and the savings, the billed test
    into each figure...) and evaluates it that many times per slice."""
    figures = _figures_from_parts(_slice_parts(d), d)
    return f"""
SELECT f.n, p.zone || '/' || p.name || '#' || p.incarnation, p.name, p.zone, p.incarnation,
       p.accelerator_type, p.chips, p.capacity, p.state, p.run_id, {sd.iso("p.ready_at", d)},
       {sd.iso("p.ended_at", d)}, p.end_reason, {sd.iso("p.deleted_at", d)}, p.price_per_chip_hour,
       p.labels, {WORKSPACE_OF_P}, {PRINCIPAL_OF_P}, {_rounded_figures("f", d)}
FROM ({figures}) AS f {sd.cross_join(d)} pods AS p ON p.id = f.id"""


# --- runs ---------------------------------------------------------------------------------------------

#: Every run group's figures (``run_rank_sql``): one row per run on SQLite (an upsert adds to it); rows
#: appended and summed by key where read on PostgreSQL (``TempTable.summed_by_key``).
RUNS_TABLE: Final = TempTable(
    "cost_runs",
    "k TEXT, usd REAL, slices INT, cs REAL",
    primary_key="k",
    without_rowid=True,
    summed_by_key=True,
)

#: Priced rows of cost_item_adj (alias a): billed time moved between runs, and recomputed work.
_ADJ_USD: Final = "((a.priced + a.unpriced * COALESCE(c.own, 0)) / 3600.0)"
_ADJ_PRICES: Final = (
    "LEFT JOIN cost_prices AS c ON c.zone = a.zone AND c.atype = a.atype AND c.capacity = a.capacity"
)


def _run_upsert(d: Dialect) -> str:
    """Rows added to a run's row (SQLite's upsert), or appended and summed where read (PostgreSQL: one row
    per run inserted into a keyed table was a quarter of its report by run)."""
    return sd.add_to_rows(RUNS_TABLE, ("usd", "slices", "cs"), d)


@functools.cache
def none_sql(d: Dialect, *, shares: bool) -> tuple[str, ...]:
    """ "(none)": every figure of the slices no run created (ranking and reporting it read it from here),
    per first billed day into cost_none_days with the USD x 3600 of the whole-priced slices' first two days
    (``none_first_days``: the page's day cells), then summed into cost_none. ``shares``: whether some run
    may have a share of one (a slice a run ran on is not one of "(none)"'s slices): then every such slice
    is read one by one, through the covering pods_norun; else the ledger's rollup of them
    (``cost_rollup_norun``) gives those it holds for the window's whole days (``:d_lo``, ``:d_hi``), with
    their quota held apart, and only the others are read one by one."""
    e = _slice(d)
    day0, s0, s1 = first_days_sql(d)
    unrolled = "" if shares else f" AND NOT {rolled_in_days_sql(d)}"
    # Each slice's parts are evaluated once (as for the slices shown): summing the figures straight from
    # the expressions evaluated the billed test, the price look-ups and the window's seconds once each.
    parts = f"""
SELECT 0 AS n, p.id AS id, {_own("run") if shares else "1"} AS own, {e.parts}, 0 AS rec, {day0} AS day,
       CASE WHEN x.id IS NULL THEN {s0} ELSE 0 END AS s0, CASE WHEN x.id IS NULL THEN {s1} ELSE 0 END AS s1
FROM pods AS p {sd.indexed("pods_norun", d)} {_PIECES_JOIN}
WHERE p.run_id IS NULL AND {e.billed_or_held}{unrolled}
{sd.fence(d)}"""
    # A price-changed slice (its pieces, x) is cut at midnight with the others' later days (``keyed``).
    days = (",\n       q.day AS day, CASE WHEN q.b THEN q.chips * q.s0 * q.price ELSE 0 END AS d0,\n"
            "       CASE WHEN q.b THEN q.chips * q.s1 * q.price ELSE 0 END AS d1")  # fmt: skip
    names = _NAMES.split(", ")
    summed = ", ".join(f"SUM(f.{name})" for name in (*names, "d0", "d1"))
    one_by_one = f"""
INSERT INTO cost_none_days (day, n, {_NAMES}, d0, d1)
SELECT f.day, COUNT(*), {summed}
FROM ({_figures_from_parts(parts, d, days)}) AS f GROUP BY f.day"""
    total = f"""
INSERT INTO cost_none (n, {_NAMES})
SELECT COALESCE(SUM(n), 0), {", ".join(f"SUM({name})" for name in names)} FROM cost_none_days"""
    return (one_by_one, total) if shares else (*_none_rolled_sql(d), one_by_one, total)


def _none_rolled_sql(d: Dialect) -> tuple[str, str, str]:
    """ "(none)"'s slices the rollup holds for the window: per day from ``cost_rollup_norun``, priced per
    combination (such a slice's first day is all of it); the quota those of them preempted held (from the
    covering pods_preempted), in a row of no day; and, taken from their days, the price-changed ones'
    USD (the day split reads their pieces)."""
    e = _slice(d)
    usd, od = ROLLUP_USD_SQL, ROLLUP_OD_SQL
    rolled = rolled_in_days_sql(d)
    columns = f"INSERT INTO cost_none_days (day, n, {_NAMES}, d0, d1)"
    return (
        f"""{columns}
SELECT r.day, SUM(r.slices), SUM(r.slices), SUM(r.billed_s), SUM(r.billed_chip_s), SUM({usd}) / 3600.0,
       SUM({od}) / 3600.0, (SUM({od}) - SUM({usd})) / 3600.0, 0, 0, 0, SUM({usd}), 0
FROM cost_rollup_norun AS r {ROLLUP_PRICES}
WHERE r.day >= :d_lo AND r.day < :d_hi
GROUP BY r.day""",
        f"""{columns}
SELECT NULL, 0, 0, 0, 0, 0, 0, 0, 0, SUM(h.hcs), SUM(h.hcs * h.price) / 3600.0, 0, 0 FROM (
    SELECT {e.held_cs} AS hcs, COALESCE(p.price_per_chip_hour, {OWN_PRICE_SQL}, 0) AS price
    FROM {e.preempted} WHERE p.end_reason = 'preempted' AND p.run_id IS NULL AND {rolled}
    {sd.fence(d)}
) AS h WHERE h.hcs > 0""",
        f"""{columns}
SELECT {day_sql("p.ready_at", d)}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
       -SUM(x.priced + x.unpriced * COALESCE({OWN_PRICE_SQL}, 0)), 0
FROM cost_item_pieces AS x {sd.cross_join(d)} {changed_pods(d)} AS p ON p.id = x.id
WHERE p.run_id IS NULL AND {rolled}
GROUP BY 1""",
    )


def none_first_days(reader: Reader) -> list[tuple[int, float, float]]:
    """ "(none)"'s first two days per first billed day, as ``none_sql`` summed them: the day's number, and
    the USD x 3600 of that day and of the next."""
    rows = reader.query("SELECT day, d0, d1 FROM cost_none_days WHERE d0 != 0 OR d1 != 0", {})
    return [(int(day), float(d0), float(d1)) for day, d0, d1 in rows]


@functools.cache
def run_rank_sql(d: Dialect) -> tuple[str, ...]:
    """Every run group's cost (and what decides whether "(none)" is a group), into cost_runs, then the
    ``:limit`` costliest into cost_top_runs. The slices runs created are summed in run order straight off
    the covering pods_run index (no sort, no row look-ups); the rest is small."""
    return (
        *_run_costs_sql(d, f"pods AS p {sd.indexed('pods_run', d)}", held_only=True),
        _run_top_sql(d, "COUNT(*) OVER ()"),
    )


def _run_costs_sql(d: Dialect, source: str, *, held_only: bool) -> tuple[str, ...]:
    """The statements that fill cost_runs: the runs' own slices (alias p, read from ``source``: pods_run
    or through it), and with ``held_only`` the runs' slices that only held quota (they make a run a group
    that may cost nothing; counted per run before the upsert on PostgreSQL, whose upsert may not meet one
    key twice); "(none)"; what was moved between them (cost_item_adj, all of it)."""
    e = _slice(d)
    held = (
        f"SELECT p.run_id, 0.0, COUNT(*), 0.0 FROM {e.preempted} WHERE p.run_id IS NOT NULL AND {e.held_only}"
        " GROUP BY p.run_id"
        if sd.upsert_groups_first(d)
        else f"SELECT p.run_id, 0.0, 1, 0.0 FROM {e.preempted} WHERE p.run_id IS NOT NULL AND {e.held_only}"
    )
    held_rows = (
        (f"INSERT INTO cost_runs (k, usd, slices, cs)\n{held}\n{_run_upsert(d)}",) if held_only else ()
    )
    return (
        f"""INSERT INTO cost_runs (k, usd, slices, cs)
SELECT p.run_id, SUM({e.usd}), COUNT(*), SUM(p.chips * {e.seconds})
FROM {source} {_PIECES_JOIN}
WHERE p.run_id IS NOT NULL AND {e.billed}
GROUP BY p.run_id""",
        *held_rows,
        f"""INSERT INTO cost_runs (k, usd, slices, cs)
SELECT :null_key, usd, slices, cs FROM cost_none WHERE n > 0
{_run_upsert(d)}""",
        f"""INSERT INTO cost_runs (k, usd, slices, cs)
SELECT a.k, SUM({_ADJ_USD}), SUM(a.slices), SUM(a.cs) FROM cost_item_adj AS a {_ADJ_PRICES}
WHERE {sd.true(d)} GROUP BY a.k
{_run_upsert(d)}""",
    )


#: Of "(none)"'s rows: only the runs' shares were moved out of it, nothing is left (no group, as the
#: reference path says).
_NOTHING_LEFT: Final = "SUM(slices) = 0 AND ABS(SUM(cs)) < 3.6e-6"


def _run_top_sql(d: Dialect, groups: str) -> str:
    """cost_runs summed by run in one pass, the ``:limit`` costliest into cost_top_runs ("(none)" left
    out when nothing is left of it); ``groups`` (SQL) counts every group before the limit."""
    return f"""INSERT INTO cost_top_runs (k, n, groups)
SELECT k, ROW_NUMBER() OVER (ORDER BY ru DESC, key), groups FROM (
    SELECT k, ru, key, {groups} AS groups FROM (
        SELECT k, {_round("SUM(usd)", d)} AS ru, CASE WHEN k = :null_key THEN '(none)' ELSE k END AS key
        FROM cost_runs GROUP BY k
        HAVING NOT (k = :null_key AND {_NOTHING_LEFT})
    ) AS summed
    ORDER BY ru DESC, key {sd.limit(":limit", d)}
) AS ranked"""


# --- the costliest runs, from candidates ----------------------------------------------------------------

#: A slice (alias p) in the window with a known chip count: billed there, or a free preemption.
_IN_WINDOW: Final = "p.ready_at < :until AND COALESCE(p.ended_at, :now) > :since AND p.chips IS NOT NULL"


@functools.cache
def run_bound_sql(d: Dialect) -> str:
    """Each run's USD x 3600 at most in the window, ``:candidates`` runs, highest first: its slices' time
    in the window at their recorded price, or at ``:top_price`` (the highest catalog price of the window's
    combinations, ``cost_prices``) where none is recorded, free preemptions included. That is at least
    its cost unless a slice's price changed (its pieces may cost more) or it ran on slices it did not
    create (its shares add to it): ``run_candidates_sql`` ranks those runs whatever their bound. One
    pass over the covering pods_run with none of the exact figure's look-ups (price pieces, catalog)."""
    e = _slice(d)
    return f"""
SELECT p.run_id, SUM(p.chips * {e.seconds} * COALESCE(p.price_per_chip_hour, :top_price)) AS bound
FROM pods AS p {sd.indexed("pods_run", d)}
WHERE p.run_id IS NOT NULL AND {_IN_WINDOW}
GROUP BY p.run_id
ORDER BY bound DESC, p.run_id {sd.limit(":candidates", d)}"""


def run_sums_hold(reader: Reader, params: Mapping[str, Any]) -> bool:
    """Whether the ledger's sums by run (``run_waste``, ``run_closed_time``: over closed slices, each
    whole) are the window's: a window from the first slice (no --since) that every slice ended before."""
    if params["since"] > -1e17:
        return False
    ended = reader.query("SELECT MAX(ended_at) FROM pods WHERE ended_at IS NOT NULL", {})[0][0]
    return ended is None or float(ended) < float(params["until"])


def _open_run_slices(d: Dialect) -> str:
    """The slices runs created that are still open and in the window (alias p; few: pods_open)."""
    open_ = f"pods AS p {sd.indexed('pods_open', d)}"
    return f"{open_} WHERE p.ended_at IS NULL AND p.run_id IS NOT NULL AND {_IN_WINDOW}"


@functools.cache
def stored_run_bound_sql(d: Dialect) -> tuple[str, str, str]:
    """``run_bound_sql``'s bounds where ``run_sums_hold``, each run's from its row of ``run_closed_time``
    (its closed slices' time at their recorded price, or at ``:top_price``) and its open slices': the
    ``:candidates`` runs whose closed slices bound most; each run's open slices' bound; the closed
    slices' bound of the runs in the JSON array ``:ids``."""
    e = _slice(d)
    closed = "c.priced_usd_s + c.unpriced_chip_s * :top_price"
    return (
        f"SELECT c.run_id, {closed} AS bound FROM run_closed_time AS c ORDER BY bound DESC, c.run_id "
        f"{sd.limit(':candidates', d)}",
        f"SELECT p.run_id, SUM(p.chips * {e.seconds} * COALESCE(p.price_per_chip_hour, :top_price)) "
        f"FROM {_open_run_slices(d)} GROUP BY p.run_id",
        f"SELECT c.run_id, {closed} FROM run_closed_time AS c "
        f"WHERE c.run_id IN ({sd.json_values(':ids', 'TEXT', d)})",
    )


@functools.cache
def runs_in_window_sql(d: Dialect, *, stored: bool) -> str:
    """How many runs have a slice in the window (``run_groups_count_sql``'s ``:runs_in_window``): their
    distinct ids straight off the covering pods_run, in its order; ``stored`` (``run_sums_hold``): the
    runs ``run_closed_time`` holds a slice of, and those with only open slices there."""
    if not stored:
        return (
            f"SELECT COUNT(DISTINCT p.run_id) FROM pods AS p {sd.indexed('pods_run', d)} "
            f"WHERE p.run_id IS NOT NULL AND {_IN_WINDOW}"
        )
    return f"""
SELECT (SELECT COUNT(*) FROM run_closed_time WHERE slices > 0.5)
     + (SELECT COUNT(DISTINCT p.run_id) FROM {_open_run_slices(d)}
        AND NOT EXISTS (SELECT 1 FROM run_closed_time AS c WHERE c.run_id = p.run_id AND c.slices > 0.5))"""


@functools.cache
def run_candidates_sql(d: Dialect) -> str:
    """The runs ranked exactly, into cost_run_cands: those in the JSON array ``:bounded`` (the highest
    bounds), every run whose bound may be below its cost (a price-changed slice of its own, a share of a
    slice it did not create: ``cost_item_pieces`` and ``cost_item_adj`` hold both), and "(none)"."""
    return f"""
INSERT INTO cost_run_cands (k)
{sd.json_values(":bounded", "TEXT", d)}
UNION SELECT {sd.key_text("a.k", d)} FROM cost_item_adj AS a
UNION SELECT p.run_id FROM cost_item_pieces AS x {sd.cross_join(d)} {changed_pods(d)} AS p ON p.id = x.id
    WHERE p.run_id IS NOT NULL
UNION SELECT :null_key"""


@functools.cache
def run_rank_candidates_sql(d: Dialect) -> tuple[str, ...]:
    """``run_rank_sql`` over the runs in cost_run_cands only (every run "(none)" moved time to is one,
    as is "(none)"), with the count of every group given (``:groups``: ``run_groups_count_sql``). Not the
    runs that only held quota: they cost nothing, and the candidates decide only costs above nothing."""
    source = f"cost_run_cands AS t {sd.cross_join(d)} pods AS p {sd.indexed('pods_run', d)} ON p.run_id = t.k"
    return (*_run_costs_sql(d, source, held_only=False), _run_top_sql(d, ":groups"))


@functools.cache
def run_bar_sql(d: Dialect) -> str:
    """How many runs cost_top_runs ranked, and the least rounded cost among them."""
    return f"""
SELECT COUNT(*), MIN(r.ru) FROM cost_top_runs AS t {sd.cross_join(d)} (
    SELECT k, {_round("SUM(usd)", d)} AS ru FROM cost_runs GROUP BY k
) AS r ON r.k = t.k"""


@functools.cache
def run_groups_count_sql(d: Dialect) -> str:
    """How many run groups the report has, as ``run_rank_sql`` counts them: the runs with a slice billed
    in the window, that is with a slice there (``:runs_in_window``: ``runs_in_window_sql``) but for
    those whose only slices there are free preemptions (few: from the preempted slices' index); those
    that only held quota there or only got shares of slices they did not create (few); and "(none)"
    unless nothing is left of it."""
    e = _slice(d)
    free = f"p.end_reason = 'preempted' AND {_IN_WINDOW} AND {free_preemption_sql('p', d)}"
    billed = f"SELECT 1 FROM pods AS p {sd.indexed('pods_run', d)} WHERE p.run_id = o.k AND {e.billed}"
    # Both kinds of preempted slices from one pass over their index (two took twice its time).
    flags = f"CASE WHEN {free} THEN 1 ELSE 0 END AS f, CASE WHEN {e.held_only} THEN 1 ELSE 0 END AS h"
    return f"""
WITH pre AS (
    SELECT o.k, MAX(o.f) AS f, MAX(o.h) AS h FROM (
        SELECT p.run_id AS k, {flags} FROM {e.preempted}
        WHERE p.end_reason = 'preempted' AND p.run_id IS NOT NULL {sd.fence(d)}
    ) AS o WHERE o.f = 1 OR o.h = 1 GROUP BY o.k
)
SELECT :runs_in_window
     - (SELECT COUNT(*) FROM pre AS o WHERE o.f = 1 AND NOT EXISTS ({billed}))
     + (SELECT COUNT(*) FROM (
            SELECT k FROM pre WHERE h = 1
            UNION SELECT {sd.key_text("a.k", d)} FROM cost_item_adj AS a WHERE a.k != :null_key
        ) AS o WHERE NOT EXISTS ({billed}))
     + (SELECT CASE WHEN COUNT(*) > 0 AND NOT ({_NOTHING_LEFT}) THEN 1 ELSE 0 END
        FROM (SELECT slices, cs FROM cost_none WHERE n > 0
              UNION ALL SELECT slices, cs FROM cost_item_adj WHERE k = :null_key) AS z)"""


@functools.cache
def run_sql(d: Dialect, *, ranked: bool) -> str:
    """Run group rows (key, whether the run is in ``runs``, its facts, figures): those in cost_top_runs in its
    order (``ranked``), else every group, most expensive first, then by key ("(none)" for slices no run
    created, as the reference path names it)."""
    e = _slice(d)
    # a.slices: a run counts the slices it ran on without creating them with its share of their time.
    adj = f"""a.slices AS slices, a.bs AS bs, a.cs AS cs, {_ADJ_USD} AS usd,
       CASE WHEN {_A_SPOT} AND c.od IS NOT NULL THEN a.cs * c.od / 3600.0
            ELSE {_ADJ_USD} END AS od,
       CASE WHEN {_A_SPOT} AND c.od IS NOT NULL
            THEN a.cs * c.od / 3600.0 - {_ADJ_USD} ELSE 0 END AS sav,
       (a.rpriced + a.runpriced * COALESCE(c.own, 0)) / 3600.0 AS rec, 0 AS hcs, 0 AS husd"""
    # Ranked: from the few runs asked for to their slices (pods_run), not every run's slices to them.
    source = (
        f"cost_top_runs AS t {sd.cross_join(d)} pods AS p {sd.indexed('pods_run', d)} ON p.run_id = t.k"
        if ranked
        else f"pods AS p {sd.indexed('pods_run', d)}"
    )
    in_top = "AND EXISTS (SELECT 1 FROM cost_top_runs WHERE k = :null_key)" if ranked else ""
    adj_in_top = "WHERE a.k IN (SELECT k FROM cost_top_runs)" if ranked else ""
    items = f"""
    SELECT p.run_id AS k, {_sums(_slice_figures("run", "0", d))}
    FROM {source} {_PIECES_JOIN}
    WHERE p.run_id IS NOT NULL AND {e.billed_or_held}
    GROUP BY p.run_id
    UNION ALL
    SELECT :null_key, {_NAMES} FROM cost_none WHERE n > 0 {in_top}
    UNION ALL
    SELECT a.k, {adj} FROM cost_item_adj AS a {_ADJ_PRICES} {adj_in_top}"""
    having = "" if ranked else f"HAVING NOT (k = :null_key AND {_NOTHING_LEFT})"
    rank = "LEFT JOIN cost_top_runs AS t ON t.k = g.k" if ranked else ""
    order = "t.n" if ranked else f"{_round('g.usd', d)} DESC, g.key"
    return f"""
WITH g AS (
    SELECT k, CASE WHEN k = :null_key THEN '(none)' ELSE k END AS key, SUM(slices) AS slices, SUM(bs) AS bs,
           SUM(cs) AS cs, SUM(usd) AS usd, SUM(od) AS od, SUM(sav) AS sav, SUM(rec) AS rec,
           SUM(hcs) AS hcs, SUM(husd) AS husd
    FROM ({items}) AS i GROUP BY k
    {having}
)
SELECT g.key, r.run_id IS NOT NULL, r.status, {sd.iso("r.created_at", d)}, {sd.iso("r.ended_at", d)},
       r.restarts, r.preemptions, r.steps, r.script, {_rounded_figures("g", d)}
FROM g LEFT JOIN runs AS r ON r.run_id = g.key {rank}
ORDER BY {order}"""


# --- set-up -------------------------------------------------------------------------------------------

#: The working tables of the slice and run groups. SQLite's REAL is PostgreSQL's float8; its untyped ``k``
#: (a slice's id or a run's) is text there, as every group key is on PostgreSQL.
PREPARE: Final = (
    TempTable(
        "cost_prices", "zone TEXT, atype TEXT, capacity TEXT, own REAL, od REAL", "zone, atype, capacity"
    ),
    TempTable("cost_item_pieces", "id INT, priced REAL, unpriced REAL", primary_key="id"),
    TempTable(
        "cost_item_adj",
        "k KEY, zone TEXT, atype TEXT, capacity TEXT, slices INT DEFAULT 0, bs REAL DEFAULT 0, "
        "cs REAL DEFAULT 0, priced REAL DEFAULT 0, unpriced REAL DEFAULT 0, rpriced REAL DEFAULT 0, "
        "runpriced REAL DEFAULT 0",
    ),
    # Typed keys: an untyped key compared with an INTEGER id cannot use its index (a scan per slice).
    TempTable("cost_item_rec", "k INT, rec REAL", primary_key="k"),
    # By rank: scanned in rowid order, its slices come out most expensive first.
    TempTable("cost_top", "n INT, k INT", primary_key="n"),
    # ``groups``: how many run groups there are in all (the same on every row), for "N more".
    TempTable("cost_top_runs", "k TEXT, n INT, groups INT", primary_key="k", without_rowid=True),
    # The runs a limited report ranks exactly (``run_candidates_sql``).
    TempTable("cost_run_cands", "k TEXT", primary_key="k", without_rowid=True),
    RUNS_TABLE,
    TempTable(
        "cost_none",
        "n INT, slices WHOLE, bs NUM, cs NUM, usd NUM, od NUM, sav NUM, rec NUM, hcs NUM, husd NUM",
    ),
    TempTable(
        "cost_none_days",
        "day INT, n INT, slices WHOLE, bs NUM, cs NUM, usd NUM, od NUM, sav NUM, rec NUM, hcs NUM, husd NUM, "
        "d0 NUM, d1 NUM",
    ),
    # The price pieces a report needs (``item_report``), and the runs' shares of slices they did not
    # create (``sql_intervals.aggregate_sql``'s columns).
    TempTable("cost_all_pieces", "id INT, s NUM, e NUM, price NUM"),
    TempTable(
        "cost_seg",
        "k KEY, zone KEY, atype KEY, capacity KEY, slices WHOLE, s NUM, cs NUM, priced NUM, unpriced NUM",
    ),
)


#: The price pieces of every price-changed slice billed in the window (``cost_all_pieces``), summed per
#: slice: USD x 3600 and unpriced chip-seconds.
@functools.cache
def pieces_sql(d: Dialect) -> str:
    return f"""
INSERT INTO cost_item_pieces (id, priced, unpriced)
SELECT x.id, COALESCE(SUM(p.chips * (x.e - x.s) * x.price), 0),
       SUM(CASE WHEN x.price IS NULL THEN p.chips * (x.e - x.s) ELSE 0 END)
FROM cost_all_pieces AS x {sd.cross_join(d)} pods AS p ON p.id = x.id WHERE x.e > x.s GROUP BY x.id"""


def adj_sql(aggregate: str, d: Dialect, *, recomputed: bool, sign: str = "") -> str:
    """Rows of an interval aggregate (``sql_intervals.aggregate_sql``: k, zone, atype, capacity, slices, s,
    cs, priced, unpriced) into cost_item_adj: as recomputed work, or as billed time (``sign`` "-" takes it
    away from "(none)")."""
    columns = "rpriced, runpriced" if recomputed else "slices, bs, cs, priced, unpriced"
    # SUM over only unpriced time is NULL, not 0.
    sums = "COALESCE(a.priced, 0), COALESCE(a.unpriced, 0)"
    values = sums if recomputed else f"a.slices, a.s, a.cs, {sums}"
    if sign:
        values = "0, -a.s, -a.cs, -COALESCE(a.priced, 0), -COALESCE(a.unpriced, 0)"
    key = ":null_key" if sign else f"COALESCE({sd.key_text('a.k', d)}, :null_key)"
    return f"""
INSERT INTO cost_item_adj (k, zone, atype, capacity, {columns})
SELECT {key}, a.zone, COALESCE(a.atype, :null_key),
       COALESCE(a.capacity, :null_key), {values}
FROM ({aggregate}) AS a"""


@functools.cache
def rec_sql(d: Dialect) -> str:
    """Recomputed work per slice, priced (after cost_prices is filled); the run groups sum cost_item_adj."""
    key = sd.slice_id("a.k", d)
    return f"""
INSERT INTO cost_item_rec (k, rec)
SELECT {key}, SUM((a.rpriced + a.runpriced * COALESCE(c.own, 0)) / 3600.0)
FROM cost_item_adj AS a {_ADJ_PRICES}
WHERE a.rpriced != 0 OR a.runpriced != 0
GROUP BY a.k"""


def combos(reader: Reader) -> list[tuple[str, str, str]]:
    """The (zone, type, capacity) combinations the aggregate pass saw billed or holding quota."""
    rows = reader.query("SELECT DISTINCT zone, atype, capacity FROM cost_agg", {})
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


def fill_prices(
    reader: Reader,
    combos: Sequence[tuple[str, str, str]],
    prices: Callable[[str, str, str], tuple[float | None, float | None]],
) -> None:
    """``cost_prices`` for these combinations (a few dozen rows, in one go: on PostgreSQL one statement
    each was a round trip each)."""
    rows = []
    for zone, atype, capacity in combos:
        own, od = prices(zone, atype, capacity)
        rows.append({"zone": zone, "atype": atype, "capacity": capacity, "own": own, "od": od})
    reader.execute_many("INSERT INTO cost_prices VALUES (:zone, :atype, :capacity, :own, :od)", rows)


# --- rows -> records ----------------------------------------------------------------------------------


def slice_records(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Records from slice_sql rows, in rank order (their first column)."""
    rows.sort(key=itemgetter(0))  # already in order (cost_top's): a linear pass
    keys = ("key", *SLICE_INFO, *FIGURES)
    labels_at = keys.index("labels") + 1
    parsed: dict[str, dict[str, str]] = {}
    out = []
    for row in rows:
        record = dict(zip(keys, row[1:], strict=True))
        text = row[labels_at]
        if text not in parsed:
            parsed[text] = json.loads(text) if text else {}
        record["labels"] = dict(parsed[text])  # each record its own dict: callers may change one
        out.append(record)
    return out


def run_records(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    known = ("key", *RUN_INFO, *FIGURES)
    unknown = ("key", *FIGURES)
    # A run id on slices with no runs row (or "(none)") has no run facts, as in the reference path.
    return [
        dict(zip(known, (r[0], *r[2:]), strict=True))
        if r[1]
        else dict(zip(unknown, (r[0], *r[9:]), strict=True))
        for r in rows
    ]
