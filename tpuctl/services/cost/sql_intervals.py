"""The interval SQL both report paths share: a slice's billed interval in the window, the pieces of a
price-changed slice (one per price in force), run segments' shares of them (a run's share of a slice it did
not create, recomputed work), the split at UTC midnight, and their sums per group.

Every relation here has the columns ``IV_COLUMNS``; ``aggregate_sql`` sums one per (group key, zone, type,
capacity). The billing rules these apply come from ``tpuctl.store.billing``. Each statement is written
once, for the ``Dialect`` it is asked for (``sql_dialect``); each text is made once per dialect.
"""

from __future__ import annotations

import functools
from typing import Final

from tpuctl.services.cost.scope import ATTRIBUTION_COLUMNS, owner_sql
from tpuctl.services.cost.window import GroupBy
from tpuctl.store import cost_sql as sd
from tpuctl.store.billing import (
    DAY_S,
    END_KINDS_SQL,
    day_sql,
    first_day_sql,
    free_preemption_sql,
    midnight_after_sql,
    recompute_fraction_sql,
)
from tpuctl.store.cost_sql import TempTable
from tpuctl.store.schema import rolled_sql
from tpuctl.store.shares_seen import shared_slice_sql
from tpuctl.store.sql import Dialect

cache = functools.cache


@cache
def billed_in_window(d: Dialect) -> str:
    """Which incarnations (alias p) are billed in the window [:since, :until), :now being now: READY at
    some point, with a known chip count, and not a free preemption (``tpuctl.store.billing``)."""
    return f"""p.ready_at IS NOT NULL AND p.chips IS NOT NULL
      AND p.ready_at < :until AND COALESCE(p.ended_at, :now) > :since
      AND NOT {free_preemption_sql("p", d)}"""


#: The pods scans run in parallel over id ranges (one connection and thread each); a query over the whole
#: table binds the full range.
PART: Final = "p.id >= :lo AND p.id < :hi"


@cache
def billed_pod(d: Dialect) -> str:
    return f"{PART} AND {billed_in_window(d)}"


@cache
def billed_s(d: Dialect) -> str:
    """A billed incarnation's billed seconds in the window (from READY until its end, or until now)."""
    return f"{d.least('COALESCE(p.ended_at, :now)', ':until')} - {d.greatest('p.ready_at', ':since')}"


@cache
def held_s(d: Dialect) -> str:
    """A preempted incarnation's quota-holding time in the window (until deleted, or until now)."""
    return f"{d.least('COALESCE(p.deleted_at, :now)', ':until')} - {d.greatest('p.ended_at', ':since')}"


IN_WINDOW_PREEMPTION: Final = "(p.end_reason = 'preempted' AND p.ended_at >= :since AND p.ended_at < :until)"


#: The columns of a price-changed slice's row that the report's queries over such slices read.
_CHANGED_POD_COLUMNS: Final = (
    "id INT, zone TEXT, name TEXT, incarnation INT, run_id TEXT, labels TEXT, workspace TEXT, "
    "principal TEXT, accelerator_type TEXT, chips INT, capacity TEXT, price_per_chip_hour REAL, "
    "ready_at REAL, ended_at REAL, end_reason TEXT, deleted_at REAL, billed_s REAL, billed_chip_s REAL, "
    "billed_usd_s REAL, billed_unpriced_chip_s REAL, rec_priced REAL, rec_unpriced REAL, rolled INT"
)
#: The rows of the slices whose price changed (those of :price_changes), copied once per report on
#: PostgreSQL (``copy_changed_pods_sql``): the queries that cut them into pieces or pick some of them read
#: these few thousand rows (``changed_pods``), where each looked every one up in ``pods`` by primary key,
#: four index and table pages each there (0.02-0.03 s a query at 1,000,000 events, four queries a report).
#: Its statistics would cost as much again (0.018 s): the planner sizes it by its pages.
CHANGED_PODS: Final = TempTable("cost_changed_pods", _CHANGED_POD_COLUMNS, primary_key="id", statistics=False)


def changed_pods(d: Dialect) -> str:
    """Where the report's queries read the price-changed slices' rows (alias p, by id): their copy on
    PostgreSQL; ``pods`` itself on SQLite, whose table is its primary key's B-tree (a look-up there is one
    descent, and the copy cost more than the look-ups it saved: 0.02 s of a report)."""
    return CHANGED_PODS.name if sd.is_pg(d) else "pods"


