"""The interval SQL both report paths share: a slice's billed interval in the window, the pieces of a
price-changed slice (one per price in force), run segments' shares of them (a run's share of a slice it did
not create, recomputed work), the split at UTC midnight, and their sums per group.

Every relation here has the columns ``IV_COLUMNS``; ``aggregate_sql`` sums one per (group key, zone, type,
capacity). The billing rules these apply come from ``tpuctl.store.billing``.
"""

from __future__ import annotations

from typing import Final

from tpuctl.services.cost.window import GroupBy
from tpuctl.store.billing import (
    DAY_S,
    END_KINDS_SQL,
    day_sql,
    free_preemption_sql,
    midnight_after_sql,
    recompute_fraction_sql,
)

#: Which incarnations (alias p) are billed in the window [:since, :until), :now being now: READY at
#: some point, with a known chip count, and not a free preemption (``tpuctl.store.billing``).
BILLED_IN_WINDOW: Final = f"""p.ready_at IS NOT NULL AND p.chips IS NOT NULL
      AND p.ready_at < :until AND COALESCE(p.ended_at, :now) > :since
      AND NOT {free_preemption_sql("p")}"""
#: The pods scans run in parallel over id ranges (one connection and thread each); a query over the whole
#: table binds the full range.
PART: Final = "p.id >= :lo AND p.id < :hi"
BILLED_POD: Final = f"{PART} AND {BILLED_IN_WINDOW}"
#: A billed incarnation's billed seconds in the window (from READY until its end, or until now).
BILLED_S: Final = "MIN(COALESCE(p.ended_at, :now), :until) - MAX(p.ready_at, :since)"
#: A preempted incarnation's quota-holding time in the window (until deleted, or until now).
HELD_S: Final = "MIN(COALESCE(p.deleted_at, :now), :until) - MAX(p.ended_at, :since)"
IN_WINDOW_PREEMPTION: Final = "(p.end_reason = 'preempted' AND p.ended_at >= :since AND p.ended_at < :until)"

#: The few slices whose price changed while billed, cut into one piece per price (the log's
#: ``price_change`` events through the small partial index events_price; the price in force at READY is
#: the one on the last event recorded up to then).
CHANGE_CTES: Final = f"""
pc AS (
    -- The price_change events were read beforehand by a query of their own (which the planner answers
    -- from the small partial index events_price) and come in as JSON: inside a join the planner may
    -- prefer walking events_pod, i.e. most of the log. Joined to pods by primary key.
    SELECT CAST(json_extract(j.value, '$[0]') AS INTEGER) AS pod_id, json_extract(j.value, '$[1]') AS ts,
           json_extract(j.value, '$[2]') AS id, json_extract(j.value, '$[3]') AS price, p.ready_at,
           COALESCE(p.ended_at, :now) AS bill_end, p.price_per_chip_hour AS last_price
    FROM json_each(:price_changes) AS j CROSS JOIN pods AS p
         ON p.id = CAST(json_extract(j.value, '$[0]') AS INTEGER)
    WHERE {BILLED_POD}
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
    SELECT pod_id AS id, MAX(t, :since) AS s,
           MIN(COALESCE(LEAD(t) OVER (PARTITION BY pod_id ORDER BY t, ord), be), :until) AS e, price
    FROM marks
)"""

