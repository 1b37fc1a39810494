"""The pages in a real browser (Debian's Chromium, driven by Playwright) against recorded runs on the
in-process simulator: clicking through from the runs list, what the charts draw, the money page's totals
against `cost report -o json`, and a live run's page showing a preemption without a reload.

With TPUCTL_SCREENSHOTS=DIR (e.g. docs/images) each page is also saved there as a PNG."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from recorded_runs import LIVE, RUN

from tpuctl.store.records import SegmentKind

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from tpuctl.services.session import Session
    from tpuctl.testing.backend import InProcessCli


#: Read when the tests are collected: each test's environment is cleaned before it runs (conftest).
SCREENSHOTS = os.environ.get("TPUCTL_SCREENSHOTS")


def _screenshot(page: Page, name: str) -> None:
    folder = SCREENSHOTS
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"dashboard-{name}.png"), full_page=True)


def test_a_run_preempted_twice_shows_both_preemptions_with_their_kinds_and_recovery_times(
    recorded: Session, served: str, page: Page, sim_cli: InProcessCli
) -> None:
    page.goto(f"{served}/")
    assert page.locator("#runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.run)") == [LIVE, RUN]
    _screenshot(page, "runs")
    page.click(f"text={RUN}")
    page.wait_for_url(f"{served}/runs/{RUN}")
    marks = page.locator('#timeline [data-mark="preemption"]')
    assert marks.evaluate_all("ms => ms.map(m => [m.dataset.number, m.dataset.kind, m.dataset.step])") == [
        ["1", "notice", "40"],
        ["2", "hard", "80"],
    ]
    segments = page.locator('#timeline [data-mark="segment"]').evaluate_all(
        "ss => ss.map(s => s.dataset.kind)"
    )
    assert segments.count("preempted") == 2 and segments.count("running") == 3
    assert page.locator("#timeline svg").is_visible()
    described = sim_cli("runs", "describe", RUN, "-o", "json").json["run"]
    shown = page.locator("#preemptions tbody tr").evaluate_all(
        "rs => rs.map(r => Number(r.dataset.recoveryS))"
    )
    assert shown == [p["recovery_s"] for p in described["recovery"]["preemptions"]]
    on_marks = marks.evaluate_all(
        "ms => ms.map(m => [Number(m.dataset.detectionLatencyS), Number(m.dataset.recoveryS)])"
    )
    assert on_marks == [
        [p["detection_latency_s"], p["recovery_s"]] for p in described["recovery"]["preemptions"]
    ]
    parts = page.locator('#cost-split [data-mark="cost-part"]').evaluate_all(
        "ps => ps.map(p => p.dataset.part)"
    )
    assert parts == ["productive", "wasted"]
    attempts = page.locator("#slices tbody tr").evaluate_all("rs => rs.map(r => r.dataset.slice)")
    assert attempts == ["p-1", "p-2", "p-3"]
    _screenshot(page, "run")
    page.click('#host-logs [data-worker="0"]')  # opens host 0's log (a host-log page of its own)
    page.wait_for_url(f"{served}/runs/{RUN}/logs/0")


def test_gone_slices_show_on_request(recorded: Session, served: str, page: Page) -> None:
    page.goto(f"{served}/slices")
    assert page.locator("#slices tbody tr").evaluate_all("rs => rs.map(r => r.dataset.slice)") == ["q-1"]
    page.click('[data-gone="1d"]')
    page.wait_for_url(f"{served}/slices?gone=1d")
    rows = page.locator("#slices tbody tr").evaluate_all(
        "rs => rs.map(r => [r.dataset.slice, r.dataset.endReason])"
    )
    assert rows == [["q-1", None], ["p-3", "deleted"], ["p-2", "preempted"], ["p-1", "preempted"]]
    _screenshot(page, "slices")


def test_the_money_pages_totals_equal_cost_report_json(
    recorded: Session, served: str, page: Page, sim_cli: InProcessCli
) -> None:
    page.goto(f"{served}/money?group_by=capacity")
    # --no-reconcile: what the page reads, the ledger as it is (test_real_run, --slow, compares a
    # reconciled report).
    report = sim_cli("cost", "report", "--group-by", "capacity", "--no-reconcile", "-o", "json").json
    for figure in ("cost_usd", "on_demand_usd", "spot_savings_usd", "waste_usd", "preemptions"):
        shown = page.locator(f'#totals [data-total="{figure}"]').get_attribute("data-value")
        assert shown is not None and float(shown) == report["totals"][figure], figure
    bars = page.locator('#per-day [data-mark="bar"]').evaluate_all("bs => bs.map(b => b.dataset.group)")
    assert set(bars) == {"spot"}
    by_run = sim_cli("cost", "report", "--group-by", "run", "--no-reconcile", "-o", "json").json
    waste = {g["key"]: g["waste_usd"] for g in by_run["groups"] if g["waste_usd"]}
    drawn = page.locator('#waste [data-mark="waste-bar"]').evaluate_all(
        "bs => bs.map(b => [b.dataset.key, Number(b.dataset.usd)])"
    )
    assert drawn == [[RUN, waste[RUN]]]
    assert "no burn-down to draw" in page.locator("#budget-note").inner_text()
    _screenshot(page, "money")


def test_a_live_runs_page_shows_a_preemption_without_a_reload(
    recorded: Session, served: str, page: Page
) -> None:
    page.goto(f"{served}/runs/{LIVE}")
    page.evaluate("window.notReloaded = true")
    assert page.locator('[data-mark="preemption"]').count() == 0
    ledger, now = recorded.ledger, recorded.clock()
    ledger.add_segment(LIVE, SegmentKind.PREEMPTED, start=now, pod="q-1")
    preemption = {"number": 1, "kind": "hard", "pod": "q-1", "detected_at": now}
    ledger.update_run(LIVE, preemptions=1, detail={"hosts": 1, "recovery": {"preemptions": [preemption]}})
    page.wait_for_selector('#timeline [data-mark="preemption"][data-kind="hard"]', timeout=15_000)
    assert page.evaluate("window.notReloaded") is True
