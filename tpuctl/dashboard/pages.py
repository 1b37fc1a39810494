"""What each page shows, read from the services the CLI's ``-o json`` prints: ``Runs`` (`runs list`,
`runs describe`), ``CostService`` (`cost report`) and the ledger's live slices (`pod list`'s ledger half).

A page never computes a figure of its own that the CLI also gives: a run's cost is its group of
``cost report --group-by run``, the money page's totals are the report's totals, a run's preemptions and
recovery times are its describe's. The only arithmetic here is drawing (where a mark goes), a slice's
USD/h and age (chips x the price the ledger recorded, now - ready), a run's productive USD (its cost less
its recomputed work) and a budget's remainder and month's projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from markupsafe import Markup

from tpuctl.dashboard import svg

if TYPE_CHECKING:
    from tpuctl.server.queue_view import QueuedRun
    from tpuctl.services.cost import CostLine, CostReport, CostScope, CostService, GroupBy
    from tpuctl.services.prices import PriceSource
    from tpuctl.services.run.service import Runs
    from tpuctl.services.run.views import RunDescription, RunView
    from tpuctl.services.session import Session
    from tpuctl.store.records import PodRecord
    from tpuctl.teams.workspaces import Workspaces

#: The groupings the money page links to (any ``cost report --group-by`` is taken as ``?group_by=``; a
#: grouping added to `cost report` is offered by adding it here).
MONEY_GROUPINGS: Final = ("workspace", "user", "type", "capacity", "zone", "region", "run")
#: Groupings with a group per run, slice or label value (thousands on a team's ledger): the page draws and
#: lists only the costliest, one colour of the chart's palette each, and each day's rest as one part.
SHOWN_GROUPS: Final = len(svg.GROUP_COLOURS)
_DAY_S: Final = 86_400.0
#: The runs the money page lists by waste.
TOP_WASTE: Final = 10
#: A host log page's last lines (`runs logs` has them all).
HOST_LOG_LINES: Final = 20_000


def epoch(text: str | None) -> float | None:
    """An ISO time as the services print it (``2026-09-21T14:13:20.000Z``) -> epoch seconds."""
    return None if text is None else datetime.fromisoformat(text).timestamp()


@dataclass(frozen=True)
class RunRow:
    run: RunView
    cost_usd: float | None  # its group of `cost report --group-by run` (None: nothing billed yet)
    goodput: float | None  # its recovery record's


@dataclass(frozen=True)
class RunSlice:
    """One slice a run had (an attempt of it: its number in creation order), as the ledger has it, with
    its USD: its group of `cost report --group-by slice`; ``tries``: the placement attempts its request
    made (zones and capacities tried before it was placed)."""

    number: int
    name: str
    zone: str
    accelerator_type: str | None
    capacity: str | None
    state: str
    created_at: str | None
    ended_at: str | None
    end_reason: str | None
    cost_usd: float | None
    tries: int


@dataclass(frozen=True)
class RunPage:
    described: RunDescription
    cost: CostLine | None  # its group of `cost report --group-by run`
    live: bool
    spans: tuple[svg.Span, ...]
    marks: tuple[svg.Mark, ...]
    slices: tuple[RunSlice, ...] = ()

    @property
    def cost_split(self) -> Markup:
        """The run's cost so far as productive (billed, less the recomputed work) and wasted (recomputed
        work and quota held after preemptions) USD: `cost report --group-by run`'s figures."""
        if self.cost is None:
            return svg.cost_split(None, None)
        return svg.cost_split(self.productive_usd, self.cost.waste_usd)

    @property
    def productive_usd(self) -> float | None:
        return None if self.cost is None else round(self.cost.cost_usd - self.cost.recomputed_usd, 6)

    @property
    def timeline(self) -> Markup:
        return svg.timeline(self.spans, self.marks)

    @property
    def loss(self) -> Markup:
        return svg.series(self.described.series.loss, name="loss", unit="")

    @property
    def step_time(self) -> Markup:
        return svg.series(self.described.series.step_time_s, name="step time", unit="s")


