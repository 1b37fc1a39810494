"""Teams on the control plane, the acceptance scenario end to end: a team server (`tpuctl server
--workspaces FILE`, a process) on a real PostgreSQL and the served simulator, and CLI processes acting as
simulated principals (credentials from the simulator's issuer). Team-a may hold 32 v5e chips and spend 50
USD a month: a1 (member) submits three v5e-16 runs, two run and the third waits with the exact reason
until a1 ends one; a1's v5e-64 is refused (exit 3). a2 (viewer) may not cancel a1's run (403); b1 (team-b)
cannot see it (404) nor list it; no token is 401; the admin's audit shows each. `/metrics`, scraped
during the scenario with the workspace file's scrape token, parses with prometheus-client's parser and
agrees with `runs list` and `cost report`.

Behind --slow (a dozen simulated hosts and fifteen CLI processes); its pieces are default-suite tests
(tests/server/test_auth.py, test_admission.py, tests/store/test_queue.py, test_metrics.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_place import CI, SCRAPE_TOKEN, TEAM_WORKSPACES, ZONE, Place, ended_under, make_place, output

from tpuctl.errors import EXIT_INFEASIBLE, EXIT_NOT_FOUND, EXIT_PERMISSION
from tpuctl.sim import SimAdminClient
from tpuctl.store.records import RunStatus
from tpuctl.testing.clock import wait_for

#: Runs until cancelled given "wait"; ends at once otherwise.
PROGRAM = """
import sys, time
print("started", flush=True)
while sys.argv[1:] == ["wait"]:
    time.sleep(0.1)
"""
FULL = "workspace team-a: 32 of 32 v5e chips in use"


@pytest.fixture
def team(tmp_path: Path, serve_sim: Callable[..., SimAdminClient], postgres_url: str) -> Iterator[Place]:
    yield from make_place(tmp_path, serve_sim, postgres_url, program=PROGRAM)


def tpuctl(place: Place, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tpuctl", *args]
    return subprocess.run(
        argv, env=place.client_env, capture_output=True, text=True, timeout=180, check=False
    )


def submit(place: Place, accelerator: str, *program_args: str) -> subprocess.CompletedProcess[str]:
    return tpuctl(place, "run", str(place.script), "--type", accelerator, "--zone", ZONE, "--no-runtime-deps",
                  "--detach", "-o", "json", "--", *program_args)  # fmt: skip


def document(said: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(said[said.index("{") :])
    return parsed


def scrape(place: Place) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = httpx.get(
        f"{place.url}/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


@pytest.mark.slow
def test_a_team_shares_a_server_within_its_limits_and_sees_only_its_own(team: Place, tmp_path: Path) -> None:
    workspaces = tmp_path / "workspaces.yaml"
    workspaces.write_text(TEAM_WORKSPACES)
    server = team.start_server("--workspaces", str(workspaces))
    emails = ("a1@example.com", "a2@example.com", "b1@example.com", CI, "lead@example.com")
    a1, a2, b1, ci, lead = (team.signed_in(e, tmp_path) for e in emails)

    bare = httpx.post(f"{team.url}/v1/runs/latest/cancel", timeout=10)
    assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Bearer")  # no token

    never = submit(a1, "v5e-64")
    assert never.returncode == EXIT_INFEASIBLE, never.stderr
    assert "more than workspace team-a may ever hold at once (32)" in never.stderr + never.stdout

    ci_run = document(submit(ci, "v5e-8").stdout)["run"]["run_id"]  # team-b's: ends at once
    first, second = (document(submit(a1, "v5e-16", "wait").stdout)["run"]["run_id"] for _ in range(2))
    third = document(submit(a1, "v5e-16").stdout)["run"]["run_id"]

    def two_running_and_one_waiting() -> bool:
        assert server.poll() is None, output(server)
        with team.ledger() as ledger:
            now = {r.run_id: (str(r.status), r.queue_reason) for r in ledger.list_runs()}
        return now[third] == ("queued", FULL) and now[first][0] == now[second][0] == "running"

    wait_for(two_running_and_one_waiting, timeout=240.0, interval=0.25, what="two runs and one waiting")

    # Who may do what: a viewer may not cancel, another team does not see, nor list.
    refused = tpuctl(a2, "runs", "cancel", first)
    assert (
        refused.returncode == EXIT_PERMISSION
        and "a2@example.com is a viewer of workspace team-a" in refused.stderr
    )
    hidden = tpuctl(b1, "runs", "describe", first)
    assert hidden.returncode == EXIT_NOT_FOUND and f"no run {first!r}" in hidden.stderr, hidden.stderr
    listed_by_b1 = document(tpuctl(b1, "runs", "list", "-o", "json").stdout)["runs"]
    assert [r["run_id"] for r in listed_by_b1] == [ci_run]

    # The scrape agrees with what the admin's `runs list` says now.
    metrics = scrape(team)
    listed = document(tpuctl(lead, "runs", "list", "-o", "json").stdout)["runs"]
    by_state = Counter((r["workspace"], r["status"]) for r in listed)
    for (workspace, state), count in by_state.items():
        assert metrics[("tpuctl_runs", (("state", state), ("workspace", workspace)))] == count
    assert metrics[("tpuctl_queued_runs", (("workspace", "team-a"),))] == 1

    # Room appears: a1 ends one of the two, and the third is admitted and runs to its end.
    assert tpuctl(a1, "runs", "cancel", first).returncode == 0
    assert ended_under(team, server, third) is RunStatus.SUCCEEDED
    waited = document(tpuctl(a1, "runs", "describe", third, "-o", "json").stdout)["run"]["queue"]
    assert waited["reason"] == FULL and waited["waited_s"] > 0
    assert tpuctl(a1, "runs", "cancel", second).returncode == 0
    wait_for(
        lambda: team.admin.status()["nodes"] == [], timeout=120.0, interval=0.25, what="every slice gone"
    )

    # With nothing billing any more, the scrape's spend is `cost report --group-by workspace`'s.
    metrics = scrape(team)
    report = document(
        tpuctl(lead, "cost", "report", "--group-by", "workspace", "--no-reconcile", "-o", "json").stdout
    )
    for group in report["groups"]:
        scraped = metrics[("tpuctl_spent_usd_total", (("workspace", group["key"]),))]
        assert round(scraped, 2) == round(group["cost_usd"], 2), group["key"]

    # The admin's audit shows each request above, refused ones included.
    audit = document(tpuctl(lead, "audit", "-o", "json").stdout)["entries"]
    rows = {(e["principal"], e["action"], e["target"], e["status"]) for e in audit}
    assert ("a2@example.com", "runs.cancel", first, 403) in rows
    assert ("b1@example.com", "runs.describe", first, 404) in rows
    assert ("a1@example.com", "runs.cancel", first, 200) in rows
    assert ("(anonymous)", "runs.cancel", "latest", 401) in rows
    assert sum(1 for p, a, _, s in rows if p == "a1@example.com" and a == "runs.submit" and s == 201) >= 1
