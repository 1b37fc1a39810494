"""What each page shows, read from the services the CLI's ``-o json`` prints: ``Runs`` (`runs list`,
`runs describe`), ``CostService`` (`cost report`) and the ledger's live slices (`pod list`'s ledger half).

A page never computes a figure of its own that the CLI also gives: a run's cost is its group of
``cost report --group-by run``, the money page's totals are the report's totals, a run's preemptions and
recovery times are its describe's. The only arithmetic here is drawing (where a mark goes) and a live
slice's USD/h and age (chips x the price the ledger recorded, now - ready).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from markupsafe import Markup

from tpuctl.dashboard import svg

if TYPE_CHECKING:
    from tpuctl.services.cost import CostLine, CostReport, CostService
    from tpuctl.services.prices import PriceSource
    from tpuctl.services.run.service import Runs
    from tpuctl.services.run.views import RunDescription, RunView
    from tpuctl.services.session import Session

#: The groupings the money page stacks its days by (``cost report --group-by``'s that are not one group
#: per slice or day).
MONEY_GROUPINGS: Final = ("type", "capacity", "zone", "region", "run")
_DAY_S: Final = 86_400.0
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
class RunPage:
    described: RunDescription
    cost: CostLine | None  # its group of `cost report --group-by run`
    live: bool
    spans: tuple[svg.Span, ...]
    marks: tuple[svg.Mark, ...]

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
class MoneyPage:
    report: CostReport  # the whole window, grouped as asked: its to_dict is `cost report -o json`'s body
    days: tuple[svg.DayStack, ...]
    groups: tuple[str, ...]

    @property
    def chart(self) -> Markup:
        return svg.stacked_bars(self.days, self.groups)

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


class Dashboard:
    """The pages' data over one session (its ledger, catalog and clock) and the catalog's price source."""

    def __init__(self, session: Session, prices: PriceSource) -> None:
        self._session = session
        self._prices = prices

    def _costs(self) -> CostService:
        from tpuctl.services.cost import CostService

        s = self._session
        return CostService(s.ledger.url, s.catalog, self._prices, clock=s.clock)

    def _runs(self) -> Runs:
        from tpuctl.services.run.service import Runs

        return Runs(self._session)

    def _run_costs(self) -> dict[str, CostLine]:
        """Each run's group of `cost report --group-by run` (its figures rounded as the JSON has them)."""
        from tpuctl.services.cost import GroupBy

        report = self._costs().report(group_by=GroupBy("run"), with_days=False)
        return {line.key: line for line in report.lines}

    def runs(self, *, limit: int) -> list[RunRow]:
        """`runs list --limit`'s runs, newest first, each with its cost so far and goodput."""
        views = self._runs().list_runs(limit=limit)
        costs = self._run_costs()
        rows = []
        for view in views:
            recovery = view.detail.get("recovery") or {}
            goodput = recovery.get("goodput") if isinstance(recovery, dict) else None
            cost = costs.get(view.run_id)
            rows.append(RunRow(view, None if cost is None else cost.cost_usd, goodput))
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
            cost=self._run_costs().get(described.run.run_id),
            live=runs.is_live(described.run.run_id),
            spans=spans,
            marks=_preemption_marks(described, spans),
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
        """`cost report --group-by G [--since S]` (offline: the dashboard records nothing), and each
        day's cost grouped the same way (the report over that day alone)."""
        from tpuctl.services.cost import parse_group_by, parse_window

        group = parse_group_by(group_by)
        costs = self._costs()
        start, end = parse_window(since, None, now=self._session.clock())
        whole = costs.report(since=start, until=end, group_by=group)
        days = []
        for day in whole.by_day:
            first = datetime.fromisoformat(day["day"]).replace(tzinfo=UTC).timestamp()
            that_day = costs.report(
                since=max(first, start if start is not None else first),
                until=min(first + _DAY_S, whole.until),
                group_by=group,
                with_days=False,
            )
            parts = tuple((str(g["key"]), float(g["cost_usd"])) for g in that_day.groups if g["cost_usd"])
            days.append(svg.DayStack(day["day"], parts))
        return MoneyPage(whole, tuple(days), tuple(str(g["key"]) for g in whole.groups))

    def slices(self) -> list[SliceRow]:
        """The slices the ledger has alive (not ended), oldest first."""
        now = self._session.clock()
        rows = []
        for pod in self._session.ledger.list_pods(alive=True):
            per_chip, chips = pod.price_per_chip_hour, pod.chips
            since = pod.ready_at or pod.created_at or pod.requested_at
            rows.append(
                SliceRow(
                    name=pod.name,
                    zone=pod.zone,
                    state=str(pod.state),
                    accelerator_type=pod.accelerator_type,
                    capacity=None if pod.capacity is None else pod.capacity.value,
                    usd_per_hour=None if per_chip is None or chips is None else round(per_chip * chips, 6),
                    age_s=None if since is None else round(now - since, 1),
                    run_id=pod.run_id,
                )
            )
        return rows


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
                )
            )
    return tuple(marks)