@dataclass(frozen=True)
class Budget:
    """A workspace's month so far against its ``usd_per_month``: its spend to the end of each day, and
    the month's projection (the spend so far at the same rate to the month's end)."""

    workspace: str
    usd_per_month: float
    month: str  # YYYY-MM
    spent_by_day: tuple[tuple[str, float], ...]  # (day, spend from the month's start to that day's end)
    projected_usd: float

    @property
    def spent_usd(self) -> float:
        return self.spent_by_day[-1][1] if self.spent_by_day else 0.0

    @property
    def chart(self) -> Markup:
        return svg.burn_down(self.spent_by_day, self.usd_per_month, self.projected_usd, self.days_in_month)

    @property
    def days_in_month(self) -> int:
        import calendar

        year, month = (int(part) for part in self.month.split("-"))
        return calendar.monthrange(year, month)[1]


@dataclass(frozen=True)
class MoneyPage:
    report: CostReport  # the whole window, grouped as asked: its to_dict is `cost report -o json`'s body
    days: tuple[svg.DayStack, ...]
    groups: tuple[str, ...]
    #: `cost report --group-by run`'s groups that wasted anything, most waste first (its JSON records).
    top_waste: tuple[dict[str, Any], ...] = ()
    budgets: tuple[Budget, ...] = ()
    #: Why no burn-down is drawn (None: one per workspace with a monthly budget is).
    budget_note: str | None = None

    @property
    def chart(self) -> Markup:
        return svg.stacked_bars(self.days, self.groups)

    @property
    def shown_of(self) -> tuple[int, int] | None:
        """(groups listed, groups in all) when the report kept only its costliest groups, else None."""
        shown, total = len(self.report.groups), self.report.groups_total
        return (shown, total) if total > shown else None

    @property
    def other_colour(self) -> str | None:
        """The colour of the days' "(other)" parts (the groups not listed), if any is drawn."""
        from tpuctl.services.cost.keyed import OTHER_KEY

        drawn = any(key == OTHER_KEY for day in self.days for key, _ in day.parts)
        return svg.OTHER_COLOUR if drawn else None

    @property
    def waste_chart(self) -> Markup:
        return svg.ranked_bars([(str(g["key"]), float(g["waste_usd"] or 0.0)) for g in self.top_waste])

    @property
    def document(self) -> dict[str, Any]:
        return self.report.to_dict()


@dataclass(frozen=True)
class SliceRow:
    name: str
    zone: str
    state: str
    accelerator_type: str | None
    capacity: str | None
    usd_per_hour: float | None
    age_s: float | None
    run_id: str | None
    ended_at: str | None = None  # a gone slice's end, and why it ended (the ledger's end_reason)
    end_reason: str | None = None


