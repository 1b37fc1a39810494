#!/usr/bin/env python3
"""Benchmark: time from `tpuctl pod create` start to READY when 7 of 8 zones are stocked out.

A simulator runs in this process with 8 zones offering v5e (every zone the catalog prices), 300 ms of
latency on every TPU API and Cloud Quotas request (``--latency-ms``) and the default world's durations at
``--speed`` (60: a 120 s create takes 2 s, a 10 s stockout 0.17 s, a 120 s queued provisioning 2 s). Each
run starts a fresh `tpuctl pod create v5e-16 --spot ...` process pointed at it (TPUCTL_SIM_URL) in a
fresh state dir, so the figures include Python start-up and CLI import, as a user would see them.

Scenarios:
- ``single_zone``: one zone, no stockout (the baseline: one create);
- ``single_zone_queued``: the same through a queued resource (the baseline for race);
- ``cheapest_7_of_8_stocked_out``: the default strategy over 8 zones whose 7 cheapest are stocked out:
  it fails over zone by zone and ends READY in the 8th;
- ``race_7_of_8_stocked_out``: ``--strategy race --race-k 8``: queued resources in all 8 at once; the
  stocked-out ones wait, the 8th goes ACTIVE and is kept, the 7 others are force-deleted.

Measured per run: ``to_ready_s`` = process start -> the READY event in the ledger; ``wall_s`` = process
start -> exit (includes deleting race losers and the final cleanup sweep); ``attempts``. Reported: median,
min and max over ``--runs``. Writes docs/bench/placement.json (or --out) and prints a table. Run from the
repository root: ``.venv/bin/python scripts/bench_placement.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ZONES = [
    "us-central1-a",
    "us-east1-c",
    "asia-northeast1-b",
    "europe-west4-b",
    "us-west4-a",
    "us-south1-a",
    "us-east5-b",
    "asia-southeast1-b",
]  # cheapest spot first; the last one is the one left with capacity
FREE_ZONE = ZONES[-1]


@dataclass(frozen=True)
class Scenario:
    name: str
    zones: list[str]
    stocked_out: list[str]
    extra: list[str]


SCENARIOS = [
    Scenario("single_zone", [FREE_ZONE], [], []),
    Scenario("single_zone_queued", [FREE_ZONE], [], ["--queued"]),
    Scenario("cheapest_7_of_8_stocked_out", ZONES, ZONES[:-1], []),
    Scenario("race_7_of_8_stocked_out", ZONES, ZONES[:-1], ["--strategy", "race", "--race-k", "8"]),
]


def world_data(latency_ms: float, speed: float) -> dict[str, Any]:
    return {
        "project": "tpuctl-sim",
        "speed": speed,
        "seed": 1,
        "zones": {z: {"v5e": {"on_demand": 256, "preemptible": 256}} for z in ZONES},
        "quotas": {
            "default": {
                "on_demand": {"zone": 256, "region": 512},
                "preemptible": {"zone": 256, "region": 512},
            }
        },
        "latency": {"base_ms": latency_ms, "jitter_ms": 0, "spike_probability": 0},
        # The default world's durations (simulated seconds).
        "durations": {
            "node_create_s": 120,
            "node_delete_s": 30,
            "node_stop_s": 30,
            "node_start_s": 60,
            "queued_provision_s": 120,
            "stockout_s": 10,
            "preemption_grace_s": 30,
        },
    }


def run_once(repo: Path, scenario: Scenario, latency_ms: float, speed: float) -> dict[str, Any]:
    from tpuctl.sim import SimAdminClient, SimServer
    from tpuctl.sim.world import world_from_data
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.records import EventKind

    with tempfile.TemporaryDirectory(prefix="bench-placement-") as tmp:
        state = Path(tmp) / "state"
        server = SimServer(state, world_from_data(world_data(latency_ms, speed), "bench world"))
        url = server.start()
        try:
            with SimAdminClient(url) as admin:
                for zone in scenario.stocked_out:
                    admin.stockout(zone)
            env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
            env.update({"TPUCTL_SIM_URL": url, "TPUCTL_STATE_DIR": str(state), "TPUCTL_OWNER": "bench"})
            args = [
                str(repo / ".venv" / "bin" / "tpuctl"),
                "pod",
                "create",
                "v5e-16",
                "--spot",
                "--name",
                "bench",
            ]
            for zone in scenario.zones:
                args += ["--zone", zone]
            args += [*scenario.extra, "-o", "json"]
            started = time.time()
            proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
            wall = time.time() - started
            if proc.returncode != 0:
                raise RuntimeError(f"{scenario.name}: exit {proc.returncode}: {proc.stderr[-2000:]}")
            placement = json.loads(proc.stdout)["placement"]
            with Ledger(state) as ledger:
                ready = [
                    e.ts
                    for e in ledger.events(kinds=[EventKind.READY])
                    if e.pod == "bench" and e.zone == placement["zone"]
                ]
            with SimAdminClient(url) as admin:
                status = admin.status()
            left = sorted((n["zone"], n["name"]) for n in status["nodes"])
            if left != [(FREE_ZONE, "bench")]:
                raise RuntimeError(f"{scenario.name}: slices left: {left}")
            return {
                "to_ready_s": round(min(ready) - started, 3),
                "wall_s": round(wall, 3),
                "zone": placement["zone"],
                "attempts": len(placement["attempts"]),
                "outcomes": [a["outcome"] for a in placement["attempts"]],
                "queued_resources_left": len(status["queued_resources"]),
            }
        finally:
            server.stop()


def summarize(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [r[key] for r in runs]
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per scenario (default 3)")
    parser.add_argument("--latency-ms", type=float, default=300.0, help="simulated API latency (default 300)")
    parser.add_argument("--speed", type=float, default=60.0, help="simulator speed factor (default 60)")
    parser.add_argument("--out", type=Path, default=Path("docs/bench/placement.json"))
    args = parser.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))

    results: dict[str, Any] = {}
    for scenario in SCENARIOS:
        runs = [run_once(repo, scenario, args.latency_ms, args.speed) for _ in range(args.runs)]
        results[scenario.name] = {
            "zones": len(scenario.zones),
            "stocked_out": len(scenario.stocked_out),
            "flags": scenario.extra,
            "to_ready_s": summarize(runs, "to_ready_s"),
            "wall_s": summarize(runs, "wall_s"),
            "attempts": runs[0]["attempts"],
            "outcomes": runs[0]["outcomes"],
            "runs": runs,
        }
        print(
            f"  {scenario.name}: {results[scenario.name]['to_ready_s']['median']:.2f} s to READY",
            file=sys.stderr,
        )

    doc = {
        "benchmark": "placement: command start to READY with 7 of 8 zones stocked out",
        "command": "tpuctl pod create v5e-16 --spot --zone Z1 ... --zone Z8 [--strategy race --race-k 8]",
        "simulator": {
            "latency_ms": args.latency_ms,
            "speed": args.speed,
            "node_create_real_s": round(120 / args.speed, 3),
            "stockout_real_s": round(10 / args.speed, 3),
            "queued_provision_real_s": round(120 / args.speed, 3),
        },
        "runs_per_scenario": args.runs,
        "host": {"python": platform.python_version(), "cpus": os.cpu_count(), "loadavg": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")

    print(
        f"placement benchmark: {args.latency_ms:.0f} ms API latency, speed {args.speed:g}, {args.runs} runs"
    )
    head = f"{'scenario':32} {'zones':>5} {'out':>4} {'attempts':>8}"
    print(f"{head} {'to READY s (med/min/max)':>26} {'wall s (med)':>12}")
    for name, r in results.items():
        t = r["to_ready_s"]
        print(
            f"{name:32} {r['zones']:>5} {r['stocked_out']:>4} {r['attempts']:>8} "
            f"{t['median']:>10.2f} / {t['min']:.2f} / {t['max']:.2f} {r['wall_s']['median']:>12.2f}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
