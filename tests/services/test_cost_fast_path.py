"""The report's fast path (closed slices summed from the billing facts the view function stored) gives
exactly what the interval arithmetic over every slice gives, for every aggregate grouping and window,
on a random ledger with open slices, window cuts, price changes (within a day and across midnight),
free and paid preemptions, quota held after preemption and unpriced slices."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.services.cost import CostService, parse_group_by
from tpuctl.services.prices import PriceSource
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, NewEvent
from tpuctl.store.schema import ROLLUP_CHECK_SQL

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
DAY = 86400.0
ZONES = ("us-central1-a", "us-east1-c", "europe-west4-b")
TYPES = (("v5litepod-8", 8), ("v5litepod-64", 64), ("v6e-16", 16))


def _ledger(path: Path, seed: int) -> Path:
    rng = random.Random(seed)
    events: list[NewEvent] = []
    for n in range(300):
        zone = rng.choice(ZONES)
        accel, chips = rng.choice(TYPES)
        capacity = rng.choice((CapacityType.SPOT, CapacityType.PREEMPTIBLE, CapacityType.ON_DEMAND))
        price = None if rng.random() < 0.05 else rng.choice((0.245, 1.2, 3.22))
        ready = T0 + rng.uniform(-3 * DAY, 3 * DAY)
        common: dict[str, Any] = {"pod": f"s{n}", "zone": zone}
        events.append(
            NewEvent(EventKind.REQUESTED, accelerator_type=accel, chips=chips, capacity=capacity,
                     price_per_chip_hour=price, labels={"team": rng.choice("ab")}, ts=ready - 60, **common)
        )  # fmt: skip
        events.append(NewEvent(EventKind.READY, ts=ready, **common))
        life = rng.choice((30.0, 45.0, 90.0, rng.expovariate(1 / 20000.0), rng.uniform(DAY, 2.5 * DAY)))
        # (Not on unpriced slices: their time before a first price_change has no recorded price, which
        # the stored facts price from the catalog while the reference bills it at the later price.)
        if price is not None and rng.random() < 0.25:
            events.append(
                NewEvent(EventKind.PRICE_CHANGE, price_per_chip_hour=rng.choice((0.5, 2.0)),
                         ts=ready + life * rng.random(), **common)
            )  # fmt: skip
        end = ready + life
        if end > T0 + 3.5 * DAY or rng.random() < 0.05:
            continue  # still open at report time
        if capacity != "on-demand" and rng.random() < 0.4:
            events.append(NewEvent(EventKind.PREEMPTED, ts=end, **common))
            if rng.random() < 0.8:
                events.append(NewEvent(EventKind.DELETED, ts=end + rng.uniform(10, 7200), **common))
        else:
            events.append(NewEvent(EventKind.DELETED, ts=end, **common))
    events.sort(key=lambda e: e.ts or 0.0)
    with Ledger(path) as ledger:
        ledger.record_events_bulk(events)
        assert ledger.check_view() == []
        db = ledger.path
    conn = sqlite3.connect(db)
    try:  # the rollup the triggers kept is what the pods view sums to
        stored = conn.execute("SELECT * FROM cost_rollup ORDER BY 1, 2, 3, 4, 5").fetchall()
        assert stored == conn.execute(ROLLUP_CHECK_SQL).fetchall()
        assert stored
    finally:
        conn.close()
    return db


def _rounded(doc: dict[str, Any]) -> dict[str, Any]:
    def walk(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 4)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(doc)  # type: ignore[no-any-return]


WINDOWS = [
    (None, None),
    (T0 - DAY, None),  # since a midnight-ish instant
    (T0 - 1.5 * DAY + 1234.5, T0 + 0.7 * DAY),  # cut on both sides, off day boundaries
    (T0 - 2 * DAY, T0 + 5 * DAY),  # until after now
]


@pytest.mark.parametrize("seed", [1, 2])
def test_fast_path_equals_interval_arithmetic(tmp_path: Path, seed: int) -> None:
    db = _ledger(tmp_path / "state", seed)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    now = T0 + 4 * DAY

    def service(fast: bool) -> CostService:
        return CostService(db, catalog, source, clock=lambda: now, workers=1, fast=fast)

    for group in ("zone", "region", "type", "capacity", "day", "label:team"):
        for since, until in WINDOWS:
            fast, slow = (
                service(f).report(since=since, until=until, group_by=parse_group_by(group)).to_dict()
                for f in (True, False)
            )
            assert _rounded(fast) == _rounded(slow), (group, since, until)
            assert fast["totals"]["cost_usd"] > 0
