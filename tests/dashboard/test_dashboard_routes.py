"""The pages over a ledger with recorded runs, through FastAPI's TestClient (no browser): what each page
shows is what the CLI's JSON says; `tpuctl server` serves the same pages at /."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from fastapi.testclient import TestClient
from recorded_runs import LIVE, RUN

from tpuctl.store.records import RunStatus

if TYPE_CHECKING:
    from tpuctl.services.session import Session
    from tpuctl.testing.backend import InProcessCli


@pytest.fixture
def client(recorded: Session) -> Iterator[TestClient]:
    from tpuctl.dashboard.serve import dashboard_app

    with TestClient(dashboard_app(recorded)) as client:
        yield client


def _attr(html: str, name: str, **where: str) -> list[str]:
    """The values of ``name`` on the tags that have every ``where`` attribute (``data_kind`` = data-kind)."""
    found = []
    for tag in re.findall(r"<[a-z]+ [^>]*>", html):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', tag))
        if all(attrs.get(k.replace("_", "-")) == v for k, v in where.items()) and name in attrs:
            found.append(attrs[name])
    return found


def test_the_runs_page_lists_runs_newest_first_with_their_cost_from_cost_report(
    client: TestClient, sim_cli: InProcessCli
) -> None:
    html = client.get("/").text
    assert _attr(html, "data-run") == [LIVE, RUN]
    report = sim_cli("cost", "report", "--group-by", "run", "--no-reconcile", "-o", "json").json
    cost = {g["key"]: g["cost_usd"] for g in report["groups"]}
    assert [float(v) for v in _attr(html, "data-cost-usd")] == [cost[LIVE], cost[RUN]]
    assert _attr(html, "data-preemptions") == ["0", "2"]
    assert _attr(client.get("/?limit=1").text, "data-run") == [LIVE]


def test_a_runs_page_marks_each_preemption_with_its_kind_and_its_recovery_time(
    client: TestClient, sim_cli: InProcessCli
) -> None:
    html = client.get(f"/runs/{RUN}").text
    assert _attr(html, "data-kind", data_mark="preemption") == ["notice", "hard"]
    assert _attr(html, "data-step", data_mark="preemption") == ["40", "80"]  # where each hit
    kinds = _attr(html, "data-kind", data_mark="segment")
    assert kinds.count("preempted") == 2 and kinds.count("running") == 3
    described = sim_cli("runs", "describe", RUN, "-o", "json").json["run"]["recovery"]["preemptions"]
    for figure in ("recovery_s", "detection_latency_s"):
        wanted = [p[figure] for p in described]
        attribute = "data-" + figure.replace("_", "-")
        assert [float(v) for v in _attr(html, attribute, data_mark="preemption")] == wanted, figure
    assert [float(v) for v in _attr(html, "data-recovery-s", data_preemption="1")] == [
        described[0]["recovery_s"]
    ]
    assert _attr(html, "data-live-src") == []  # it ended: nothing polls


def test_a_live_runs_page_polls_its_live_part_which_says_whether_the_run_is_still_live(
    client: TestClient,
) -> None:
    assert f'data-live-src="/runs/{LIVE}/live"' in client.get(f"/runs/{LIVE}").text
    live = client.get(f"/runs/{LIVE}/live")
    assert live.headers["X-Tpuctl-Live"] == "yes" and "<html" not in live.text
    assert client.get(f"/runs/{RUN}/live").headers["X-Tpuctl-Live"] == "no"


def test_a_runs_page_links_each_hosts_log_from_this_machine_or_from_the_ledger(
    client: TestClient, recorded: Session
) -> None:
    from tpuctl.services.run.rundir import RunDir
    from tpuctl.store.records import LeaseOwner

    RunDir.of(recorded.state_dir, RUN).make().host_log(0).write_text("step 1\nstep 2\n")
    # LIVE keeps its lines in the ledger: a supervisor on another machine (it took the run over) wrote
    # them, and this machine has no log file of it.
    ledger = recorded.ledger
    ledger.save_run_request(LIVE, "{}")
    claim = ledger.claim_lease(LIVE, LeaseOwner("owner-x", "host-x", 4242, 7), 300.0)
    ledger.append_log_lines(claim, 0, 0, [(recorded.clock(), "from the supervisor on host-x")])
    ledger.release_lease(claim)
    for run, text in ((RUN, "step 1\nstep 2\n"), (LIVE, "from the supervisor on host-x\n")):
        html = client.get(f"/runs/{run}").text
        assert _attr(html, "href", data_worker="0") == [f"/runs/{run}/logs/0"]
        log = client.get(f"/runs/{run}/logs/0")
        assert (log.status_code, log.text) == (200, text)
        assert log.headers["content-type"].startswith("text/plain")
    assert client.get(f"/runs/{RUN}/logs/1").status_code == 400  # one host: worker 0 only


def test_the_money_pages_totals_are_cost_reports(client: TestClient, sim_cli: InProcessCli) -> None:
    for group in ("type",):
        html = client.get(f"/money?group_by={group}").text
        # --no-reconcile: the ledger as it is, as the page reads it (listing every zone of the simulated
        # cloud to reconcile costs seconds; test_real_run compares a reconciled report, --slow).
        report = sim_cli("cost", "report", "--group-by", group, "--no-reconcile", "-o", "json").json
        for figure in ("cost_usd", "waste_usd", "preemptions"):
            assert float(_attr(html, "data-value", data_total=figure)[0]) == report["totals"][figure]
        days = {d["day"]: d["cost_usd"] for d in report["by_day"]}
        bars = _attr(html, "data-usd", data_mark="bar")
        assert sum(float(b) for b in bars) == pytest.approx(sum(days.values()), abs=1e-4)


def test_the_slices_page_shows_the_live_slices_with_their_price_and_run(client: TestClient) -> None:
    html = client.get("/slices").text
    assert _attr(html, "data-slice") == ["q-1"]
    assert _attr(html, "data-usd-per-hour") == ["3.6"]  # 4 chips x 0.90 USD
    assert f'href="/runs/{LIVE}"' in html


def test_tpuctl_server_serves_the_pages_at_its_root(recorded: Session, tmp_path: object) -> None:
    from pathlib import Path

    from tpuctl.server.app import build_app
    from tpuctl.server.bundles import BundleStore

    app = build_app(recorded, BundleStore(Path(str(tmp_path)) / "bundles"), None)
    with TestClient(app) as client:
        assert _attr(client.get("/").text, "data-run") == [LIVE, RUN]
        assert client.get("/healthz").json() == {"status": "ok"} or client.get("/healthz").status_code == 200
        assert "/" not in client.get("/openapi.json").json()["paths"]  # pages are not the API


def test_gone_slices_show_on_request_with_when_and_why_they_ended(client: TestClient) -> None:
    assert _attr(client.get("/slices").text, "data-slice") == ["q-1"]  # the live ones only
    html = client.get("/slices?gone=1d").text
    assert _attr(html, "data-slice") == ["q-1", "p-3", "p-2", "p-1"]  # live, then the last to end first
    assert _attr(html, "data-end-reason") == ["deleted", "preempted", "preempted"]
    ended = _attr(html, "data-ended-at")
    assert ended == sorted(ended, reverse=True) and len(ended) == 3
    assert client.get("/slices?gone=tomorrowish").status_code == 400  # `cost report --since`'s forms


def test_a_runs_page_lists_its_attempts_slices_and_cost_split_as_cost_report_has_them(
    client: TestClient, sim_cli: InProcessCli
) -> None:
    html = client.get(f"/runs/{RUN}").text
    assert _attr(html, "data-slice", data_zone="us-central2-b") == ["p-1", "p-2", "p-3"]
    assert _attr(html, "data-attempt") == ["1", "2", "3"]
    by_slice = sim_cli("cost", "report", "--group-by", "slice", "--no-reconcile", "-o", "json").json
    usd = {g["name"]: g["cost_usd"] for g in by_slice["groups"]}
    assert [float(v) for v in _attr(html, "data-cost-usd", data_capacity="spot")] == [
        usd["p-1"],
        usd["p-2"],
        usd["p-3"],
    ]
    by_run = sim_cli("cost", "report", "--group-by", "run", "--no-reconcile", "-o", "json").json
    (run,) = [g for g in by_run["groups"] if g["key"] == RUN]
    drawn = dict(
        zip(
            _attr(html, "data-part", data_mark="cost-part"),
            _attr(html, "data-usd", data_mark="cost-part"),
            strict=True,
        )
    )
    assert float(drawn["wasted"]) == run["waste_usd"] > 0  # the quota two preempted slices held
    assert float(drawn["productive"]) == pytest.approx(run["cost_usd"] - run["recomputed_usd"], abs=1e-6)


def _another_day(session: Session) -> None:
    """An on-demand v5litepod-8 (no run) billed across the midnight a day before: a second type, a
    second capacity and a second day."""
    from tpuctl.catalog import CapacityType
    from tpuctl.store.records import EventKind

    now = session.clock()
    facts: dict[str, Any] = {"pod": "od-1", "zone": "us-central1-a"}
    session.ledger.record_event(EventKind.CREATED, accelerator_type="v5litepod-8", chips=8, hosts=1,
                                capacity=CapacityType.ON_DEMAND, price_per_chip_hour=1.2,
                                ts=now - 40 * 3600, **facts)  # fmt: skip
    session.ledger.record_event(EventKind.READY, ts=now - 36 * 3600, **facts)
    session.ledger.record_event(EventKind.DELETED, ts=now - 20 * 3600, **facts)


def _bar_cells(html: str) -> list[tuple[str, str, float]]:
    """The money page's stacked bars: (day, group, USD) of each mark drawn."""
    return list(zip(_attr(html, "data-day", data_mark="bar"), _attr(html, "data-group", data_mark="bar"),
                    (float(v) for v in _attr(html, "data-usd", data_mark="bar")), strict=True))  # fmt: skip