@cache
def copy_changed_pods_sql(d: Dialect) -> str | None:
    """Fill ``CHANGED_PODS`` from :price_changes (every change the report knows) in the report's snapshot,
    on each connection that reads the price changes; None where ``changed_pods`` reads ``pods``."""
    if changed_pods(d) == "pods":
        return None
    columns = ", ".join(column.split()[0] for column in _CHANGED_POD_COLUMNS.split(", "))
    return (
        f"INSERT INTO {CHANGED_PODS.name} ({columns}) SELECT {columns} FROM pods "
        f"WHERE {sd.among('id', _changed_ids(d), d)}"
    )


@cache
def change_ctes(d: Dialect) -> str:
    """The few slices whose price changed while billed, cut into one piece per price (the log's
    ``price_change`` events through the small partial index events_price; the price in force at READY is
    the one on the last event recorded up to then)."""
    pod_id = sd.json_int("j.value", 0, d)
    return f"""
pc AS (
    -- The price_change events were read beforehand by a query of their own (which the planner answers
    -- from the small partial index events_price) and come in as JSON: inside a join the planner may
    -- prefer walking events_pod, i.e. most of the log. Joined to the slices' rows copied beforehand.
    SELECT {pod_id} AS pod_id, {sd.json_real("j.value", 1, d)} AS ts,
           {sd.json_id("j.value", 2, d)} AS id,
           {sd.json_real("j.value", 3, d)} AS price, p.ready_at,
           COALESCE(p.ended_at, :now) AS bill_end, p.price_per_chip_hour AS last_price
    FROM {sd.json_elements(":price_changes", "j", d)} {sd.cross_join(d)} {changed_pods(d)} AS p
         ON p.id = {pod_id}
    WHERE {billed_pod(d)}
),
changed AS (SELECT DISTINCT pod_id, ready_at, bill_end, last_price FROM pc),
marks AS (
    SELECT c.pod_id, c.ready_at AS t, 0 AS ord, c.bill_end AS be,
           COALESCE((SELECT e.price_per_chip_hour FROM events AS e
                     WHERE e.pod_id = c.pod_id AND e.ts <= c.ready_at AND e.price_per_chip_hour IS NOT NULL
                     ORDER BY e.ts DESC, e.id DESC LIMIT 1), c.last_price) AS price
    FROM changed AS c
    UNION ALL
    SELECT pod_id, ts, id, bill_end, price FROM pc WHERE ts > ready_at AND ts < bill_end
),
pieces AS (
    SELECT pod_id AS id, {d.greatest("t", ":since")} AS s,
           {d.least("COALESCE(LEAD(t) OVER (PARTITION BY pod_id ORDER BY t, ord), be)", ":until")} AS e, price
    FROM marks
)"""


#: Interval relations, all with these columns: (pod id, start, end, price, weight, run of a segment,
#: the slice's attributes).
IV_COLUMNS: Final = "id, s, e, price, w, run, zone, name, atype, capacity, chips, run_id, labels"
ATTRS: Final = "p.zone, p.name, p.accelerator_type, p.capacity, p.chips, p.run_id, p.labels"
UNCHANGED: Final = "p.id NOT IN (SELECT pod_id FROM changed)"


@cache
def rolled_in_days_sql(d: Dialect) -> str:
    """Whether the rollups hold the slice (alias p) for the window: rolled up (closed within its first UTC
    day), that day one of the window's whole days (``:d_lo``, ``:d_hi``: ``scan.whole_days``)."""
    day = first_day_sql("p", d)
    return f"({rolled_sql('p', d)} AND {day} >= :d_lo AND {day} < :d_hi)"


@cache
def first_days_sql(d: Dialect) -> tuple[str, str, str]:
    """A slice's (alias p) first billed UTC day in the window (its number), and its billed seconds on
    that day and on the next (most slices end by then; the rest is ``keyed``'s later days)."""
    b0, be = d.greatest("p.ready_at", ":since"), d.least("COALESCE(p.ended_at, :now)", ":until")
    after = midnight_after_sql(b0, d)
    second = d.greatest("0", f"{d.least(be, f'{after} + {DAY_S}.0')} - {after}")
    return day_sql(b0, d), f"{d.least(be, after)} - {b0}", second


