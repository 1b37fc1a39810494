"""`cost report` from the ledger: GCP's billing rules on hand-computed cases, group-by and time windows,
savings and waste, and the JSON/CSV shapes. The ledger is written with explicit timestamps and the
report runs with a fixed clock, so every figure is asserted exactly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.errors import UsageError
from tpuctl.params import flag
from tpuctl.services.cost import CSV_COLUMNS, CostReport, CostService, parse_group_by, parse_window
from tpuctl.services.prices import PriceSource
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, SegmentKind

# 2027-01-15T08:00:00Z: far from a day boundary unless a test wants one.
T0 = 1_800_000_000.0
DAY = 86400.0
Z = "us-central1-a"


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger]) -> Iterator[Ledger]:
    with open_ledger() as led:
        yield led


def slice_life(
    ledger: Ledger,
    name: str,
    *,
    ready: float,
    end: float | None = None,
    end_kind: EventKind = EventKind.DELETED,
    deleted: float | None = None,
    zone: str = Z,
    accel: str = "v5litepod-64",
    chips: int = 64,
    capacity: str = "spot",
    price: float | None = 0.245,
    run_id: str | None = None,
    labels: dict[str, str] | None = None,
) -> None:
    """requested (60 s before READY) -> created -> ready -> [end] -> [deleted]."""
    ledger.record_event(
        EventKind.REQUESTED, pod=name, zone=zone, accelerator_type=accel, chips=chips,
        capacity=CapacityType(capacity), price_per_chip_hour=price, run_id=run_id, labels=labels,
        ts=ready - 60, backend="sim",
    )  # fmt: skip
    ledger.record_event(EventKind.CREATED, pod=name, zone=zone, ts=ready - 30)
    ledger.record_event(EventKind.READY, pod=name, zone=zone, ts=ready)
    if end is not None:
        ledger.record_event(end_kind, pod=name, zone=zone, ts=end)
    if deleted is not None:
        ledger.record_event(EventKind.DELETED, pod=name, zone=zone, ts=deleted)


@pytest.fixture
def report(ledger: Ledger) -> Callable[..., CostReport]:
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)

    def run(
        *, now: float = T0 + DAY, group_by: str | None = None, fast: bool = True, **kwargs: Any
    ) -> CostReport:
        service = CostService(ledger.url, catalog, source, clock=lambda: now, fast=fast)
        return service.report(group_by=parse_group_by(group_by), **kwargs)

    return run


def groups(rep: CostReport) -> dict[str, dict[str, Any]]:
    return {g["key"]: g for g in rep.to_dict()["groups"]}


# --- the billing rules, by hand ---------------------------------------------------------------------


def test_v5e_64_spot_90_minutes_at_0_245_is_23_52(ledger: Ledger, report: Callable[..., CostReport]) -> None:
    slice_life(ledger, "a", ready=T0, end=T0 + 90 * 60)

    rep = report()

    totals = rep.to_dict()["totals"]
    assert totals["cost_usd"] == 23.52  # 64 x 0.245 x 1.5
    assert totals["chip_hours"] == 96.0
    assert totals["billed_hours"] == 1.5
    assert totals["slices"] == 1
    # Against on-demand v5e in us-central1 (1.20): 64 x 1.20 x 1.5 = 115.2, so spot saved 91.68.
    assert totals["on_demand_usd"] == 115.2
    assert totals["spot_savings_usd"] == 91.68
    line = groups(rep)["us-central1-a/a#1"]
    assert (line["name"], line["state"], line["end_reason"]) == ("a", "DELETED", "deleted")
    assert line["ready_at"] == "2027-01-15T08:00:00Z"


def test_billing_starts_at_ready_not_at_create(ledger: Ledger, report: Callable[..., CostReport]) -> None:
    # REQUESTED 60 s and CREATED 30 s before READY cost nothing.
    slice_life(ledger, "a", ready=T0, end=T0 + 3600, chips=8, accel="v5litepod-8")
    assert report().totals.cost_usd == pytest.approx(8 * 0.245)


def test_preemptible_preempted_after_40_s_costs_nothing(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    slice_life(ledger, "p", ready=T0, end=T0 + 40, end_kind=EventKind.PREEMPTED, capacity="preemptible")

    rep = report()

    assert rep.totals.cost_usd == 0.0
    assert rep.totals.chip_hours == 0.0
    assert (rep.preemptions, rep.free_preemptions) == (1, 1)


def test_spot_preempted_at_exactly_60_s_is_charged_the_minute(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    slice_life(ledger, "p", ready=T0, end=T0 + 60, end_kind=EventKind.PREEMPTED)

    rep = report()

    assert round(rep.totals.cost_usd, 6) == round(64 * 0.245 / 60, 6)
    assert (rep.preemptions, rep.free_preemptions) == (1, 0)


def test_on_demand_slice_ended_in_its_first_minute_is_charged(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    # The first-minute rule is for preemptions of preemptible capacity only.
    slice_life(ledger, "o", ready=T0, end=T0 + 40, capacity="on-demand", price=1.2)
    assert round(report().totals.cost_usd, 6) == round(64 * 1.2 * 40 / 3600, 6)


def test_run_with_two_preemptions_costs_its_three_slices(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    ledger.create_run("r1", script="train.py", ts=T0 - 100)
    # Slice 1: 2 h then preempted; slice 2 (another zone): 30 min then preempted; slice 3: 1 h, done.
    slice_life(ledger, "r1-a", ready=T0, end=T0 + 7200, end_kind=EventKind.PREEMPTED, deleted=T0 + 7260,
               run_id="r1")  # fmt: skip
    slice_life(ledger, "r1-b", ready=T0 + 7500, end=T0 + 9300, end_kind=EventKind.PREEMPTED,
               deleted=T0 + 9400, run_id="r1", zone="us-east1-c")  # fmt: skip
    slice_life(ledger, "r1-c", ready=T0 + 9700, end=T0 + 13300, run_id="r1")
    slice_life(ledger, "other", ready=T0, end=T0 + 3600)  # not the run's

    rep = report(group_by="run")

    # 64 chips x 0.245 x (2 + 0.5 + 1) h = 54.88
    run = groups(rep)["r1"]
    assert run["cost_usd"] == 54.88
    assert run["slices"] == 3
    assert run["billed_hours"] == 3.5
    assert run["program"] == "train.py"
    assert groups(rep)["(none)"]["cost_usd"] == 15.68
    assert rep.totals.cost_usd == pytest.approx(54.88 + 15.68)
    # Quota held after the preemptions: 60 s and 100 s of 64 chips.
    assert run["quota_held_chip_hours"] == round(64 * 160 / 3600, 6)


def test_price_change_mid_life_bills_each_price_for_its_own_interval(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    slice_life(ledger, "a", ready=T0, zone=Z)
    ledger.record_event(EventKind.PRICE_CHANGE, pod="a", zone=Z, price_per_chip_hour=0.30, ts=T0 + 3600)
    ledger.record_event(EventKind.PRICE_CHANGE, pod="a", zone=Z, price_per_chip_hour=0.20, ts=T0 + 5400)
    ledger.record_event(EventKind.DELETED, pod="a", zone=Z, ts=T0 + 7200)

    rep = report()

    # 64 x (0.245 x 1 h + 0.30 x 0.5 h + 0.20 x 0.5 h) = 64 x 0.495 = 31.68
    assert round(rep.totals.cost_usd, 6) == 31.68
    assert rep.totals.chip_hours == 128.0


def test_price_change_before_ready_sets_the_starting_price(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    ledger.record_event(EventKind.REQUESTED, pod="a", zone=Z, accelerator_type="v5litepod-8", chips=8,
                        capacity=CapacityType.SPOT, price_per_chip_hour=0.245, ts=T0 - 60)  # fmt: skip
    ledger.record_event(EventKind.PRICE_CHANGE, pod="a", zone=Z, price_per_chip_hour=0.5, ts=T0 - 30)
    ledger.record_event(EventKind.READY, pod="a", zone=Z, ts=T0)
    ledger.record_event(EventKind.PRICE_CHANGE, pod="a", zone=Z, price_per_chip_hour=1.0, ts=T0 + 3600)
    ledger.record_event(EventKind.DELETED, pod="a", zone=Z, ts=T0 + 7200)

    assert round(report().totals.cost_usd, 6) == 8 * 0.5 + 8 * 1.0


def test_a_live_slice_is_billed_until_now(ledger: Ledger, report: Callable[..., CostReport]) -> None:
    slice_life(ledger, "a", ready=T0, chips=8, accel="v5litepod-8")
    assert round(report(now=T0 + 1800).totals.cost_usd, 6) == round(8 * 0.245 * 0.5, 6)


def test_a_slice_never_ready_costs_nothing(ledger: Ledger, report: Callable[..., CostReport]) -> None:
    ledger.record_event(EventKind.REQUESTED, pod="q", zone=Z, accelerator_type="v5litepod-8", chips=8,
                        capacity=CapacityType.SPOT, price_per_chip_hour=0.245, ts=T0)  # fmt: skip
    ledger.record_event(EventKind.FAILED, pod="q", zone=Z, ts=T0 + 100)
    rep = report()
    assert rep.totals.cost_usd == 0.0
    assert rep.lines == []


def test_a_slice_without_a_recorded_price_uses_the_catalog(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    slice_life(ledger, "a", ready=T0, end=T0 + 3600, price=None, capacity="on-demand", chips=8,
               accel="v5litepod-8")  # fmt: skip
    rep = report()
    assert round(rep.totals.cost_usd, 6) == 8 * 1.2
    assert any("no price in the ledger" in w for w in rep.warnings)


# --- windows and groups ------------------------------------------------------------------------------


def test_time_window_clips_billed_time(ledger: Ledger, report: Callable[..., CostReport]) -> None:
    slice_life(ledger, "a", ready=T0, end=T0 + 4 * 3600, chips=8, accel="v5litepod-8")

    rep = report(since=T0 + 3600, until=T0 + 2 * 3600)

    assert round(rep.totals.cost_usd, 6) == round(8 * 0.245, 6)
    assert rep.totals.billed_hours == 1.0
    assert report(since=T0 + 5 * 3600).totals.cost_usd == 0.0


def test_group_by_day_splits_a_slice_at_midnight(ledger: Ledger, report: Callable[..., CostReport]) -> None:
    midnight = (T0 // DAY + 1) * DAY  # 2027-01-16T00:00Z
    slice_life(ledger, "a", ready=midnight - 3600, end=midnight + 7200, chips=8, accel="v5litepod-8")

    rep = report(now=midnight + DAY, group_by="day")

    days = groups(rep)
    assert list(days) == ["2027-01-15", "2027-01-16"]
    assert days["2027-01-15"]["cost_usd"] == round(8 * 0.245 * 1, 6)
    assert days["2027-01-16"]["cost_usd"] == round(8 * 0.245 * 2, 6)
    assert rep.by_day == [
        {"day": "2027-01-15", "cost_usd": 1.96},
        {"day": "2027-01-16", "cost_usd": 3.92},
    ]


def test_group_by_zone_region_type_capacity_and_label(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    hour: dict[str, Any] = {"end": T0 + 3600, "chips": 8, "accel": "v5litepod-8"}
    slice_life(ledger, "a", ready=T0, zone="us-central1-a", labels={"team": "nlp"}, **hour)  # 1.96
    slice_life(ledger, "b", ready=T0, zone="us-central1-b", labels={"team": "vision"}, **hour)  # 1.96
    slice_life(ledger, "c", ready=T0, zone="us-east1-c", capacity="on-demand", price=1.2,
               labels={"team": "nlp"}, **hour)  # 9.6  # fmt: skip
    slice_life(ledger, "d", ready=T0, zone="us-east1-c", accel="v6e-8", chips=8, price=0.544, end=T0 + 3600)

    assert {k: g["cost_usd"] for k, g in groups(report(group_by="zone")).items()} == {
        "us-central1-a": 1.96, "us-central1-b": 1.96, "us-east1-c": round(9.6 + 8 * 0.544, 6),
    }  # fmt: skip
    by_region = groups(report(group_by="region"))
    assert {k: (g["cost_usd"], g["slices"]) for k, g in by_region.items()} == {
        "us-central1": (3.92, 2), "us-east1": (round(9.6 + 4.352, 6), 2),
    }  # fmt: skip
    assert {k: g["cost_usd"] for k, g in groups(report(group_by="type")).items()} == {
        "v5litepod-8": 13.52, "v6e-8": 4.352,
    }  # fmt: skip
    by_capacity = groups(report(group_by="capacity"))
    assert {k: g["cost_usd"] for k, g in by_capacity.items()} == {
        "on-demand": 9.6,
        "spot": round(3.92 + 4.352, 6),
    }
    assert by_capacity["on-demand"]["spot_savings_usd"] == 0.0
    # v6e on-demand in us-east1 is 2.70: 8 x (2.70 - 0.544) = 17.248 saved; v5e: 2 x 8 x (1.20 - 0.245).
    assert by_capacity["spot"]["spot_savings_usd"] == round(17.248 + 15.28, 6)
    by_team = groups(report(group_by="label:team"))
    assert {k: (g["cost_usd"], g["slices"]) for k, g in by_team.items()} == {
        "nlp": (11.56, 2), "vision": (1.96, 1), "(none)": (4.352, 1),
    }  # fmt: skip


@pytest.mark.parametrize("fast", [True, False])
def test_groups_are_sorted_by_cost_then_slices_by_ready_time(
    ledger: Ledger, report: Callable[..., CostReport], fast: bool
) -> None:
    slice_life(ledger, "early", ready=T0, end=T0 + 60 * 5)
    slice_life(ledger, "late", ready=T0 + 600, end=T0 + 4200)  # an hour: costs more than early's 5 min
    slice_life(ledger, "twin-b", ready=T0 + 120, end=T0 + 120 + 60 * 5)  # costs what early costs
    rep = report(fast=fast)
    assert [g["name"] for g in rep.to_dict()["groups"]] == ["late", "early", "twin-b"]
    assert [g["cost_usd"] for g in rep.to_dict()["groups"]] == [15.68, 1.306667, 1.306667]
    slice_life(ledger, "big", ready=T0, end=T0 + 3600, zone="us-east1-c")
    slice_life(ledger, "small", ready=T0, end=T0 + 60, zone="us-west4-a")
    assert [g.key for g in report(group_by="zone").lines] == ["us-central1-a", "us-east1-c", "us-west4-a"]


@pytest.mark.parametrize("group_by", [None, "run", "zone"])
@pytest.mark.parametrize("fast", [True, False])
def test_limit_keeps_the_costliest_groups_and_totals_cover_all(
    ledger: Ledger, report: Callable[..., CostReport], group_by: str | None, fast: bool
) -> None:
    for i, (zone, hours) in enumerate([(Z, 1), ("us-east1-c", 3), ("us-west4-a", 2), (Z, 0.5)]):
        ledger.create_run(f"r{i}", script="t.py", ts=T0 - 100)
        slice_life(ledger, f"s{i}", ready=T0, end=T0 + hours * 3600, zone=zone, chips=8,
                   accel="v5litepod-8", run_id=f"r{i}")  # fmt: skip

    full = report(group_by=group_by, fast=fast)
    top = report(group_by=group_by, fast=fast, limit=2)

    groups = 3 if group_by == "zone" else 4
    assert (full.groups_total, len(full.groups), full.limit) == (groups, groups, None)
    assert (top.groups_total, len(top.groups), top.limit) == (full.groups_total, 2, 2)
    assert top.groups == full.groups[:2]
    # 3 h, 2 h, then 1 h + 0.5 h in us-central1-a
    costs = {"run": ["r1", "r2"], "zone": ["us-east1-c", "us-west4-a"]}.get(str(group_by))
    if costs is not None:
        assert [g["key"] for g in top.groups] == costs
    else:
        assert [g["name"] for g in top.groups] == ["s1", "s2"]  # 3 h and 2 h of 8 x 0.245
    assert [g["cost_usd"] for g in full.groups] == sorted((g["cost_usd"] for g in full.groups), reverse=True)
    assert top.to_dict()["totals"] == full.to_dict()["totals"]  # totals are over every group
    assert full.totals.cost_usd == pytest.approx(8 * 0.245 * 6.5)
    rest = top.omitted
    assert rest is not None and full.omitted is None
    assert rest.cost_usd == pytest.approx(full.totals.cost_usd - sum(g["cost_usd"] for g in top.groups))
    assert report(group_by=group_by, fast=fast, limit=0).to_dict() == full.to_dict()


@pytest.mark.parametrize("fast", [True, False])
def test_the_costliest_slice_may_be_one_the_ledger_has_no_price_for(
    ledger: Ledger, report: Callable[..., CostReport], fast: bool
) -> None:
    # Its stored USD is 0 (no price recorded); the catalog's on-demand v5e price makes it the costliest.
    slice_life(ledger, "priced-a", ready=T0, end=T0 + 3600, chips=8, accel="v5litepod-8")
    slice_life(ledger, "priced-b", ready=T0, end=T0 + 1800, chips=8, accel="v5litepod-8")
    slice_life(ledger, "unpriced", ready=T0, end=T0 + 3600, chips=8, accel="v5litepod-8",
               capacity="on-demand", price=None)  # fmt: skip
    slice_life(ledger, "open", ready=T0 + 600, chips=8, accel="v5litepod-8", capacity="on-demand",
               price=1.2)  # still running: no stored USD either  # fmt: skip

    top = report(limit=2, fast=fast, now=T0 + 600 + 2 * 3600)

    assert [g["name"] for g in top.groups] == ["open", "unpriced"]
    assert [g["cost_usd"] for g in top.groups] == [19.2, 9.6]  # 8 x 1.20 x 2 h so far; 8 x 1.20 x 1 h
    assert top.groups_total == 4
    assert "some slices had no price in the ledger" in " ".join(top.warnings)


def test_limit_on_days_keeps_the_costliest_days_in_date_order(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    midnight = (T0 // DAY + 1) * DAY
    for day, hours in enumerate([1, 4, 2]):
        slice_life(ledger, f"d{day}", ready=midnight + day * DAY, end=midnight + day * DAY + hours * 3600)
    rep = report(group_by="day", now=midnight + 4 * DAY, limit=2)
    assert [g["key"] for g in rep.groups] == ["2027-01-17", "2027-01-18"]  # 4 h and 2 h, by date
    assert rep.groups_total == 3


def test_a_negative_limit_is_refused(report: Callable[..., CostReport]) -> None:
    with pytest.raises(ValueError, match="limit"):
        report(limit=-1)


def test_name_reused_after_delete_is_a_separate_slice(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    slice_life(ledger, "a", ready=T0, end=T0 + 3600, chips=8, accel="v5litepod-8")
    slice_life(ledger, "a", ready=T0 + 7200, end=T0 + 9000, chips=8, accel="v5litepod-8")
    lines = groups(report())
    assert set(lines) == {"us-central1-a/a#1", "us-central1-a/a#2"}
    assert lines["us-central1-a/a#1"]["cost_usd"] == 1.96
    assert lines["us-central1-a/a#2"]["cost_usd"] == 0.98


# --- waste -------------------------------------------------------------------------------------------


def test_quota_held_after_preemption_until_deleted_or_now(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    slice_life(ledger, "a", ready=T0, end=T0 + 600, end_kind=EventKind.PREEMPTED, deleted=T0 + 600 + 1800,
               chips=8, accel="v5litepod-8")  # fmt: skip
    slice_life(ledger, "b", ready=T0, end=T0 + 600, end_kind=EventKind.PREEMPTED, chips=8,
               accel="v5litepod-8")  # still not deleted  # fmt: skip

    rep = report(now=T0 + 600 + 3600)

    lines = groups(rep)
    assert lines["us-central1-a/a#1"]["quota_held_chip_hours"] == 4.0  # 8 chips x 0.5 h
    assert lines["us-central1-a/b#1"]["quota_held_chip_hours"] == 8.0  # 8 chips x 1 h, until now
    assert rep.totals.quota_held_usd == pytest.approx(12 * 0.245)
    # Not billed: the spend is the 10 minutes each ran.
    assert rep.totals.cost_usd == pytest.approx(2 * 8 * 0.245 / 6)


def test_recomputed_steps_cost_their_share_of_the_segment(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    ledger.create_run("r", script="train.py", ts=T0 - 100)
    slice_life(ledger, "r-a", ready=T0, end=T0 + 3600, end_kind=EventKind.PREEMPTED, deleted=T0 + 3700,
               run_id="r", chips=8, accel="v5litepod-8")  # fmt: skip
    slice_life(ledger, "r-b", ready=T0 + 4000, end=T0 + 4000 + 7200, run_id="r", chips=8, accel="v5litepod-8")
    seg = ledger.add_segment("r", SegmentKind.RUNNING, start=T0, pod="r-a", zone=Z)
    ledger.close_segment(seg, end=T0 + 3600, steps_completed=100, steps_recomputed=0)
    seg = ledger.add_segment("r", SegmentKind.RUNNING, start=T0 + 4000, pod="r-b", zone=Z)
    # 200 steps in 2 h on the new slice, 50 of them redoing work lost at the preemption.
    ledger.close_segment(seg, end=T0 + 4000 + 7200, steps_completed=200, steps_recomputed=50)

    run = groups(report(group_by="run"))["r"]

    # A quarter of the second slice's 2 h: 8 x 0.245 x 2 x 50/200 = 0.98
    assert run["recomputed_usd"] == 0.98
    assert run["cost_usd"] == round(8 * 0.245 * 3, 6)
    assert run["waste_usd"] == round(0.98 + 8 * 0.245 * 100 / 3600, 6)


def test_a_slice_no_run_created_is_billed_to_the_runs_that_used_it(
    ledger: Ledger, report: Callable[..., CostReport]
) -> None:
    # pod create, then two runs on it (--pod) with an idle hour between: each run pays its own hour.
    slice_life(ledger, "shared", ready=T0, end=T0 + 4 * 3600, chips=8, accel="v5litepod-8")
    for run_id, start in (("r1", T0 + 3600), ("r2", T0 + 3 * 3600)):
        ledger.create_run(run_id, script="x.py", ts=start)
        seg = ledger.add_segment(run_id, SegmentKind.RUNNING, start=start, pod="shared", zone=Z)
        ledger.close_segment(seg, end=start + 3600)

    lines = groups(report(group_by="run"))

    assert {k: g["cost_usd"] for k, g in lines.items()} == {"(none)": 3.92, "r1": 1.96, "r2": 1.96}
    assert {k: g["slices"] for k, g in lines.items()} == {"(none)": 0, "r1": 1, "r2": 1}


# --- shapes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
def test_preemptions_are_counted_by_the_kind_their_runs_supervisor_recorded(
    ledger: Ledger, report: Callable[..., CostReport], fast: bool
) -> None:
    preempted: dict[str, list[str | None]] = {
        "finished": ["notice_finished"],
        "ignored": ["notice_ignored"],
        "listed-first": [None, "notice_ignored"],  # the listing saw it before the supervisor said how
        "no-run": [None],
    }
    for name, kinds in preempted.items():
        slice_life(ledger, name, ready=T0)
        for kind in kinds:
            detail = None if kind is None else {"seen_by": "run supervisor", "kind": kind}
            ledger.record_event(EventKind.PREEMPTED, pod=name, zone=Z, ts=T0 + 600, detail=detail)
    slice_life(ledger, "before", ready=T0 - 2 * DAY, end=T0 - DAY, end_kind=EventKind.PREEMPTED)

    rep = report(since=T0 - 3600, fast=fast)

    assert rep.preemptions == 4
    assert rep.preemption_kinds == {"notice_finished": 1, "notice_ignored": 2, "unclassified": 1}
    assert rep.to_dict()["totals"]["preemption_kinds"] == rep.preemption_kinds
    # A reader that shows neither the kinds nor the price notes (the dashboard) may leave them out; every
    # figure stays the same.
    bare = report(since=T0 - 3600, fast=fast, kinds_and_notes=False)
    assert (bare.preemption_kinds, bare.price_notes) == ({}, {})
    assert bare.to_dict()["totals"] == {**rep.to_dict()["totals"], "preemption_kinds": {}}
    assert bare.groups == rep.groups and bare.by_day == rep.by_day


def test_json_document_schema(ledger: Ledger, report: Callable[..., CostReport]) -> None:
    slice_life(ledger, "a", ready=T0, end=T0 + 5400)

    doc = report(group_by="zone", since=T0 - 3600).to_dict()

    assert list(doc) == [
        "window", "group_by", "currency", "prices", "totals", "groups_total", "limit", "groups", "by_day",
        "untracked", "reconciled", "warnings",
    ]  # fmt: skip
    assert (doc["groups_total"], doc["limit"]) == (1, None)
    assert doc["window"] == {
        "since": "2027-01-15T07:00:00Z", "until": "2027-01-16T08:00:00Z", "now": "2027-01-16T08:00:00Z",
    }  # fmt: skip
    assert doc["group_by"] == "zone"
    assert doc["prices"]["catalog"]["cached"] is False
    assert doc["prices"]["catalog"]["date"] == Catalog.load().prices.date
    assert set(doc["totals"]) == {
        *CSV_COLUMNS[2:],
        "preemptions",
        "free_preemptions",
        "preemption_kinds",
        "untracked_usd_per_hour",
    }
    assert list(doc["groups"][0]) == list(CSV_COLUMNS[1:])
    assert doc["groups"][0]["cost_usd"] == 23.52


def test_csv_rows_follow_the_documented_columns(ledger: Ledger, report: Callable[..., CostReport]) -> None:
    slice_life(ledger, "a", ready=T0, end=T0 + 5400)
    rows = report(group_by="capacity").csv_rows()
    assert rows == [["capacity", "spot", 1, 1.5, 96.0, 23.52, 115.2, 91.68, 0.0, 0.0, 0.0, 0.0]]
    assert len(rows[0]) == len(CSV_COLUMNS)


# --- input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2027-01-15", 1_800_000_000.0 - 8 * 3600),
        ("2027-01-15T08:00", T0),
        ("2027-01-15T08:00:00Z", T0),
        ("2027-01-15T10:00+02:00", T0),
        ("7d", T0 + DAY - 7 * DAY),
        ("1h30m", T0 + DAY - 5400),
        ("today", (T0 + DAY) // DAY * DAY),
        ("yesterday", (T0 + DAY) // DAY * DAY - DAY),
        ("month", 1_798_761_600.0),  # 2027-01-01T00:00Z
    ],
)
def test_window_values(value: str, expected: float) -> None:
    since, until = parse_window(value, None, now=T0 + DAY)
    assert since == expected
    assert until == T0 + DAY


@pytest.mark.parametrize("value", ["yesterdayish", "2027-13-01", "15/01/2027", "-3d", ""])
def test_unparsable_dates_name_the_value_and_the_fix(value: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_window(value, None, now=T0)
    assert err.value.field == "since" and flag(err.value.field) == "--since"
    assert err.value.value == value
    assert err.value.fix is not None and "2026-11-01" in err.value.fix


def test_since_after_until_is_refused() -> None:
    with pytest.raises(UsageError) as err:
        parse_window("2027-01-16", "2027-01-15", now=T0 + 5 * DAY)
    assert "2027-01-16" in err.value.message and "2027-01-15" in err.value.message
    assert err.value.field == "since" and flag(err.value.field) == "--since"


@pytest.mark.parametrize("value", ["node", "label:", "label:Team", "zones", "label:KEY"])
def test_unknown_group_by_is_refused(value: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_group_by(value)
    assert err.value.field == "group_by" and flag(err.value.field) == "--group-by"
    assert err.value.value == value


def test_group_by_values() -> None:
    assert parse_group_by(None).name == "slice"
    assert parse_group_by("Zone").name == "zone"
    assert parse_group_by("label:team").label_key == "team"


def test_parallel_scans_over_id_ranges_give_the_same_report(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tpuctl.services.cost.scan as cost_module

    midnight = (T0 // DAY + 1) * DAY
    ledger.create_run("r", script="t.py", ts=T0 - 100)
    for i in range(12):
        capacity = ("spot", "preemptible", "on-demand")[i % 3]
        price = 1.2 if capacity == "on-demand" else 0.245
        end_kind = EventKind.PREEMPTED if capacity != "on-demand" and i % 2 else EventKind.DELETED
        end = midnight + 600 * i + 30
        zone = ("us-central1-a", "us-east1-c")[i % 2]
        slice_life(ledger, f"s{i}", ready=midnight - 3600 * (i + 1), end=None if i == 5 else end,
                   end_kind=end_kind, zone=zone, capacity=capacity,
                   price=price, run_id="r" if i < 4 else None, labels={"team": f"t{i % 3}"},
                   chips=8, accel="v5litepod-8")  # fmt: skip
        if i == 5:  # its price changes while it runs (a change recorded after its end would change nothing)
            ledger.record_event(EventKind.PRICE_CHANGE, pod="s5", zone=zone, price_per_chip_hour=0.5,
                                ts=midnight - 1800)  # fmt: skip
            ledger.record_event(end_kind, pod="s5", zone=zone, ts=end)
    seg = ledger.add_segment("r", SegmentKind.RUNNING, start=midnight - 3000, pod="s7", zone="us-east1-c")
    ledger.close_segment(seg, end=midnight + 100, steps_completed=10, steps_recomputed=3)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)

    def doc(workers: int, group: str) -> dict[str, Any]:
        service = CostService(ledger.url, catalog, source, clock=lambda: midnight + DAY, workers=workers)
        return service.report(group_by=parse_group_by(group), since=midnight - 5 * 3600).to_dict()

    monkeypatch.setattr(cost_module, "_PARALLEL_MIN_PODS", 0)
    for group in ("slice", "zone", "day", "run", "label:team", "capacity"):
        one, three = doc(1, group), doc(3, group)
        assert one == three, group
        assert one["totals"]["cost_usd"] > 0
    # s5 (on-demand, 1.20) in the window from 5 h before midnight: 1.20 up to the price change 30 min
    # before midnight (16200 s), 0.5 after it until its end 3030 s after midnight (4830 s).
    s5 = next(g for g in doc(3, "slice")["groups"] if g["name"] == "s5")
    assert s5["cost_usd"] == round(8 * (1.2 * 16200 + 0.5 * 4830) / 3600, 6)
