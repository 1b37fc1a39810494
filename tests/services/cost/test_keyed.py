"""Each day's cost split by groupings the rollups do not keep: by workspace and user from one pass over the
slices (the report's groups from the same pass), and by run, slice or label as the costliest groups and
the rest. On the fast path's random ledger (slices of three workspaces and four principals, some from
before workspaces; price changes across midnight, open slices, window cuts, segments on slices no run
created): the split's groups are `cost report --group-by workspace|user`'s, and each day's cells are that
day's own report."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from test_fast_path import DAY, T0, WINDOWS, _ledger

from tpuctl.catalog import Catalog
from tpuctl.services.cost import CostService, parse_group_by
from tpuctl.services.cost.keyed import OTHER_KEY
from tpuctl.services.cost.model import CostReport
from tpuctl.services.prices import PriceSource
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LOCAL_WORKSPACE, UNKNOWN_PRINCIPAL

NOW = T0 + 4 * DAY


def _service(open_ledger: Callable[..., Ledger], seed: int, *, shares: bool = True) -> CostService:
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    return CostService(
        _ledger(open_ledger, seed, shares=shares), catalog, source, clock=lambda: NOW, workers=1
    )


def _day_window(day: str, since: float | None, until: float | None) -> tuple[float, float]:
    first = datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp()
    return max(first, since if since is not None else first), min(first + DAY, until if until else NOW)


@pytest.mark.slow_on_postgresql
def test_the_split_by_whose_it_is_is_the_report_and_each_days_own_report(
    open_ledger: Callable[..., Ledger],
) -> None:
    service = _service(open_ledger, 4)
    for group, unknown in (("workspace", LOCAL_WORKSPACE), ("user", UNKNOWN_PRINCIPAL)):
        by = parse_group_by(group)
        for n, (since, until) in enumerate(WINDOWS):
            report, days = service.split_report(since=since, until=until, group_by=by)
            got = report.to_dict()
            wanted = service.report(since=since, until=until, group_by=by).to_dict()
            # The totals, days and counts are every grouping's; the groups the attributed report's (which
            # adds each slice's row rounded: to the rounding of the sums).
            assert (got["totals"], got["by_day"]) == (wanted["totals"], wanted["by_day"])
            assert {g["key"] for g in got["groups"]} == {g["key"] for g in wanted["groups"]} >= {unknown}
            by_key = {g["key"]: g for g in wanted["groups"]}
            for g in got["groups"]:
                w = by_key[g["key"]]
                assert g["slices"] == w["slices"], (group, g["key"])
                for figure, value in g.items():
                    if isinstance(value, float):
                        assert value == pytest.approx(w[figure], abs=2e-5), (group, g["key"], figure)
            cells = {(d.day, key): usd for d in days for key, usd in d.groups}
            for g in got["groups"]:
                mine = sum(usd for (_, key), usd in cells.items() if key == g["key"])
                assert mine == pytest.approx(g["cost_usd"], abs=1e-5)
            if n in (0, 2):  # a day's cells are the report over that day alone
                for day in {d for d, _ in cells}:
                    lo, hi = _day_window(day, since, until)
                    alone = service.report(since=lo, until=hi, group_by=by, with_days=False)
                    shown = {k: usd for (d, k), usd in cells.items() if d == day}
                    assert shown == pytest.approx(
                        {g["key"]: g["cost_usd"] for g in alone.groups if g["cost_usd"]}, abs=2e-5
                    ), (group, day)


@pytest.mark.slow_on_postgresql
def test_the_costliest_groups_days_and_the_rest_add_up_to_the_reports(
    open_ledger: Callable[..., Ledger],
) -> None:
    service = _service(open_ledger, 5)
    for group, limit in (("run", 3), ("slice", 4), ("label:team", 1)):
        for n, (since, until) in enumerate(WINDOWS):
            _check_costliest_split(service, group, limit, since, until, each_day=group == "run" and n == 2)
    with pytest.raises(ValueError, match="keeps the costliest groups"):
        service.split_report(group_by=parse_group_by("run"))


def test_by_run_with_no_shares_none_s_days_come_from_its_own_pass_and_still_add_up(
    open_ledger: Callable[..., Ledger],
) -> None:
    """No run ran on a slice it did not create: "(none)"'s first days come from the report's own pass
    over its slices (and no shares are split), still each day's own report and adding up to its cost."""
    service = _service(open_ledger, 8, shares=False)
    for n, (since, until) in enumerate(WINDOWS):
        report = _check_costliest_split(service, "run", 3, since, until, each_day=n in (0, 2))
        assert "(none)" in {g["key"] for g in report.groups}


def _check_costliest_split(
    service: CostService, group: str, limit: int, since: float | None, until: float | None, *, each_day: bool
) -> CostReport:
    """The split's report is the limited report; its days add up to the report's, its groups' cells to
    their costs; ``each_day``: a group's day is its group in that day's own report."""
    by = parse_group_by(group)
    report, days = service.split_report(since=since, until=until, group_by=by, limit=limit)
    limited = service.report(since=since, until=until, group_by=by, limit=limit)
    assert report.to_dict() == limited.to_dict()  # the same groups, totals and days
    assert len(report.groups) == limit < report.groups_total
    assert [d.day for d in days] == [d["day"] for d in report.by_day if d["cost_usd"]]
    for day, wanted in zip(days, (d for d in report.by_day if d["cost_usd"]), strict=True):
        assert sum(usd for _, usd in day.groups) == pytest.approx(wanted["cost_usd"], abs=1e-5)
    keys = {key for d in days for key, _ in d.groups}
    assert keys <= {str(g["key"]) for g in report.groups} | {OTHER_KEY}
    assert OTHER_KEY in keys, group
    for g in report.groups:
        mine = sum(usd for d in days for key, usd in d.groups if key == g["key"])
        assert mine == pytest.approx(g["cost_usd"], abs=1e-5), (group, g["key"])
    for day in days if each_day else ():
        lo, hi = _day_window(day.day, since, until)
        alone = {g["key"]: g["cost_usd"] for g in service.report(
            since=lo, until=hi, group_by=by, with_days=False).groups}  # fmt: skip
        for key, usd in day.groups:
            if key != OTHER_KEY:
                assert usd == pytest.approx(alone[key], abs=2e-6), (day.day, key)
    return report
