#!/usr/bin/env python3
"""Benchmark: `cost report` over a ledger of 1,000,000 events (target: 1 s or less).

Builds a ledger with ``Ledger.record_events_bulk`` from a seeded, realistic mix of slices (requested,
created, ready, then deleted, or preempted and deleted later, or failed before READY; a few price changes;
labels; most slices created for runs), plus runs and their segments (with recomputed steps after
preemptions), then times the report for each --group-by, best of ``--repeat``, and ``tpuctl cost report``
end to end in a fresh process (offline: --no-reconcile). Writes the figures to docs/bench/cost.json.
The bulk path maintains the per-slice billing facts and the ``cost_rollup`` the report reads (schema v4),
so the timed reports take the same path as on a ledger written event by event.

    .venv/bin/python scripts/bench_cost.py [--events 1000000] [--repeat 3] [--out docs/bench/cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpuctl.catalog import Catalog  # noqa: E402
from tpuctl.services.cost import CostService, parse_group_by  # noqa: E402
from tpuctl.services.prices import load_catalog  # noqa: E402
from tpuctl.store.ledger import Ledger  # noqa: E402
from tpuctl.store.records import EventKind, NewEvent  # noqa: E402

START = 1_790_000_000.0  # 2026-09-21
SPAN_S = 60 * 86400.0  # two months of activity
ZONES = {
    "v5litepod": ["us-central1-a", "us-east1-c", "us-west4-a", "europe-west4-b", "us-south1-a"],
    "v6e": ["us-central1-b", "us-east5-b", "europe-west4-a"],
    "v5p": ["us-central1-a", "us-east5-a"],
}
SIZES = {"v5litepod": [8, 16, 32, 64, 256], "v6e": [8, 16, 64], "v5p": [8, 32, 128]}
GENERATION = {"v5litepod": "v5e", "v6e": "v6e", "v5p": "v5p"}
TEAMS = ["nlp", "vision", "speech", "infra"]
CAPACITIES = ["spot", "spot", "spot", "preemptible", "on-demand"]


AGGREGATE_GROUPS = ("zone", "type", "capacity", "day", "label:team")
PER_ITEM_GROUPS = ("run", "slice")


def chips_of(prefix: str, size: int) -> int:
    return size // 2 if prefix == "v5p" else size


def generate(
    target_events: int, seed: int
) -> tuple[list[NewEvent], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Events, runs rows and run_segments rows; slice lives are spread over two months."""
    rng = random.Random(seed)
    catalog = Catalog.load()
    events: list[NewEvent] = []
    runs: list[tuple[Any, ...]] = []
    segments: list[tuple[Any, ...]] = []
    n = 0
    run_id: str | None = None
    run_left = 0
    run_clock = START
    while len(events) < target_events:
        n += 1
        prefix = rng.choice(list(ZONES))
        zone = rng.choice(ZONES[prefix])
        size = rng.choice(SIZES[prefix])
        capacity = rng.choice(CAPACITIES)
        region = zone.rsplit("-", 1)[0]
        key = "spot" if capacity != "on-demand" else "on_demand"
        price = catalog.prices.prices.get(GENERATION[prefix], {}).get(region, {}).get(key)
        if run_left == 0 and rng.random() < 0.8:
            run_id = f"run-{n}"
            run_left = rng.randint(1, 4)  # its slices: 1, or more after preemptions
            run_clock = START + rng.random() * SPAN_S
            runs.append((run_id, "train.py", "[]", "succeeded", zone, run_clock, "{}", run_clock))
        elif run_left == 0:
            run_id = None
        owner = run_id
        name = f"s{n}"
        t = run_clock if owner else START + rng.random() * SPAN_S
        common = {"pod": name, "zone": zone}
        events.append(
            NewEvent(
                EventKind.REQUESTED,
                accelerator_type=f"{prefix}-{size}",
                chips=chips_of(prefix, size),
                capacity=capacity,
                price_per_chip_hour=price,
                labels={"team": rng.choice(TEAMS)},
                run_id=owner,
                ts=t,
                backend="sim",
                project="bench",
                **common,
            )
        )
        if rng.random() < 0.05:  # stockout or quota: failed before READY
            events.append(NewEvent(EventKind.FAILED, ts=t + rng.uniform(5, 120), **common))
            continue
        created = t + rng.uniform(1, 5)
        ready = created + rng.uniform(30, 300)
        events.append(NewEvent(EventKind.CREATED, ts=created, **common))
        events.append(NewEvent(EventKind.READY, ts=ready, **common))
        life = rng.expovariate(1 / 7200.0)
        if rng.random() < 0.02:
            events.append(
                NewEvent(
                    EventKind.PRICE_CHANGE,
                    price_per_chip_hour=(price or 1.0) * 1.1,
                    ts=ready + life / 2,
                    **common,
                )
            )
        preempted = capacity != "on-demand" and rng.random() < 0.3
        end = ready + life
        if preempted:
            events.append(NewEvent(EventKind.PREEMPTED, ts=end, **common))
            events.append(NewEvent(EventKind.DELETED, ts=end + rng.uniform(20, 900), **common))
        else:
            events.append(NewEvent(EventKind.DELETED, ts=end, **common))
        if owner is not None:
            recomputed = rng.randint(0, 50) if run_left > 0 and segments and segments[-1][1] == owner else 0
            steps = max(int(life / 2), recomputed + 1)
            segments.append((owner, "running", ready, end, name, zone, capacity, steps, recomputed))
            run_left -= 1
            run_clock = end + rng.uniform(30, 600)
            if not preempted:
                run_left = 0
    return events[:target_events], runs, segments


