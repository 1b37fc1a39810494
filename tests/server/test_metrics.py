"""``/metrics``: the scrape of a ledger with runs in several states and workspaces, queued and admitted
runs, preemptions with their segments and recovery records, and priced slices (live and ended), parsed
with prometheus-client's own parser, each number compared with what `runs list`, `runs describe` and
`cost report` print for the same ledger (on both engines: the cost numbers come from the cost service
the report uses); and who may scrape (the workspace file's token, a member's token, nobody else)."""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from tpuctl.catalog import CapacityType
from tpuctl.server import problems
from tpuctl.server.metrics import (
    DETECTION_BUCKETS_S,
    QUEUE_WAIT_BUCKETS_S,
    RECOVERY_BUCKETS_S,
    metrics_router,
)
from tpuctl.services.prices import load_catalog
from tpuctl.services.session import Session, open_session
from tpuctl.settings import load_settings
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, NewEvent, RunStatus, SegmentKind
from tpuctl.teams.workspaces import Workspaces
from tpuctl.testing.backend import InProcessCli

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note on which httpx it prefers, at import
    from fastapi.testclient import TestClient

ZONE = "us-central1-a"
HOUR = 3600.0
WORLD: dict[str, Any] = {
    "project": "tpuctl-sim",
    "zones": {ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}}},
    "latency": {"base_ms": 0, "jitter_ms": 0},
}
SQLITE_ONLY = pytest.mark.parametrize("open_ledger", ["sqlite"], indirect=True)


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return WORLD


@dataclass(frozen=True)
class Slice:
    name: str
    workspace: str | None
    run_id: str | None
    chips: int
    capacity: CapacityType
    price: float
    ready: float  # hours before now
    ended: float | None = None  # hours before now; None: still billing
    end_kind: EventKind = EventKind.DELETED


def _preemption(detection_s: float | None, recovery_s: float | None) -> dict[str, Any]:
    return {"number": 1, "kind": "notice", "pod": "p", "zone": ZONE,
            "detection_latency_s": detection_s, "recovery_s": recovery_s}  # fmt: skip


def _recovery(preemptions: list[dict[str, Any]], productive_s: float | None, wall_s: float) -> Any:
    goodput = None if productive_s is None else round(productive_s / wall_s, 4)
    record = {"preemptions": preemptions, "preemption_count": len(preemptions),
              "productive_step_s": productive_s, "wall_s": wall_s, "goodput": goodput}  # fmt: skip
    return {"recovery": record}


#: run -> (workspace, status, hours created before now, preemptions, detail, queued: wait in s or
#: "waiting").
RUNS: dict[str, tuple[str | None, RunStatus, float, int, dict[str, Any], float | str | None]] = {
    "run-a1": ("team-a", RunStatus.SUCCEEDED, 3.0, 1,
               _recovery([_preemption(4.5, 290.0)], 5000.0, 7200.0), None),
    "run-a2": ("team-a", RunStatus.RUNNING, 1.0, 0, {}, 600.0),
    "run-a3": ("team-a", RunStatus.PENDING, 0.5, 0, {}, "waiting"),
    "run-a4": ("team-a", RunStatus.CANCELLED, 0.4, 0, {}, "waiting"),  # cancelled while it waited
    "run-b1": ("team-b", RunStatus.FAILED, 2.0, 2,
               _recovery([_preemption(30.0, 900.0), _preemption(12.0, None)], None, 3000.0), None),
    "run-b2": ("team-b", RunStatus.RUNNING, 2.0, 0, _recovery([], 1000.0, 4000.0), 5400.0),
    "run-l1": (None, RunStatus.SUCCEEDED, 5.0, 0, {}, None),  # from before workspaces: "default"
}  # fmt: skip
SLICES = (
    Slice("a1-s1", "team-a", "run-a1", 8, CapacityType.SPOT, 0.245, 3.0, 2.0, EventKind.PREEMPTED),
    Slice("a1-s2", "team-a", "run-a1", 8, CapacityType.SPOT, 0.245, 1.9, 1.0),
    Slice("a2-s1", "team-a", "run-a2", 16, CapacityType.ON_DEMAND, 1.2, 0.75),
    Slice("b1-s1", "team-b", "run-b1", 8, CapacityType.SPOT, 0.245, 2.0, 1.5, EventKind.PREEMPTED),
    Slice("b2-s1", "team-b", "run-b2", 8, CapacityType.SPOT, 0.245, 0.5),
    Slice("l1-s1", None, "run-l1", 8, CapacityType.ON_DEMAND, 1.2, 5.0, 4.0),
    Slice("loose", None, None, 4, CapacityType.ON_DEMAND, 1.2, 0.25),  # `pod create`: no run
)


