"""A report's groups summed from the pods scans (``scan``): every grouping on the reference path, and all
but slice and run (and the totals of those) on the fast path. Python only prices and adds up the few
aggregate rows the SQL gives back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from tpuctl.services.cost.daily import DayCosts, day_cells
from tpuctl.services.cost.details import NONE_KEY, display_key, sorted_lines
from tpuctl.services.cost.model import CostLine
from tpuctl.services.cost.pricing import Pricer
from tpuctl.services.cost.scan import scan_all
from tpuctl.services.cost.sql_intervals import (
    aggregate_sql,
    recomputed_sql,
    recomputing_changes_sql,
    src_held,
    src_recomputed,
    src_segment_runs,
)
from tpuctl.services.cost.subs import Partial, Sub, negate, sub_rows, subs, unnull
from tpuctl.services.cost.window import GroupBy
from tpuctl.store.billing import round_usd as _r
from tpuctl.store.cost_reader import LedgerReader

_DAY = GroupBy("day")


@dataclass
class Query:
    """One report being computed: where it reads, with what, and what the ledger holds."""

    reader: LedgerReader
    params: dict[str, Any]
    warnings: list[str]
    pricer: Pricer
    fast: bool
    workers: int
    segments: bool = False  # some run segment names its slice
    changes: bool = False  # some price_change is in force
    # Some slice no run created may have a segment on it (its runs get shares of its time): False where
    # none ever had (``tpuctl.store.shares_seen``); looked up exactly for a report by run, whose passes over
    # those shares it spares when none has.
    shares: bool = True


class _Lines:
    """The groups by their display key, made on first use."""

    def __init__(self, group: GroupBy) -> None:
        self.group = group
        self.by_key: dict[Any, CostLine] = {}

    def __call__(self, sub: Sub) -> CostLine:
        key = display_key(self.group, sub)
        if key not in self.by_key:
            self.by_key[key] = CostLine(str(key))
        return self.by_key[key]


class Aggregate(NamedTuple):
    """What the aggregate path computed: the groups, the per-day spend, (preemptions, free preemptions,
    distinct slices), and each day's spend split by a grouping where one was asked for (else empty)."""

    lines: list[CostLine]
    by_day: list[dict[str, Any]]
    counts: tuple[int, int, int]
    day_split: list[DayCosts]


def aggregate_lines(
    q: Query, group: GroupBy, *, with_days: bool, recomputed: bool = True, split: GroupBy | None = None
) -> Aggregate:
    """The groups, the per-day spend, and (preemptions, free preemptions, distinct slices); without
    ``recomputed`` the cost of recomputed work is left out (the caller adds it). ``split``: also each
    day's spend split by that grouping (``daily.DAY_SPLIT_GROUPINGS``), from the same scan: the cells
    whose rows add up to ``by_day`` and whose columns, when ``split`` is ``group``, to the groups."""
    line_for = _Lines(group)
    by_group = group.kind != "day"
    main = group if by_group else GroupBy("total")
    fast = q.fast and group.kind not in ("slice", "run")
    partials = scan_all(
        q.reader, main, group, q.params, need_days=with_days or not by_group or split is not None,
        fast=fast, changes=q.changes, workers=q.workers, split=split,
    )  # fmt: skip
    total_slices, day_subs = _merge_partials(q, partials, line_for, by_group=by_group)
    if not by_group:
        for sub in day_subs:
            line = line_for(sub)
            q.pricer.add_billed(line, sub, q.warnings, sign=1.0)
            line.slices += sub.slices
        for sub in subs(q.reader, src_held(q.reader.dialect), group, q.params):
            q.pricer.add_held(line_for(sub), sub, q.warnings)
    if group.kind == "run" and q.segments:
        _move_segment_runs(q, group, line_for)
    if q.segments and recomputed:
        d = q.reader.dialect
        sql = recomputed_sql(group, d) if q.fast else aggregate_sql(src_recomputed(d), group, d)
        params = q.params
        if q.fast and q.changes:
            # Only the price changes of slices that redid steps: the pieces of every other one are not read.
            needed = q.reader.query(recomputing_changes_sql(d), params)[0][0] or "[]"
            params = {**params, "price_changes": needed}
        for sub in sub_rows(q.reader, sql, params):
            line_for(sub).recomputed_usd += q.pricer.usd(sub, q.warnings)
    out = list(line_for.by_key.values())
    for line in out:
        # Subtracting floats can leave -1e-13 where the truth is 0.
        for name in ("billed_hours", "chip_hours", "cost_usd", "on_demand_usd", "spot_savings_usd"):
            if abs(getattr(line, name)) < 1e-9:
                setattr(line, name, 0.0)
    rest = line_for.by_key.get(NONE_KEY)
    if group.kind == "run" and rest is not None and not rest.slices and rest.chip_hours == 0:
        out.remove(rest)  # only the runs' shares were moved out of it: nothing is left
    days = _by_day(q, group, out, day_subs, partials)
    preemptions = sum(part.preemptions for part in partials)
    free = sum(part.free for part in partials)
    # The fast path sums the per-day rows in SQL (split_rows); its day_subs then hold only the pieces of
    # price-changed slices. The reference path's day_subs hold every per-day row.
    split_rows = [_day_row(r) for part in partials for r in part.split_rows]
    cells = [] if split is None else day_cells(q, split, [*day_subs, *split_rows])
    return Aggregate(sorted_lines(group, out), days, (preemptions, free, total_slices), cells)