def build(path: Path, events: int, seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    evs, runs, segments = generate(events, seed)
    t1 = time.perf_counter()
    with Ledger(path) as ledger:
        ledger.record_events_bulk(evs)
        db = ledger.path
    t2 = time.perf_counter()
    # The ledger has no bulk path for runs and segments (one transaction each); a bench needs thousands.
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany(
            "INSERT INTO runs (run_id, script, args, status, zone, created_at, labels, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            runs,
        )
        conn.executemany(
            "INSERT INTO run_segments (run_id, kind, started_at, ended_at, pod, zone, capacity, "
            "steps_completed, steps_recomputed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            segments,
        )
    pods = conn.execute("SELECT COUNT(*) FROM pods").fetchone()[0]
    n_events = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    conn.close()
    return {
        "events": n_events,
        "pods": pods,
        "runs": len(runs),
        "segments": len(segments),
        "generate_s": round(t1 - t0, 2),
        "bulk_write_s": round(t2 - t1, 2),
        "db_bytes": os.path.getsize(db),
    }


def timed(repeat: int, fn: Any) -> Iterator[float]:
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        yield time.perf_counter() - t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "cost.json")
    parser.add_argument("--target-s", type=float, default=1.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-cost-") as tmp:
        state = Path(tmp) / "state"
        print(f"building a ledger of {args.events:,} events ...", flush=True)
        ledger_info = build(state, args.events, args.seed)
        print(json.dumps(ledger_info), flush=True)
        catalog, source = load_catalog(state, "sim")
        now = START + SPAN_S + 86400
        service = CostService(state / "ledger.db", catalog, source, clock=lambda: now)
        results: dict[str, Any] = {}
        load_before = os.getloadavg()
        for group in AGGREGATE_GROUPS + PER_ITEM_GROUPS:
            last: dict[str, Any] = {}

            def run_report(group: str = group, last: dict[str, Any] = last) -> None:
                doc = service.report(group_by=parse_group_by(group)).to_dict()
                json.dumps(doc)  # the -o json rendering, minus the write
                last["doc"] = doc

            # One group per run or per slice is output-bound (hundreds of thousands of groups): once.
            repeat = args.repeat if group in AGGREGATE_GROUPS else 1
            times = list(timed(repeat, run_report))
            doc = last["doc"]
            results[group] = {
                "best_s": round(min(times), 3),
                "median_s": round(sorted(times)[len(times) // 2], 3),
                "groups": len(doc["groups"]),
                "total_cost_usd": round(doc["totals"]["cost_usd"], 2),
            }
            print(
                f"group-by {group:<11} best {min(times):.3f} s  ({len(doc['groups']):,} groups)", flush=True
            )
        # End to end: a fresh process running the CLI (offline: no simulator started).
        env = {**os.environ, "TPUCTL_STATE_DIR": str(state)}
        cli_times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tpuctl",
                    "cost",
                    "report",
                    "--no-reconcile",
                    "--group-by",
                    "zone",
                    "-o",
                    "json",
                ],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            cli_times.append(time.perf_counter() - t)
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
        totals = json.loads(proc.stdout)["totals"]
        print(
            f"tpuctl cost report --group-by zone -o json (new process): best {min(cli_times):.3f} s",
            flush=True,
        )

    default = results["zone"]["best_s"]
    doc = {
        "benchmark": "cost report over a ledger of 1,000,000 events",
        "target_s": args.target_s,
        "met": max(results[g]["best_s"] for g in AGGREGATE_GROUPS) <= args.target_s,
        "ledger": ledger_info,
        "report_best_s_by_group": {g: r["best_s"] for g, r in results.items()},
        "report": results,
        "cli_end_to_end_best_s": round(min(cli_times), 3),
        "cli_totals": totals,
        "headline_s": default,
        "notes": "report = CostService.report() + JSON encoding (with by_day), best of --repeat, warm page "
        "cache; `met` is judged on the aggregate groupings; run and slice groupings emit one group per run "
        "(~158k) or slice (~230k), are output-bound and timed once; the CLI figure is a fresh "
        "`python -m tpuctl` process including interpreter start-up and imports. The machine is shared: "
        "load_average is what other processes were doing around the run.",
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        "machine": {
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0 if doc["met"] else 2


if __name__ == "__main__":
    raise SystemExit(main())
