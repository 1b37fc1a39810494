"""Cost reports from the ledger, with GCP's billing rules, aggregated in SQL.

Billing rules (tpu-facts §4), applied to each incarnation of a slice (a row of the ledger's ``pods``):

* billed from ``ready_at`` (the first READY) until ``ended_at`` (preempted, failed, deleted or seen gone),
  or until now while it is still alive;
* a spot or preemptible slice preempted within its first minute (``ended_at - ready_at < 60 s``) is not
  charged at all;
* cost = chips x USD per chip-hour in force at each moment x hours. The price in force is the one the
  ledger recorded with the slice; a ``price_change`` event recorded while the slice was open splits the
  interval and each price is billed for its own part (one recorded after it ended changes nothing, as
  in the ledger's view). A slice with no recorded price is priced at the catalog's current list price (and the
  report says so).

Everything is clipped to the window ``[since, until)``.

Beyond spend, per group: what the same chip-hours would have cost on demand (the on-demand list price of
the same generation and region) and so the spot savings; the cost of recomputed work (from
``run_segments.steps_recomputed``: that share of the segment's slice time, see ``recompute_fraction``);
and quota held after preemption (the time from a preemption until the slice was deleted, in chip-hours
and at the slice's own price: GCP does not bill it, but the quota could have run something else).

Why it is fast: the ledger keeps the report's facts as events arrive (schema v2-v8). The view function
(``tpuctl.store.view``) accumulates each slice's billed seconds, chip-seconds and USD at each price in
force (price changes are events, so each closed price interval is billed as it closes), final when its
billing closes; triggers on ``pods`` and ``run_segments`` keep, in the same transaction: ``cost_rollup``
(every slice whose billing closed within one UTC day, per day, zone, type, capacity and labels),
``cost_rollup_x``/``cost_rollup_xdays`` (closed slices crossing midnight: their facts and first-day share,
and their piece of each later day), ``cost_rollup_held`` (quota held from a preemption to the deletion)
and each closed slice's recomputed work (``pods.rec_*``, from the segments that redid steps on it). A
report over the aggregate groupings (all but slice and run) reads the rollups for the days wholly inside
the window (thousands of rows, whatever the number of slices); only the slices on the window's partial
edge days, still open, cut by --since/--until, price-changed across midnight or still holding quota are
read one by one (found by index), and only the open or cut ones go through interval arithmetic.
Per-slice and per-run reports (one group per slice or run: hundreds of thousands on a big ledger) are
computed in SQL by ``tpuctl.services.cost_items``, ranked by cost so that a ``limit`` (the table's 50)
computes and formats only the groups shown; their totals come from the aggregate path grouped by
nothing. ``CostService(fast=False)`` puts every grouping through the reference path (interval arithmetic
over every slice, scanned in parallel id ranges), which the fast one is tested against. Groups are
ordered most expensive first (days by date). The schema is the ledger's versioned one
(``tpuctl.store.schema``); a ledger of another version is refused with a clear error rather than
misread.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from tpuctl.catalog import CapacityType, Catalog, region_of_zone
from tpuctl.errors import UsageError
from tpuctl.services import cost_items as items
from tpuctl.services.cost_items import FIGURES
from tpuctl.services.prices import PriceSource
from tpuctl.store.records import LedgerError
from tpuctl.store.schema import END_DAY_SQL, END_KINDS_SQL, FIRST_DAY_SQL

#: A spot/preemptible slice preempted within this many seconds of READY is not charged.
FREE_PREEMPTION_S: Final = 60.0
#: The ledger schema version these queries are written for.
KNOWN_SCHEMA: Final = 8
GROUP_BY_CHOICES: Final = ("slice", "run", "zone", "region", "type", "capacity", "day", "label:KEY")
_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(w|d|h|m|s)")
_DURATION_UNITS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_TIME_FIX = (
    "use a date (2026-11-01), a UTC time (2026-11-01T12:00 or 2026-11-01T12:00:00Z), a time with an "
    "offset (2026-11-01T12:00+02:00), a duration ago (7d, 12h, 1h30m), or today, yesterday, month, now"
)
_NONE_KEY = "(none)"
_PREEMPTIBLE_VALUES = frozenset({CapacityType.SPOT.value, CapacityType.PREEMPTIBLE.value})
#: ISO 8601 UTC with a Z, as ``iso()`` writes it, computed by SQLite (NULL stays NULL).
_ISO_SQL = "strftime('%Y-%m-%dT%H:%M:%SZ', {0}, 'unixepoch')"


# --------------------------------------------------------------------------------------------------
# Input


@dataclass(frozen=True)
class GroupBy:
    kind: str  # slice | run | zone | region | type | capacity | day | label
    label_key: str | None = None

    @property
    def name(self) -> str:
        return f"label:{self.label_key}" if self.kind == "label" else self.kind


def parse_group_by(value: str | None) -> GroupBy:
    """``slice|run|zone|region|type|capacity|day|label:KEY`` (default slice) -> ``GroupBy``."""
    if value is None:
        return GroupBy("slice")
    text = value.strip()
    fix = "use one of: " + ", ".join(GROUP_BY_CHOICES) + " (e.g. --group-by label:team)"
    if text.lower().startswith("label:"):
        key = text.split(":", 1)[1]  # as given: label keys are case-sensitive (and lowercase on GCP)
        if not _LABEL_KEY_RE.match(key):
            raise UsageError(
                f"--group-by {value!r}: {key!r} is not a label key",
                field="--group-by",
                value=value,
                fix="a label key is lowercase letters, digits, - and _, starting with a letter, "
                "e.g. --group-by label:team",
            )
        return GroupBy("label", key)
    kind = text.lower()
    if kind not in GROUP_BY_CHOICES or kind == "label:key":
        raise UsageError(f"unknown --group-by {value!r}", field="--group-by", value=value, fix=fix)
    return GroupBy(kind)


#: Groups the table shows by default (the costliest); machine formats list every group unless --limit.
DEFAULT_TABLE_LIMIT: Final = 50


def parse_limit(value: str | None, *, table: bool) -> int | None:
    """``--limit N`` -> the number of groups to keep (None: all). N is a whole number >= 0, 0 meaning
    all; without it the table keeps ``DEFAULT_TABLE_LIMIT`` (hundreds of thousands of slices do not make
    a readable table) and JSON/YAML/CSV keep every group (a script wants them all)."""
    if value is None:
        return DEFAULT_TABLE_LIMIT if table else None
    text = value.strip()
    if not text.isdigit():
        raise UsageError(
            f"--limit {value!r} is not a whole number >= 0",
            field="--limit",
            value=value,
            fix="give how many of the costliest groups to show, e.g. --limit 20, or --limit 0 for all",
        )
    return int(text) or None


def parse_instant(value: str, *, field_name: str, now: float) -> float:
    """A point in time as epoch seconds. Naive dates and times are UTC (cost reports are in UTC days)."""
    text = value.strip()
    lowered = text.lower()
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    named = {
        "now": now,
        "today": today.timestamp(),
        "yesterday": (today - timedelta(days=1)).timestamp(),
        "month": today.replace(day=1).timestamp(),
    }
    if lowered in named:
        return named[lowered]
    if lowered and re.fullmatch(r"(\s*[0-9]+(\.[0-9]+)?\s*[wdhms])+\s*", lowered):
        return now - sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART_RE.findall(lowered))
    try:
        if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text):
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"cannot parse {field_name} {value!r} as a date or time",
            field=field_name,
            value=value,
            fix=_TIME_FIX,
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_window(since: str | None, until: str | None, *, now: float) -> tuple[float | None, float]:
    """``--since``/``--until`` -> ``(since or None, until)``; until defaults to now. since >= until is an
    error (exit 2) naming both values."""
    start = None if since is None else parse_instant(since, field_name="--since", now=now)
    end = now if until is None else parse_instant(until, field_name="--until", now=now)
    if start is not None and start >= end:
        raise UsageError(
            f"--since {since!r} ({iso(start)}) is not before --until {until or 'now'!r} ({iso(end)})",
            field="--since",
            value=since,
            fix="give a --since earlier than --until (the window is [since, until), in UTC)",
        )
    return start, end


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------------------------------
# Output records


@dataclass
class CostLine:
    """One group of a report (a slice, a run, a zone, a day, ...): what it was billed and what it wasted.

    USD figures are exact sums of chips x price x seconds / 3600; rounding happens only in ``to_dict``.
    """

    key: str
    slices: int = 0
    billed_hours: float = 0.0  # slice-hours billed (summed over slices)
    chip_hours: float = 0.0
    cost_usd: float = 0.0
    on_demand_usd: float = 0.0  # the same chip-hours at the on-demand list price of type and region
    spot_savings_usd: float = 0.0  # on_demand_usd - cost_usd, for spot/preemptible time only
    recomputed_usd: float = 0.0  # cost of slice time whose work was recomputed after a preemption
    quota_held_chip_hours: float = 0.0  # chip-hours a preempted slice held quota until deleted
    quota_held_usd: float = 0.0  # the same at the slice's price (not billed: what the quota was worth)
    info: dict[str, Any] = field(default_factory=dict)  # per-kind facts (a slice's zone, a run's status)

    def add(self, other: CostLine) -> None:
        self.slices += other.slices
        self.billed_hours += other.billed_hours
        self.chip_hours += other.chip_hours
        self.cost_usd += other.cost_usd
        self.on_demand_usd += other.on_demand_usd
        self.spot_savings_usd += other.spot_savings_usd
        self.recomputed_usd += other.recomputed_usd
        self.quota_held_chip_hours += other.quota_held_chip_hours
        self.quota_held_usd += other.quota_held_usd

    @property
    def waste_usd(self) -> float:
        return self.recomputed_usd + self.quota_held_usd

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            **self.info,
            "slices": self.slices,
            "billed_hours": _r(self.billed_hours),
            "chip_hours": _r(self.chip_hours),
            "cost_usd": _r(self.cost_usd),
            "on_demand_usd": _r(self.on_demand_usd),
            "spot_savings_usd": _r(self.spot_savings_usd),
            "recomputed_usd": _r(self.recomputed_usd),
            "quota_held_chip_hours": _r(self.quota_held_chip_hours),
            "quota_held_usd": _r(self.quota_held_usd),
            "waste_usd": _r(self.waste_usd),
        }


#: CSV columns of ``cost report -o csv`` (one row per group; documented in the README).
CSV_COLUMNS: Final = ("group_by", "key", *FIGURES)


def _r(value: float) -> float:
    # 6 decimals: exact to a millionth of a dollar, and 64 x 0.245 x 1.5 prints as 23.52, not 23.519999.
    out = round(value, 6)
    return 0.0 if out == 0 else out


@dataclass
class CostReport:
    """A report. ``groups`` are the group records (``CostLine.to_dict`` shape, figures rounded), in report
    order: most expensive first (then by key; slices by READY time, then id), days in date order. With a
    ``limit`` they are the ``limit`` costliest of ``groups_total``; totals and per-day figures always
    cover every group."""

    group_by: GroupBy
    since: float | None
    until: float
    now: float
    groups: list[dict[str, Any]]
    totals: CostLine
    by_day: list[dict[str, Any]]
    preemptions: int
    free_preemptions: int
    prices: PriceSource
    groups_total: int = 0
    limit: int | None = None
    warnings: list[str] = field(default_factory=list)
    untracked: list[dict[str, Any]] = field(default_factory=list)
    reconciled: list[dict[str, Any]] = field(default_factory=list)

    @property
    def lines(self) -> list[CostLine]:
        """The groups as ``CostLine`` objects (with their rounded figures)."""
        figures = set(_FIGURE_FIELDS) | {"key", "waste_usd"}
        return [
            CostLine(
                str(g["key"]),
                **{name: g[name] for name in _FIGURE_FIELDS},
                info={k: v for k, v in g.items() if k not in figures},
            )
            for g in self.groups
        ]

    @property
    def omitted(self) -> CostLine | None:
        """What the groups a --limit left out add up to (totals less the groups shown), or None."""
        if self.groups_total <= len(self.groups):
            return None
        rest = CostLine(f"{self.groups_total - len(self.groups)} more")
        rest.add(self.totals)
        for g in self.groups:
            for name in _FIGURE_FIELDS[1:]:  # not slices: a slice may count in several groups
                setattr(rest, name, getattr(rest, name) - g[name])
        rest.slices = 0
        return rest

    def to_dict(self) -> dict[str, Any]:
        """The ``cost report -o json`` document body (schema in the README's Cost section)."""
        totals = self.totals.to_dict()
        totals.pop("key")
        totals.update(
            {
                "preemptions": self.preemptions,
                "free_preemptions": self.free_preemptions,
                "untracked_usd_per_hour": _r(sum(u["usd_per_hour"] or 0.0 for u in self.untracked)),
            }
        )
        return {
            "window": {"since": iso(self.since), "until": iso(self.until), "now": iso(self.now)},
            "group_by": self.group_by.name,
            "currency": "USD",
            "prices": {
                "ledger": "each slice is billed at the price per chip-hour the ledger recorded for it, "
                "in force at each moment (price_change events split its time)",
                "catalog": self.prices.to_dict(),
            },
            "totals": totals,
            "groups_total": self.groups_total,
            "limit": self.limit,
            "groups": self.groups,
            "by_day": self.by_day,
            "untracked": self.untracked,
            "reconciled": self.reconciled,
            "warnings": list(self.warnings),
        }

    def csv_rows(self) -> list[list[Any]]:
        name = self.group_by.name
        columns = CSV_COLUMNS[1:]
        return [[name, *(g[c] for c in columns)] for g in self.groups]


#: CostLine's figures, as constructor arguments (waste_usd, the last, is derived).
_FIGURE_FIELDS: Final = FIGURES[:-1]


# --------------------------------------------------------------------------------------------------
# SQL


def recompute_fraction_sql(alias: str) -> str:
    """The share of a segment's slice time whose work was recomputed: steps_recomputed / steps_completed,
    where steps_completed counts every step the segment ran, recomputed ones included (capped at 1)."""
    return (
        f"MIN(1.0, CAST({alias}.steps_recomputed AS REAL) / MAX(COALESCE({alias}.steps_completed, 0), "
        f"{alias}.steps_recomputed, 1))"
    )


#: Which incarnations are billed in the window: READY at some point, and not a spot/preemptible slice
#: preempted within its first minute. (COALESCE: with a NULL end_reason the NOT would be NULL, not true.)
#: The pods scans run in parallel over id ranges (one connection and thread each); a query over the whole
#: table binds the full range.
_PART: Final = "p.id >= :lo AND p.id < :hi"
_BILLED_POD: Final = f"""{_PART} AND p.ready_at IS NOT NULL AND p.chips IS NOT NULL
      AND p.ready_at < :until AND COALESCE(p.ended_at, :now) > :since
      AND NOT COALESCE(p.end_reason = 'preempted' AND p.capacity IN ('spot', 'preemptible')
                        AND p.ended_at - p.ready_at < :free_s, 0)"""
#: A preempted incarnation's quota-holding time in the window (until deleted, or until now).
_HELD_S: Final = "MIN(COALESCE(p.deleted_at, :now), :until) - MAX(p.ended_at, :since)"
_BILLED_S: Final = "MIN(COALESCE(p.ended_at, :now), :until) - MAX(p.ready_at, :since)"
_IN_WINDOW_PREEMPTION: Final = "(p.end_reason = 'preempted' AND p.ended_at >= :since AND p.ended_at < :until)"

#: The few slices whose price changed while billed, cut into one piece per price (the log's
#: ``price_change`` events through the small partial index events_price; the price in force at READY is
#: the one on the last event recorded up to then).
_CHANGE_CTES: Final = f"""
pc AS (
    -- The price_change events were read beforehand by a query of their own (which the planner answers
    -- from the small partial index events_price) and come in as JSON: inside a join the planner may
    -- prefer walking events_pod, i.e. most of the log. Joined to pods by primary key.
    SELECT CAST(json_extract(j.value, '$[0]') AS INTEGER) AS pod_id, json_extract(j.value, '$[1]') AS ts,
           json_extract(j.value, '$[2]') AS id, json_extract(j.value, '$[3]') AS price, p.ready_at,
           COALESCE(p.ended_at, :now) AS bill_end, p.price_per_chip_hour AS last_price
    FROM json_each(:price_changes) AS j CROSS JOIN pods AS p
         ON p.id = CAST(json_extract(j.value, '$[0]') AS INTEGER)
    WHERE {_BILLED_POD}
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
_IV_COLUMNS: Final = "id, s, e, price, w, run, zone, name, atype, capacity, chips, run_id, labels"
_ATTRS: Final = "p.zone, p.name, p.accelerator_type, p.capacity, p.chips, p.run_id, p.labels"
_UNCHANGED: Final = "p.id NOT IN (SELECT pod_id FROM changed)"
_SRC_BILLED: Final = f"""
SELECT p.id, MAX(p.ready_at, :since), MIN(COALESCE(p.ended_at, :now), :until), p.price_per_chip_hour, 1.0,
       NULL, {_ATTRS}
FROM pods AS p WHERE {_BILLED_POD} AND {_UNCHANGED}
UNION ALL
SELECT x.id, x.s, x.e, x.price, 1.0, NULL, {_ATTRS} FROM pieces AS x JOIN pods AS p ON p.id = x.id"""
_SRC_CHANGED: Final = (
    f"SELECT x.id, x.s, x.e, x.price, 1.0, NULL, {_ATTRS} FROM pieces AS x JOIN pods AS p ON p.id = x.id"
)
#: The same slices over their whole billed interval at their last price: what the pods scan counted
#: for them, to take back before adding their pieces.
_SRC_CHANGED_WHOLE: Final = f"""
SELECT p.id, MAX(p.ready_at, :since), MIN(COALESCE(p.ended_at, :now), :until), p.price_per_chip_hour, 1.0,
       NULL, {_ATTRS}
FROM changed AS c JOIN pods AS p ON p.id = c.pod_id"""
_SRC_CHANGED_TEMP: Final = "SELECT * FROM cost_pieces"
_SRC_CHANGED_WHOLE_TEMP: Final = "SELECT * FROM cost_whole"
_SRC_HELD: Final = f"""
SELECT p.id, MAX(p.ended_at, :since), MIN(COALESCE(p.deleted_at, :now), :until), p.price_per_chip_hour, 1.0,
       NULL, {_ATTRS}
FROM pods AS p WHERE p.end_reason = 'preempted' AND p.chips IS NOT NULL"""


def _segment_source(condition: str, weight: str, source: str, *, unchanged_only: str = "1") -> str:
    """Billed intervals cut to the run segments that ran on them (``source`` joins run_segments rs to pods
    p, in the order the condition's index makes cheap; price-changed slices through their pieces).
    ``unchanged_only``: a further condition on the slices whose price did not change."""
    seg = "MAX({s}, rs.started_at), MIN({e}, COALESCE(rs.ended_at, :now))"
    return f"""
SELECT p.id, {seg.format(s="MAX(p.ready_at, :since)", e="MIN(COALESCE(p.ended_at, :now), :until)")},
       p.price_per_chip_hour, {weight}, rs.run_id, {_ATTRS}
FROM {source}
WHERE {condition} AND {_BILLED_POD} AND {_UNCHANGED} AND {unchanged_only}
UNION ALL
SELECT p.id, {seg.format(s="x.s", e="x.e")}, x.price, {weight}, rs.run_id, {_ATTRS}
FROM run_segments AS rs JOIN pods AS p ON p.name = rs.pod AND p.zone = rs.zone JOIN pieces AS x ON x.id = p.id
WHERE {condition}"""


#: Billed time of slices no run created, attributed to the runs whose segments ran on them: from those
#: slices (partial index pods_norun) to their segments (run_segments_pod), not from every segment.
_SRC_SEGMENT_RUNS: Final = _segment_source(
    "p.run_id IS NULL",
    "1.0",
    "pods AS p INDEXED BY pods_norun CROSS JOIN run_segments AS rs ON rs.zone = p.zone AND rs.pod = p.name",
)
#: The recomputed share of billed time, from the segments that recomputed steps (a partial index: most
#: segments redo nothing, and a report should not read them all to find that out).
_SRC_RECOMPUTED: Final = _segment_source(
    "rs.steps_recomputed > 0",
    recompute_fraction_sql("rs"),
    "run_segments AS rs INDEXED BY run_segments_recomputed CROSS JOIN pods AS p "
    "ON p.name = rs.pod AND p.zone = rs.zone",
)

#: A slice (alias p) closed, billed wholly inside the window, and before now: what the ledger stored for
#: it is its bill (its billing facts) and its recomputed work (``pods.rec_*``, schema v7; an open segment's
#: time ends at now). For the recomputed work its price must not have changed either (the stored figure
#: is at its last price).
_CLOSED_IN_WINDOW: Final = (
    "p.ended_at IS NOT NULL AND p.ready_at >= :since AND p.ended_at <= :until AND p.ended_at <= :now"
)


def _recomputed_sql(
    group: GroupBy,
    ctes: str = _CHANGE_CTES,
    *,
    only: str = "1",
    only_stored: str | None = None,
    stored_from: str = "pods AS p INDEXED BY pods_rec",
) -> str:
    """The recomputed share of billed time per (group key, zone, type, capacity), in _aggregate_sql's
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
        return _aggregate_sql(_SRC_RECOMPUTED, group, ctes=ctes)
    stored = _CLOSED_IN_WINDOW + (" AND p.run_id IS NOT NULL" if group.kind == "run" else "")
    rest = "SELECT id FROM cost_rest UNION SELECT id FROM pods INDEXED BY pods_ended WHERE ended_at > :now"
    if group.kind == "run":
        # From the recomputing segments to the covering pods_norun: few rows fetched, not every slice
        # no run created.
        rest += (
            " UNION SELECT p.id FROM run_segments AS rs INDEXED BY run_segments_recomputed"
            " CROSS JOIN pods AS p INDEXED BY pods_norun ON p.zone = rs.zone AND p.name = rs.pod"
            " WHERE rs.steps_recomputed > 0 AND p.run_id IS NULL"
        )
    computed = _segment_source(
        f"rs.steps_recomputed > 0 AND {only}",
        recompute_fraction_sql("rs"),
        f"({rest}) AS r CROSS JOIN pods AS p ON p.id = r.id CROSS JOIN run_segments AS rs "
        "INDEXED BY run_segments_recomputed ON rs.zone = p.zone AND rs.pod = p.name",
        unchanged_only=f"NOT ({stored})",
    )
    return f"""{_aggregate_sql(computed, group, ctes=ctes)}
UNION ALL
SELECT {_key_sql(group, "p")} AS k, p.zone AS zone, p.accelerator_type AS atype, p.capacity AS capacity,
       0 AS slices, 0.0 AS s, 0.0 AS cs, TOTAL(p.rec_priced) AS priced, TOTAL(p.rec_unpriced) AS unpriced
FROM {stored_from}
WHERE (p.rec_priced != 0 OR p.rec_unpriced != 0) AND {stored} AND {_UNCHANGED}
      AND {only if only_stored is None else only_stored}
GROUP BY 1, 2, 3, 4"""


#: UTC days: the first day of every interval comes straight out; only intervals that cross midnight
#: recurse for the days after.
_DAY_SPLIT: Final = f"""
days({_IV_COLUMNS}, pe) AS (
    SELECT id, s, MIN(e, (CAST(s / 86400 AS INTEGER) + 1) * 86400.0), price, w, run, zone, name, atype,
           capacity, chips, run_id, labels, e
    FROM src
    UNION ALL
    SELECT id, e, MIN(pe, e + 86400.0), price, w, run, zone, name, atype, capacity, chips, run_id, labels, pe
    FROM days WHERE e < pe
),
iv AS (SELECT {_IV_COLUMNS} FROM days)"""


def _key_sql(group: GroupBy, alias: str) -> str:
    a = alias
    return {
        "slice": f"{a}.id",
        "run": f"COALESCE({a}.run_id, {a}.run)" if a == "iv" else f"{a}.run_id",
        "zone": f"{a}.zone",
        "region": f"{a}.zone",  # mapped to the region in Python (SQLite has no rsplit)
        "type": f"{a}.{'atype' if a == 'iv' else 'accelerator_type'}",
        "capacity": f"{a}.capacity",
        "day": f"CAST({a}.s / 86400 AS INTEGER)",  # the UTC day number; a date in Python
        "label": f"json_extract({a}.labels, :label_path)",
        "total": "NULL",
    }[group.kind]


#: The price changes in force: each one recorded while its slice was open. One recorded after the slice
#: ended (events out of order) changed nothing: the ledger's view ignores it when it bills the slice
#: (``tpuctl.store.view``), and so do both report paths, whichever way the slice is summed.
_PRICE_CHANGES_SQL: Final = f"""
SELECT e.pod_id, e.ts, e.id, e.price_per_chip_hour FROM events AS e INDEXED BY events_price_facts
WHERE e.kind = 'price_change'
  AND NOT EXISTS (SELECT 1 FROM events AS x INDEXED BY events_end
                  WHERE x.pod_id = e.pod_id AND x.id < e.id AND x.kind IN {END_KINDS_SQL})"""

_CHANGED_IDS: Final = "SELECT CAST(json_extract(value, '$[0]') AS INTEGER) FROM json_each(:price_changes)"
#: The price changes (as JSON, like :price_changes) of the slices whose pieces a per-slice or per-run
#: report needs: not billed wholly inside the window, or with segments whose share is priced by piece.
_PIECES_NEEDED_SQL: Final = f"""
SELECT json_group_array(json(j.value)) FROM json_each(:price_changes) AS j
WHERE CAST(json_extract(j.value, '$[0]') AS INTEGER) IN (
    SELECT p.id FROM pods AS p
    WHERE p.id IN ({_CHANGED_IDS})
      AND (NOT ({_CLOSED_IN_WINDOW})
           OR EXISTS (SELECT 1 FROM run_segments AS rs INDEXED BY run_segments_recomputed
                      WHERE rs.zone = p.zone AND rs.pod = p.name AND rs.steps_recomputed > 0)
           OR (p.run_id IS NULL AND EXISTS (SELECT 1 FROM run_segments AS rs INDEXED BY run_segments_pod
                                            WHERE rs.zone = p.zone AND rs.pod = p.name)))
)"""
#: The other price-changed slices billed in the window, into cost_item_pieces from their stored facts
#: (USD x 3600 at each price in force, and chip-seconds with no price).
_STORED_PIECES_SQL: Final = f"""
INSERT OR IGNORE INTO cost_item_pieces (id, priced, unpriced)
SELECT p.id, p.billed_usd_s, p.billed_unpriced_chip_s FROM pods AS p
WHERE p.id IN ({_CHANGED_IDS}) AND {_CLOSED_IN_WINDOW} AND {_BILLED_POD}"""

#: _CHANGE_CTES's ``changed`` and ``pieces`` read back from ``cost_all_pieces``, where a report that
#: needs them in several queries computed them once (only the slices that need pieces: see
#: _PIECES_NEEDED_SQL; the segment queries, the only readers of ``changed``, meet no other).
_STORED_CHANGE_CTES: Final = """
changed AS (SELECT DISTINCT id AS pod_id FROM cost_all_pieces),
pieces AS (SELECT id, s, e, price FROM cost_all_pieces)"""


def _aggregate_sql(source: str, group: GroupBy, *, count: bool = False, ctes: str = _CHANGE_CTES) -> str:
    """Sum an interval relation per (group key, zone, type, capacity); ``count``: distinct slices too."""
    split = _DAY_SPLIT if group.kind == "day" else "iv AS (SELECT * FROM src)"
    return f"""
WITH RECURSIVE {ctes},
src({_IV_COLUMNS}) AS ({source}),
{split}
SELECT {_key_sql(group, "iv")} AS k, iv.zone AS zone, iv.atype AS atype, iv.capacity AS capacity,
       {"COUNT(DISTINCT iv.id)" if count else "0"} AS slices,
       SUM((iv.e - iv.s) * iv.w) AS s,
       SUM(iv.chips * (iv.e - iv.s) * iv.w) AS cs,
       SUM(iv.chips * (iv.e - iv.s) * iv.w * iv.price) AS priced,
       SUM(CASE WHEN iv.price IS NULL THEN iv.chips * (iv.e - iv.s) * iv.w ELSE 0 END) AS unpriced
FROM iv
WHERE iv.e > iv.s
GROUP BY 1, 2, 3, 4"""


#: Stands for a NULL group key or attribute inside the temp tables (NULLs never conflict in a UNIQUE key).
_NULL_KEY: Final = "\x00"
_AGG_TABLE: Final = """CREATE TEMP TABLE cost_agg (
    k, zone TEXT, atype TEXT, capacity TEXT, day0 INTEGER,
    slices INTEGER DEFAULT 0, seen INTEGER DEFAULT 0, bs REAL DEFAULT 0, cs REAL DEFAULT 0,
    priced REAL DEFAULT 0, unpriced REAL DEFAULT 0, d0s REAL DEFAULT 0, d0cs REAL DEFAULT 0,
    d0priced REAL DEFAULT 0, d0unpriced REAL DEFAULT 0, hcs REAL DEFAULT 0, hpriced REAL DEFAULT 0,
    hunpriced REAL DEFAULT 0,
    PRIMARY KEY (k, zone, atype, capacity, day0)
)"""
_DAY_TABLE: Final = """CREATE TEMP TABLE cost_days (
    day INTEGER, zone TEXT, atype TEXT, capacity TEXT, slices INTEGER, s REAL, cs REAL, priced REAL,
    unpriced REAL, PRIMARY KEY (day, zone, atype, capacity)
)"""
_GROUP_COLUMNS: Final = (
    "COALESCE({k}, :null_key), p.zone, COALESCE(p.accelerator_type, :null_key), "
    "COALESCE(p.capacity, :null_key)"
)


def _upsert(columns: Sequence[str]) -> str:
    return "ON CONFLICT (k, zone, atype, capacity, day0) DO UPDATE SET " + ", ".join(
        f"{c} = {c} + excluded.{c}" for c in columns
    )


def _own_sql(group: GroupBy) -> str:
    """Whether a slice counts for its own group: always, except that with --group-by run a slice no run
    created counts for "(none)" only when no run ever ran on it (the runs that did get it through the
    segment query). NULLs are kept out of the list: NOT IN a list holding a NULL is NULL."""
    if group.kind != "run":
        return "1"
    # NOT EXISTS through run_segments_pod: a look-up for each slice no run created, where a NOT IN list
    # would be built from every segment on each use.
    return (
        "(p.run_id IS NOT NULL OR NOT EXISTS (SELECT 1 FROM run_segments AS rs "
        "WHERE rs.zone = p.zone AND rs.pod = p.name))"
    )


#: Where the scans read slices from: every pod (a rowid range scan: the planner would walk an index for
#: the key), or, on the fast path, only the slices that need interval arithmetic (``cost_rest``).
_ALL_PODS: Final = "pods AS p NOT INDEXED"
_REST_PODS: Final = "cost_rest AS r CROSS JOIN pods AS p ON p.id = r.id"


def _pods_billed_sql(group: GroupBy, source: str = _ALL_PODS) -> str:
    """ONE scan of ``pods``: the billed time of every slice whose price never changed, and its share on
    the day it started, summed per (group key, zone, type, capacity, first billed day).

    Summed by an UPSERT into a small keyed temp table rather than GROUP BY: SQLite groups by sorting
    every row, which costs more than the scan itself for a few hundred thousand slices. The predicate
    sits in the WHERE so the per-row expressions stay plain arithmetic. Price-changed slices are summed
    here at their last price like the rest and corrected afterwards from their pieces (excluding the few
    of them here would cost a lookup on every row)."""
    b0 = "MAX(p.ready_at, :since)"
    be = "MIN(COALESCE(p.ended_at, :now), :until)"
    day0 = f"CAST({b0} / 86400 AS INTEGER)"
    d0 = f"(MIN({be}, ({day0} + 1) * 86400.0) - {b0})"
    columns = ("slices", "seen", "bs", "cs", "priced", "unpriced", "d0s", "d0cs", "d0priced", "d0unpriced")
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT {_GROUP_COLUMNS.format(k=_key_sql(group, "p"))}, {day0}, {_own_sql(group)}, 1,
       {be} - {b0}, p.chips * ({be} - {b0}), COALESCE(p.chips * ({be} - {b0}) * p.price_per_chip_hour, 0),
       CASE WHEN p.price_per_chip_hour IS NULL THEN p.chips * ({be} - {b0}) ELSE 0 END,
       {d0}, p.chips * {d0}, COALESCE(p.chips * {d0} * p.price_per_chip_hour, 0),
       CASE WHEN p.price_per_chip_hour IS NULL THEN p.chips * {d0} ELSE 0 END
FROM {source}
WHERE {_BILLED_POD}
{_upsert(columns)}"""


def _pods_held_sql(group: GroupBy, source: str = _ALL_PODS) -> str:
    """Quota held after preemption (preempted until deleted, or until now), per group; a slice only
    holding quota in the window (not billed in it) counts as a slice of its group here.

    Grouped before the UPSERT: one upsert per preempted slice cost more than the rest of the query (tens
    of thousands of them), and pods_preempted hands the rows over in (zone, type, capacity) order."""
    held = f"({_HELD_S})"
    columns = ("slices", "seen", "hcs", "hpriced", "hunpriced")
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT {_GROUP_COLUMNS.format(k=_key_sql(group, "p"))}, -1,
       SUM(CASE WHEN {_BILLED_POD} THEN 0 ELSE {_own_sql(group)} END),
       SUM(CASE WHEN {_BILLED_POD} THEN 0 ELSE 1 END),
       SUM(p.chips * {held}), SUM(COALESCE(p.chips * {held} * p.price_per_chip_hour, 0)),
       SUM(CASE WHEN p.price_per_chip_hour IS NULL THEN p.chips * {held} ELSE 0 END)
FROM {source}
WHERE {_PART} AND p.end_reason = 'preempted' AND p.chips IS NOT NULL AND {held} > 0
GROUP BY 1, 2, 3, 4
{_upsert(columns)}"""


#: The fast path (every grouping but slice and run). A slice whose billing closed inside the window
#: contributes the billing facts the view function stored when it closed (``tpuctl.store.view``: billed
#: seconds, chip-seconds and USD at each price in force), summed in SQL straight from the covering index
#: ``pods_closed``. Only the rest -- slices still open, cut by --since/--until, and price-changed slices
#: crossing midnight (their per-day split needs their pieces) -- goes through the interval arithmetic,
#: found through indexes, never a scan of the pods rows.
_REST_TABLE: Final = "CREATE TEMP TABLE cost_rest (id INTEGER PRIMARY KEY)"
_LATER_TABLE: Final = "CREATE TEMP TABLE cost_later (id INTEGER PRIMARY KEY)"
_REST_PODS_LATER: Final = "cost_later AS r CROSS JOIN pods AS p ON p.id = r.id"
_CROSSES_MIDNIGHT: Final = "p.ended_at > (CAST(p.ready_at / 86400 AS INTEGER) + 1) * 86400.0"
_CLOSED_CROSSING: Final = f"p.ended_at IS NOT NULL AND p.ready_at IS NOT NULL AND {_CROSSES_MIDNIGHT}"
_REST_OPEN: Final = (
    "INSERT OR IGNORE INTO cost_rest (id) SELECT id FROM pods "
    "WHERE ended_at IS NULL AND ready_at IS NOT NULL AND ready_at < :until"
)
#: ``cut``: the window bound; pods_ended's range after it holds every slice it cuts.
_REST_CUT: Final = (
    "INSERT OR IGNORE INTO cost_rest (id) SELECT id FROM pods INDEXED BY pods_ended "
    "WHERE ended_at > :cut AND ready_at < :cut"
)
_REST_CHANGED: Final = f"""
INSERT OR IGNORE INTO cost_rest (id)
SELECT p.id FROM json_each(:price_changes) AS j CROSS JOIN pods AS p
     ON p.id = CAST(json_extract(j.value, '$[0]') AS INTEGER)
WHERE {_CLOSED_CROSSING} AND p.rolled = 0"""
#: The price changes of the slices in cost_rest (the others' facts already hold their pieces).
_REST_PRICE_CHANGES: Final = """
SELECT json_group_array(json(j.value)) FROM json_each(:price_changes) AS j
WHERE CAST(json_extract(j.value, '$[0]') AS INTEGER) IN (SELECT id FROM cost_rest)"""
#: Billed, closed inside [since, until), not a free preemption, not in cost_rest.
_CLOSED: Final = """p.ended_at IS NOT NULL AND p.ready_at IS NOT NULL
      AND p.ready_at >= :since AND p.ready_at < :until AND p.ended_at <= :until AND p.ended_at > :since
      AND p.chips IS NOT NULL
      AND NOT COALESCE(p.end_reason = 'preempted' AND p.capacity IN ('spot', 'preemptible')
                        AND p.ended_at - p.ready_at < :free_s, 0)
      AND p.id NOT IN (SELECT id FROM cost_rest)"""
#: The single-day closed slices cost_rollup does not answer: those of the window's partial first and last
#: days (a ready_at range of pods_closed; the ones crossing midnight are below, _CLOSED_XREST).
#: (The window's own ready_at bounds are kept off the index with a unary +: the day's range is the tight
#: one, and the planner would otherwise walk the whole window.)
_UNINDEXED_WINDOW: Final = _CLOSED.replace(
    "p.ready_at >= :since AND p.ready_at < :until", "+p.ready_at >= :since AND +p.ready_at < :until"
)
_CLOSED_EDGE_DAY: Final = f"""INDEXED BY pods_closed
WHERE {_UNINDEXED_WINDOW}
      AND NOT {_CROSSES_MIDNIGHT}
      AND p.ready_at >= :b_lo AND p.ready_at < :b_hi
      AND NOT (CAST(p.ready_at / 86400 AS INTEGER) >= :d_lo
               AND CAST(p.ready_at / 86400 AS INTEGER) < :d_hi)"""


#: Closed slices crossing midnight that the rollups (schema v8: cost_rollup_x, cost_rollup_xdays) hold
#: for the window: rolled, and every day they were billed in is a whole day of the window.
_X_INSIDE: Final = (
    f"p.rolled = 1 AND {FIRST_DAY_SQL.format(r='p')} >= :d_lo AND {END_DAY_SQL.format(r='p')} <= :d_hi"
)
#: The candidates for the other closed slices crossing midnight, found by index: beginning before the
#: window's first whole day, ending after its last, or not rolled up at all (price-changed, free, long).
_XREST_TABLE: Final = "CREATE TEMP TABLE cost_xrest (id INTEGER PRIMARY KEY)"
_XREST_FILL: Final = tuple(
    f"INSERT OR IGNORE INTO cost_xrest (id) SELECT p.id FROM pods AS p INDEXED BY {index} "
    f"WHERE {_CLOSED_CROSSING} AND {where}"
    for index, where in (
        ("pods_crossing", "p.ready_at < :d_lo * 86400.0"),
        ("pods_ended", "p.ended_at > :d_hi * 86400.0"),
        ("pods_unrolled_crossing", "p.rolled = 0"),
    )
)
_CLOSED_XREST: Final = (
    f"WHERE p.id IN (SELECT id FROM cost_xrest) AND {_CLOSED} AND {_CROSSES_MIDNIGHT} AND NOT ({_X_INSIDE})"
)
_LATER_CLOSED: Final = f"""
INSERT OR IGNORE INTO cost_later (id)
SELECT p.id FROM pods AS p {_CLOSED_XREST}"""


def _rollup_x_sql(group: GroupBy) -> str:
    """The rolled-up slices crossing midnight inside the window's whole days, from ``cost_rollup_x``: their
    stored facts and first day's share, per first day."""
    columns = ("slices", "seen", "bs", "cs", "priced", "unpriced", "d0s", "d0cs", "d0priced", "d0unpriced")
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT COALESCE({_key_sql(group, "r")}, :null_key), r.zone, r.accelerator_type, r.capacity, r.first_day,
       SUM(r.slices), SUM(r.slices), SUM(r.billed_s), SUM(r.billed_chip_s), SUM(r.billed_usd_s),
       SUM(r.billed_unpriced_chip_s), SUM(r.d0_s), SUM(r.d0_chip_s), SUM(r.d0_usd_s),
       SUM(r.d0_unpriced_chip_s)
FROM cost_rollup_x AS r
WHERE r.first_day >= :d_lo AND r.end_day <= :d_hi
GROUP BY 1, 2, 3, 4, 5
{_upsert(columns)}"""


#: Their days after the first, from ``cost_rollup_xdays``, into cost_days.
_ROLLUP_XDAYS_SQL: Final = """
INSERT INTO cost_days (day, zone, atype, capacity, slices, s, cs, priced, unpriced)
SELECT r.day, r.zone, r.accelerator_type, r.capacity, SUM(r.slices), SUM(r.s), SUM(r.chip_s), SUM(r.usd_s),
       SUM(r.unpriced_chip_s)
FROM cost_rollup_xdays AS r
WHERE r.first_day >= :d_lo AND r.end_day <= :d_hi
GROUP BY 1, 2, 3, 4
ON CONFLICT (day, zone, atype, capacity) DO UPDATE SET slices = slices + excluded.slices, s = s + excluded.s,
    cs = cs + excluded.cs, priced = priced + excluded.priced, unpriced = unpriced + excluded.unpriced"""

#: Quota held: the preempted slices deleted inside the window's days (preempted after the day holding
#: :since began, deleted by the end of its last whole day) from ``cost_rollup_held``; the rest -- still
#: held, deleted later, or preempted before that -- slice by slice (pods_held finds them).
_HREST_TABLE: Final = "CREATE TEMP TABLE cost_hrest (id INTEGER PRIMARY KEY)"
_HREST_FILL: Final = (
    "INSERT OR IGNORE INTO cost_hrest (id) SELECT id FROM pods INDEXED BY pods_held "
    "WHERE end_reason = 'preempted' AND deleted_at IS NULL",
    "INSERT OR IGNORE INTO cost_hrest (id) SELECT id FROM pods INDEXED BY pods_held "
    "WHERE end_reason = 'preempted' AND deleted_at > :d_hi * 86400.0",
    "INSERT OR IGNORE INTO cost_hrest (id) SELECT id FROM pods INDEXED BY pods_held "
    "WHERE end_reason = 'preempted' AND deleted_at > :since AND ended_at < :h_lo * 86400.0",
)
_HREST_PODS: Final = "cost_hrest AS r CROSS JOIN pods AS p ON p.id = r.id"


def _rollup_held_sql(group: GroupBy) -> str:
    columns = ("slices", "seen", "hcs", "hpriced", "hunpriced")
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT COALESCE({_key_sql(group, "r")}, :null_key), r.zone, r.accelerator_type, r.capacity, -1,
       SUM(r.slices), SUM(r.slices), SUM(r.held_chip_s), SUM(r.held_usd_s), SUM(r.held_unpriced_chip_s)
FROM cost_rollup_held AS r
WHERE r.end_day >= :h_lo AND r.deleted_day <= :d_hi
GROUP BY 1, 2, 3, 4
{_upsert(columns)}"""


def _rollup_sql(group: GroupBy) -> str:
    """The closed single-day slices of the days wholly inside the window, from ``cost_rollup`` (a few
    rows per day), in the pods scan's shape: for a single-day slice its first day's share is the whole."""
    columns = ("slices", "seen", "bs", "cs", "priced", "unpriced", "d0s", "d0cs", "d0priced", "d0unpriced")
    sums = "SUM(r.billed_s), SUM(r.billed_chip_s), SUM(r.billed_usd_s), SUM(r.billed_unpriced_chip_s)"
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT COALESCE({_key_sql(group, "r")}, :null_key), r.zone, r.accelerator_type, r.capacity, r.day,
       SUM(r.slices), SUM(r.slices), {sums}, {sums}
FROM cost_rollup AS r
WHERE r.day >= :d_lo AND r.day < :d_hi
GROUP BY 1, 2, 3, 4, 5
{_upsert(columns)}"""


def _closed_billed_sql(group: GroupBy, where: str) -> str:
    """The closed slices' stored facts, summed per (group key, zone, type, capacity, first day); the
    first day's share is the whole for a slice within one UTC day (most), else cut at midnight at its one
    price (a price-changed slice crossing midnight is in cost_rest)."""
    day0 = "CAST(p.ready_at / 86400 AS INTEGER)"
    one = f"p.ended_at <= ({day0} + 1) * 86400.0"
    d0 = f"(({day0} + 1) * 86400.0 - p.ready_at)"
    columns = ("slices", "seen", "bs", "cs", "priced", "unpriced", "d0s", "d0cs", "d0priced", "d0unpriced")
    return f"""
INSERT INTO cost_agg (k, zone, atype, capacity, day0, {", ".join(columns)})
SELECT {_GROUP_COLUMNS.format(k=_key_sql(group, "p"))}, {day0} AS d, COUNT(*), COUNT(*),
       SUM(p.billed_s), SUM(p.billed_chip_s), SUM(p.billed_usd_s), SUM(p.billed_unpriced_chip_s),
       SUM(CASE WHEN {one} THEN p.billed_s ELSE {d0} END),
       SUM(CASE WHEN {one} THEN p.billed_chip_s ELSE p.chips * {d0} END),
       SUM(CASE WHEN {one} THEN p.billed_usd_s ELSE COALESCE(p.chips * {d0} * p.price_per_chip_hour, 0) END),
       SUM(CASE WHEN {one} THEN p.billed_unpriced_chip_s
                WHEN p.price_per_chip_hour IS NULL THEN p.chips * {d0} ELSE 0 END)
FROM pods AS p {where}
GROUP BY 1, 2, 3, 4, 5
{_upsert(columns)}"""


#: Preemptions in the window, and those within the first minute (not billed): totals, no grouping.
_PREEMPTIONS_SQL: Final = f"""
SELECT COALESCE(SUM({_IN_WINDOW_PREEMPTION}), 0),
       COALESCE(SUM({_IN_WINDOW_PREEMPTION} AND p.capacity IN ('spot', 'preemptible')
                    AND p.ready_at IS NOT NULL AND p.ended_at - p.ready_at < :free_s), 0)
FROM pods AS p WHERE {_PART} AND p.end_reason = 'preempted'"""
#: The same on the fast path (one range, every id): the window's range of the narrow pods_preemptions.
_PREEMPTIONS_FAST_SQL: Final = """
SELECT COUNT(*), COALESCE(SUM(p.capacity IN ('spot', 'preemptible') AND p.ready_at IS NOT NULL
                              AND p.ended_at - p.ready_at < :free_s), 0)
FROM pods AS p INDEXED BY pods_preemptions
WHERE p.end_reason = 'preempted' AND p.ended_at >= :since AND p.ended_at < :until"""


#: The days after the first of every billed interval that crosses midnight (UTC), for the per-day
#: figures: seeded only with those intervals, so the recursion touches few rows.
_LATER_DAYS_SQL: Final = """
WITH RECURSIVE x AS (
    SELECT p.zone, p.accelerator_type AS atype, p.capacity, p.chips, p.price_per_chip_hour AS price,
           (CAST(MAX(p.ready_at, :since) / 86400 AS INTEGER) + 1) * 86400.0 AS s,
           MIN(COALESCE(p.ended_at, :now), :until) AS e
    FROM {source}
    WHERE {billed}
      AND MIN(COALESCE(p.ended_at, :now), :until)
          > (CAST(MAX(p.ready_at, :since) / 86400 AS INTEGER) + 1) * 86400.0
),
days(zone, atype, capacity, chips, price, s, e, pe) AS (
    SELECT zone, atype, capacity, chips, price, s, MIN(e, s + 86400.0), e FROM x
    UNION ALL
    SELECT zone, atype, capacity, chips, price, e, MIN(pe, e + 86400.0), pe FROM days WHERE e < pe
)
INSERT INTO cost_days (day, zone, atype, capacity, slices, s, cs, priced, unpriced)
SELECT CAST(s / 86400 AS INTEGER), zone, COALESCE(atype, :null_key), COALESCE(capacity, :null_key),
       COUNT(*), SUM(e - s), SUM(chips * (e - s)),
       -- TOTAL, not SUM: a day's unpriced piece must not make its priced sum NULL
       TOTAL(chips * (e - s) * price), SUM(CASE WHEN price IS NULL THEN chips * (e - s) ELSE 0 END)
FROM days WHERE 1
-- Grouped before the UPSERT: one upsert per day of every midnight-crossing slice cost more than the
-- recursion itself.
GROUP BY 1, 2, 3, 4
ON CONFLICT (day, zone, atype, capacity) DO UPDATE SET slices = slices + excluded.slices, s = s + excluded.s,
    cs = cs + excluded.cs, priced = priced + excluded.priced, unpriced = unpriced + excluded.unpriced"""


#: The per-day spend of the fast path without a per-day grouping (the chart's figures): each interval's
#: first day (cost_agg) and its later days (cost_days), summed per day in SQL rather than as thousands of
#: per-day x zone x type x capacity rows in Python. Unpriced time comes per combination (the catalog
#: prices it), usually none.
_DAY_USD_SQL: Final = """
WITH d AS (
    SELECT day0 AS day, zone, atype, capacity, d0priced AS priced, d0unpriced AS unpriced
    FROM cost_agg WHERE day0 >= 0
    UNION ALL
    SELECT day, zone, atype, capacity, priced, unpriced FROM cost_days
)
SELECT day, NULL, NULL, NULL, TOTAL(priced), 0.0 FROM d GROUP BY day
UNION ALL
SELECT day, zone, atype, capacity, 0.0, SUM(unpriced) FROM d WHERE unpriced != 0 GROUP BY 1, 2, 3, 4"""


@dataclass(frozen=True)
class _Sub:
    """One aggregate row: a group's share in one (zone, type, capacity)."""

    key: Any
    zone: str
    accelerator_type: str | None
    capacity: str | None
    slices: int
    seconds: float
    chip_seconds: float
    priced_usd_seconds: float  # sum of chips x seconds x price: USD x 3600
    unpriced_chip_seconds: float


@dataclass
class _Partial:
    """What one id range of the pods table contributed."""

    rows: list[tuple[Any, ...]]  # per group key x zone x type x capacity (cost_agg summed over days)
    first_days: list[tuple[Any, ...]]  # per first billed day x zone x type x capacity
    preemptions: int
    free: int
    changed_subs: list[_Sub] = field(default_factory=list)  # their pieces, each at its price
    changed_whole: list[_Sub] = field(default_factory=list)  # what the scan counted for them
    changed_days: list[_Sub] = field(default_factory=list)
    changed_days_whole: list[_Sub] = field(default_factory=list)
    later: list[_Sub] = field(default_factory=list)
    #: The fast path's per-day spend, summed in SQL (_DAY_USD_SQL): (day, None, None, None, priced, 0)
    #: per day and (day, zone, type, capacity, 0, unpriced) where the catalog prices some time.
    day_rows: list[tuple[Any, ...]] = field(default_factory=list)


#: Below this many pods one scan is quicker than starting threads and connections.
_PARALLEL_MIN_PODS: Final = 20_000


def _partitions(lo: int, hi: int, workers: int) -> list[tuple[int, int]]:
    """Split the id range [lo, hi) into ``workers`` ranges (one when the table is small)."""
    if workers <= 1 or hi - lo < _PARALLEL_MIN_PODS:
        return [(lo, hi)]
    step = -(-(hi - lo) // workers)
    return [(start, min(start + step, hi)) for start in range(lo, hi, step)]


class LedgerReader:
    """A read-only SQLite connection to the ledger file, for the report's aggregate queries."""

    def __init__(self, path: Path, *, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise LedgerError(f"no ledger at {self.path}", fix="run a tpuctl command to create it")
        try:
            self._conn = sqlite3.connect(
                self.path.resolve().as_uri() + "?mode=ro",
                uri=True,
                timeout=timeout_s,
                check_same_thread=False,
            )
            version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
            # The report's temp tables and sorts stay in memory (a few tens of MB for a million events).
            self._conn.execute("PRAGMA temp_store = MEMORY")
            self._conn.execute("PRAGMA cache_size = -65536")
            # A report is a new connection in a new process: every page it reads is a first read. Mapped,
            # those are memory reads rather than a read() call each (13% of a 1,000,000-event report).
            # Safe here: the connection only reads, and the ledger file never shrinks (WAL, no VACUUM),
            # which is what makes a mapping fault.
            self._conn.execute("PRAGMA mmap_size = 1073741824")
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {exc}") from None
        if version != KNOWN_SCHEMA:
            self._conn.close()
            raise LedgerError(
                f"the ledger {self.path} has schema version {version}; cost reports know version "
                f"{KNOWN_SCHEMA}",
                fix="use the tpuctl version that wrote this ledger",
            )

    def query(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql, dict(params)).fetchall()
        except sqlite3.OperationalError as exc:
            raise LedgerError(
                f"ledger {self.path}: {exc}", fix="retry; run `tpuctl doctor` if it persists"
            ) from exc
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"the ledger {self.path} is unreadable: {exc}") from exc

    def execute(self, sql: str, params: Mapping[str, Any]) -> None:
        try:
            self._conn.execute(sql, dict(params))
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path}: {exc}") from exc

    def snapshot(self) -> _Snapshot:
        return _Snapshot(self._conn)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> LedgerReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Snapshot:
    """One read transaction: every query of a report sees the same ledger state."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN")

    def __exit__(self, *exc: object) -> None:
        if self._conn.in_transaction:
            self._conn.execute("COMMIT")


# --------------------------------------------------------------------------------------------------
# The report


class CostService:
    """Builds cost reports from the ledger file. ``catalog`` prices what the ledger left unpriced and
    gives the on-demand prices that savings are measured against."""

    def __init__(
        self,
        ledger_path: Path,
        catalog: Catalog,
        prices: PriceSource,
        *,
        clock: Callable[[], float] = time.time,
        workers: int | None = None,
        fast: bool = True,
    ) -> None:
        self._path = Path(ledger_path)
        self._catalog = catalog
        self._prices = prices
        self._clock = clock
        self._price_cache: dict[tuple[str | None, str, str | None], tuple[float | None, float | None]] = {}
        self._segments = False
        self._changes = False
        self._workers = workers if workers is not None else min(4, os.cpu_count() or 1)
        # False: every slice through the interval arithmetic (the reference the fast path is tested on).
        self._fast = fast

    # --- entry points ----------------------------------------------------------------------------

    def report(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        group_by: GroupBy | None = None,
        with_days: bool = True,
        limit: int | None = None,
    ) -> CostReport:
        """The report over ``[since, until)`` (until defaults to now). ``limit``: keep only the ``limit``
        costliest groups (None or 0: all); totals and per-day figures still cover every group."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        limit = limit or None
        now = self._clock()
        end = now if until is None else until
        group = group_by or GroupBy("slice")
        params = self._params(since, end, now, group)
        warnings: list[str] = list(self._prices.warnings)
        with LedgerReader(self._path) as reader, reader.snapshot():
            self._segments = bool(
                reader.query("SELECT EXISTS (SELECT 1 FROM run_segments WHERE pod IS NOT NULL)", {})[0][0]
            )
            changes = reader.query(_PRICE_CHANGES_SQL, {})
            params["price_changes"] = json.dumps([c for c in changes if c[0] is not None])
            self._changes = bool(changes)
            if self._fast and group.kind in ("slice", "run"):
                groups, groups_total, by_day, counts, totals = self._item_report(
                    reader, group, params, warnings, with_days=with_days, limit=limit
                )
            else:
                lines, by_day, counts = self._lines(reader, group, params, warnings, with_days=with_days)
                if group.kind == "slice":
                    self._slice_info(reader, lines)
                elif group.kind == "run":
                    self._run_info(reader, lines)
                totals = CostLine("total")
                for line in lines:
                    totals.add(line)
                groups_total = len(lines)
                groups = [line.to_dict() for line in _limited(group, lines, limit)]
        preemptions, free, total_slices = counts
        totals.key = "total"
        totals.slices = total_slices
        return CostReport(
            group_by=group,
            since=since,
            until=end,
            now=now,
            groups=groups,
            totals=totals,
            by_day=by_day,
            preemptions=int(preemptions),
            free_preemptions=int(free),
            prices=self._prices,
            groups_total=groups_total,
            limit=limit,
            warnings=_dedupe(warnings),
        )

    def _item_report(
        self,
        reader: LedgerReader,
        group: GroupBy,
        params: dict[str, Any],
        warnings: list[str],
        *,
        with_days: bool,
        limit: int | None,
    ) -> tuple[list[dict[str, Any]], int, list[dict[str, Any]], tuple[int, int, int], CostLine]:
        """Slice and run groups on the fast path (``cost_items``): (groups, how many in all, by_day,
        counts, totals). Totals, per-day spend and counts come from the aggregate fast path grouped by
        nothing, which leaves its temp tables (the combinations priced, the price pieces) for the groups'
        one pass over ``pods``."""
        # Recomputed work is added below, per group, and summed into the totals from the same rows.
        lines, by_day, counts = self._lines(
            reader, GroupBy("total"), params, warnings, with_days=with_days, recomputed=False
        )
        totals = lines[0] if lines else CostLine("total")
        for statement in items.PREPARE:
            reader.execute(statement, {})
        items.fill_prices(reader, items.combos(reader), self._combo_prices)
        ctes = _CHANGE_CTES
        if self._changes:
            # The pieces of the price-changed slices that need them, once (the groups and both segment
            # queries read them): those still open or cut by the window, and those segments ran on
            # (their recomputed work, or a run's share of a slice it did not create, is priced piece by
            # piece). For the other ones, billed wholly inside the window, the stored facts are the bill.
            needed = reader.query(_PIECES_NEEDED_SQL, params)[0][0] or "[]"
            pieces = f"WITH {_CHANGE_CTES} SELECT id, s, e, price FROM pieces"
            reader.execute(
                f"CREATE TEMP TABLE cost_all_pieces AS {pieces}", {**params, "price_changes": needed}
            )
            reader.execute(items.PIECES_SQL, {})
            reader.execute(_STORED_PIECES_SQL, params)
            ctes = _STORED_CHANGE_CTES
        if self._segments:
            # The total from the few per-combination rows; per group below (for slices: only those shown).
            for sub in self._sub_rows(reader, _recomputed_sql(GroupBy("total"), ctes), params):
                totals.recomputed_usd += self._usd(sub, warnings)
            if group.kind == "run":
                # Slices no run created are billed to the runs that ran on them, for the time they did;
                # the rest of their time stays with "(none)".
                runs = _aggregate_sql(_SRC_SEGMENT_RUNS, group, count=True, ctes=ctes)
                reader.execute(f"CREATE TEMP TABLE cost_seg AS {runs}", params)
                reader.execute(items.adj_sql("SELECT * FROM cost_seg", recomputed=False), params)
                reader.execute(items.adj_sql("SELECT * FROM cost_seg", recomputed=False, sign="-"), params)
        bound = {**params, "limit": limit if limit is not None else -1}
        ranked = limit is not None
        if group.kind == "slice":
            if ranked:
                bar, found = reader.query(items.SLICE_BAR_SQL, bound)[0]
                if found == limit and bar is not None and bar > items.BAR_MARGIN_USD_S:
                    # Only slices that can be among the costliest: closed ones down to the bar, and those
                    # the stored facts cannot rank (open, cut by the window, unpriced).
                    reader.execute(items.SLICE_RANK_ABOVE_SQL, {**bound, "bar": bar - items.BAR_MARGIN_USD_S})
                else:  # fewer than `limit` closed slices cost anything: rank them all
                    reader.execute(items.SLICE_RANK_SQL, bound)
            else:
                reader.execute(items.SLICE_RANK_ALL_SQL, bound)
            if self._segments:
                shown = _recomputed_sql(
                    group,
                    ctes,
                    only="p.id IN (SELECT k FROM cost_top)",
                    stored_from="cost_top AS t CROSS JOIN pods AS p ON p.id = t.k",
                )
                reader.execute(items.adj_sql(shown, recomputed=True), params)
                reader.execute(items.REC_SQL, {})
            groups = items.slice_records(reader.query(items.slice_sql(), bound))
            # One group per slice billed or holding quota in the window: what the aggregate pass counted.
            total = counts[2]
        else:
            reader.execute(items.NONE_SQL, bound)
            if ranked:
                for statement in items.RUN_RANK_SQL:
                    reader.execute(statement, bound)
            if self._segments:
                # Recomputed work is not part of the ranking: only the runs shown need it.
                rec = (
                    _recomputed_sql(
                        group,
                        ctes,
                        only="COALESCE(p.run_id, rs.run_id) IN (SELECT k FROM cost_top_runs)",
                        only_stored="1",
                        stored_from="cost_top_runs AS t CROSS JOIN pods AS p ON p.run_id = t.k",
                    )
                    if ranked
                    else _recomputed_sql(group, ctes)
                )
                reader.execute(items.adj_sql(rec, recomputed=True), params)
            groups = items.run_records(reader.query(items.run_sql(ranked=ranked), bound))
            total = int(reader.query("SELECT COUNT(*) FROM cost_runs", {})[0][0]) if ranked else len(groups)
        return groups, total, by_day, counts, totals

    def _combo_prices(self, zone: str, atype: str, capacity: str) -> tuple[float | None, float | None]:
        """(own, on-demand) catalog prices per chip-hour of a temp-table combination (NULLs as _NULL_KEY)."""
        return self._catalog_prices(_unnull(atype), zone, _unnull(capacity))

    def spend(self, *, since: float | None = None, until: float | None = None) -> float:
        """Total billed USD in the window (for budgets)."""
        report = self.report(since=since, until=until, group_by=GroupBy("total"), with_days=False)
        return report.totals.cost_usd

    # --- pieces ---------------------------------------------------------------------------------------

    @staticmethod
    def _params(since: float | None, until: float, now: float, group: GroupBy) -> dict[str, Any]:
        return {
            # -inf would do, but SQLite binds it as a REAL fine only on some builds: a far past is plain.
            "since": -1e18 if since is None else float(since),
            "until": float(until),
            "now": float(now),
            "free_s": FREE_PREEMPTION_S,
            "label_path": f'$."{group.label_key}"' if group.label_key else "$",
            "price_changes": "[]",
            "null_key": _NULL_KEY,
            "lo": -(2**62),
            "hi": 2**62,
        }

    def _subs(
        self,
        reader: LedgerReader,
        source: str,
        group: GroupBy,
        params: Mapping[str, Any],
        *,
        count: bool = False,
    ) -> list[_Sub]:
        return self._sub_rows(reader, _aggregate_sql(source, group, count=count), params)

    @staticmethod
    def _sub_rows(reader: LedgerReader, sql: str, params: Mapping[str, Any]) -> list[_Sub]:
        """The rows of ``sql``, in ``_aggregate_sql``'s columns."""
        return [
            _Sub(
                r[0],
                r[1],
                r[2],
                r[3],
                int(r[4]),
                float(r[5] or 0),
                float(r[6] or 0),
                float(r[7] or 0),
                float(r[8] or 0),
            )
            for r in reader.query(sql, params)
        ]

    def _lines(
        self,
        reader: LedgerReader,
        group: GroupBy,
        params: Mapping[str, Any],
        warnings: list[str],
        *,
        with_days: bool,
        recomputed: bool = True,
    ) -> tuple[list[CostLine], list[dict[str, Any]], tuple[int, int, int]]:
        """The groups, the per-day spend, and (preemptions, free preemptions, distinct slices); without
        ``recomputed`` the cost of recomputed work is left out (the caller adds it)."""
        lines: dict[Any, CostLine] = {}

        def line_for(sub: _Sub) -> CostLine:
            key = self._display_key(group, sub)
            if key not in lines:
                lines[key] = CostLine(str(key))
            return lines[key]

        day = GroupBy("day")
        by_group = group.kind != "day"
        main = group if by_group else GroupBy("total")
        need_days = with_days or not by_group
        # Two subqueries: SQLite reads MIN or MAX of the rowid from the B-tree's ends only when each is
        # the query's sole aggregate (both in one SELECT scan the table).
        lo, hi = reader.query(
            "SELECT COALESCE((SELECT MIN(id) FROM pods), 0), COALESCE((SELECT MAX(id) FROM pods), 0) + 1", {}
        )[0]
        fast = self._fast and group.kind not in ("slice", "run")
        parts = [(int(lo), int(hi))] if fast else _partitions(int(lo), int(hi), self._workers)
        if len(parts) == 1:
            partials = [self._scan(reader, main, group, {**params, "lo": lo, "hi": hi}, need_days, fast=fast)]
        else:
            from concurrent.futures import ThreadPoolExecutor

            def scan(bounds: tuple[int, int]) -> _Partial:
                # sqlite3 releases the GIL while a statement runs: one connection per thread scans its
                # range of pods on its own core.
                with LedgerReader(self._path) as part_reader, part_reader.snapshot():
                    return self._scan(
                        part_reader, main, group, {**params, "lo": bounds[0], "hi": bounds[1]}, need_days
                    )

            with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="tpuctl-cost") as pool:
                partials = list(pool.map(scan, parts))
        preemptions = sum(part.preemptions for part in partials)
        free = sum(part.free for part in partials)
        total_slices = 0
        first_days: list[_Sub] = []
        day_subs: list[_Sub] = []
        for part in partials:
            for r in part.first_days:
                first_days.append(_Sub(r[0], str(r[1]), _unnull(r[2]), _unnull(r[3]), r[4], *r[5:9]))
            for r in part.rows:
                key, zone, atype, capacity = _unnull(r[0]), str(r[1]), _unnull(r[2]), _unnull(r[3])
                total_slices += int(r[5] or 0)
                if by_group:
                    # The temp table's sums default to 0, never NULL: no conversion needed.
                    billed = _Sub(key, zone, atype, capacity, r[4], r[6], r[7], r[8], r[9])
                    line = line_for(billed)
                    line.slices += billed.slices
                    self._add_billed(line, billed, warnings, sign=1.0)
                    held = _Sub(key, zone, atype, capacity, 0, 0.0, r[10], r[11], r[12])
                    self._add_held(line, held, warnings)
            # Slices whose price changed: the scan billed them at their last price; take that back and
            # bill their pieces, each at its own price.
            for sub in part.changed_whole:
                self._add_billed(line_for(sub), sub, warnings, sign=-1.0)
            for sub in part.changed_subs:
                self._add_billed(line_for(sub), sub, warnings, sign=1.0)
            day_subs += part.later + part.changed_days
            day_subs += [_negate(sub) for sub in part.changed_days_whole]
        day_subs = first_days + day_subs
        if not by_group:
            for sub in day_subs:
                line = line_for(sub)
                self._add_billed(line, sub, warnings, sign=1.0)
                line.slices += sub.slices
            for sub in self._subs(reader, _SRC_HELD, group, params):
                self._add_held(line_for(sub), sub, warnings)
        if group.kind == "run" and self._segments:
            # Slices no run created are billed to the runs that ran on them, for the time they did; the
            # rest of their time stays with "(none)".
            for sub in self._subs(reader, _SRC_SEGMENT_RUNS, group, params, count=True):
                line = line_for(sub)
                self._add_billed(line, sub, warnings, sign=1.0)
                line.slices += sub.slices
                none = _Sub(None, sub.zone, sub.accelerator_type, sub.capacity, 0, sub.seconds,
                            sub.chip_seconds, sub.priced_usd_seconds, sub.unpriced_chip_seconds)  # fmt: skip
                self._add_billed(line_for(none), none, warnings, sign=-1.0)
        if self._segments and recomputed:
            sql = _recomputed_sql(group) if self._fast else _aggregate_sql(_SRC_RECOMPUTED, group)
            for sub in self._sub_rows(reader, sql, params):
                line_for(sub).recomputed_usd += self._usd(sub, warnings)
        out = list(lines.values())
        for line in out:
            # Subtracting floats can leave -1e-13 where the truth is 0.
            for name in ("billed_hours", "chip_hours", "cost_usd", "on_demand_usd", "spot_savings_usd"):
                if abs(getattr(line, name)) < 1e-9:
                    setattr(line, name, 0.0)
        rest = lines.get(_NONE_KEY)
        if group.kind == "run" and rest is not None and not rest.slices and rest.chip_hours == 0:
            out.remove(rest)  # only the runs' shares were moved out of it: nothing is left
        by_day: dict[str, float] = {}
        if group.kind == "day":
            by_day = {line.key: line.cost_usd for line in out}
        else:
            for sub in day_subs:
                key = str(self._display_key(day, sub))
                by_day[key] = by_day.get(key, 0.0) + self._usd(sub, warnings)
            for part in partials:
                for r in part.day_rows:
                    sub = _Sub(r[0], r[1], _unnull(r[2]), _unnull(r[3]), 0, 0.0, 0.0, r[4], r[5])
                    key = str(self._display_key(day, sub))
                    by_day[key] = by_day.get(key, 0.0) + self._usd(sub, warnings)
        days = [{"day": d, "cost_usd": _r(v)} for d, v in sorted(by_day.items())]
        return self._sorted(group, out), days, (preemptions, free, total_slices)

    def _scan(
        self,
        reader: LedgerReader,
        main: GroupBy,
        group: GroupBy,
        params: Mapping[str, Any],
        need_days: bool,
        *,
        fast: bool = False,
    ) -> _Partial:
        """The pods scans over one id range (its bounds in ``params``), in one read transaction; ``fast``:
        closed slices from their stored facts, the rest (``cost_rest``) by interval arithmetic."""
        reader.execute(_AGG_TABLE, {})
        if fast:
            params = dict(params)
            reader.execute(_REST_TABLE, {})
            reader.execute(_REST_OPEN, params)
            for cut in (params["since"], params["until"]):
                if cut > -1e17:  # no --since: nothing is cut at the start
                    reader.execute(_REST_CUT, {"cut": cut})
            if self._changes:
                reader.execute(_REST_CHANGED, params)
                params["price_changes"] = reader.query(_REST_PRICE_CHANGES, params)[0][0] or "[]"
            reader.execute(_pods_billed_sql(main, _REST_PODS), params)
            # Whole UTC days inside the window come from the rollup; the rest slice by slice.
            d_lo = math.ceil(params["since"] / 86400.0)
            d_hi = math.floor(params["until"] / 86400.0)
            days = {"d_lo": d_lo, "d_hi": d_hi}
            reader.execute(_rollup_sql(main), {**params, **days})
            reader.execute(_rollup_x_sql(main), {**params, **days})
            reader.execute(_XREST_TABLE, {})
            for statement in _XREST_FILL:
                reader.execute(statement, days)
            reader.execute(_closed_billed_sql(main, _CLOSED_XREST), {**params, **days})
            for edge in {d_lo - 1, d_hi}:
                bounds = {"b_lo": edge * 86400.0, "b_hi": (edge + 1) * 86400.0}
                reader.execute(_closed_billed_sql(main, _CLOSED_EDGE_DAY), {**params, **days, **bounds})
            # Held quota: rolled up when preempted after the day holding :since began (so the slice
            # ended after :since, as being billed in the window asks) and deleted by :d_hi.
            held_days = {"d_hi": d_hi, "h_lo": math.floor(params["since"] / 86400.0) + 1}
            reader.execute(_rollup_held_sql(main), {**params, **held_days})
            reader.execute(_HREST_TABLE, {})
            for statement in _HREST_FILL:
                reader.execute(statement, {**params, **held_days})
            reader.execute(_pods_held_sql(main, _HREST_PODS), params)
            params["d_lo"], params["d_hi"] = d_lo, d_hi  # for the later days
        else:
            reader.execute(_pods_billed_sql(main), params)
            reader.execute(_pods_held_sql(main), params)
        # Summed here rather than row by row in Python: cost_agg holds a row per day as well (tens of
        # thousands on a big ledger), which the groups do not need and the per-day figures need apart.
        rows = reader.query(
            "SELECT k, zone, atype, capacity, SUM(slices), SUM(seen), SUM(bs), SUM(cs), SUM(priced), "
            "SUM(unpriced), SUM(hcs), SUM(hpriced), SUM(hunpriced) FROM cost_agg GROUP BY 1, 2, 3, 4",
            {},
        )
        # The fast path sums the days in SQL unless the groups are the days themselves.
        sql_days = fast and need_days and group.kind != "day"
        first_days = (
            []
            if sql_days
            else reader.query(
                "SELECT day0, zone, atype, capacity, SUM(slices), SUM(d0s), SUM(d0cs), SUM(d0priced), "
                "SUM(d0unpriced) FROM cost_agg WHERE day0 >= 0 GROUP BY 1, 2, 3, 4",
                {},
            )
        )
        preemptions_sql = _PREEMPTIONS_FAST_SQL if fast else _PREEMPTIONS_SQL
        preemptions, free = (int(v) for v in reader.query(preemptions_sql, params)[0])
        part = _Partial(rows=rows, first_days=first_days, preemptions=preemptions, free=free)
        changed = self._changes and self._materialize_changed(reader, params)
        if changed and group.kind != "day":
            part.changed_subs = self._subs(reader, _SRC_CHANGED_TEMP, group, params)
            part.changed_whole = self._subs(reader, _SRC_CHANGED_WHOLE_TEMP, group, params)
        if need_days:
            # Per day: each interval's first day (in rows), the days after it for those crossing
            # midnight, and the price-changed slices' pieces cut at midnight.
            reader.execute(_DAY_TABLE, {})
            source = _ALL_PODS
            if fast:
                reader.execute(_LATER_TABLE, {})
                reader.execute("INSERT INTO cost_later (id) SELECT id FROM cost_rest", {})
                reader.execute(_LATER_CLOSED, params)
                source = _REST_PODS_LATER
            reader.execute(_LATER_DAYS_SQL.format(source=source, billed=_BILLED_POD), params)
            if fast:
                reader.execute(_ROLLUP_XDAYS_SQL, params)
            if sql_days:
                part.day_rows = reader.query(_DAY_USD_SQL, {})
            else:
                part.later = [
                    _Sub(r[0], r[1], _unnull(r[2]), _unnull(r[3]), int(r[4]), *_floats(r[5:9]))
                    for r in reader.query(
                        "SELECT day, zone, atype, capacity, slices, s, cs, priced, unpriced FROM cost_days",
                        {},
                    )
                ]
            if changed:
                day = GroupBy("day")
                part.changed_days = self._subs(reader, _SRC_CHANGED_TEMP, day, params)
                part.changed_days_whole = self._subs(reader, _SRC_CHANGED_WHOLE_TEMP, day, params)
        return part

    @staticmethod
    def _materialize_changed(reader: LedgerReader, params: Mapping[str, Any]) -> bool:
        """The price-changed slices of this range, cut into pieces, in temp tables read four times
        (per group and per day, pieces and whole); False when this range has none."""
        reader.execute(f"CREATE TEMP TABLE cost_pieces AS WITH {_CHANGE_CTES} {_SRC_CHANGED}", params)
        reader.execute(f"CREATE TEMP TABLE cost_whole AS WITH {_CHANGE_CTES} {_SRC_CHANGED_WHOLE}", params)
        return bool(reader.query("SELECT EXISTS (SELECT 1 FROM cost_whole)", {})[0][0])

    def _add_held(self, line: CostLine, sub: _Sub, warnings: list[str]) -> None:
        line.quota_held_chip_hours += sub.chip_seconds / 3600.0
        if sub.chip_seconds:
            line.quota_held_usd += self._usd(sub, warnings)

    # --- prices ---------------------------------------------------------------------------------------

    def _catalog_prices(
        self, accel_type: str | None, zone: str, capacity: str | None
    ) -> tuple[float | None, float | None]:
        """(this capacity's list price, the on-demand list price) per chip-hour, from the catalog."""
        key = (accel_type, zone, capacity)
        if key not in self._price_cache:
            own: float | None = None
            od: float | None = None
            try:
                if accel_type is not None:
                    accel = self._catalog.resolve(accel_type)
                    region = region_of_zone(zone)
                    od = self._catalog.prices.per_chip_hour(
                        accel.generation.name, region, CapacityType.ON_DEMAND
                    )
                    if capacity is not None:
                        own = self._catalog.prices.per_chip_hour(
                            accel.generation.name, region, CapacityType(capacity)
                        )
            except (UsageError, ValueError):
                pass
            self._price_cache[key] = (own, od)
        return self._price_cache[key]

    def _usd(self, sub: _Sub, warnings: list[str]) -> float:
        usd = sub.priced_usd_seconds / 3600.0
        if sub.unpriced_chip_seconds > 0:
            own, _od = self._catalog_prices(sub.accelerator_type, sub.zone, sub.capacity)
            if own is None:
                warnings.append(
                    f"no price for {sub.accelerator_type} {sub.capacity} in {sub.zone}, in the ledger or the "
                    "catalog: that time is counted at 0 USD"
                )
            else:
                warnings.append(
                    "some slices had no price in the ledger; they are priced at the catalog's current "
                    "list price"
                )
                usd += sub.unpriced_chip_seconds / 3600.0 * own
        return usd

    def _add_billed(self, line: CostLine, sub: _Sub, warnings: list[str], *, sign: float) -> None:
        usd = self._usd(sub, warnings)
        chip_hours = sub.chip_seconds / 3600.0
        line.billed_hours += sign * sub.seconds / 3600.0
        line.chip_hours += sign * chip_hours
        line.cost_usd += sign * usd
        preemptible = sub.capacity in _PREEMPTIBLE_VALUES
        if not preemptible:
            line.on_demand_usd += sign * usd
            return
        _own, od = self._catalog_prices(sub.accelerator_type, sub.zone, sub.capacity)
        if od is None:
            warnings.append(
                f"no on-demand price for {sub.accelerator_type} in {_region_or(sub.zone)}: its spot time is "
                "compared at its own price (no savings counted)"
            )
            line.on_demand_usd += sign * usd
            return
        od_usd = chip_hours * od
        line.on_demand_usd += sign * od_usd
        line.spot_savings_usd += sign * (od_usd - usd)

    # --- keys and details -----------------------------------------------------------------------------

    @staticmethod
    def _display_key(group: GroupBy, sub: _Sub) -> Any:
        if sub.key is None:
            return _NONE_KEY
        if group.kind == "region":
            return _region_or(str(sub.key))
        if group.kind == "day":
            return datetime.fromtimestamp(int(sub.key) * 86400, UTC).date().isoformat()
        if group.kind == "slice":
            return int(sub.key)
        return str(sub.key)

    @staticmethod
    def _sorted(group: GroupBy, lines: list[CostLine]) -> list[CostLine]:
        if group.kind == "day":
            return sorted(lines, key=lambda line: line.key)
        if group.kind == "slice":
            return lines  # ordered by _slice_info (cost, then ready time and id)
        # By the cost as shown (rounded): the order must not hang on the last bits of a float sum, which
        # the fast path adds up in another order.
        return sorted(lines, key=lambda line: (-_r(line.cost_usd), line.key))

    def _slice_info(self, reader: LedgerReader, lines: list[CostLine]) -> None:
        by_id = {int(line.key): line for line in lines}
        if not by_id:
            return
        rows = reader.query(
            # Times formatted by SQLite: a few hundred thousand datetime objects cost seconds in Python.
            f"SELECT id, zone, name, incarnation, accelerator_type, chips, capacity, state, run_id, "
            f"{_ISO_SQL.format('ready_at')}, {_ISO_SQL.format('ended_at')}, end_reason, "
            f"{_ISO_SQL.format('deleted_at')}, price_per_chip_hour, labels, ready_at FROM pods "
            "WHERE id IN (SELECT value FROM json_each(:ids))",
            {"ids": json.dumps(sorted(by_id))},
        )
        order: dict[int, tuple[float, int]] = {}
        for r in rows:
            line = by_id[int(r[0])]
            line.key = f"{r[1]}/{r[2]}#{r[3]}"
            line.info = {
                "name": r[2],
                "zone": r[1],
                "incarnation": r[3],
                "accelerator_type": r[4],
                "chips": r[5],
                "capacity": r[6],
                "state": r[7],
                "run_id": r[8],
                "ready_at": r[9],
                "ended_at": r[10],
                "end_reason": r[11],
                "deleted_at": r[12],
                "price_per_chip_hour": r[13],
                "labels": json.loads(r[14]) if r[14] else {},
            }
            order[id(line)] = (r[15] if r[15] is not None else math.inf, int(r[0]))
        lines.sort(key=lambda line: (-_r(line.cost_usd), *order.get(id(line), (math.inf, 0))))

    def _run_info(self, reader: LedgerReader, lines: list[CostLine]) -> None:
        ids = [line.key for line in lines if line.key != _NONE_KEY]
        if not ids:
            return
        rows = reader.query(
            "SELECT run_id, status, created_at, ended_at, restarts, preemptions, steps, script FROM runs "
            "WHERE run_id IN (SELECT value FROM json_each(:ids))",
            {"ids": json.dumps(ids)},
        )
        info = {
            r[0]: {
                "status": r[1],
                "created_at": iso(r[2]),
                "ended_at": iso(r[3]),
                "restarts": r[4],
                "preemptions": r[5],
                "steps": r[6],
                "program": r[7],
            }
            for r in rows
        }
        for line in lines:
            if line.key in info:
                line.info = info[line.key]


def _limited(group: GroupBy, lines: list[CostLine], limit: int | None) -> list[CostLine]:
    """The ``limit`` costliest of ``lines`` (already in report order), kept in that order."""
    if limit is None or len(lines) <= limit:
        return lines
    if group.kind != "day":
        return lines[:limit]  # already most expensive first
    ranked = sorted(range(len(lines)), key=lambda i: (-_r(lines[i].cost_usd), lines[i].key))
    keep = sorted(ranked[:limit])
    return [lines[i] for i in keep]


def _negate(sub: _Sub) -> _Sub:
    """The same amounts taken away (slices are not counted twice, so theirs stay 0)."""
    return _Sub(sub.key, sub.zone, sub.accelerator_type, sub.capacity, 0, -sub.seconds, -sub.chip_seconds,
                -sub.priced_usd_seconds, -sub.unpriced_chip_seconds)  # fmt: skip


def _unnull(value: Any) -> Any:
    return None if value == _NULL_KEY else value


def _floats(values: Sequence[Any]) -> list[float]:
    return [float(v or 0.0) for v in values]


def _region_or(zone: str) -> str:
    try:
        return region_of_zone(zone)
    except UsageError:
        return zone


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
