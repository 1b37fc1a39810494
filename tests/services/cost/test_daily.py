"""Each day's cost split by a slice's own facts, in one scan: on the fast path's random ledger (price
changes across midnight, open slices, window cuts) a day's cells add up to the report's ``by_day`` figure
for it and a group's cells to the group's ``cost_usd``, in every window; the report and its split from
one scan (``split_report``) are the report and the split asked apart."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_fast_path import DAY, T0, WINDOWS, _ledger

from tpuctl.catalog import Catalog
from tpuctl.services.cost import CostService, parse_group_by
from tpuctl.services.prices import PriceSource
from tpuctl.store.ledger import Ledger


@pytest.mark.slow_on_postgresql
def test_a_days_cells_add_up_to_its_day_and_a_groups_to_its_group(open_ledger: Callable[..., Ledger]) -> None:
    db = _ledger(open_ledger, 2)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    service = CostService(db, catalog, source, clock=lambda: T0 + 4 * DAY, workers=1)
    for group in ("type", "region"):  # a fact as stored, and one derived from the zone
        for since, until in WINDOWS:
            report = service.report(since=since, until=until, group_by=parse_group_by(group)).to_dict()
            days = service.cost_per_day(since=since, until=until, group_by=parse_group_by(group))
            assert [d.day for d in days] == [d["day"] for d in report["by_day"] if d["cost_usd"]]
            for day, wanted in zip(days, (d for d in report["by_day"] if d["cost_usd"]), strict=True):
                assert sum(usd for _, usd in day.groups) == pytest.approx(wanted["cost_usd"], abs=1e-4)
            for g in report["groups"]:
                cells = sum(usd for d in days for key, usd in d.groups if key == g["key"])
                assert cells == pytest.approx(g["cost_usd"], abs=1e-4), (group, g["key"])
            assert len({key for d in days for key, _ in d.groups}) == len(report["groups"]) > 1
    with pytest.raises(ValueError, match="does not split by run"):
        service.cost_per_day(group_by=parse_group_by("run"))


@pytest.mark.slow_on_postgresql
def test_the_report_split_in_one_scan_is_the_report_and_the_split_asked_apart(
    open_ledger: Callable[..., Ledger],
) -> None:
    db = _ledger(open_ledger, 3)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    # The fast path sums the cells in SQL, the reference one in Python from the same per-day rows.
    for fast, group in ((True, "capacity"), (False, "zone")):
        service = CostService(db, catalog, source, clock=lambda: T0 + 4 * DAY, workers=1, fast=fast)
        by = parse_group_by(group)
        for since, until in WINDOWS:
            report, days = service.split_report(since=since, until=until, group_by=by)
            assert report.to_dict() == service.report(since=since, until=until, group_by=by).to_dict()
            assert days == service.cost_per_day(since=since, until=until, group_by=by)
            assert sum(usd for d in days for _, usd in d.groups) == pytest.approx(
                report.totals.cost_usd, abs=1e-4
            )
    with pytest.raises(ValueError, match="keeps the costliest groups"):
        service.split_report(group_by=parse_group_by("run"))
