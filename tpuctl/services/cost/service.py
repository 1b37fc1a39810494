"""Cost reports from the ledger: ``CostService``, the facade over the report's paths.

The billing rules are ``tpuctl.store.billing``'s (its docstring writes them out). Beyond spend, per group:
what the same chip-hours would have cost on demand (the on-demand list price of the same generation and
region) and so the spot savings; the cost of recomputed work; and quota held after preemption (in
chip-hours and at the slice's own price: GCP does not bill it, but the quota could have run something
else). Everything is clipped to the window ``[since, until)``.

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
computed in SQL by ``items`` (``item_report``), ranked by cost so that a ``limit`` (the table's 50)
computes and formats only the groups shown; their totals come from the aggregate path grouped by
nothing. ``CostService(fast=False)`` puts every grouping through the reference path (interval arithmetic
over every slice, scanned in parallel id ranges), which the fast one is tested against. Groups are
ordered most expensive first (days by date). The schema is the ledger's versioned one
(``tpuctl.store.schema``); a ledger of another version is refused with a clear error rather than
misread.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from tpuctl.errors import UsageError
from tpuctl.services.cost import items
from tpuctl.services.cost.aggregate import Query, aggregate_lines
from tpuctl.services.cost.attributed import ATTRIBUTED_KINDS, attributed_report
from tpuctl.services.cost.daily import DAY_SPLIT_GROUPINGS, splittable
from tpuctl.services.cost.details import dedupe, limited, mark_unknown_steps, run_info, slice_info
from tpuctl.services.cost.item_report import item_report
from tpuctl.services.cost.items import PREPARE
from tpuctl.services.cost.keyed import KEYED_KINDS, TOP_KINDS, keyed_report, top_day_cells
from tpuctl.services.cost.model import CostLine, CostReport
from tpuctl.services.cost.pricing import Pricer
from tpuctl.services.cost.scan import SCAN_TABLES, copy_changed_pods
from tpuctl.services.cost.scope import CostScope
from tpuctl.services.cost.sql_intervals import price_changes_sql, shares_exist_sql
from tpuctl.services.cost.sql_scan import preemption_kinds_sql
from tpuctl.services.cost.window import GroupBy
from tpuctl.store import shares_seen
from tpuctl.store.cost_reader import LedgerReader, open_reader
from tpuctl.store.cost_sql import null_key
from tpuctl.store.url import DatabaseUrl

if TYPE_CHECKING:
    from tpuctl.catalog import Catalog
    from tpuctl.services.cost.daily import DayCosts
    from tpuctl.services.prices import PriceSource
    from tpuctl.store.database import Database


#: The working tables of a report: its scan's and its slice and run groups'.
REPORT_TABLES: Final = (*SCAN_TABLES, *PREPARE)

#: The kind of a preemption no run's supervisor classified (a slice no run was on, one the listing found).
UNCLASSIFIED = "unclassified"


class CostService:
    """Builds cost reports from the ledger's database (its URL, or the open ``Database``, whose connections
    the reports then share), on either engine. ``catalog`` prices what the ledger left unpriced and
    gives the on-demand prices that savings are measured against."""

    def __init__(
        self,
        database: DatabaseUrl | Database,
        catalog: Catalog,
        prices: PriceSource,
        *,
        clock: Callable[[], float] = time.time,
        workers: int | None = None,
        fast: bool = True,
    ) -> None:
        self._database = database
        self._prices = prices
        self._clock = clock
        self._catalog = catalog
        self._pricer = Pricer(catalog)
        self._workers = workers if workers is not None else min(4, os.cpu_count() or 1)
        # False: every slice through the interval arithmetic (the reference the fast path is tested on).
        self._fast = fast

    @property
    def parallel_reports(self) -> bool:
        """Whether two reports at once run in parallel elsewhere: on a database server (PostgreSQL) each
        report's work is in a server process of its own, and this process mostly waits. A SQLite report's
        work is this process's CPU, where two at once took a fifth more of it (the threads contend for
        the same cores) for little less wall time."""
        url = self._database if isinstance(self._database, DatabaseUrl) else self._database.url
        return url.path is None

    def report(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        group_by: GroupBy | None = None,
        with_days: bool = True,
        limit: int | None = None,
        scope: CostScope | None = None,
        kinds_and_notes: bool = True,
    ) -> CostReport:
        """The report over ``[since, until)`` (until defaults to now). ``limit``: keep only the ``limit``
        costliest groups (None or 0: all); totals and per-day figures still cover every group.
        ``scope``: only the slices of some workspaces or of one principal (None: every slice;
        ``attributed``). ``kinds_and_notes``: False leaves ``preemption_kinds`` and ``price_notes`` empty
        (a reader that shows neither; the kinds are a look-up per preempted slice, a fifth of a
        1,000,000-event report's time)."""
        report, _ = self._report(since, until, group_by, with_days=with_days, limit=limit, scope=scope,
                                 kinds_and_notes=kinds_and_notes, split=False)  # fmt: skip
        return report

    def split_report(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        group_by: GroupBy,
        limit: int | None = None,
        kinds_and_notes: bool = True,
        with_days: bool = True,
    ) -> tuple[CostReport, list[DayCosts]]:
        """The report grouped by ``group_by`` over every slice, and each UTC day's billed USD split the
        same way (the dashboard's stacked bars), from few scans: a day's cells add up to its ``by_day``
        figure and a group's to its ``cost_usd``. By a slice's own fact (``daily.DAY_SPLIT_GROUPINGS``)
        from the report's own scan, by workspace or user from the owner rollup (``keyed``); by
        run, slice or label (thousands of groups) only the ``limit`` costliest groups are kept (the
        report's ``limit``) and split, each day's rest as ``keyed.OTHER_KEY``. ``with_days``: False leaves
        the report's ``by_day`` empty where the split does not need it (by workspace or user: a reader that
        draws the split, not the days, saves their scan)."""
        if group_by.kind in TOP_KINDS:
            if not limit:
                raise ValueError(f"a split by {group_by.name} keeps the costliest groups: give a limit")
        elif group_by.kind not in (*KEYED_KINDS, "day", "total"):
            splittable(group_by)
        with_days = with_days or group_by.kind not in KEYED_KINDS
        return self._report(since, until, group_by, with_days=with_days, limit=limit, scope=None,
                            kinds_and_notes=kinds_and_notes, split=True)  # fmt: skip

    def _report(
        self,
        since: float | None,
        until: float | None,
        group_by: GroupBy | None,
        *,
        with_days: bool,
        limit: int | None,
        scope: CostScope | None,
        kinds_and_notes: bool,
        split: bool,
    ) -> tuple[CostReport, list[DayCosts]]:
        """``report``, and with ``split`` (an aggregate grouping over every slice) its days split by
        its grouping."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        limit = limit or None
        now = self._clock()
        end = now if until is None else until
        group = group_by or GroupBy("slice")
        warnings: list[str] = list(self._prices.warnings)
        day_split: list[DayCosts] = []
        none_first_days: list[tuple[int, float, float]] | None = None
        with open_reader(self._database) as reader, reader.snapshot(REPORT_TABLES):
            params = _params(since, end, now, group, null_key(reader.dialect))
            q = self._query(reader, params, warnings, group)
            scope = scope or CostScope()
            if split and group.kind in KEYED_KINDS:
                (groups, groups_total, by_day, counts, totals), day_split = keyed_report(
                    q, group, with_days=with_days
                )
            elif group.kind in ATTRIBUTED_KINDS or not scope.everything:
                groups, groups_total, by_day, counts, totals = attributed_report(
                    q, group, scope, with_days=with_days, limit=limit
                )
            elif self._fast and group.kind in ("slice", "run"):
                groups, groups_total, by_day, counts, totals = item_report(
                    q, group, with_days=with_days, limit=limit
                )
                if group.kind == "run":  # its pass over "(none)" summed its first days too
                    none_first_days = items.none_first_days(reader)
            else:
                lines, by_day, counts, day_split = aggregate_lines(
                    q,
                    group,
                    with_days=with_days,
                    split=group if split and group.kind in DAY_SPLIT_GROUPINGS else None,
                )
                if group.kind == "slice":
                    slice_info(reader, lines)
                elif group.kind == "run":
                    run_info(reader, lines)
                totals = CostLine("total")
                for line in lines:
                    totals.add(line)
                groups_total = len(lines)
                groups = [line.to_dict() for line in limited(group, lines, limit)]
            if split and group.kind not in KEYED_KINDS and group.kind not in DAY_SPLIT_GROUPINGS:
                keys = [str(g["key"]) for g in groups]
                day_split = top_day_cells(q, group, keys, by_day, none_first_days=none_first_days)
            if group.kind == "run":
                mark_unknown_steps(reader, groups)
            notes: dict[str, str] = {}
            kinds: dict[str, int] = {}
            if kinds_and_notes:
                notes = self._price_notes(reader, q.params)
                kinds_sql = preemption_kinds_sql(reader.dialect, scoped=not scope.everything)
                kinds = {str(kind or UNCLASSIFIED): int(n) for kind, n in reader.query(kinds_sql, q.params)}
        preemptions, free, total_slices = counts
        totals.key = "total"
        totals.slices = total_slices
        report = CostReport(
            group_by=group,
            since=since,
            until=end,
            now=now,
            groups=groups,
            totals=totals,
            by_day=by_day,
            preemptions=int(preemptions),
            free_preemptions=int(free),
            preemption_kinds=kinds,
            prices=self._prices,
            groups_total=groups_total,
            limit=limit,
            warnings=dedupe(warnings),
            price_notes=notes,
        )
        return report, day_split

    def _price_notes(self, reader: LedgerReader, params: dict[str, Any]) -> dict[str, str]:
        """The price table's notes on the generations of the slices billed in the window (TPU7x: its
        price's unit is unconfirmed), so the report says so beside the figures they make."""
        rows = reader.query(
            "SELECT DISTINCT accelerator_type FROM pods WHERE ready_at IS NOT NULL AND ready_at < :until "
            "AND COALESCE(ended_at, :now) > :since",
            params,
        )
        notes: dict[str, str] = {}
        for (atype,) in rows:
            try:
                generation = self._catalog.resolve(str(atype)).generation.name
            except UsageError:
                continue
            note = self._prices.note_for(generation)
            if note:
                notes[generation] = note
        return dict(sorted(notes.items()))

    def cost_per_day(
        self, *, since: float | None = None, until: float | None = None, group_by: GroupBy
    ) -> list[DayCosts]:
        """Each UTC day's billed USD in ``[since, until)`` split by ``group_by`` (one of
        ``daily.DAY_SPLIT_GROUPINGS``), in one scan: the cells whose rows and columns add up to the
        report's ``by_day`` and ``groups``."""
        if group_by.kind in KEYED_KINDS:
            return self.split_report(since=since, until=until, group_by=group_by, kinds_and_notes=False)[1]
        splittable(group_by)
        now = self._clock()
        end = now if until is None else until
        warnings: list[str] = []
        with open_reader(self._database) as reader, reader.snapshot(REPORT_TABLES):
            q = self._query(
                reader, _params(since, end, now, GroupBy("day"), null_key(reader.dialect)), warnings
            )
            return aggregate_lines(
                q, GroupBy("total"), with_days=True, recomputed=False, split=group_by
            ).day_split

    def run_groups(
        self, run_ids: Sequence[str], *, since: float | None = None, until: float | None = None
    ) -> list[dict[str, Any]]:
        """These runs' groups of ``cost report --group-by run`` over ``[since, until)`` (its JSON records;
        a run billed nothing in the window has none), computed for them alone (``run_groups``)."""
        from tpuctl.services.cost.run_groups import run_groups

        return self._run_query(since, until, lambda q: run_groups(q, run_ids))

    def runs_by_waste(
        self, count: int, *, since: float | None = None, until: float | None = None
    ) -> list[dict[str, Any]]:
        """The ``count`` groups of ``cost report --group-by run`` over ``[since, until)`` with the most
        ``waste_usd``, most first (none that wasted nothing), without computing every run's group."""
        from tpuctl.services.cost.run_groups import waste_candidates

        # A run whose steps are unknown has no waste figure (``_run_query`` marks it).
        groups = self._run_query(since, until, lambda q: waste_candidates(q, count))
        wasted = [g for g in groups if (g["waste_usd"] or 0) > 0]
        wasted.sort(key=lambda g: (-float(g["waste_usd"]), str(g["key"])))
        return wasted[:count]

    def _run_query(
        self, since: float | None, until: float | None, groups_of: Callable[[Any], list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """``groups_of`` some runs' groups of the run report over ``[since, until)``, in one read
        snapshot, each marked where its steps are unknown (as the report marks them)."""
        now = self._clock()
        end = now if until is None else until
        with open_reader(self._database) as reader, reader.snapshot(REPORT_TABLES):
            params = _params(since, end, now, GroupBy("run"), null_key(reader.dialect))
            # Only some runs' slices are read: their changed slices' rows are copied (``run_groups``).
            q = self._query(reader, params, [], copy_changes=False)
            groups = groups_of(q)
            mark_unknown_steps(reader, groups)
            return groups

    def spend(self, *, since: float | None = None, until: float | None = None) -> float:
        """Total billed USD in the window (for budgets)."""
        report = self.report(since=since, until=until, group_by=GroupBy("total"), with_days=False)
        return report.totals.cost_usd

    def _query(
        self,
        reader: LedgerReader,
        params: dict[str, Any],
        warnings: list[str],
        group: GroupBy | None = None,
        *,
        copy_changes: bool = True,
    ) -> Query:
        """The report's query state, with what the ledger holds: run segments on slices, price changes,
        whether runs may have shares of slices they did not create (exactly, for a report by run:
        ``group``).
        ``copy_changes``: the price-changed slices' rows are copied for the queries that read them
        (``scan.copy_changed_pods``); False where the caller copies those it reads."""
        segments, seen = reader.query(
            f"SELECT EXISTS (SELECT 1 FROM run_segments WHERE pod IS NOT NULL), ({shares_seen.SEEN_SQL})", {}
        )[0]
        shares = bool(segments) and bool(seen)  # unseen: no run ever ran on a slice no run created
        if shares and group is not None and group.kind == "run":
            shares = bool(reader.query(shares_exist_sql(reader.dialect), {})[0][0])
        changes = reader.query(price_changes_sql(reader.dialect), {})
        params["price_changes"] = json.dumps([c for c in changes if c[0] is not None])
        if copy_changes and changes:
            copy_changed_pods(reader, params)
        return Query(
            reader=reader, params=params, warnings=warnings, pricer=self._pricer, fast=self._fast,
            workers=self._workers, segments=bool(segments), changes=bool(changes), shares=shares,
        )  # fmt: skip


def _params(since: float | None, until: float, now: float, group: GroupBy, null: str) -> dict[str, Any]:
    return {
        # -inf would do, but SQLite binds it as a REAL fine only on some builds: a far past is plain.
        "since": -1e18 if since is None else float(since),
        "until": float(until),
        "now": float(now),
        "label_path": f'$."{group.label_key}"' if group.label_key else "$",
        "label_key": group.label_key or "",
        "price_changes": "[]",
        "null_key": null,
        "lo": -(2**62),
        "hi": 2**62,
    }
