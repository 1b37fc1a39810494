"""A report by run with a limit ranks only candidates (the runs with the highest bounds on their cost, and
those a bound may miss), yet gives the full ranking's first groups and count: on the fast path's random
ledgers (runs on slices they did not create, price changes, unpriced and free-preempted slices, quota
held, open slices, window cuts) in every window, with as few candidates as the ranking allows, so that it
decides to stop or to take more on every ledger."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from test_fast_path import DAY, T0, WINDOWS, _ledger

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.services.cost import CostService, items, parse_group_by
from tpuctl.services.cost import item_report as report_module
from tpuctl.services.prices import PriceSource
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, NewEvent, SegmentKind
from tpuctl.store.sql import Dialect
from tpuctl.store.url import DatabaseUrl


# On PostgreSQL with --slow only: by default the next test runs every path of the ranking there.
@pytest.mark.slow_on_postgresql
@pytest.mark.parametrize("seed", [7, 8, pytest.param(9, marks=pytest.mark.slow)])
def test_the_costliest_runs_from_candidates_are_the_full_rankings_first(
    open_ledger: Callable[..., Ledger], monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    service = _service_at(_ledger(open_ledger, seed), T0 + 4 * DAY)
    by_run = parse_group_by("run")
    full = {w: service.report(since=w[0], until=w[1], group_by=by_run).to_dict() for w in WINDOWS}

    # One candidate at first: the ranking must find out when the bounds do not settle the order.
    monkeypatch.setattr(report_module, "RUN_CANDIDATES", 1)
    rounds = _count_calls(monkeypatch, "run_bound_sql")
    stored = _count_calls(monkeypatch, "stored_run_bound_sql")
    every_run = _count_calls(monkeypatch, "run_rank_sql")
    for (since, until), whole in full.items():
        assert whole["groups_total"] == len(whole["groups"]) > 5
        for limit in range(1, 6):
            top = service.report(since=since, until=until, group_by=by_run, limit=limit).to_dict()
            assert top["groups"] == whole["groups"][:limit], (since, until, limit)
            assert top["groups_total"] == whole["groups_total"], (since, until, limit)
            assert (top["totals"], top["by_day"]) == (whole["totals"], whole["by_day"])
    # Each settled on its first candidates, fewer than the runs: the bounds told the rest apart. Those of
    # the window with no --since (every slice ended before now) came from the closed time by run.
    assert (rounds["calls"], stored["calls"]) == ((len(full) - 1) * 5, 5)
    assert every_run["calls"] == 0  # never the ranking of every run

    # With every run a candidate at once, the same again; and past the most candidates, every run ranked.
    for most in (1, 10_000):
        monkeypatch.setattr(report_module, "RUN_CANDIDATES_MAX", most)
        top = service.report(since=WINDOWS[2][0], until=WINDOWS[2][1], group_by=by_run, limit=3).to_dict()
        assert top["groups"] == full[WINDOWS[2]]["groups"][:3]
    assert every_run["calls"] == 1


def test_the_runs_a_bound_misses_are_ranked_and_a_run_without_a_bill_is_no_group(
    open_ledger: Callable[..., Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs whose bound from their own slices' recorded prices falls short of their cost still rank
    first: one with a share of a slice it did not create, one whose slice has no recorded price (the
    catalog's). When the limit falls between two runs of the same cost, the one first by key is shown
    even if its bound is the lower. A run whose only slice is a free preemption is no group, unless it
    held quota: then a group that costs nothing, shown when the limit leaves room."""
    zone = "us-central1-a"
    common: dict[str, Any] = {"capacity": CapacityType.ON_DEMAND}
    slices = (  # (name, run, chips, recorded price, hours): $96 + a $72 share, $120, ~$3,000, $32 and $32
        ("own", "a-shares", 8, 3.0, 4.0),
        ("borrowed", None, 8, 3.0, 3.0),
        ("plain", "b-plain", 8, 5.0, 3.0),
        ("unpriced", "c-unpriced", 64, None, 40.0),
        ("tie-1", "t1", 8, 2.0, 2.0),
        ("tie-9", "t9", 8, 2.0, 2.0),
    )
    events: list[NewEvent] = []
    for name, run_id, chips, price, hours in slices:
        at: dict[str, Any] = {"pod": name, "zone": zone}
        events += [
            NewEvent(EventKind.REQUESTED, accelerator_type=f"v5litepod-{chips}", chips=chips,
                     price_per_chip_hour=price, run_id=run_id, ts=T0 - 60, **common, **at),
            NewEvent(EventKind.READY, ts=T0, **at),
            NewEvent(EventKind.DELETED, ts=T0 + hours * 3600, **at),
        ]  # fmt: skip
    # Free preemptions: d-free's only slice, one that puts t9's bound above t1's (not its cost), and
    # e-held's, whose quota held for an hour makes it a group that costs nothing.
    for name, run_id, held in (("free", "d-free", 0.0), ("free-9", "t9", 0.0), ("held", "e-held", 3600.0)):
        at = {"pod": name, "zone": zone}
        events += [
            NewEvent(EventKind.REQUESTED, accelerator_type="v5litepod-8", chips=8, price_per_chip_hour=9.0,
                     run_id=run_id, ts=T0 - 60, capacity=CapacityType.SPOT, **at),
            NewEvent(EventKind.READY, ts=T0, **at),
            NewEvent(EventKind.PREEMPTED, ts=T0 + 20, **at),
            NewEvent(EventKind.DELETED, ts=T0 + 20 + held, **at),
        ]  # fmt: skip
    with open_ledger() as ledger:
        ledger.record_events_bulk(sorted(events, key=lambda e: e.ts or 0.0))
        ledger.create_run("a-shares", script="a.py", ts=T0 - DAY)
        segment = ledger.add_segment("a-shares", SegmentKind.RUNNING, start=T0, pod="borrowed", zone=zone)
        ledger.close_segment(segment, end=T0 + 3 * 3600, steps_completed=10, steps_recomputed=0)
        db = ledger.url
    service = _service_at(db, T0 + DAY)
    by_run = parse_group_by("run")
    whole = service.report(group_by=by_run).to_dict()
    keys = [g["key"] for g in whole["groups"]]
    assert keys[:5] == ["c-unpriced", "a-shares", "b-plain", "t1", "t9"] and "d-free" not in keys
    held = next(g for g in whole["groups"] if g["key"] == "e-held")
    assert held["cost_usd"] == 0 and held["quota_held_usd"] > 0
    monkeypatch.setattr(report_module, "RUN_CANDIDATES", 1)
    rounds = _count_calls(monkeypatch, "run_bound_sql")
    reports = 0
    for since in (None, T0 + 30):  # from 30 s on, e-held only holds quota: its slice is in no bound
        whole = service.report(since=since, group_by=by_run).to_dict()
        assert "e-held" in [g["key"] for g in whole["groups"]]
        for limit in range(1, len(whole["groups"]) + 1):
            top = service.report(since=since, group_by=by_run, limit=limit).to_dict()
            reports += 1
            assert top["groups"] == whole["groups"][:limit], (since, limit)
            assert top["groups_total"] == whole["groups_total"] == len(whole["groups"])
    assert rounds["calls"] > reports  # the tie at t1 took more candidates