def fill(ledger: Ledger, now: float) -> None:
    """RUNS and SLICES, with run a1's segments: running on a1-s1, preempted, recovering, and running again
    on a1-s2 with 20 of its 120 steps recomputed."""
    events = []
    for s in sorted(SLICES, key=lambda s: -s.ready):
        common: dict[str, Any] = {"pod": s.name, "zone": ZONE}
        events += [
            NewEvent(EventKind.REQUESTED, accelerator_type=f"v5litepod-{s.chips}", chips=s.chips,
                     capacity=s.capacity, price_per_chip_hour=s.price, run_id=s.run_id,
                     workspace=None if s.run_id else s.workspace, ts=now - s.ready * HOUR - 60, **common),
            NewEvent(EventKind.READY, ts=now - s.ready * HOUR, **common),
        ]  # fmt: skip
        if s.ended is not None:
            events.append(NewEvent(s.end_kind, ts=now - s.ended * HOUR, **common))
    # The runs first: each slice of a run is then its run's workspace's (the ledger attributes it).
    for run_id, (workspace, status, created, preemptions, detail, queued) in RUNS.items():
        ledger.create_run(run_id, script="train.py", ts=now - created * HOUR, workspace=workspace,
                          queue_reason=None if queued is None else "workspace full")  # fmt: skip
        ledger.update_run(run_id, status=status, preemptions=preemptions, detail=detail or None, ts=now)
    ledger.record_events_bulk(sorted(events, key=lambda e: e.ts or 0.0))
    with ledger._write() as conn:  # an admission's instant, as a replica writes it when it admits
        for run_id, (*_, queued) in RUNS.items():
            if isinstance(queued, float):
                conn.execute("UPDATE runs SET admitted_at = queued_at + :wait WHERE run_id = :run_id",
                             {"wait": queued, "run_id": run_id})  # fmt: skip
    segments = ((SegmentKind.RUNNING, "a1-s1", 3.0, 2.0, 100, 0),
                (SegmentKind.PREEMPTED, "a1-s1", 2.0, 1.95),
                (SegmentKind.RECOVERING, None, 1.95, 1.9),
                (SegmentKind.RUNNING, "a1-s2", 1.9, 1.0, 120, 20))  # fmt: skip
    for kind, pod, start, end, *steps in segments:
        seg = ledger.add_segment("run-a1", kind, start=now - start * HOUR, pod=pod, zone=pod and ZONE)
        done, redone = steps or (None, None)
        ledger.close_segment(seg, end=now - end * HOUR, steps_completed=done, steps_recomputed=redone)
    assert ledger.check_view() == []