#: Interval relations, all with these columns: (pod id, start, end, price, weight, run of a segment,
#: the slice's attributes).
IV_COLUMNS: Final = "id, s, e, price, w, run, zone, name, atype, capacity, chips, run_id, labels"
ATTRS: Final = "p.zone, p.name, p.accelerator_type, p.capacity, p.chips, p.run_id, p.labels"
UNCHANGED: Final = "p.id NOT IN (SELECT pod_id FROM changed)"
SRC_BILLED: Final = f"""
SELECT p.id, MAX(p.ready_at, :since), MIN(COALESCE(p.ended_at, :now), :until), p.price_per_chip_hour, 1.0,
       NULL, {ATTRS}
FROM pods AS p WHERE {BILLED_POD} AND {UNCHANGED}
UNION ALL
SELECT x.id, x.s, x.e, x.price, 1.0, NULL, {ATTRS} FROM pieces AS x JOIN pods AS p ON p.id = x.id"""
SRC_CHANGED: Final = (
    f"SELECT x.id, x.s, x.e, x.price, 1.0, NULL, {ATTRS} FROM pieces AS x JOIN pods AS p ON p.id = x.id"
)
#: The same slices over their whole billed interval at their last price: what the pods scan counted
#: for them, to take back before adding their pieces.
SRC_CHANGED_WHOLE: Final = f"""
SELECT p.id, MAX(p.ready_at, :since), MIN(COALESCE(p.ended_at, :now), :until), p.price_per_chip_hour, 1.0,
       NULL, {ATTRS}
FROM changed AS c JOIN pods AS p ON p.id = c.pod_id"""
SRC_CHANGED_TEMP: Final = "SELECT * FROM cost_pieces"
SRC_CHANGED_WHOLE_TEMP: Final = "SELECT * FROM cost_whole"
SRC_HELD: Final = f"""
SELECT p.id, MAX(p.ended_at, :since), MIN(COALESCE(p.deleted_at, :now), :until), p.price_per_chip_hour, 1.0,
       NULL, {ATTRS}
FROM pods AS p WHERE p.end_reason = 'preempted' AND p.chips IS NOT NULL"""


def segment_source(condition: str, weight: str, source: str, *, unchanged_only: str = "1") -> str:
    """Billed intervals cut to the run segments that ran on them (``source`` joins run_segments rs to pods
    p, in the order the condition's index makes cheap; price-changed slices through their pieces).
    ``unchanged_only``: a further condition on the slices whose price did not change."""
    seg = "MAX({s}, rs.started_at), MIN({e}, COALESCE(rs.ended_at, :now))"
    return f"""
SELECT p.id, {seg.format(s="MAX(p.ready_at, :since)", e="MIN(COALESCE(p.ended_at, :now), :until)")},
       p.price_per_chip_hour, {weight}, rs.run_id, {ATTRS}
FROM {source}
WHERE {condition} AND {BILLED_POD} AND {UNCHANGED} AND {unchanged_only}
UNION ALL
SELECT p.id, {seg.format(s="x.s", e="x.e")}, x.price, {weight}, rs.run_id, {ATTRS}
FROM run_segments AS rs JOIN pods AS p ON p.name = rs.pod AND p.zone = rs.zone JOIN pieces AS x ON x.id = p.id
WHERE {condition}"""


#: Billed time of slices no run created, attributed to the runs whose segments ran on them: from those
#: slices (partial index pods_norun) to their segments (run_segments_pod), not from every segment.
SRC_SEGMENT_RUNS: Final = segment_source(
    "p.run_id IS NULL",
    "1.0",
    "pods AS p INDEXED BY pods_norun CROSS JOIN run_segments AS rs ON rs.zone = p.zone AND rs.pod = p.name",
)
#: The recomputed share of billed time, from the segments that recomputed steps (a partial index: most
#: segments redo nothing, and a report should not read them all to find that out).
SRC_RECOMPUTED: Final = segment_source(
    "rs.steps_recomputed > 0",
    recompute_fraction_sql("rs"),
    "run_segments AS rs INDEXED BY run_segments_recomputed CROSS JOIN pods AS p "
    "ON p.name = rs.pod AND p.zone = rs.zone",
)

#: A slice (alias p) closed, billed wholly inside the window, and before now: what the ledger stored for
#: it is its bill (its billing facts) and its recomputed work (``pods.rec_*``, schema v7; an open segment's
#: time ends at now). For the recomputed work its price must not have changed either (the stored figure
#: is at its last price).
CLOSED_IN_WINDOW: Final = (
    "p.ended_at IS NOT NULL AND p.ready_at >= :since AND p.ended_at <= :until AND p.ended_at <= :now"
)


