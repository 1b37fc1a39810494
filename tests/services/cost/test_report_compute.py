"""A Compute Engine slice in the ledger is a slice like any other: a tpu7x slice's life (create, READY,
delete) is billed per second from READY to its deletion at the TPU7x list price, with the price's source,
date and the note that its unit is unconfirmed; nothing on the way looks up a TPU API name or runtime."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tpuctl.catalog import CapacityType
from tpuctl.services.cost import CostService, parse_group_by
from tpuctl.services.prices import load_catalog
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
ZONE = "us-central1-c"  # a TPU7x zone


def _tpu7x_life(ledger: Ledger, name: str, *, price: float | None, ready_s: float) -> None:
    """requested -> created (the instances' MIG) -> READY (every host RUNNING) -> deleted."""
    ledger.record_event(
        EventKind.REQUESTED, pod=name, zone=ZONE, accelerator_type="tpu7x-64", chips=32,
        capacity=CapacityType.ON_DEMAND, price_per_chip_hour=price, ts=T0 - 420, backend="sim",
        project="tpuctl-sim",
    )  # fmt: skip
    ledger.record_event(EventKind.CREATED, pod=name, zone=ZONE, ts=T0 - 400)
    ledger.record_event(EventKind.READY, pod=name, zone=ZONE, ts=T0)
    ledger.record_event(EventKind.DELETED, pod=name, zone=ZONE, ts=T0 + ready_s)


def test_a_tpu7x_slice_is_billed_at_the_tpu7x_price_with_its_source_and_note(
    tmp_path: Path, open_ledger: Callable[..., Ledger]
) -> None:
    catalog, source = load_catalog(tmp_path / "state", "sim")
    price = catalog.prices.per_chip_hour("tpu7x", "us-central1", CapacityType.ON_DEMAND)
    assert price == 12.0
    with open_ledger() as ledger:
        _tpu7x_life(ledger, "ce-7x", price=price, ready_s=1800)
        _tpu7x_life(ledger, "ce-7x-unpriced", price=None, ready_s=900)  # priced from the catalog
        service = CostService(ledger.url, catalog, source, clock=lambda: T0 + 3600)
        report = service.report(group_by=parse_group_by("slice"))

    doc = report.to_dict()
    by_name = {g["name"]: g for g in doc["groups"]}
    priced = by_name["ce-7x"]
    assert (priced["accelerator_type"], priced["chips"], priced["capacity"]) == ("tpu7x-64", 32, "on-demand")
    assert priced["price_per_chip_hour"] == 12.0
    assert priced["cost_usd"] == 192.0  # 32 chips x 12.00 x 0.5 h, per second from READY
    assert priced["billed_hours"] == 0.5 and priced["state"] == "DELETED"
    assert by_name["ce-7x-unpriced"]["cost_usd"] == 96.0  # 32 x 12.00 x 0.25 h at the catalog's price
    assert doc["totals"]["cost_usd"] == 288.0
    assert doc["totals"]["on_demand_usd"] == 288.0 and doc["totals"]["spot_savings_usd"] == 0.0
    catalog_doc = doc["prices"]["catalog"]
    assert (catalog_doc["source"], catalog_doc["date"]) == (catalog.prices.source, catalog.prices.date)
    note = doc["prices"]["notes"]["tpu7x"]
    assert "unconfirmed" in note and "per chip" in note
    assert catalog_doc["notes"]["tpu7x"] == note
    # The unpriced one is said to be at the catalog's price; no "no price for tpu7x-64" warning.
    assert doc["warnings"] == [
        "some slices had no price in the ledger; they are priced at the catalog's current list price"
    ]


def test_a_report_without_tpu7x_carries_no_tpu7x_note(
    tmp_path: Path, open_ledger: Callable[..., Ledger]
) -> None:
    catalog, source = load_catalog(tmp_path / "state", "sim")
    with open_ledger() as ledger:
        ledger.record_event(
            EventKind.REQUESTED, pod="v5e", zone="us-central1-a", accelerator_type="v5litepod-8", chips=8,
            capacity=CapacityType.SPOT, price_per_chip_hour=0.245, ts=T0 - 60, backend="sim",
        )  # fmt: skip
        ledger.record_event(EventKind.READY, pod="v5e", zone="us-central1-a", ts=T0)
        report = CostService(ledger.url, catalog, source, clock=lambda: T0 + 3600).report()
    assert report.price_notes == {}
    # Neither does a window that ends before the tpu7x slice was READY.
    with open_ledger() as ledger:
        _tpu7x_life(ledger, "later", price=12.0, ready_s=60)
        early = CostService(ledger.url, catalog, source, clock=lambda: T0 + 3600).report(until=T0 - 1)
    assert early.price_notes == {}