def _day_row(r: tuple[Any, ...]) -> Sub:
    """A row of ``sql_scan.day_usd_sql`` (day, zone, type, capacity, priced, unpriced) as a ``Sub``."""
    return Sub(r[0], r[1], unnull(r[2]), unnull(r[3]), 0, 0.0, 0.0, r[4], r[5])


def _merge_partials(
    q: Query, partials: list[Partial], line_for: _Lines, *, by_group: bool
) -> tuple[int, list[Sub]]:
    """The scans' rows priced into their groups (when grouping by something else than days); returns
    the distinct slices counted and the per-day rows (each interval's first day, then the rest)."""
    total_slices = 0
    first_days: list[Sub] = []
    day_subs: list[Sub] = []
    for part in partials:
        for r in part.first_days:
            first_days.append(Sub(r[0], str(r[1]), unnull(r[2]), unnull(r[3]), r[4], *r[5:9]))
        for r in part.rows:
            key, zone, atype, capacity = unnull(r[0]), str(r[1]), unnull(r[2]), unnull(r[3])
            total_slices += int(r[5] or 0)
            if by_group:
                # The temp table's sums default to 0, never NULL: no conversion needed.
                billed = Sub(key, zone, atype, capacity, r[4], r[6], r[7], r[8], r[9])
                line = line_for(billed)
                line.slices += billed.slices
                q.pricer.add_billed(line, billed, q.warnings, sign=1.0)
                held = Sub(key, zone, atype, capacity, 0, 0.0, r[10], r[11], r[12])
                q.pricer.add_held(line, held, q.warnings)
        # Slices whose price changed: the scan billed them at their last price; take that back and
        # bill their pieces, each at its own price.
        for sub in part.changed_whole:
            q.pricer.add_billed(line_for(sub), sub, q.warnings, sign=-1.0)
        for sub in part.changed_subs:
            q.pricer.add_billed(line_for(sub), sub, q.warnings, sign=1.0)
        day_subs += part.later + part.changed_days
        day_subs += [negate(sub) for sub in part.changed_days_whole]
    return total_slices, first_days + day_subs


def _move_segment_runs(q: Query, group: GroupBy, line_for: _Lines) -> None:
    """Slices no run created are billed to the runs that ran on them, for the time they did; the rest of
    their time stays with "(none)"."""
    for sub in subs(q.reader, src_segment_runs(q.reader.dialect), group, q.params, count=True):
        line = line_for(sub)
        q.pricer.add_billed(line, sub, q.warnings, sign=1.0)
        line.slices += sub.slices
        none = Sub(None, sub.zone, sub.accelerator_type, sub.capacity, 0, sub.seconds, sub.chip_seconds,
                   sub.priced_usd_seconds, sub.unpriced_chip_seconds)  # fmt: skip
        q.pricer.add_billed(line_for(none), none, q.warnings, sign=-1.0)


def _by_day(
    q: Query, group: GroupBy, out: list[CostLine], day_subs: list[Sub], partials: list[Partial]
) -> list[dict[str, Any]]:
    """The per-day spend: the groups themselves when they are the days, else from the per-day rows."""
    by_day: dict[str, float] = {}
    if group.kind == "day":
        by_day = {line.key: line.cost_usd for line in out}
    else:
        for sub in day_subs:
            key = str(display_key(_DAY, sub))
            by_day[key] = by_day.get(key, 0.0) + q.pricer.usd(sub, q.warnings)
        for part in partials:
            for r in part.day_rows:
                sub = _day_row(r)
                key = str(display_key(_DAY, sub))
                by_day[key] = by_day.get(key, 0.0) + q.pricer.usd(sub, q.warnings)
    return [{"day": d, "cost_usd": _r(v)} for d, v in sorted(by_day.items())]