def recomputed_sql(
    group: GroupBy,
    ctes: str = CHANGE_CTES,
    *,
    only: str = "1",
    only_stored: str | None = None,
    stored_from: str = "pods AS p INDEXED BY pods_rec",
) -> str:
    """The recomputed share of billed time per (group key, zone, type, capacity), in aggregate_sql's
    columns: the slices the ledger stored it for summed from ``pods_rec`` (one row per slice that redid
    work), the rest from their segments. Those are found from the slices, not from every recomputing
    segment: ``cost_rest`` (the aggregate pass's slices still open or cut by the window, which must exist
    on the connection), slices that end after now (only a test clock has them), and the price-changed
    ones (through their pieces). Per day the stored figures are no use (a slice's segments may cross
    midnight): all from the segments. For runs the stored figure serves only slices a run created (the
    group is then the slice's run whatever segment ran on it); the others' segments name their run, so
    all slices no run created are computed too. ``only``: a condition on the slice (alias p) and its
    segment (alias rs), ``only_stored`` the same on the slice alone (default: ``only``); ``stored_from``:
    where the stored figures are read from (a few given slices: from their list)."""
    if group.kind == "day":
        return aggregate_sql(SRC_RECOMPUTED, group, ctes=ctes)
    stored = CLOSED_IN_WINDOW + (" AND p.run_id IS NOT NULL" if group.kind == "run" else "")
    rest = "SELECT id FROM cost_rest UNION SELECT id FROM pods INDEXED BY pods_ended WHERE ended_at > :now"
    if group.kind == "run":
        # From the recomputing segments to the covering pods_norun: few rows fetched, not every slice
        # no run created.
        rest += (
            " UNION SELECT p.id FROM run_segments AS rs INDEXED BY run_segments_recomputed"
            " CROSS JOIN pods AS p INDEXED BY pods_norun ON p.zone = rs.zone AND p.name = rs.pod"
            " WHERE rs.steps_recomputed > 0 AND p.run_id IS NULL"
        )
    computed = segment_source(
        f"rs.steps_recomputed > 0 AND {only}",
        recompute_fraction_sql("rs"),
        f"({rest}) AS r CROSS JOIN pods AS p ON p.id = r.id CROSS JOIN run_segments AS rs "
        "INDEXED BY run_segments_recomputed ON rs.zone = p.zone AND rs.pod = p.name",
        unchanged_only=f"NOT ({stored})",
    )
    return f"""{aggregate_sql(computed, group, ctes=ctes)}
UNION ALL
SELECT {key_sql(group, "p")} AS k, p.zone AS zone, p.accelerator_type AS atype, p.capacity AS capacity,
       0 AS slices, 0.0 AS s, 0.0 AS cs, TOTAL(p.rec_priced) AS priced, TOTAL(p.rec_unpriced) AS unpriced
FROM {stored_from}
WHERE (p.rec_priced != 0 OR p.rec_unpriced != 0) AND {stored} AND {UNCHANGED}
      AND {only if only_stored is None else only_stored}
GROUP BY 1, 2, 3, 4"""


#: UTC days: the first day of every interval comes straight out; only intervals that cross midnight
#: recurse for the days after.
DAY_SPLIT: Final = f"""
days({IV_COLUMNS}, pe) AS (
    SELECT id, s, MIN(e, {midnight_after_sql("s")}), price, w, run, zone, name, atype,
           capacity, chips, run_id, labels, e
    FROM src
    UNION ALL
    SELECT id, e, MIN(pe, e + {DAY_S}.0), price, w, run, zone, name, atype, capacity, chips, run_id, labels,
           pe
    FROM days WHERE e < pe
),
iv AS (SELECT {IV_COLUMNS} FROM days)"""


def key_sql(group: GroupBy, alias: str) -> str:
    a = alias
    return {
        "slice": f"{a}.id",
        "run": f"COALESCE({a}.run_id, {a}.run)" if a == "iv" else f"{a}.run_id",
        "zone": f"{a}.zone",
        "region": f"{a}.zone",  # mapped to the region in Python (SQLite has no rsplit)
        "type": f"{a}.{'atype' if a == 'iv' else 'accelerator_type'}",
        "capacity": f"{a}.capacity",
        "day": day_sql(f"{a}.s"),  # the UTC day number; a date in Python
        "label": f"json_extract({a}.labels, :label_path)",
        "total": "NULL",
    }[group.kind]


