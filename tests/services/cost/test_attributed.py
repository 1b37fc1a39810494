"""Cost by whose it is, on both engines: `--group-by workspace|user` equal to the sums of the slice rows,
reports limited to some workspaces or one user (a reader of team-b never sees team-a's cost), and rows
from before workspaces read as the local workspace and an unknown principal."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.errors import UsageError
from tpuctl.services.cost import CostReport, CostScope, CostService, parse_group_by
from tpuctl.services.prices import PriceSource
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind
from tpuctl.teams.actor import Actor
from tpuctl.teams.workspaces import Role

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
Z = "us-central1-a"


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger]) -> Iterator[Ledger]:
    with open_ledger() as led:
        yield led


def _slice(ledger: Ledger, name: str, hours: float, **owner: Any) -> None:
    """A v5e-8 spot slice at 0.5 USD per chip-hour (4 USD an hour), READY at T0 for ``hours``."""
    ledger.record_event(
        EventKind.REQUESTED, pod=name, zone=Z, accelerator_type="v5litepod-8", chips=8,
        capacity=CapacityType.SPOT, price_per_chip_hour=0.5, ts=T0 - 60, **owner,
    )  # fmt: skip
    ledger.record_event(EventKind.READY, pod=name, zone=Z, ts=T0)
    ledger.record_event(EventKind.DELETED, pod=name, zone=Z, ts=T0 + hours * 3600)


@pytest.fixture
def teams(ledger: Ledger) -> Ledger:
    """a1 spends 4 + 8 USD in team-a (one slice through a run), b1 16 USD in team-b, and a slice from
    before workspaces 2 USD."""
    ledger.create_run("run-a", script="train.py", principal="a1@x.com", workspace="team-a", ts=T0 - 120)
    _slice(ledger, "a-run", 1, run_id="run-a")
    _slice(ledger, "a-pod", 2, principal="a1@x.com", workspace="team-a")
    _slice(ledger, "b-pod", 4, principal="b1@x.com", workspace="team-b")
    _slice(ledger, "old", 0.5)
    return ledger


def _report(ledger: Ledger, group_by: str, scope: CostScope | None = None) -> CostReport:
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    service = CostService(ledger.url, catalog, source, clock=lambda: T0 + 86400)
    return service.report(group_by=parse_group_by(group_by), scope=scope)


def _costs(report: CostReport) -> dict[str, float]:
    return {g["key"]: g["cost_usd"] for g in report.groups}


def test_cost_by_whose_it_is(teams: Ledger) -> None:
    _groups_are_the_sums_of_their_slices(teams)
    _a_reader_of_team_b_sees_only_team_b(teams)
    _a_users_report_counts_their_slices_in_every_workspace(teams)
    _old_rows_are_the_local_workspaces(teams)
    with pytest.raises(UsageError, match="--group-by day"):
        _report(teams, "day", CostScope(frozenset({"team-a"})))


def _groups_are_the_sums_of_their_slices(teams: Ledger) -> None:
    slices = _report(teams, "slice")
    by_workspace = _report(teams, "workspace")
    by_user = _report(teams, "user")

    assert _costs(by_workspace) == {"team-b": 16.0, "team-a": 12.0, "default": 2.0}
    assert _costs(by_user) == {"b1@x.com": 16.0, "a1@x.com": 12.0, "(unknown)": 2.0}
    for grouped, field in ((by_workspace, "workspace"), (by_user, "principal")):
        for group in grouped.groups:
            rows = [s for s in slices.groups if s[field] == group["key"]]
            assert group["slices"] == len(rows)
            assert group["chip_hours"] == pytest.approx(sum(s["chip_hours"] for s in rows))
        assert grouped.totals.cost_usd == pytest.approx(slices.totals.cost_usd) == 30.0
        assert grouped.by_day == slices.by_day


def _a_reader_of_team_b_sees_only_team_b(teams: Ledger) -> None:
    viewer = Actor("b2@x.com", {"team-b": Role.VIEWER})
    scope = CostScope(viewer.visible)

    report = _report(teams, "workspace", scope)
    by_run = _report(teams, "run", scope)

    assert _costs(report) == {"team-b": 16.0}
    assert report.totals.cost_usd == 16.0 and report.totals.slices == 1
    assert "run-a" not in _costs(by_run) and by_run.totals.cost_usd == 16.0
    # Asking for team-a's through --workspace narrows the scope, never widens it.
    assert _report(teams, "slice", scope.narrowed("team-a", None)).groups == []


def _a_users_report_counts_their_slices_in_every_workspace(teams: Ledger) -> None:
    report = _report(teams, "zone", CostScope().narrowed(None, "a1@x.com"))

    assert _costs(report) == {Z: 12.0}
    assert report.totals.slices == 2
    assert report.by_day == [] and any("per-day" in w for w in report.warnings)


def _old_rows_are_the_local_workspaces(teams: Ledger) -> None:
    local = Actor("me", {"default": Role.ADMIN})

    report = _report(teams, "user", CostScope(local.visible))

    assert _costs(report) == {"(unknown)": 2.0}
