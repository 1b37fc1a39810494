"""Some runs' groups, computed for them alone, are the full ``cost report --group-by run``'s records of
those runs, in every window of the fast path's random ledger (runs that created slices, runs on slices they
did not create, price changes, recomputed steps, quota held), in the order asked."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from test_fast_path import DAY, T0, WINDOWS, _ledger

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.services.cost import CostService, parse_group_by
from tpuctl.services.prices import PriceSource
from tpuctl.store.ledger import Ledger


@pytest.mark.slow_on_postgresql
def test_some_runs_groups_are_the_full_reports_records_of_them(open_ledger: Callable[..., Ledger]) -> None:
    db = _ledger(open_ledger, 6)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    service = CostService(db, catalog, source, clock=lambda: T0 + 4 * DAY, workers=1)
    rng = random.Random(7)
    wasted = 0
    for since, until in WINDOWS:
        full = service.report(since=since, until=until, group_by=parse_group_by("run")).to_dict()["groups"]
        by_key = {g["key"]: g for g in full if g["key"] != "(none)"}
        asked = [*rng.sample(sorted(by_key), k=min(5, len(by_key))), "r-not-in-the-ledger"]
        got = service.run_groups(asked, since=since, until=until)
        assert got == [by_key[k] for k in asked if k in by_key], (since, until)
        wasted += sum(1 for g in got if g["waste_usd"])
        assert service.run_groups(sorted(by_key), since=since, until=until) == [
            by_key[k] for k in sorted(by_key)
        ]
    assert wasted > 0  # the figures a run's page splits by were exercised
    assert service.run_groups([]) == []


@pytest.mark.slow_on_postgresql
def test_the_runs_that_wasted_most_are_the_full_reports(open_ledger: Callable[..., Ledger]) -> None:
    db = _ledger(open_ledger, 6)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    service = CostService(db, catalog, source, clock=lambda: T0 + 4 * DAY, workers=1)
    for since, until in WINDOWS:
        full = service.report(since=since, until=until, group_by=parse_group_by("run")).to_dict()["groups"]
        wasted = [g for g in full if g["key"] != "(none)" and (g["waste_usd"] or 0) > 0]
        wasted.sort(key=lambda g: (-g["waste_usd"], g["key"]))
        assert len(wasted) > 3
        for count in (1, 3, len(wasted) + 2):
            assert service.runs_by_waste(count, since=since, until=until) == wasted[:count], (since, until)


def test_the_runs_that_wasted_most_among_many_are_found_from_the_stored_waste(
    open_ledger: Callable[..., Ledger],
) -> None:
    """More wasting runs than candidates (5 per run shown): the ledger's waste by run picks them, the
    quota still held (not deleted, growing with the clock) included; the same runs as the full report."""
    from tpuctl.store import EventKind, NewEvent

    zone, now = "us-central1-a", T0 + 2 * DAY
    with open_ledger() as db:
        events = []
        for n in range(30):
            run, pod, ended = f"r{n:02d}", f"p{n:02d}", T0 + 3600 + n
            db.create_run(run, script="train.py", ts=T0)
            price = 1.0 + n % 7
            events += [
                NewEvent(EventKind.REQUESTED, pod=pod, zone=zone, ts=T0, run_id=run, chips=8,
                         accelerator_type="v5e-8", capacity=CapacityType.SPOT, price_per_chip_hour=price),
                NewEvent(EventKind.READY, pod=pod, zone=zone, ts=T0 + 600),
                NewEvent(EventKind.PREEMPTED, pod=pod, zone=zone, ts=ended),
            ]  # fmt: skip
            if n != 3:  # r03 still holds its quota: the most, by now
                events.append(NewEvent(EventKind.DELETED, pod=pod, zone=zone, ts=ended + 60 * (n % 11)))
        db.record_events_bulk(events)
        catalog = Catalog.load()
        source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
        service = CostService(db.url, catalog, source, clock=lambda: now, workers=1)
        full = service.report(group_by=parse_group_by("run")).to_dict()["groups"]
        wasted = sorted(
            (g for g in full if (g["waste_usd"] or 0) > 0), key=lambda g: (-g["waste_usd"], g["key"])
        )
        assert wasted[0]["key"] == "r03" and len(wasted) > 5 * 2
        for count in (1, 2):
            assert service.runs_by_waste(count) == wasted[:count]