def _billed_interval(d: Dialect) -> str:
    return f"{d.greatest('p.ready_at', ':since')}, {d.least('COALESCE(p.ended_at, :now)', ':until')}"


@cache
def src_billed(d: Dialect) -> str:
    return f"""
SELECT p.id, {_billed_interval(d)}, p.price_per_chip_hour, 1.0,
       NULL, {ATTRS}
FROM pods AS p WHERE {billed_pod(d)} AND {UNCHANGED}
UNION ALL
SELECT x.id, x.s, x.e, x.price, 1.0, NULL, {ATTRS} FROM pieces AS x JOIN pods AS p ON p.id = x.id"""


SRC_CHANGED: Final = (
    f"SELECT x.id, x.s, x.e, x.price, 1.0, NULL, {ATTRS} FROM pieces AS x JOIN pods AS p ON p.id = x.id"
)


@cache
def src_changed_whole(d: Dialect) -> str:
    """The same slices over their whole billed interval at their last price: what the pods scan counted
    for them, to take back before adding their pieces."""
    return f"""
SELECT p.id, {_billed_interval(d)}, p.price_per_chip_hour, 1.0,
       NULL, {ATTRS}
FROM changed AS c JOIN pods AS p ON p.id = c.pod_id"""


SRC_CHANGED_TEMP: Final = "SELECT * FROM cost_pieces"
SRC_CHANGED_WHOLE_TEMP: Final = "SELECT * FROM cost_whole"


@cache
def src_held(d: Dialect) -> str:
    return f"""
SELECT p.id, {d.greatest("p.ended_at", ":since")}, {d.least("COALESCE(p.deleted_at, :now)", ":until")}, \
p.price_per_chip_hour, 1.0,
       NULL, {ATTRS}
FROM pods AS p WHERE p.end_reason = 'preempted' AND p.chips IS NOT NULL"""


def segment_source(condition: str, weight: str, source: str, d: Dialect, *, unchanged_only: str = "") -> str:
    """Billed intervals cut to the run segments that ran on them (``source`` joins run_segments rs to pods
    p, in the order the condition's index makes cheap; price-changed slices through their pieces).
    ``unchanged_only``: a further condition on the slices whose price did not change."""

    def seg(s: str, e: str) -> str:
        return f"{d.greatest(s, 'rs.started_at')}, {d.least(e, 'COALESCE(rs.ended_at, :now)')}"

    whole = seg(d.greatest("p.ready_at", ":since"), d.least("COALESCE(p.ended_at, :now)", ":until"))
    return f"""
SELECT p.id, {whole},
       p.price_per_chip_hour, {weight}, rs.run_id, {ATTRS}
FROM {source}
WHERE {condition} AND {billed_pod(d)} AND {UNCHANGED} AND {unchanged_only or sd.true(d)}
UNION ALL
SELECT p.id, {seg("x.s", "x.e")}, x.price, {weight}, rs.run_id, {ATTRS}
FROM run_segments AS rs JOIN pods AS p ON p.name = rs.pod AND p.zone = rs.zone JOIN pieces AS x ON x.id = p.id
WHERE {condition}"""


@cache
def src_segment_runs(d: Dialect, *, top_runs: bool = False) -> str:
    """Billed time of slices no run created, attributed to the runs whose segments ran on them: from
    those slices (partial index pods_norun) to their segments (run_segments_pod), not from every segment;
    ``top_runs``: only the runs in cost_top_runs, from their segments (run_segments_run) to the slices."""
    join = sd.cross_join(d)
    if top_runs:
        return segment_source(
            "p.run_id IS NULL AND rs.run_id IN (SELECT k FROM cost_top_runs)",
            "1.0",
            f"cost_top_runs AS t {join} run_segments AS rs {sd.indexed('run_segments_run', d)} "
            f"ON rs.run_id = t.k {join} pods AS p {sd.indexed('pods_norun', d)} "
            "ON p.zone = rs.zone AND p.name = rs.pod",
            d,
        )
    return segment_source(
        "p.run_id IS NULL",
        "1.0",
        f"pods AS p {sd.indexed('pods_norun', d)} {join} run_segments AS rs "
        "ON rs.zone = p.zone AND rs.pod = p.name",
        d,
    )


