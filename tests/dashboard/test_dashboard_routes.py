"""The pages over a ledger with recorded runs, through FastAPI's TestClient (no browser): what each page
shows is what the CLI's JSON says; `tpuctl server` serves the same pages at /."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient
from recorded_runs import LIVE, RUN

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
    described = sim_cli("runs", "describe", RUN, "-o", "json").json["run"]
    assert [float(v) for v in _attr(html, "data-recovery-s")] == [
        p["recovery_s"] for p in described["recovery"]["preemptions"]
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