def test_with_every_slice_ended_the_bounds_come_from_the_closed_time_by_run_and_the_open_slices(
    open_ledger: Callable[..., Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --since, every closed slice ended before now: the bounds and the count of runs come from the
    ledger's closed time by run and the slices still open. A run whose open slice makes it the costliest
    ranks first though its closed time is the least, and a run with only an open slice is a group."""
    zone = "us-central1-a"
    slices = (  # (name, run, hours, open): closed $48, $36, $24; r-open $6 closed + 20 h open ($480)
        ("big", "r-big", 2.0, False),
        ("mid", "r-mid", 1.5, False),
        ("low", "r-low", 1.0, False),
        ("small", "r-open", 0.25, False),
        ("long", "r-open", 20.0, True),
        ("only", "r-only-open", 0.5, True),
    )
    events: list[NewEvent] = []
    for name, run_id, hours, still_open in slices:
        at: dict[str, Any] = {"pod": name, "zone": zone}
        ready = T0 + DAY - hours * 3600 if still_open else T0
        events += [
            NewEvent(EventKind.REQUESTED, accelerator_type="v5litepod-8", chips=8, price_per_chip_hour=3.0,
                     run_id=run_id, ts=ready - 60, capacity=CapacityType.ON_DEMAND, **at),
            NewEvent(EventKind.READY, ts=ready, **at),
            *([] if still_open else [NewEvent(EventKind.DELETED, ts=T0 + hours * 3600, **at)]),
        ]  # fmt: skip
    with open_ledger() as ledger:
        ledger.record_events_bulk(sorted(events, key=lambda e: e.ts or 0.0))
        db = ledger.url
    service = _service_at(db, T0 + DAY)
    by_run = parse_group_by("run")
    whole = service.report(group_by=by_run).to_dict()
    assert [g["key"] for g in whole["groups"]] == ["r-open", "r-big", "r-mid", "r-low", "r-only-open"]
    monkeypatch.setattr(report_module, "RUN_CANDIDATES", 1)
    stored = _count_calls(monkeypatch, "stored_run_bound_sql")
    for limit in range(1, len(whole["groups"]) + 1):
        top = service.report(group_by=by_run, limit=limit).to_dict()
        assert top["groups"] == whole["groups"][:limit], limit
        assert top["groups_total"] == whole["groups_total"] == 5
    assert stored["calls"] >= 5


def _service_at(db: DatabaseUrl, now: float) -> CostService:
    """The cost service over ``db`` with the catalog's prices, its clock at ``now``."""
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    return CostService(db, catalog, source, clock=lambda: now, workers=1)


def _count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> dict[str, int]:
    """Counts the calls of ``items.<name>`` from now on."""
    counted = {"calls": 0}
    real = getattr(items, name)

    def counting(d: Dialect) -> Any:
        counted["calls"] += 1
        return real(d)

    monkeypatch.setattr(items, name, counting)
    return counted