@cache
def src_recomputed(d: Dialect) -> str:
    """The recomputed share of billed time, from the segments that recomputed steps (a partial index:
    most segments redo nothing, and a report should not read them all to find that out)."""
    return segment_source(
        "rs.steps_recomputed > 0",
        recompute_fraction_sql("rs", d),
        f"run_segments AS rs {sd.indexed('run_segments_recomputed', d)} {sd.cross_join(d)} pods AS p "
        "ON p.name = rs.pod AND p.zone = rs.zone",
        d,
    )


#: A slice (alias p) closed, billed wholly inside the window, and before now: what the ledger stored for
#: it is its bill (its billing facts) and its recomputed work (``pods.rec_*``, schema v7; an open segment's
#: time ends at now). For the recomputed work its price must not have changed either (the stored figure
#: is at its last price).
CLOSED_IN_WINDOW: Final = (
    "p.ended_at IS NOT NULL AND p.ready_at >= :since AND p.ended_at <= :until AND p.ended_at <= :now"
)


@cache
def recomputed_sql(
    group: GroupBy,
    d: Dialect,
    ctes: str | None = None,
    *,
    only: str = "",
    only_stored: str | None = None,
    stored_from: str | None = None,
    shares: bool = True,
) -> str:
    """The recomputed share of billed time per (group key, zone, type, capacity), in aggregate_sql's
    columns: the slices the ledger stored it for summed from ``pods_rec`` (one row per slice that redid
    work), the rest from their segments. Those are found from the slices, not from every recomputing
    segment: ``cost_rest`` (the aggregate pass's slices still open or cut by the window), slices that
    end after now (only a test clock has them), and the price-changed ones (through their pieces). Per
    day the stored figures are no use (a slice's segments may cross midnight): all from the segments.
    For runs the stored figure serves only slices a run created (the group is then the slice's run
    whatever segment ran on it); the others' segments name their run, so all slices no run created are
    computed too. ``ctes``: the price pieces (default ``change_ctes``); ``only``: a condition on the slice
    (alias p) and its segment (alias rs), ``only_stored`` the same on the slice alone (default: ``only``);
    ``stored_from``: where the stored figures are read from (default ``pods_rec``; a few given slices:
    from their list). ``shares``: False where no run's segment is on a slice no run created (``Query``'s
    ``shares``), so that no such slice has recomputing segments to compute (by run: a pass of 13 ms on
    PostgreSQL at 1,000,000 events over every such slice and recomputing segment, finding none)."""
    ctes = change_ctes(d) if ctes is None else ctes
    only = only or sd.true(d)
    if stored_from is None:
        stored_from = f"pods AS p {sd.indexed('pods_rec', d)}"
    if group.kind == "day":
        return aggregate_sql(src_recomputed(d), group, d, ctes=ctes)
    stored = CLOSED_IN_WINDOW + (" AND p.run_id IS NOT NULL" if group.kind == "run" else "")
    join = sd.cross_join(d)
    rest = (
        f"SELECT id FROM cost_rest UNION SELECT id FROM pods {sd.indexed('pods_ended', d)} "
        "WHERE ended_at > :now"
    )
    if group.kind == "run" and shares:
        # From the recomputing segments to the covering pods_norun: few rows fetched, not every slice
        # no run created.
        rest += (
            f" UNION SELECT p.id FROM run_segments AS rs {sd.indexed('run_segments_recomputed', d)}"
            f" {join} pods AS p {sd.indexed('pods_norun', d)} ON p.zone = rs.zone AND p.name = rs.pod"
            " WHERE rs.steps_recomputed > 0 AND p.run_id IS NULL"
        )
    computed = segment_source(
        f"rs.steps_recomputed > 0 AND {only}",
        recompute_fraction_sql("rs", d),
        f"({rest}) AS r {join} pods AS p ON p.id = r.id {join} run_segments AS rs "
        f"{sd.indexed('run_segments_recomputed', d)} ON rs.zone = p.zone AND rs.pod = p.name",
        d,
        unchanged_only=f"NOT ({stored})",
    )
    # In pods_rec's order (zone, type, capacity: no sort) where the key is one of those or none; in
    # pods_rec_owner's (owner first) where it is whose the slice is (a key's rows may then come in several
    # groups, which the reader adds up).
    stored_groups = "1, 2, 3, 4"
    if group.kind in ("zone", "region", "type", "capacity", "total"):
        stored_groups = "p.zone, p.accelerator_type, p.capacity"
    elif group.kind in ATTRIBUTION_COLUMNS:
        stored_groups = "p.workspace, p.principal, p.zone, p.accelerator_type, p.capacity"
    return f"""{aggregate_sql(computed, group, d, ctes=ctes)}
UNION ALL
SELECT {key_sql(group, "p", d)} AS k, p.zone AS zone, p.accelerator_type AS atype, p.capacity AS capacity,
       0 AS slices, 0.0 AS s, 0.0 AS cs, {sd.total("p.rec_priced", d)} AS priced, \
{sd.total("p.rec_unpriced", d)} AS unpriced
FROM {stored_from}
WHERE (p.rec_priced != 0 OR p.rec_unpriced != 0) AND {stored} AND {UNCHANGED}
      AND {only if only_stored is None else only_stored}
GROUP BY {stored_groups}"""