#: The price changes in force: each one recorded while its slice was open. One recorded after the slice
#: ended (events out of order) changed nothing: the ledger's view ignores it when it bills the slice
#: (``tpuctl.store.view``), and so do both report paths, whichever way the slice is summed.
PRICE_CHANGES_SQL: Final = f"""
SELECT e.pod_id, e.ts, e.id, e.price_per_chip_hour FROM events AS e INDEXED BY events_price_facts
WHERE e.kind = 'price_change'
  AND NOT EXISTS (SELECT 1 FROM events AS x INDEXED BY events_end
                  WHERE x.pod_id = e.pod_id AND x.id < e.id AND x.kind IN {END_KINDS_SQL})"""

CHANGED_IDS: Final = "SELECT CAST(json_extract(value, '$[0]') AS INTEGER) FROM json_each(:price_changes)"
#: The price changes (as JSON, like :price_changes) of the slices whose pieces a per-slice or per-run
#: report needs: not billed wholly inside the window, or with segments whose share is priced by piece.
PIECES_NEEDED_SQL: Final = f"""
SELECT json_group_array(json(j.value)) FROM json_each(:price_changes) AS j
WHERE CAST(json_extract(j.value, '$[0]') AS INTEGER) IN (
    SELECT p.id FROM pods AS p
    WHERE p.id IN ({CHANGED_IDS})
      AND (NOT ({CLOSED_IN_WINDOW})
           OR EXISTS (SELECT 1 FROM run_segments AS rs INDEXED BY run_segments_recomputed
                      WHERE rs.zone = p.zone AND rs.pod = p.name AND rs.steps_recomputed > 0)
           OR (p.run_id IS NULL AND EXISTS (SELECT 1 FROM run_segments AS rs INDEXED BY run_segments_pod
                                            WHERE rs.zone = p.zone AND rs.pod = p.name)))
)"""
#: The other price-changed slices billed in the window, into cost_item_pieces from their stored facts
#: (USD x 3600 at each price in force, and chip-seconds with no price).
STORED_PIECES_SQL: Final = f"""
INSERT OR IGNORE INTO cost_item_pieces (id, priced, unpriced)
SELECT p.id, p.billed_usd_s, p.billed_unpriced_chip_s FROM pods AS p
WHERE p.id IN ({CHANGED_IDS}) AND {CLOSED_IN_WINDOW} AND {BILLED_POD}"""

#: CHANGE_CTES's ``changed`` and ``pieces`` read back from ``cost_all_pieces``, where a report that
#: needs them in several queries computed them once (only the slices that need pieces: see
#: PIECES_NEEDED_SQL; the segment queries, the only readers of ``changed``, meet no other).
STORED_CHANGE_CTES: Final = """
changed AS (SELECT DISTINCT id AS pod_id FROM cost_all_pieces),
pieces AS (SELECT id, s, e, price FROM cost_all_pieces)"""


def aggregate_sql(source: str, group: GroupBy, *, count: bool = False, ctes: str = CHANGE_CTES) -> str:
    """Sum an interval relation per (group key, zone, type, capacity); ``count``: distinct slices too."""
    split = DAY_SPLIT if group.kind == "day" else "iv AS (SELECT * FROM src)"
    return f"""
WITH RECURSIVE {ctes},
src({IV_COLUMNS}) AS ({source}),
{split}
SELECT {key_sql(group, "iv")} AS k, iv.zone AS zone, iv.atype AS atype, iv.capacity AS capacity,
       {"COUNT(DISTINCT iv.id)" if count else "0"} AS slices,
       SUM((iv.e - iv.s) * iv.w) AS s,
       SUM(iv.chips * (iv.e - iv.s) * iv.w) AS cs,
       SUM(iv.chips * (iv.e - iv.s) * iv.w * iv.price) AS priced,
       SUM(CASE WHEN iv.price IS NULL THEN iv.chips * (iv.e - iv.s) * iv.w ELSE 0 END) AS unpriced
FROM iv
WHERE iv.e > iv.s
GROUP BY 1, 2, 3, 4"""
