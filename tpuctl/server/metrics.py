"""``GET /metrics``: the ledger's figures in the Prometheus text format (prometheus-client), read when
scraped. Every metric, its labels and the CLI command whose number it equals: docs/metrics.md.

A scrape reads the ledger with a handful of aggregate queries in one read snapshot (runs by state, the
queue and its waits, the slices billing now, the goodput sums of the recovery records), the preemptions of
the preempted runs (each read through ``PreemptionView``, as `runs describe` reads it), and the cost report
grouped by workspace (``CostService``, the one behind `cost report`) on a thread beside them: nothing is kept
between scrapes, so two replicas answer alike.

Who may scrape is the server's gate's to say (``tpuctl.server.auth``): a bearer token whose SHA-256 is the
workspace file's ``metrics.scrape_token_sha256`` sees every workspace's series, a member's ID token only
those of the workspaces they belong to (a scrape must not show what `runs list` would hide from them).
Without a workspace file the server is one user's on loopback and ``/metrics`` is open, like the rest of
its API.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from tpuctl.store.cost_sql import fence, is_pg
from tpuctl.store.records import LOCAL_WORKSPACE, RunStatus

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from tpuctl.services.cost import CostLine
    from tpuctl.services.prices import PriceSource
    from tpuctl.services.session import Session
    from tpuctl.store.cost_reader import LedgerReader
    from tpuctl.store.sql import Dialect
    from tpuctl.teams.workspaces import Workspaces

#: A run's wait in the server's queue: from seconds (room appeared at once) through minutes (a run ended)
#: to hours and a day (a workspace at its monthly dollars waits for the next month's share).
QUEUE_WAIT_BUCKETS_S: Final = (10.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0)
#: From a preemption's first evidence to the supervisor knowing: a notice is seen within seconds, a hard
#: preemption when the hosts or the API say so (tens of seconds to minutes).
DETECTION_BUCKETS_S: Final = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: From detection to training running again: a new slice's creation and setup, minutes to an hour or more
#: while no zone has capacity.
RECOVERY_BUCKETS_S: Final = (60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0)
#: A run in one of these has ended: one that entered the queue and ended there (cancelled) waits no more.
_FINISHED: Final = tuple(s.value for s in RunStatus if s.finished)


@dataclass
class Histogram:
    """Observations against fixed upper bounds, counted cumulatively (Prometheus' ``le`` buckets)."""

    bounds: tuple[float, ...]
    at_or_below: list[int] = field(default_factory=list)  # per bound
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.at_or_below:
            self.at_or_below = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.at_or_below[i] += 1
        self.count += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        # A bound written as prometheus-client writes its own (60.0): the same le label either way.
        le = [(str(float(b)), float(n)) for b, n in zip(self.bounds, self.at_or_below, strict=True)]
        return [*le, ("+Inf", float(self.count))]


@dataclass
class WorkspaceFigures:
    """One workspace's figures at scrape time."""

    runs: dict[str, int] = field(default_factory=dict)  # status -> runs
    queued: int = 0
    queue_wait: Histogram = field(default_factory=lambda: Histogram(QUEUE_WAIT_BUCKETS_S))
    preemptions: int = 0
    recoveries: int = 0
    detection: Histogram = field(default_factory=lambda: Histogram(DETECTION_BUCKETS_S))
    recovery: Histogram = field(default_factory=lambda: Histogram(RECOVERY_BUCKETS_S))
    burning_usd_per_hour: dict[str, float] = field(default_factory=dict)  # capacity -> USD/h
    billing_slices: dict[str, int] = field(default_factory=dict)  # capacity -> slices
    spent_usd: float = 0.0
    recomputed_usd: float = 0.0
    productive_s: float = 0.0
    wall_s: float = 0.0

    @property
    def goodput(self) -> float | None:
        """Productive step time over wall time, summed over the runs whose goodput is known."""
        return None if self.wall_s <= 0 else self.productive_s / self.wall_s


class Figures(defaultdict[str, WorkspaceFigures]):
    """Every workspace's figures, by name (rows from before workspaces: ``LOCAL_WORKSPACE``)."""

    def __init__(self) -> None:
        super().__init__(WorkspaceFigures)


def read_figures(session: Session, prices: PriceSource, known: Iterable[str] = ()) -> Figures:
    """The ledger's figures now, for every workspace it has rows of and every one in ``known``."""
    from tpuctl.services.cost import InBackground
    from tpuctl.store.cost_reader import open_reader

    # The cost report (most of a scrape's time, in the database) overlaps the other queries.
    costs = InBackground(lambda: _workspace_costs(session, prices), name="tpuctl-metrics-cost")
    figures = Figures()
    for name in known:
        figures.setdefault(name, WorkspaceFigures())  # a workspace of the file shows its zeros
    with open_reader(session.ledger.url) as reader, reader.snapshot():
        params = {"local": LOCAL_WORKSPACE}
        _read_runs(reader, params, figures)
        _read_queue(reader, params, figures)
        _read_recoveries(reader, params, figures)
        _read_goodput(reader, params, figures)
        _read_burning(reader, params, figures)
    _add_costs(costs.result(), figures)
    return figures


def _read_runs(reader: LedgerReader, params: dict[str, Any], figures: Figures) -> None:
    """Runs by status, and their preemptions (`runs list`'s ``preemptions``), per workspace."""
    rows = reader.query(
        "SELECT COALESCE(workspace, :local), status, COUNT(*), SUM(preemptions) FROM runs GROUP BY 1, 2",
        params,
    )
    for workspace, status, runs, preemptions in rows:
        figures[workspace].runs[str(status)] = int(runs)
        figures[workspace].preemptions += int(preemptions or 0)


def _read_queue(reader: LedgerReader, params: dict[str, Any], figures: Figures) -> None:
    """Runs waiting now, and the waits of the runs admitted (``queued_at`` to ``admitted_at``)."""
    finished = ", ".join(f"'{s}'" for s in _FINISHED)
    waiting = reader.query(
        "SELECT COALESCE(workspace, :local), COUNT(*) FROM runs WHERE queued_at IS NOT NULL "
        f"AND admitted_at IS NULL AND status NOT IN ({finished}) GROUP BY 1",
        params,
    )
    for workspace, runs in waiting:
        figures[workspace].queued = int(runs)
    wait = "(admitted_at - queued_at)"
    # Each bucket counted in SQL: one row per workspace, whatever the number of runs.
    at_or_below = ", ".join(f"SUM(CASE WHEN {wait} <= {b!r} THEN 1 ELSE 0 END)" for b in QUEUE_WAIT_BUCKETS_S)
    rows = reader.query(
        f"SELECT COALESCE(workspace, :local), COUNT(*), SUM({wait}), {at_or_below} FROM runs "
        "WHERE queued_at IS NOT NULL AND admitted_at IS NOT NULL GROUP BY 1",
        params,
    )
    for workspace, count, total, *buckets in rows:
        histogram = figures[workspace].queue_wait
        histogram.count, histogram.total = int(count), float(total or 0.0)
        histogram.at_or_below = [int(n or 0) for n in buckets]


def _read_recoveries(reader: LedgerReader, params: dict[str, Any], figures: Figures) -> None:
    """The preemptions of each run's recovery record, each read as `runs describe` reads it
    (``PreemptionView``): its detection latency and its recovery time (one with a recovery time is a
    recovery: training ran again). Only the preempted runs' records are read (``runs.preemptions`` is
    the length of that list, written with it)."""
    from tpuctl.services.run.views import PreemptionView

    preemptions = _json_text("detail", ("recovery", "preemptions"), reader.dialect)
    rows = reader.query(
        f"SELECT COALESCE(workspace, :local), {preemptions} FROM runs WHERE preemptions > 0", params
    )
    for workspace, listed in rows:
        into = figures[workspace]
        for record in _json_list(listed):
            preemption = PreemptionView.of(record)
            if preemption.detection_latency_s is not None:
                into.detection.observe(preemption.detection_latency_s)
            if preemption.recovery_s is not None:
                into.recoveries += 1
                into.recovery.observe(preemption.recovery_s)


def _read_goodput(reader: LedgerReader, params: dict[str, Any], figures: Figures) -> None:
    """The productive step time and wall time of the recovery records whose goodput is known (those
    `runs describe` shows a goodput for), summed in SQL: every run's record, so not parsed one by one
    here. Each record is cut out of its run's detail once (the fence keeps the subquery from being
    flattened into three cuts a row)."""
    d = reader.dialect
    record = "CAST(detail AS jsonb) -> 'recovery'" if is_pg(d) else "json_extract(detail, '$.recovery')"
    productive, wall, goodput = (
        _json_number("r", key, d) for key in ("productive_step_s", "wall_s", "goodput")
    )
    rows = reader.query(
        f"SELECT ws, SUM({productive}), SUM({wall}) FROM (SELECT COALESCE(workspace, :local) AS ws, "
        f"{record} AS r FROM runs WHERE detail IS NOT NULL {fence(d)}) AS j "
        f"WHERE {goodput} IS NOT NULL AND {productive} IS NOT NULL AND {wall} > 0 GROUP BY ws",
        params,
    )
    for workspace, productive_s, wall_s in rows:
        figures[workspace].productive_s = float(productive_s)
        figures[workspace].wall_s = float(wall_s)


def _json_text(document: str, path: tuple[str, ...], dialect: Dialect) -> str:
    """The JSON at ``path`` of the JSON text ``document``, as JSON text (NULL where there is none)."""
    if is_pg(dialect):
        return f"(CAST({document} AS jsonb) #>> '{{{','.join(path)}}}')"
    return f"json_extract({document}, '$.{'.'.join(path)}')"


def _json_number(document: str, key: str, dialect: Dialect) -> str:
    """The number under ``key`` of the JSON object ``document`` (jsonb on PostgreSQL, JSON text on
    SQLite), or NULL."""
    if is_pg(dialect):
        return f"CAST({document} ->> '{key}' AS DOUBLE PRECISION)"
    return f"json_extract({document}, '$.{key}')"


def _json_list(text: str | None) -> list[dict[str, Any]]:
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []  # not JSON: nothing a scrape can read (runs describe shows the record as stored)
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _read_burning(reader: LedgerReader, params: dict[str, Any], figures: Figures) -> None:
    """The slices billing now (READY and not ended: the billing rules' span) with a recorded price: chips x
    USD per chip-hour, per workspace and capacity type."""
    rows = reader.query(
        "SELECT COALESCE(workspace, :local), COALESCE(capacity, 'unknown'), COUNT(*), "
        "SUM(chips * price_per_chip_hour) FROM pods WHERE ended_at IS NULL AND ready_at IS NOT NULL "
        "AND chips IS NOT NULL AND price_per_chip_hour IS NOT NULL GROUP BY 1, 2",
        params,
    )
    for workspace, capacity, slices, usd_per_hour in rows:
        figures[workspace].billing_slices[str(capacity)] = int(slices)
        figures[workspace].burning_usd_per_hour[str(capacity)] = float(usd_per_hour or 0.0)


def _workspace_costs(session: Session, prices: PriceSource) -> list[CostLine]:
    """`cost report --group-by workspace`'s groups, from the same service: each slice counts for its own
    workspace (its run's, else its maker's; a slice from before workspaces for ``LOCAL_WORKSPACE``)."""
    from tpuctl.services.cost import CostService, GroupBy

    service = CostService(session.ledger.url, session.catalog, prices, clock=session.clock)
    return service.report(group_by=GroupBy("workspace"), with_days=False).lines


def _add_costs(lines: list[CostLine], figures: Figures) -> None:
    for line in lines:
        into = figures[str(line.key)]
        into.spent_usd += line.cost_usd
        into.recomputed_usd += line.recomputed_usd


class LedgerMetrics(Collector):
    """The collector of one app: reads the ledger on every ``collect`` (a scrape), limited to
    ``visible`` workspaces (None: all)."""

    def __init__(
        self,
        session: Session,
        prices: PriceSource,
        workspaces: Collection[str] = (),
        visible: frozenset[str] | None = None,
    ) -> None:
        self._session = session
        self._prices = prices
        self._workspaces = tuple(workspaces)
        self._visible = visible

    def scoped(self, visible: frozenset[str] | None) -> LedgerMetrics:
        """The same collector showing only ``visible``'s series (None: all)."""
        return LedgerMetrics(self._session, self._prices, self._workspaces, visible)

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration: reading the ledger there would be a side effect

    def collect(self) -> Iterator[Metric]:
        figures = read_figures(self._session, self._prices, self._workspaces)
        shown = {
            name: f for name, f in sorted(figures.items()) if self._visible is None or name in self._visible
        }
        yield from families(shown)


def families(figures: dict[str, WorkspaceFigures]) -> Iterator[Metric]:
    """The metric families of ``figures`` (names, help and labels: docs/metrics.md)."""
    yield from _run_families(figures)
    yield from _recovery_families(figures)
    yield from _money_families(figures)


def _run_families(figures: dict[str, WorkspaceFigures]) -> Iterator[Metric]:
    runs = GaugeMetricFamily("tpuctl_runs", "Runs in the ledger by state.", labels=["workspace", "state"])
    queued = GaugeMetricFamily("tpuctl_queued_runs", "Runs waiting in the queue now.", labels=["workspace"])
    wait = HistogramMetricFamily(
        "tpuctl_queue_wait_seconds", "Time admitted runs waited in the queue.", labels=["workspace"]
    )
    for ws, f in figures.items():
        for state, n in sorted(f.runs.items()):
            runs.add_metric([ws, state], n)
        queued.add_metric([ws], f.queued)
        wait.add_metric([ws], f.queue_wait.buckets(), f.queue_wait.total)
    yield from (runs, queued, wait)


def _recovery_families(figures: dict[str, WorkspaceFigures]) -> Iterator[Metric]:
    ws_label = ["workspace"]
    preemptions = CounterMetricFamily("tpuctl_preemptions", "Preemptions of runs.", labels=ws_label)
    recoveries = CounterMetricFamily(
        "tpuctl_recoveries", "Preemptions after which training ran again.", labels=ws_label
    )
    detection = HistogramMetricFamily(
        "tpuctl_preemption_detection_latency_seconds",
        "From a preemption's first evidence to its detection.",
        labels=ws_label,
    )
    recovery = HistogramMetricFamily(
        "tpuctl_recovery_seconds", "From a preemption's detection to training running again.", labels=ws_label
    )
    goodput = GaugeMetricFamily(
        "tpuctl_goodput_ratio", "Productive step time over wall time of runs.", labels=ws_label
    )
    productive = GaugeMetricFamily(
        "tpuctl_productive_step_seconds",
        "Productive step time of runs with a known goodput.",
        labels=ws_label,
    )
    wall = GaugeMetricFamily(
        "tpuctl_run_wall_seconds", "Wall time of runs with a known goodput.", labels=ws_label
    )
    for ws, f in figures.items():
        preemptions.add_metric([ws], f.preemptions)
        recoveries.add_metric([ws], f.recoveries)
        detection.add_metric([ws], f.detection.buckets(), f.detection.total)
        recovery.add_metric([ws], f.recovery.buckets(), f.recovery.total)
        productive.add_metric([ws], f.productive_s)
        wall.add_metric([ws], f.wall_s)
        if f.goodput is not None:
            goodput.add_metric([ws], f.goodput)
    yield from (preemptions, recoveries, detection, recovery, goodput, productive, wall)


def _money_families(figures: dict[str, WorkspaceFigures]) -> Iterator[Metric]:
    burning = GaugeMetricFamily(
        "tpuctl_burn_rate_usd_per_hour",
        "USD per hour of the slices billing now.",
        labels=["workspace", "capacity"],
    )
    slices = GaugeMetricFamily(
        "tpuctl_billing_slices", "Slices billing now.", labels=["workspace", "capacity"]
    )
    spent = CounterMetricFamily("tpuctl_spent_usd", "USD billed.", labels=["workspace"])
    recomputed = CounterMetricFamily(
        "tpuctl_recomputed_usd", "USD of slice time whose work was recomputed.", labels=["workspace"]
    )
    for ws, f in figures.items():
        for capacity in sorted(f.burning_usd_per_hour):
            burning.add_metric([ws, capacity], f.burning_usd_per_hour[capacity])
            slices.add_metric([ws, capacity], f.billing_slices[capacity])
        spent.add_metric([ws], f.spent_usd)
        recomputed.add_metric([ws], f.recomputed_usd)
    yield from (burning, slices, spent, recomputed)


# --- the route -------------------------------------------------------------------------------------------


def metrics_router(
    session: Session, workspaces: Workspaces, *, prices: PriceSource | None = None
) -> APIRouter:
    """``GET /metrics`` over ``session``'s ledger, showing the series of the workspaces the request's actor
    may see (``tpuctl.server.gate``: the scrape token's actor sees all, a member theirs, and without a
    workspace file the server's own actor sees all); ``prices``: the catalog's price source (None: loaded
    as `cost report` loads it)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from tpuctl.server.gate import scoped

    if prices is None:
        from tpuctl.services.prices import load_catalog

        prices = load_catalog(session.state_dir, session.backend.name)[1]
    metrics = LedgerMetrics(session, prices, list(workspaces.workspaces))
    router = APIRouter()

    @router.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}},
    )
    def scrape() -> Response:
        """The ledger's figures (docs/metrics.md), for a scrape token or a member's ID token."""
        # A registry per scrape, not per app: what it shows depends on who asks.
        registry = CollectorRegistry(auto_describe=False)
        registry.register(metrics.scoped(scoped(session).actor.visible))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router