def _cells_add_up(cells: list[tuple[str, str, float]], report: dict[str, Any]) -> None:
    """Each day's cells add up to the report's figure for that day, and each group's to its cost."""
    assert len({day for day, _, _ in cells}) == len(report["by_day"]) >= 2
    for day in report["by_day"]:
        assert sum(usd for d, _, usd in cells if d == day["day"]) == pytest.approx(day["cost_usd"], abs=2e-6)
    for g in report["groups"]:
        assert sum(usd for _, k, usd in cells if k == g["key"]) == pytest.approx(g["cost_usd"], abs=2e-6)


@pytest.mark.parametrize("group", ["type", "capacity", "run"])
def test_the_money_pages_days_add_up_to_cost_reports_days_and_groups(
    client: TestClient, recorded: Session, sim_cli: InProcessCli, group: str
) -> None:
    _another_day(recorded)
    html = client.get(f"/money?group_by={group}").text
    report = sim_cli("cost", "report", "--group-by", group, "--no-reconcile", "-o", "json").json
    cells = _bar_cells(html)
    _cells_add_up(cells, report)
    assert [float(v) for v in _attr(html, "data-cost-usd")] == [g["cost_usd"] for g in report["groups"]]


@pytest.mark.parametrize("group", ["workspace", "user"])
def test_the_money_page_by_whose_it_is_has_cost_reports_totals_groups_and_days(
    client: TestClient, recorded: Session, sim_cli: InProcessCli, group: str
) -> None:
    _another_day(recorded)
    html = client.get(f"/money?group_by={group}").text
    report = sim_cli("cost", "report", "--group-by", group, "--no-reconcile", "-o", "json").json
    for figure in ("cost_usd", "waste_usd", "chip_hours", "preemptions"):
        assert float(_attr(html, "data-value", data_total=figure)[0]) == report["totals"][figure]
    # The groups from the page's one pass: the report's (which adds each slice's row rounded) to the
    # rounding of the sums; the rows without a workspace or principal under the report's name for them.
    shown = [float(v) for v in _attr(html, "data-cost-usd")]
    assert shown == pytest.approx([g["cost_usd"] for g in report["groups"]], abs=2e-6)
    cells = _bar_cells(html)
    assert {k for _, k, _ in cells} == {g["key"] for g in report["groups"] if g["cost_usd"]}
    _cells_add_up(cells, report)


