"""A calendar month's spend per workspace and per user (what the queue and the metrics read): the cost
report's own figures, the month's part only, productive and wasted."""

from __future__ import annotations

from pathlib import Path

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.services.cost import CostService, Spend, month_spend
from tpuctl.services.cost.monthly_spend import month_bounds, month_of
from tpuctl.services.prices import PriceSource
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, SegmentKind

FEB = month_bounds(2027, 2)[0]  # 2027-02-01T00:00Z
Z = "us-central1-a"


def _slice(
    ledger: Ledger, name: str, ready: float, hours: float, *, run_id: str | None = None,
    principal: str | None = None, workspace: str | None = None,
) -> None:  # fmt: skip
    """A v5e-8 on demand at 0.5 USD per chip-hour: 4 USD an hour."""
    ledger.record_event(
        EventKind.REQUESTED, pod=name, zone=Z, accelerator_type="v5litepod-8", chips=8,
        capacity=CapacityType.ON_DEMAND, price_per_chip_hour=0.5, ts=ready - 60, run_id=run_id,
        principal=principal, workspace=workspace,
    )  # fmt: skip
    ledger.record_event(EventKind.READY, pod=name, zone=Z, ts=ready)
    ledger.record_event(EventKind.DELETED, pod=name, zone=Z, ts=ready + hours * 3600)


def test_month_spend_per_workspace_and_user(tmp_path: Path) -> None:
    """On SQLite only: the report it sums is held equal on both engines by the cost report's tests."""
    ledger = Ledger(tmp_path / "state")
    ledger.create_run("r1", script="t.py", principal="a1", workspace="team-a", ts=FEB)
    _slice(ledger, "a", FEB + 3600, 2, run_id="r1")  # 8 USD, a quarter of it recomputed below
    segment = ledger.add_segment("r1", SegmentKind.RUNNING, pod="a", zone=Z, start=FEB + 3600)
    ledger.close_segment(segment, end=FEB + 3 * 3600, steps_completed=100, steps_recomputed=25)
    _slice(ledger, "b", FEB + 3600, 1, principal="a2", workspace="team-a")  # 4 USD
    _slice(ledger, "c", FEB + 3600, 3, principal="b1", workspace="team-b")  # 12 USD
    _slice(ledger, "jan", FEB - 2 * 3600, 4, principal="b1", workspace="team-b")  # 8 USD: 2 h in Feb
    _slice(ledger, "mar", month_bounds(2027, 3)[0], 1, principal="b1", workspace="team-b")  # March
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    service = CostService(ledger.url, catalog, source, clock=lambda: FEB + 40 * 86400)

    spend = month_spend(service, *month_of(FEB + 86400))

    assert spend.month == "2027-02"
    assert spend.by_workspace == {"team-a": Spend(12.0, 2.0), "team-b": Spend(20.0, 0.0)}
    assert spend.by_principal == {
        ("team-a", "a1"): Spend(8.0, 2.0),
        ("team-a", "a2"): Spend(4.0, 0.0),
        ("team-b", "b1"): Spend(20.0, 0.0),
    }
    assert spend.by_workspace["team-a"].productive_usd == 10.0
    ledger.close()
    start, end = month_bounds(2026, 12)  # December's end is January's start
    assert (end - start) / 86400 == 31 and month_of(end) == (2027, 1)