def parsed(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and sorted labels, through prometheus-client's own parser."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _by_workspace(values: dict[str, float]) -> dict[str, float]:
    """A per-run figure summed by the run's workspace (RUNS'; "default" for no run or none)."""
    sums: dict[str, float] = defaultdict(float)
    for run_id, value in values.items():
        workspace = RUNS[run_id][0] if run_id in RUNS else None
        sums[workspace or "default"] += value
    return dict(sums)


@pytest.fixture
def team_ledger(open_ledger: Callable[..., Ledger], sim_cli: InProcessCli) -> Iterator[Ledger]:
    with open_ledger(clock=sim_cli.clock) as ledger:
        fill(ledger, sim_cli.clock.now())
        yield ledger


@pytest.fixture
def session(sim_cli: InProcessCli, state_dir: Path, team_ledger: Ledger) -> Iterator[Session]:
    settings = {"backend": "sim", "state_dir": state_dir, "database": team_ledger.url.secret_url}
    with open_session(load_settings(settings), backend=sim_cli.backend) as opened:
        yield opened


def scrape(session: Session, workspaces: Workspaces, **kwargs: Any) -> TestClient:
    app = FastAPI()
    problems.install(app)
    prices = load_catalog(session.state_dir, "sim")[1]
    app.include_router(metrics_router(session, workspaces, prices=prices, **kwargs))
    return TestClient(app)


def test_scrape_agrees_with_runs_list_describe_and_cost_report(
    session: Session, sim_cli: InProcessCli, team_ledger: Ledger
) -> None:
    answer = scrape(session, Workspaces.implicit()).get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=")
    got = parsed(answer.text)
    env = {"TPUCTL_DATABASE_URL": team_ledger.url.secret_url}

    def cli_json(*args: str) -> Any:
        result = sim_cli(*args, "-o", "json", env=env)
        assert result.code == 0, result.stderr
        return result.json

    # Runs by state and their preemptions: `runs list`.
    listed = cli_json("runs", "list", "--limit", "1000")
    listed = listed["runs"] if isinstance(listed, dict) else listed
    states: dict[tuple[str, str], int] = defaultdict(int)
    for run in listed:
        states[(RUNS[run["run_id"]][0] or "default", run["status"])] += 1
    shown = {
        (dict(labels)["workspace"], dict(labels)["state"]): v
        for (n, labels), v in got.items()
        if n == "tpuctl_runs"
    }
    assert shown == states
    preemptions = _by_workspace({r["run_id"]: r["preemptions"] for r in listed})
    for ws, n in preemptions.items():
        assert got[("tpuctl_preemptions_total", (("workspace", ws),))] == n
    assert sum(preemptions.values()) == 3

    # The queue: a3 waits (a4, cancelled while waiting, does not); a2 and b2 waited 10 and 90 minutes.
    assert got[("tpuctl_queued_runs", (("workspace", "team-a"),))] == 1
    assert got[("tpuctl_queued_runs", (("workspace", "team-b"),))] == 0
    check_histogram(got, "tpuctl_queue_wait_seconds", "team-a", QUEUE_WAIT_BUCKETS_S, [600.0])
    check_histogram(got, "tpuctl_queue_wait_seconds", "team-b", QUEUE_WAIT_BUCKETS_S, [5400.0])

    # Detection latency, recoveries and goodput: `runs describe`'s recovery record.
    described = {
        run_id: cli_json("runs", "describe", run_id)["run"]["recovery"]
        for run_id in ("run-a1", "run-b1", "run-b2")
    }
    for ws, runs in (("team-a", ("run-a1",)), ("team-b", ("run-b1", "run-b2"))):
        records = [described[r] for r in runs]
        preempted = [p for rec in records for p in rec["preemptions"]]
        latencies = [p["detection_latency_s"] for p in preempted]
        recoveries = [p["recovery_s"] for p in preempted if p["recovery_s"] is not None]
        check_histogram(
            got, "tpuctl_preemption_detection_latency_seconds", ws, DETECTION_BUCKETS_S, latencies
        )
        check_histogram(got, "tpuctl_recovery_seconds", ws, RECOVERY_BUCKETS_S, recoveries)
        assert got[("tpuctl_recoveries_total", (("workspace", ws),))] == len(recoveries)
        known = [rec for rec in records if rec["goodput"] is not None]
        productive = sum(rec["productive_step_s"] for rec in known)
        wall = sum(rec["wall_s"] for rec in known)
        assert got[("tpuctl_goodput_ratio", (("workspace", ws),))] == pytest.approx(productive / wall)
    assert got[("tpuctl_goodput_ratio", (("workspace", "team-a"),))] == pytest.approx(
        described["run-a1"]["goodput"], abs=1e-4
    )
    assert ("tpuctl_goodput_ratio", (("workspace", "default"),)) not in got  # no run of it says

    # Spent and recomputed USD: `cost report --group-by run`, by the run's workspace.
    report = cli_json("cost", "report", "--group-by", "run", "--no-reconcile")
    spent = _by_workspace({g["key"]: g["cost_usd"] for g in report["groups"]})
    recomputed = _by_workspace({g["key"]: g["recomputed_usd"] for g in report["groups"]})
    assert set(spent) == {"team-a", "team-b", "default"}
    for ws in spent:
        assert got[("tpuctl_spent_usd_total", (("workspace", ws),))] == pytest.approx(spent[ws], abs=1e-9)
        assert got[("tpuctl_recomputed_usd_total", (("workspace", ws),))] == pytest.approx(
            recomputed[ws], abs=1e-9
        )
    assert recomputed["team-a"] > 0
    assert sum(spent.values()) == pytest.approx(report["totals"]["cost_usd"], abs=1e-5)

    # USD per hour burning now: `cost report --group-by slice`'s slices still billing, chips x price.
    slices = cli_json("cost", "report", "--group-by", "slice", "--no-reconcile")["groups"]
    burning: dict[tuple[str, str], float] = defaultdict(float)
    workspace_of = {s.name: s.workspace or "default" for s in SLICES}
    for g in slices:
        if g["ended_at"] is None:
            burning[(workspace_of[g["name"]], g["capacity"])] += g["chips"] * g["price_per_chip_hour"]
    shown_burn = {
        (dict(labels)["workspace"], dict(labels)["capacity"]): v
        for (n, labels), v in got.items()
        if n == "tpuctl_burn_rate_usd_per_hour"
    }
    assert shown_burn == pytest.approx(dict(burning))
    assert set(burning) == {("team-a", "on-demand"), ("team-b", "spot"), ("default", "on-demand")}


def check_histogram(
    got: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    workspace: str,
    bounds: tuple[float, ...],
    values: list[float],
) -> None:
    labels = (("workspace", workspace),)
    assert got[(f"{name}_count", labels)] == len(values)
    assert got[(f"{name}_sum", labels)] == pytest.approx(sum(values))
    for bound in (*bounds, float("inf")):
        le = "+Inf" if bound == float("inf") else str(bound)  # as prometheus-client writes one: 60.0
        bucket = got[(f"{name}_bucket", (("le", le), *labels))]
        assert bucket == sum(1 for v in values if v <= bound), (name, workspace, le)


# --- who may scrape ---------------------------------------------------------------------------------------


# --- what a scrape costs ----------------------------------------------------------------------------------


def big_ledger(ledger: Ledger, now: float, runs: int = 10_000) -> int:
    """``runs`` runs in four workspaces (two in five preempted, half through the queue, each with a
    recovery record of a run's size) and two or three slices each: ~94,000 events, their number returned."""
    import json
    import random

    rng = random.Random(7)
    events, rows = [], []
    for i in range(runs):
        run, created = f"run-{i:05d}", now - rng.uniform(1, 60 * 24) * HOUR
        for k in range(rng.choice((2, 2, 3, 3, 3))):  # a first slice, then the recoveries' (preempted)
            common: dict[str, Any] = {"pod": f"{run}-{k}", "zone": ZONE}
            ready = created + k * 600 + 60
            events += [
                NewEvent(EventKind.REQUESTED, accelerator_type="v5litepod-8", chips=8, run_id=run,
                         capacity=rng.choice((CapacityType.SPOT, CapacityType.ON_DEMAND)),
                         price_per_chip_hour=rng.choice((0.245, 1.2)), ts=ready - 60, **common),
                NewEvent(EventKind.READY, ts=ready, **common),
            ]  # fmt: skip
            if i >= runs - 50:
                continue  # the last 50 runs' slices still bill
            end = ready + rng.uniform(600, 3 * HOUR)
            events.append(NewEvent(EventKind.PREEMPTED if k else EventKind.DELETED, ts=end, **common))
            if k:
                events.append(NewEvent(EventKind.DELETED, ts=end + 10, **common))
        n = rng.choice((0, 0, 0, 1, 2))
        preempted = [{**_preemption(rng.uniform(1, 60), rng.uniform(60, 3000)), "number": j + 1,
                      "source": "runtime-notice", "occurred_at": created + 100, "detected_at": created + 105,
                      "provisioning_s": 100.0, "setup_s": 20.0, "lost_slices": [], "replaced_slices": []}
                     for j in range(n)]  # fmt: skip
        detail = {"hosts": 2, "executor": "ssh", "checkpoint_dir": f"gs://b/{run}", "exit_codes": {"0": 0},
                  **_recovery(preempted, 3000.0, 4000.0)}  # fmt: skip
        queued = created if i % 2 else None
        admitted = None if queued is None else queued + 700
        rows.append({"run_id": run, "status": "succeeded", "created_at": created, "preemptions": n,
                     "detail": json.dumps(detail), "workspace": ("team-a", "team-b", "team-c", None)[i % 4],
                     "queued_at": queued, "admitted_at": admitted})  # fmt: skip
    ledger.record_events_bulk(sorted(events, key=lambda e: e.ts or 0.0))
    with ledger._write() as conn:
        conn.executemany(
            "INSERT INTO runs (run_id, script, status, created_at, updated_at, preemptions, detail,"
            " workspace, queued_at, admitted_at) VALUES (:run_id, 'train.py', :status, :created_at,"
            " :created_at, :preemptions, :detail, :workspace, :queued_at, :admitted_at)",
            rows,
        )
    return len(events)


@pytest.mark.slow
@SQLITE_ONLY
def test_a_scrape_of_10000_runs_and_94000_events_takes_well_under_a_second(
    open_ledger: Callable[..., Ledger], sim_cli: InProcessCli, state_dir: Path
) -> None:
    """Measured in CPU seconds (both of the scrape's threads): what it costs unloaded, whatever else the
    machine runs meanwhile."""
    import time

    from tpuctl.server.metrics import read_figures

    with open_ledger(clock=sim_cli.clock) as ledger:
        assert big_ledger(ledger, sim_cli.clock.now()) > 90_000
        settings = {"backend": "sim", "state_dir": state_dir, "database": ledger.url.secret_url}
        with open_session(load_settings(settings), backend=sim_cli.backend) as opened:
            prices = load_catalog(state_dir, "sim")[1]
            spent = []
            for _ in range(3):
                started = time.process_time()
                figures = read_figures(opened, prices)
                spent.append(time.process_time() - started)
    assert sum(f.runs.get("succeeded", 0) for f in figures.values()) == 10_000
    assert figures["team-a"].recoveries > 0 and figures["default"].queue_wait.count == 2500  # odd runs
    print(f"scrape CPU seconds: {[round(s, 3) for s in spent]}")
    assert min(spent) < 1.0  # 0.5-0.6 s on a loaded two-core machine; most of it `cost report --group-by run`