@cache
def day_split(d: Dialect) -> str:
    """UTC days: the first day of every interval comes straight out; only intervals that cross midnight
    recurse for the days after."""
    return f"""
days({IV_COLUMNS}, pe) AS (
    SELECT id, s, {d.least("e", midnight_after_sql("s", d))}, price, w, run, zone, \
name, atype,
           capacity, chips, run_id, labels, e
    FROM src
    UNION ALL
    SELECT id, e, {d.least("pe", f"e + {DAY_S}.0")}, price, w, run, zone, name, atype, capacity, chips, \
run_id, labels,
           pe
    FROM days WHERE e < pe
),
iv AS (SELECT {IV_COLUMNS} FROM days)"""


@cache
def key_sql(group: GroupBy, alias: str, d: Dialect) -> str:
    a = alias
    if group.kind == "label":
        return sd.label_value(f"{a}.labels", d)
    if group.kind in ATTRIBUTION_COLUMNS:
        # Whose a slice is, NULL (a row from before workspaces) read as reports show it. An interval
        # relation (iv) carries no such column: its slice's, by primary key (few rows read it so).
        column = ATTRIBUTION_COLUMNS[group.kind][0]
        owner = f"{a}.{column}" if a != "iv" else f"(SELECT w.{column} FROM pods AS w WHERE w.id = iv.id)"
        return owner_sql(group.kind, owner)
    return {
        "slice": f"{a}.id",
        "run": f"COALESCE({a}.run_id, {a}.run)" if a == "iv" else f"{a}.run_id",
        "zone": f"{a}.zone",
        "region": f"{a}.zone",  # mapped to the region in Python (SQLite has no rsplit)
        "type": f"{a}.{'atype' if a == 'iv' else 'accelerator_type'}",
        "capacity": f"{a}.capacity",
        "day": day_sql(f"{a}.s", d),  # the UTC day number; a date in Python
        "total": "NULL",
    }[group.kind]


@cache
def price_changes_sql(d: Dialect) -> str:
    """The price changes in force: each one recorded while its slice was open. One recorded after the
    slice ended (events out of order) changed nothing: the ledger's view ignores it when it bills the
    slice (``tpuctl.store.view``), and so do both report paths, whichever way the slice is summed."""
    return f"""
SELECT e.pod_id, e.ts, e.id, e.price_per_chip_hour FROM events AS e {sd.indexed("events_price_facts", d)}
WHERE e.kind = 'price_change'
  AND NOT EXISTS (SELECT 1 FROM events AS x {sd.indexed("events_end", d)}
                  WHERE x.pod_id = e.pod_id AND x.id < e.id AND x.kind IN {END_KINDS_SQL})"""


@cache
def changes_of_sql(slices: str, d: Dialect) -> str:
    """The price changes (as JSON, like :price_changes) of the slices ``slices`` picks (a condition on the
    slice, alias p): with them as :price_changes, ``change_ctes`` cuts only those slices into pieces and
    ``UNCHANGED`` still keeps out every changed slice a source reads if ``slices`` picks all it reads. The
    slices' rows are looked up by id (``changed_pods``), where the pieces of every changed slice read the
    log per slice."""
    pod_id = sd.json_int("j.value", 0, d)
    return f"""
SELECT {sd.json_array_agg("j.value", d)} FROM {sd.json_elements(":price_changes", "j", d)}
WHERE EXISTS (SELECT 1 FROM {changed_pods(d)} AS p WHERE p.id = {pod_id} AND {slices})"""