def test_the_money_page_by_run_lists_and_draws_the_costliest_runs_and_the_rest(
    client: TestClient, recorded: Session, sim_cli: InProcessCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuctl.dashboard import pages
    from tpuctl.services.cost.keyed import OTHER_KEY

    monkeypatch.setattr(pages, "SHOWN_GROUPS", 1)  # the palette's size on a team's ledger
    _another_day(recorded)
    html = client.get("/money?group_by=run").text
    report = sim_cli(
        "cost", "report", "--group-by", "run", "--limit", "1", "--no-reconcile", "-o", "json"
    ).json
    (top,) = report["groups"]
    assert report["groups_total"] >= 3
    assert _attr(html, "data-groups-total", id="shown-of") == [str(report["groups_total"])]
    assert f"The 1 costliest of {report['groups_total']} groups by run" in html
    assert [float(v) for v in _attr(html, "data-cost-usd")] == [top["cost_usd"]]
    for figure in ("cost_usd", "waste_usd", "chip_hours"):
        assert float(_attr(html, "data-value", data_total=figure)[0]) == report["totals"][figure]
    rest = float(_attr(html, "data-rest-usd")[0])
    assert rest == pytest.approx(report["totals"]["cost_usd"] - top["cost_usd"], abs=2e-6)
    cells = _bar_cells(html)
    assert {k for _, k, _ in cells} == {top["key"], OTHER_KEY}
    for day in report["by_day"]:
        assert sum(usd for d, _, usd in cells if d == day["day"]) == pytest.approx(day["cost_usd"], abs=2e-6)
    assert sum(usd for _, k, usd in cells if k == top["key"]) == pytest.approx(top["cost_usd"], abs=2e-6)
    assert sum(usd for _, k, usd in cells if k == OTHER_KEY) == pytest.approx(rest, abs=2e-6)


def test_a_scoped_viewers_money_page_draws_no_other_workspaces_days(recorded: Session) -> None:
    from dataclasses import replace

    from tpuctl.dashboard.pages import Dashboard
    from tpuctl.services.prices import load_catalog
    from tpuctl.teams.actor import Actor
    from tpuctl.teams.workspaces import Role

    prices = load_catalog(recorded.state_dir, recorded.backend.name)[1]
    whole = Dashboard(recorded, prices).money(group_by="type", since=None)
    assert whole.days and whole.report.groups  # the local user sees the ledger's days
    # A viewer of another workspace only: none of this ledger's slices, and no per-day cost either (a
    # scoped report has none, and the unscoped split would be other workspaces' cost).
    outsider = replace(recorded, actor=Actor("b@example.com", {"team-b": Role.VIEWER}))
    for group in ("type", "run"):
        page = Dashboard(outsider, prices).money(group_by=group, since=None)
        assert (page.days, page.report.groups, page.report.totals.cost_usd) == ((), [], 0.0)


def test_the_money_page_ranks_the_runs_by_waste_as_cost_report_has_it(
    client: TestClient, sim_cli: InProcessCli
) -> None:
    html = client.get("/money").text
    report = sim_cli("cost", "report", "--group-by", "run", "--no-reconcile", "-o", "json").json
    wasted = sorted((g for g in report["groups"] if g["waste_usd"]), key=lambda g: -g["waste_usd"])
    assert [g["key"] for g in wasted] == [RUN]
    assert _attr(html, "data-key", data_mark="waste-bar") == _attr(html, "data-run") == [RUN]
    assert [float(v) for v in _attr(html, "data-waste-usd")] == [wasted[0]["waste_usd"]]
    # The implicit local workspace has no monthly budget: the page says so and draws no burn-down.
    assert "no burn-down to draw" in html and 'data-mark="projection"' not in html


def test_a_budget_burns_down_with_the_months_projection() -> None:
    from datetime import UTC, datetime

    from tpuctl.dashboard import svg
    from tpuctl.dashboard.pages import _budget

    month = datetime(2026, 11, 1, tzinfo=UTC)
    days = (svg.DayStack("2026-11-01", (("team-a", 100.0), ("team-b", 5.0))),
            svg.DayStack("2026-11-02", (("team-a", 50.0),)))  # fmt: skip
    now = month.timestamp() + 2 * 86_400  # the end of the 2nd: 150 USD in 2 of 30 days
    budget = _budget("team-a", 1000.0, month, days, now)
    assert budget.spent_by_day == (("2026-11-01", 100.0), ("2026-11-02", 150.0))
    assert budget.projected_usd == 2250.0  # 75 USD a day x 30 days
    drawn = str(budget.chart)
    assert _attr(drawn, "data-left-usd", data_mark="left") == ["900.000000", "850.000000"]
    assert _attr(drawn, "data-left-usd", data_mark="projection") == ["-1250.00"]


def test_a_workspace_budget_burns_down_by_its_spend_this_month(recorded: Session) -> None:
    from tpuctl.dashboard.pages import Dashboard
    from tpuctl.services.cost import CostService, GroupBy
    from tpuctl.services.prices import load_catalog
    from tpuctl.teams.workspaces import Workspace, Workspaces

    budgeted = Workspaces(
        workspaces={"default": Workspace(name="default", usd_per_month=500.0)}, source="workspaces.yaml"
    )
    prices = load_catalog(recorded.state_dir, recorded.backend.name)[1]
    page = Dashboard(recorded, prices, budgeted).money(group_by="type", since=None)
    (budget,) = page.budgets
    now = recorded.clock()
    first = datetime.fromtimestamp(now, UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    report = CostService(recorded.ledger.url, recorded.catalog, prices, clock=recorded.clock).report(
        since=first.timestamp(), until=now, group_by=GroupBy("workspace"), with_days=False
    )
    spent = sum(float(g["cost_usd"]) for g in report.groups if g["key"] == "default")
    # The burn-down's spend is `cost report --group-by workspace`'s for the month (to the cent).
    assert (budget.workspace, budget.month) == ("default", first.strftime("%Y-%m"))
    assert round(budget.spent_usd, 2) == round(spent, 2)
    unbudgeted = Dashboard(recorded, prices).money(group_by="type", since=None)
    assert unbudgeted.budget_note is not None and "local workspace" in unbudgeted.budget_note


def test_the_queue_page_is_tpuctl_queues_order_and_reasons(
    recorded: Session, client: TestClient, sim_cli: InProcessCli
) -> None:
    ledger, now = recorded.ledger, recorded.clock()
    full = "workspace default: 8 of 8 v5e chips in use"
    for run_id, band, ago in (("run-q-batch", "batch", 300.0), ("run-q-prod", "production", 60.0)):
        ledger.create_run(run_id, script="train.py", status=RunStatus.QUEUED, accelerator_type="v5litepod-8",
                          ts=now - ago, priority=band, queue_reason=full)  # fmt: skip
    html = client.get("/queue").text
    listed = sim_cli("queue", "-o", "json").json["queue"]
    assert [q["run_id"] for q in listed] == ["run-q-prod", "run-q-batch"]  # production's band first
    assert _attr(html, "data-run") == [q["run_id"] for q in listed]
    assert _attr(html, "data-position") == [str(q["position"]) for q in listed]
    assert _attr(html, "data-reason") == [q["reason"] for q in listed]
    assert 'data-workspace="default"' in client.get("/").text  # the runs list says whose each run is


def test_on_postgresql_the_money_page_ranks_the_waste_beside_the_report_and_is_the_same_page(
    session: Session, postgres_ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database server runs two reports at once in processes of its own: the waste ranking is asked on a
    thread of its own while the report runs; the page is the one SQLite's ledger of the same runs gives."""
    import threading
    from dataclasses import replace

    from recorded_runs import record_both

    from tpuctl.dashboard.pages import Dashboard
    from tpuctl.services.prices import load_catalog
    from tpuctl.store import Ledger

    prices = load_catalog(session.state_dir, session.backend.name)[1]
    ranked_on: list[str] = []
    top_waste = Dashboard.top_waste

    def watched(self: Dashboard, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], ...]:
        ranked_on.append(threading.current_thread().name)
        return top_waste(self, *args, **kwargs)

    monkeypatch.setattr(Dashboard, "top_waste", watched)
    with Ledger.open(postgres_ledger_url) as on_postgresql:
        pages = []
        for ledger in (session.ledger, on_postgresql):
            record_both(ledger, session.clock())
            for group in ("run", "type"):
                page = Dashboard(replace(session, ledger=ledger), prices).money(group_by=group, since=None)
                pages.append((page.report.to_dict(), page.days, page.groups, page.top_waste))
    sqlite, postgresql = pages[:2], pages[2:]
    assert [p[3][0]["key"] for p in postgresql] == [RUN, RUN]  # the run preempted twice wasted most
    for (s_report, *s_rest), (p_report, *p_rest) in zip(sqlite, postgresql, strict=True):
        assert p_rest == s_rest
        assert _close(p_report["totals"], s_report["totals"]) and _close(
            p_report["groups"], s_report["groups"]
        )
    assert ranked_on[:2] == ["MainThread"] * 2  # SQLite: after the report, on this thread
    assert [name.startswith("tpuctl-waste") for name in ranked_on[2:]] == [True, True]


def _close(have: Any, want: Any) -> bool:
    """Equal, floats to their last digits (the engines sum in another order)."""
    if isinstance(want, dict):
        return (
            isinstance(have, dict)
            and have.keys() == want.keys()
            and all(_close(have[k], v) for k, v in want.items())
        )
    if isinstance(want, list):
        return isinstance(have, list) and len(have) == len(want) and all(map(_close, have, want))
    if isinstance(want, float):
        return bool(have == pytest.approx(want, rel=1e-9, abs=1e-9))
    return bool(have == want)
