"""A reconciled cost report: the live listing is fetched while the report is computed, and the report is
computed again only when reconciliation recorded an event (which it then bills)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.cloud.base import Node, TpuCloud
from tpuctl.errors import NotFoundError, TransientError
from tpuctl.services.cost import CostReport, CostService, GroupBy
from tpuctl.services.cost.reconcile import InBackground, Reconciler, reconciled_report
from tpuctl.services.prices import PriceSource
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, LedgerError, PodState
from tpuctl.testing.clock import FakeClock

T0 = 1_800_000_000.0
Z = "us-central1-a"


class FakeCloud:
    """Lists ``nodes``; ``gate``, when given, holds the listing until the report has started."""

    backend = "sim"
    project = "p"

    def __init__(
        self, nodes: list[Node], gate: threading.Event | None = None, error: Exception | None = None
    ) -> None:
        self.nodes = nodes
        self.gate = gate
        self.error = error
        self.listed_on: str | None = None

    def list_nodes(self, zone: str | None) -> list[Node]:
        self.listed_on = threading.current_thread().name
        if self.gate is not None and not self.gate.wait(10):
            raise AssertionError("the report never started while the listing was out")
        if self.error is not None:
            raise self.error
        return list(self.nodes)

    def get_node(self, zone: str, name: str) -> Node:
        raise NotFoundError(f"{name} not found")


def _node(name: str, state: str = "READY") -> Node:
    return Node(name=name, zone=Z, accelerator_type="v5litepod-8", state=state, capacity=CapacityType.SPOT)


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger]) -> Ledger:
    led = open_ledger()
    for name in ("kept", "vanished"):
        led.record_event(EventKind.REQUESTED, pod=name, zone=Z, accelerator_type="v5litepod-8", chips=8,
                         capacity=CapacityType.SPOT, price_per_chip_hour=0.245, ts=T0 - 60, backend="sim",
                         project="p")  # fmt: skip
        led.record_event(EventKind.READY, pod=name, zone=Z, ts=T0)
    return led


def _reconciled(
    ledger: Ledger, cloud: FakeCloud, report: Any, *, at: float = T0 + 3600, dry_run: bool = False
) -> CostReport:
    tpu = cast(TpuCloud, cloud)  # the two calls reconciliation makes, and the backend it filters on
    reconciler = Reconciler(ledger, tpu, Catalog.load(), clock=lambda: at)
    return reconciled_report(reconciler, tpu, report, dry_run=dry_run)


def _reporter(ledger: Ledger, clock: FakeClock) -> tuple[list[CostReport], Callable[[], CostReport]]:
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    service = CostService(ledger.url, catalog, source, clock=clock)
    made: list[CostReport] = []

    def report() -> CostReport:
        made.append(service.report(group_by=GroupBy("slice")))
        return made[-1]

    return made, report


def test_the_listing_runs_while_the_report_is_computed_and_nothing_recorded_means_one_report(
    ledger: Ledger,
) -> None:
    gate = threading.Event()
    cloud = FakeCloud([_node("kept"), _node("vanished"), _node("rogue")], gate=gate)
    made, report = _reporter(ledger, FakeClock(T0 + 3600))

    def report_then_open_gate() -> CostReport:
        gate.set()  # the listing can only finish once the report has begun: they overlap
        return report()

    result = _reconciled(ledger, cloud, report_then_open_gate)

    assert cloud.listed_on == "tpuctl-cost-listing"
    assert len(made) == 1
    assert [u["name"] for u in result.untracked] == ["rogue"]
    assert result.reconciled == []
    assert result.totals.cost_usd == pytest.approx(2 * 8 * 0.245)


def test_an_event_reconciliation_records_is_billed_by_a_second_report(ledger: Ledger) -> None:
    cloud = FakeCloud([_node("kept")])  # "vanished" is gone from the listing (and its GET)
    clock = FakeClock(T0 + 3600)
    made, report = _reporter(ledger, clock)

    def later_report() -> CostReport:
        clock.advance(1800 if made else 0)  # the second report runs half an hour after the gone event
        return report()

    result = _reconciled(ledger, cloud, later_report)

    assert len(made) == 2
    (action,) = result.reconciled
    assert (action["name"], action["event"], action["recorded"]) == ("vanished", "gone", True)
    pod = ledger.get_pod("vanished", zone=Z)
    assert pod is not None and pod.state is PodState.DELETED and pod.ended_at == T0 + 3600
    # The report returned is the second: "vanished" billed 1 h (until seen gone), "kept" 1.5 h (until now).
    assert result is made[1]
    assert result.totals.cost_usd == pytest.approx(8 * 0.245 * 2.5)


def test_a_dry_run_records_nothing_and_reports_once(ledger: Ledger) -> None:
    cloud = FakeCloud([_node("kept")])
    made, report = _reporter(ledger, FakeClock(T0 + 3600))

    result = _reconciled(ledger, cloud, report, dry_run=True)

    assert len(made) == 1
    assert [a["recorded"] for a in result.reconciled] == [False]
    pod = ledger.get_pod("vanished", zone=Z)
    assert pod is not None and pod.alive


def test_a_failed_listing_fails_the_report(ledger: Ledger) -> None:
    cloud = FakeCloud([], error=TransientError("list nodes: could not connect"))
    made, report = _reporter(ledger, FakeClock(T0 + 3600))

    with pytest.raises(TransientError, match="could not connect"):
        _reconciled(ledger, cloud, report)
    assert len(made) == 1  # computed while the listing was out; its failure fails the command


def _early(ledger: Ledger, cloud: FakeCloud, report: Any, first: InBackground[CostReport]) -> CostReport:
    tpu = cast(TpuCloud, cloud)
    reconciler = Reconciler(ledger, tpu, Catalog.load(), clock=lambda: T0 + 3600)
    return reconciled_report(reconciler, tpu, report, first=first)


def test_a_report_started_before_the_session_is_the_one_returned(ledger: Ledger) -> None:
    cloud = FakeCloud([_node("kept"), _node("vanished")])
    made, report = _reporter(ledger, FakeClock(T0 + 3600))
    first = InBackground(report, name="tpuctl-cost-report")

    result = _early(ledger, cloud, report, first)

    assert len(made) == 1 and result is made[0]  # not computed a second time
    assert result.totals.cost_usd == pytest.approx(2 * 8 * 0.245)


def test_a_report_started_before_the_ledger_could_be_read_is_computed_again(ledger: Ledger) -> None:
    cloud = FakeCloud([_node("kept"), _node("vanished")])
    made, report = _reporter(ledger, FakeClock(T0 + 3600))

    def too_early() -> CostReport:
        raise LedgerError("the ledger has schema version 7; cost reports know version 8")

    result = _early(ledger, cloud, report, InBackground(too_early, name="tpuctl-cost-report"))

    assert len(made) == 1 and result is made[0]  # the session's own report, on the migrated ledger
    assert result.totals.cost_usd == pytest.approx(2 * 8 * 0.245)


def test_an_early_report_that_fails_otherwise_fails_the_command(ledger: Ledger) -> None:
    cloud = FakeCloud([_node("kept"), _node("vanished")])
    made, report = _reporter(ledger, FakeClock(T0 + 3600))

    def broken() -> CostReport:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        _early(ledger, cloud, report, InBackground(broken, name="tpuctl-cost-report"))
    assert made == []