def _changed_ids(d: Dialect) -> str:
    return f"SELECT {sd.json_int('j.value', 0, d)} FROM {sd.json_elements(':price_changes', 'j', d)}"


@cache
def recomputing_changes_sql(d: Dialect) -> str:
    """The price changes (as JSON, like :price_changes) of the slices some segment redid steps on: all that
    ``recomputed_sql`` reads of them (its pieces, and ``changed`` to keep them out of the other sources,
    each of which is joined to the recomputing segments or holds only slices that have some)."""
    return changes_of_sql(_redid_steps_sql(d), d)


@cache
def pieces_needed_sql(d: Dialect) -> str:
    """The price changes (as JSON, like :price_changes) of the slices whose pieces a per-slice or per-run
    report needs: not billed wholly inside the window, or with segments whose share is priced by piece."""
    return changes_of_sql(f"(NOT ({CLOSED_IN_WINDOW}) OR {_redid_steps_sql(d)} OR {shared_slice_sql(d)})", d)


def _redid_steps_sql(d: Dialect) -> str:
    """Whether some segment redid steps on the slice (alias p): from the partial index of such segments."""
    return (
        f"EXISTS (SELECT 1 FROM run_segments AS rs {sd.indexed('run_segments_recomputed', d)} "
        "WHERE rs.zone = p.zone AND rs.pod = p.name AND rs.steps_recomputed > 0)"
    )


@cache
def shares_exist_sql(d: Dialect) -> str:
    """Whether some slice no run created has a segment on it: a look-up per such slice (the covering
    pods_norun) when none has, as much as one pass over their shares costs."""
    norun = f"pods AS p {sd.indexed('pods_norun', d)}"
    return f"SELECT EXISTS (SELECT 1 FROM {norun} WHERE {shared_slice_sql(d)})"


@cache
def stored_pieces_sql(d: Dialect) -> str:
    """The other price-changed slices billed in the window, into cost_item_pieces from their stored facts
    (USD x 3600 at each price in force, and chip-seconds with no price)."""
    return sd.insert_ignore(
        "cost_item_pieces (id, priced, unpriced)",
        f"""
SELECT p.id, p.billed_usd_s, p.billed_unpriced_chip_s FROM {changed_pods(d)} AS p
WHERE p.id IN ({_changed_ids(d)}) AND {CLOSED_IN_WINDOW} AND {billed_pod(d)}""",
        d,
    )


#: change_ctes's ``changed`` and ``pieces`` read back from ``cost_all_pieces``, where a report that
#: needs them in several queries computed them once (only the slices that need pieces: see
#: pieces_needed_sql; the segment queries, the only readers of ``changed``, meet no other).
STORED_CHANGE_CTES: Final = """
changed AS (SELECT DISTINCT id AS pod_id FROM cost_all_pieces),
pieces AS (SELECT id, s, e, price FROM cost_all_pieces)"""


@cache
def aggregate_sql(
    source: str, group: GroupBy, d: Dialect, *, count: bool = False, ctes: str | None = None
) -> str:
    """Sum an interval relation per (group key, zone, type, capacity); ``count``: distinct slices too."""
    ctes = change_ctes(d) if ctes is None else ctes
    split = day_split(d) if group.kind == "day" else "iv AS (SELECT * FROM src)"
    return f"""
WITH RECURSIVE {ctes},
src({IV_COLUMNS}) AS ({source}),
{split}
SELECT {key_sql(group, "iv", d)} AS k, iv.zone AS zone, iv.atype AS atype, iv.capacity AS capacity,
       {"COUNT(DISTINCT iv.id)" if count else "0"} AS slices,
       SUM((iv.e - iv.s) * iv.w) AS s,
       SUM(iv.chips * (iv.e - iv.s) * iv.w) AS cs,
       SUM(iv.chips * (iv.e - iv.s) * iv.w * iv.price) AS priced,
       SUM(CASE WHEN iv.price IS NULL THEN iv.chips * (iv.e - iv.s) * iv.w ELSE 0 END) AS unpriced
FROM iv
WHERE iv.e > iv.s
GROUP BY 1, 2, 3, 4"""