class Dashboard:
    """The pages' data over one session (its ledger, catalog and clock) and the catalog's price source."""

    def __init__(self, session: Session, prices: PriceSource, workspaces: Workspaces | None = None) -> None:
        from tpuctl.teams.workspaces import Workspaces

        self._session = session
        self._prices = prices
        self._workspaces = workspaces if workspaces is not None else Workspaces.implicit()

    def _costs(self) -> CostService:
        from tpuctl.services.cost import CostService

        s = self._session
        return CostService(s.ledger.database, s.catalog, self._prices, clock=s.clock)

    def _scope(self) -> CostScope | None:
        """The slices the viewer's reports cover: None, every slice (a local ledger, a scrape of it all);
        else those of the workspaces the session's actor may see (a team server's member), exactly as
        the API's cost report is scoped."""
        from tpuctl.services.cost import CostScope

        visible = self._session.actor.visible
        return None if visible is None else CostScope(visible)

    def _runs(self) -> Runs:
        from tpuctl.services.run.service import Runs

        return Runs(self._session)

    def _run_cost(self, run_id: str) -> CostLine | None:
        """The run's group of `cost report --group-by run` (its figures rounded as the JSON has them)."""

        groups = self._costs().run_groups([run_id])
        return None if not groups else _cost_line(groups[0])

    def runs(self, *, limit: int) -> list[RunRow]:
        """`runs list --limit`'s runs, newest first, each with its cost so far (its group of `cost report
        --group-by run`, computed for the runs shown alone) and goodput."""
        views = self._runs().list_runs(limit=limit)
        costs = {g["key"]: g for g in self._costs().run_groups([v.run_id for v in views])}
        rows = []
        for view in views:
            recovery = view.detail.get("recovery") or {}
            goodput = recovery.get("goodput") if isinstance(recovery, dict) else None
            cost = costs.get(view.run_id)
            rows.append(RunRow(view, None if cost is None else cost["cost_usd"], goodput))
        return rows

    def run(self, ref: str) -> RunPage:
        """`runs describe RUN`, its cost so far, and its timeline's marks."""
        runs = self._runs()
        described = runs.describe(ref)
        spans = tuple(
            svg.Span(s.kind, start, start + s.duration_s)
            for s in described.segments
            if (start := epoch(s.start)) is not None
        )
        return RunPage(
            described=described,
            cost=self._run_cost(described.run.run_id),
            live=runs.is_live(described.run.run_id),
            spans=spans,
            marks=_preemption_marks(described, spans),
            slices=self._run_slices(described.run.run_id),
        )

    def _run_slices(self, run_id: str) -> tuple[RunSlice, ...]:
        """The run's slices, oldest first, each with its group of `cost report --group-by slice` (the
        report over the window from the run's first slice on, which holds each of them whole)."""
        from tpuctl.services.cost import GroupBy
        from tpuctl.timefmt import iso_or_none

        ledger = self._session.ledger
        pods = ledger.list_pods(run_id=run_id)
        if not pods:
            return ()
        starts = [t for p in pods if (t := p.requested_at or p.created_at or p.ready_at) is not None]
        report = self._costs().report(
            since=min(starts) if starts else None,
            group_by=GroupBy("slice"),
            with_days=False,
            scope=self._scope(),
        )
        usd = {(g.get("zone"), g.get("name"), g.get("incarnation")): g["cost_usd"] for g in report.groups}
        return tuple(
            RunSlice(
                number=i,
                name=p.name,
                zone=p.zone,
                accelerator_type=p.accelerator_type,
                capacity=None if p.capacity is None else p.capacity.value,
                state=str(p.state),
                created_at=iso_or_none(p.created_at or p.requested_at),
                ended_at=iso_or_none(p.ended_at),
                end_reason=p.end_reason,
                cost_usd=usd.get((p.zone, p.name, p.incarnation)),
                tries=len(ledger.attempts(p.request_id)) if p.request_id else 0,
            )
            for i, p in enumerate(pods, start=1)
        )

    def host_log(self, ref: str, worker: int) -> str:
        """Host ``worker``'s log of the run, as `runs logs RUN --worker N --raw --all` prints it: the
        ledger's lines (wherever the run was supervised, a run taken over included), else this machine's
        log file. At most the last ``HOST_LOG_LINES`` lines."""
        from collections import deque

        runs = self._runs()
        logs = runs.logs(ref, worker=worker)  # exit 2 (a 400) for a worker the run does not have
        lines = deque((line.text for line in runs.read_logs(logs)), maxlen=HOST_LOG_LINES)
        return "".join(f"{text}\n" for text in lines)

    def money(self, *, group_by: str, since: str | None) -> MoneyPage:
        """`cost report --group-by G [--since S]` (offline: the dashboard records nothing), each day's
        cost split the same way, the runs that wasted most, and each workspace's budget burn-down. The
        report and its day split come from few scans (``CostService.split_report``); by run, slice or
        label only the ``SHOWN_GROUPS`` costliest groups are listed and drawn (`cost report --limit`: the
        totals still cover every group), each day's rest as one "(other)" part. The page draws neither
        the preemptions by kind, nor the price table's notes, nor the report's own days (the split is
        drawn): the report leaves them out where it can.

        The waste ranking is asked beside the report where reports run in parallel elsewhere
        (``CostService.parallel_reports``: PostgreSQL's server processes; 0.12 s of each page at 1,000,000
        events), else after it: on SQLite, asked at once on two connections, the two took a fifth more CPU
        between them (0.50 s against 0.41 s: the two threads contend for the same cores) for 0.06 s less
        wall time on an idle machine, and none on a busy one."""
        from concurrent.futures import ThreadPoolExecutor

        from tpuctl.services.cost import parse_group_by, parse_window

        group = parse_group_by(group_by)
        now = self._session.clock()
        start, end = parse_window(since, None, now=now)
        # The pool starts its thread at the first task only: none on SQLite.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpuctl-waste") as pool:
            beside = pool.submit(self.top_waste, start, end) if self._costs().parallel_reports else None
            whole, days = self._money_report(group, start, end)
            top_waste = self.top_waste(start, end) if beside is None else beside.result()
        return MoneyPage(
            whole, days, tuple(str(g["key"]) for g in whole.groups), top_waste=top_waste, **self._budgets(now)
        )

    def _money_report(
        self, group: GroupBy, start: float | None, end: float
    ) -> tuple[CostReport, tuple[svg.DayStack, ...]]:
        """The money page's report, and each day's cost split by its grouping (none for a scoped viewer)."""
        from tpuctl.services.cost.keyed import TOP_KINDS

        costs, scope = self._costs(), self._scope()
        limit = SHOWN_GROUPS if group.kind in TOP_KINDS else None
        # A scoped report has no per-day figures (docs/cost.md, Attribution), nor is the day split
        # scoped: a member's page draws no days rather than other workspaces' cost.
        if scope is not None:
            whole = costs.report(
                since=start, until=end, group_by=group, scope=scope, limit=limit, kinds_and_notes=False
            )
            return whole, ()
        whole, split = costs.split_report(
            since=start, until=end, group_by=group, limit=limit, kinds_and_notes=False, with_days=False
        )
        return whole, tuple(svg.DayStack(d.day, d.groups) for d in split)

    def top_waste(
        self, start: float | None, end: float, *, count: int = TOP_WASTE
    ) -> tuple[dict[str, Any], ...]:
        """The ``count`` groups of `cost report --group-by run` that wasted most (none that wasted
        nothing), most first; a scoped viewer's from their own runs' report."""
        from tpuctl.services.cost import GroupBy

        scope = self._scope()
        if scope is None:
            return tuple(self._costs().runs_by_waste(count, since=start, until=end))
        report = self._costs().report(since=start, until=end, group_by=GroupBy("run"), with_days=False,
                                      scope=scope)  # fmt: skip
        wasted = [g for g in report.groups if float(g.get("waste_usd") or 0) > 0]
        return tuple(sorted(wasted, key=lambda g: -float(g["waste_usd"]))[:count])

    def _budgets(self, now: float) -> dict[str, Any]:
        """The burn-down of each workspace with a ``usd_per_month``, or why there is none."""
        from tpuctl.errors import UsageError
        from tpuctl.services.cost import parse_group_by

        actor = self._session.actor
        budgeted = [w for w in self._workspaces if w.usd_per_month is not None and actor.may_see(w.name)]
        if not budgeted:
            where = "this server's workspace file" if self._workspaces.source else "the local workspace"
            return {"budget_note": f"No workspace has a monthly budget (usd_per_month) in {where}: "
                                   "there is no burn-down to draw."}  # fmt: skip
        try:
            group = parse_group_by("workspace")
        except UsageError:
            return {"budget_note": "A workspace's spend needs `cost report --group-by workspace`, which "
                                   "this tpuctl does not have: no burn-down is drawn."}  # fmt: skip
        month = datetime.fromtimestamp(now, UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        first = month.timestamp()
        # Every workspace's days (a scoped report has none), of which only the visible workspaces' budgets
        # are drawn: nothing of another workspace reaches the page.
        split = self._costs().cost_per_day(since=first, until=now, group_by=group)
        days = tuple(svg.DayStack(d.day, d.groups) for d in split)
        return {
            "budgets": tuple(_budget(w.name, float(w.usd_per_month or 0), month, days, now) for w in budgeted)
        }

    def queue(self) -> list[QueuedRun]:
        """`tpuctl queue`'s runs: what waits for room, why, in the order the server will admit it (the
        viewer's workspaces only)."""
        from tpuctl.server.queue_view import queue_of
        from tpuctl.services.cost.monthly_spend import this_month_spend

        return queue_of(
            self._session, self._workspaces, this_month_spend(self._session, now=self._session.clock())
        )

    def slices(self, *, gone_since: float | None = None) -> list[SliceRow]:
        """The slices the ledger has alive (not ended), oldest first; with ``gone_since``, then the ones
        that ended since then, the last to end first, with when and why they ended."""
        now = self._session.clock()
        ledger = self._session.ledger
        seen = self._session.actor.may_see  # a slice of a workspace the viewer may not see is not shown
        rows = [_slice_row(pod, now) for pod in ledger.list_pods(alive=True) if seen(pod.workspace)]
        if gone_since is not None:
            gone = [
                p
                for p in ledger.list_pods(alive=False, since=gone_since)
                if (p.ended_at or 0) >= gone_since and seen(p.workspace)
            ]
            gone.sort(key=lambda p: (-(p.ended_at or 0.0), -p.id))
            rows += [_slice_row(pod, now) for pod in gone]
        return rows


def _slice_row(pod: PodRecord, now: float) -> SliceRow:
    """A slice's row: USD/h = chips x the price the ledger recorded; age = from ready (else created, else
    asked for) to its end, or to now while it lives."""
    from tpuctl.timefmt import iso_or_none

    per_chip, chips = pod.price_per_chip_hour, pod.chips
    since = pod.ready_at or pod.created_at or pod.requested_at
    return SliceRow(
        name=pod.name,
        zone=pod.zone,
        state=str(pod.state),
        accelerator_type=pod.accelerator_type,
        capacity=None if pod.capacity is None else pod.capacity.value,
        usd_per_hour=None if per_chip is None or chips is None else round(per_chip * chips, 6),
        age_s=None if since is None else round((pod.ended_at or now) - since, 1),
        run_id=pod.run_id,
        ended_at=iso_or_none(pod.ended_at),
        end_reason=pod.end_reason,
    )


def _preemption_marks(described: RunDescription, spans: tuple[svg.Span, ...]) -> tuple[svg.Mark, ...]:
    """A mark per preemption of the recovery record, where it was detected (its ``detected_at``), else at
    the start of the matching preempted segment."""
    records = described.recovery.record.get("preemptions") or []
    preempted = [s for s in spans if s.kind == "preempted"]
    marks = []
    for i, view in enumerate(described.recovery.preemptions):
        record = records[i] if i < len(records) and isinstance(records[i], dict) else {}
        at = epoch(record.get("detected_at")) if isinstance(record.get("detected_at"), str) else None
        if at is None and i < len(preempted):
            at = preempted[i].start
        step = record.get("last_step")
        if at is not None:
            marks.append(
                svg.Mark(
                    at,
                    view.number or i + 1,
                    view.kind or "unclassified",
                    step if isinstance(step, int) else None,
                    detection_latency_s=view.detection_latency_s,
                    recovery_s=view.recovery_s,
                )
            )
    return tuple(marks)


def _budget(
    name: str, usd_per_month: float, month: datetime, days: tuple[svg.DayStack, ...], now: float
) -> Budget:
    """``name``'s spend to the end of each day of the month so far, and its projection to the month's
    end at the month's rate so far."""
    import calendar

    spent, running = [], 0.0
    for day in days:
        running += sum(usd for key, usd in day.parts if key == name)
        spent.append((day.day, round(running, 6)))
    days_in_month = calendar.monthrange(month.year, month.month)[1]
    elapsed = max(now - month.timestamp(), 1.0)
    projected = round(running / elapsed * days_in_month * _DAY_S, 2)
    return Budget(name, usd_per_month, month.strftime("%Y-%m"), tuple(spent), projected)


def _cost_line(group: dict[str, Any]) -> CostLine:
    """A group record of the report's JSON as a ``CostLine`` (the report's own ``lines`` conversion)."""
    from tpuctl.services.cost.model import FIGURE_FIELDS, CostLine

    figures: dict[str, Any] = {n: 0.0 if group[n] is None else group[n] for n in FIGURE_FIELDS}
    return CostLine(str(group["key"]), **figures)
