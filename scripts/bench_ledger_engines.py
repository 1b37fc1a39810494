#!/usr/bin/env python3
"""Benchmark: `cost report` on PostgreSQL against SQLite, over the same ledger (target: PostgreSQL at most
1.5x SQLite's time, per group-by).

Builds one seeded ledger of ``--events`` events (``bench_cost``'s mix: slices, runs, their segments) twice:
in a SQLite file and in a throwaway PostgreSQL cluster on loopback (``PostgresCluster``, the tests'
server; ``VACUUM ANALYZE`` after the load, as autovacuum would on a real server).
Then times ``CostService.report`` for the group-bys users run, SQLite and PostgreSQL alternated in each
of ``--repeat`` rounds so that the machine's load falls on both alike, and writes each group's median on
each engine and their ratio (PostgreSQL / SQLite) to docs/bench/ledger_engines.json. Both engines'
reports must agree to the cent (checked; a mismatch fails the run). The judged figure is the worst
group's ratio.

    .venv/bin/python scripts/bench_ledger_engines.py [--events 100000] [--repeat 5]
    .venv/bin/python scripts/bench_ledger_engines.py --events 1000000   # the full figure (long)
    .venv/bin/python scripts/bench_ledger_engines.py --reuse-sqlite PATH --reuse-postgresql URL

``--reuse-*`` times two ledgers built before from the same events (``build`` here, same --events and
--seed; their counts are checked equal) instead of building them again: a 1,000,000-event ledger takes
minutes to write on SQLite and several times that on PostgreSQL.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_cost import SPAN_S, START, generate  # noqa: E402
from bench_machine import machine  # noqa: E402

from tpuctl.services.cost import CostService, parse_group_by  # noqa: E402
from tpuctl.services.prices import load_catalog  # noqa: E402
from tpuctl.store.database import open_database  # noqa: E402
from tpuctl.store.engine import create_engine  # noqa: E402
from tpuctl.store.ledger import Ledger  # noqa: E402
from tpuctl.store.url import DatabaseUrl, parse_database_url, sqlite_url  # noqa: E402
from tpuctl.testing.postgres import PostgresCluster  # noqa: E402

#: (name, group-by, limit): the groupings of `cost report`, slice and run as the table shows them, and
#: whose the cost is (the sums of every slice's row: docs/cost.md, Attribution).
CASES: tuple[tuple[str, str, int | None], ...] = (
    ("zone", "zone", None),
    ("type", "type", None),
    ("capacity", "capacity", None),
    ("day", "day", None),
    ("label:team", "label:team", None),
    ("run", "run", 50),
    ("slice", "slice", 50),
    ("workspace", "workspace", None),
    ("user", "user", None),
)
#: The server's memory as a server's would be set, not the tests' defaults: 128 MB of shared buffers held a
#: fraction of a 1,000,000-event ledger, where SQLite's report maps up to 1 GB of the file.
SERVER_SETTINGS: Final = {"shared_buffers": "'1GB'"}
RUNS_INSERT = (
    "INSERT INTO runs (run_id, script, args, status, zone, created_at, labels, updated_at) "
    "VALUES (:run_id, :script, :args, :status, :zone, :created_at, :labels, :updated_at)"
)
SEGMENTS_INSERT = (
    "INSERT INTO run_segments (run_id, kind, started_at, ended_at, pod, zone, capacity, steps_completed, "
    "steps_recomputed) VALUES (:run_id, :kind, :started_at, :ended_at, :pod, :zone, :capacity, "
    ":steps_completed, :steps_recomputed)"
)
RUN_COLUMNS = ("run_id", "script", "args", "status", "zone", "created_at", "labels", "updated_at")
SEGMENT_COLUMNS = (
    "run_id", "kind", "started_at", "ended_at", "pod", "zone", "capacity", "steps_completed",
    "steps_recomputed",
)  # fmt: skip


def build(url: DatabaseUrl, data: tuple[list[Any], list[Any], list[Any]]) -> dict[str, Any]:
    """The ledger at ``url`` from ``data`` (events in bulk, then runs and segments in one transaction:
    the ledger has no bulk path for those); its counts and the seconds each part took."""
    events, runs, segments = data
    t0 = time.perf_counter()
    with Ledger(open_database(url)) as ledger:
        ledger.record_events_bulk(events)
        t1 = time.perf_counter()
        with ledger._write() as conn:
            for row in runs:
                conn.execute(RUNS_INSERT, dict(zip(RUN_COLUMNS, row, strict=True)))
            for row in segments:
                conn.execute(SEGMENTS_INSERT, dict(zip(SEGMENT_COLUMNS, row, strict=True)))
        t2 = time.perf_counter()
        with ledger._read() as conn:
            (n_events,) = conn.execute("SELECT COUNT(*) FROM events", {}).fetchone()
            (n_pods,) = conn.execute("SELECT COUNT(*) FROM pods", {}).fetchone()
    if url.path is None:
        vacuum_analyze(url)
    return {
        "events": int(n_events),
        "pods": int(n_pods),
        "runs": len(runs),
        "segments": len(segments),
        "bulk_write_s": round(t1 - t0, 2),
        "runs_write_s": round(t2 - t1, 2),
        "total_s": round(time.perf_counter() - t0, 2),
    }


def vacuum_analyze(url: DatabaseUrl) -> None:
    """What autovacuum does after a big load on a real server (the tests' cluster runs without it): the
    planner's statistics, and the visibility map that lets it answer from an index alone."""
    engine = create_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    finally:
        engine.dispose()


def timed(fn: Callable[[], dict[str, Any]]) -> tuple[float, float, dict[str, Any]]:
    wall, cpu = time.perf_counter(), time.process_time()
    doc = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, doc


def same_report(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The two engines' documents agree on every group's key and cost, to the cent."""

    def cents(doc: dict[str, Any]) -> list[tuple[Any, int]]:
        return [(g["key"], round(g["cost_usd"] * 100)) for g in doc["groups"]]

    return cents(a) == cents(b) and round(a["totals"]["cost_usd"], 2) == round(b["totals"]["cost_usd"], 2)


def _report(service: CostService, group: str, limit: int | None) -> dict[str, Any]:
    return service.report(group_by=parse_group_by(group), limit=limit).to_dict()


def compare(services: dict[str, CostService], repeat: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, group, limit in CASES:
        walls: dict[str, list[float]] = {engine: [] for engine in services}
        cpus: dict[str, list[float]] = {engine: [] for engine in services}
        docs: dict[str, dict[str, Any]] = {}
        load = os.getloadavg()[0]
        for round_ in range(repeat):
            # Alternate which engine goes first: neither always reads after the other warmed the cache.
            order = list(services) if round_ % 2 == 0 else list(reversed(services))
            for engine in order:
                wall, cpu, docs[engine] = timed(functools.partial(_report, services[engine], group, limit))
                walls[engine].append(wall)
                cpus[engine].append(cpu)
        if not same_report(docs["sqlite"], docs["postgresql"]):
            raise SystemExit(f"--group-by {name}: the engines' reports differ")
        medians = {engine: statistics.median(w) for engine, w in walls.items()}
        results[name] = {
            "sqlite_median_s": round(medians["sqlite"], 4),
            "postgresql_median_s": round(medians["postgresql"], 4),
            "ratio": round(medians["postgresql"] / medians["sqlite"], 3),
            "sqlite_cpu_median_s": round(statistics.median(cpus["sqlite"]), 4),
            "postgresql_cpu_median_s": round(statistics.median(cpus["postgresql"]), 4),
            "groups": len(docs["sqlite"]["groups"]),
            "total_cost_usd": round(docs["sqlite"]["totals"]["cost_usd"], 2),
            "walls": {engine: [round(w, 4) for w in ws] for engine, ws in walls.items()},
            "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        }
        r = results[name]
        print(
            f"--group-by {name:<11} sqlite {r['sqlite_median_s']:.3f} s, postgresql "
            f"{r['postgresql_median_s']:.3f} s: {r['ratio']:.2f}x  (load {r['load']})",
            flush=True,
        )
    return results


def counts(url: DatabaseUrl) -> dict[str, Any]:
    """What a ledger holds (to check that two reused ledgers are the same one)."""
    with Ledger(open_database(url)) as ledger, ledger._read() as conn:
        return {
            table: int(conn.execute(f"SELECT COUNT(*) FROM {table}", {}).fetchone()[0])
            for table in ("events", "pods", "runs", "run_segments")
        }


def measure(urls: dict[str, DatabaseUrl], state: Path, repeat: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The group-bys timed on both ledgers, and the PostgreSQL server's settings they ran under."""
    catalog, source = load_catalog(state, "sim")
    now = START + SPAN_S + 86400
    services = {engine: CostService(url, catalog, source, clock=lambda: now) for engine, url in urls.items()}
    for service in services.values():  # one untimed report each: both caches warm before the first figure
        _report(service, "zone", None)
    results = compare(services, repeat)
    settings = {}
    with Ledger(open_database(urls["postgresql"])) as ledger, ledger._read() as conn:
        for name in ("server_version", "shared_buffers", "temp_buffers", "work_mem", "jit"):
            settings[name] = str(conn.execute(f"SHOW {name}", {}).fetchone()[0])
    return results, settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--target", type=float, default=1.5, help="the worst ratio allowed")
    parser.add_argument(
        "--reuse-sqlite",
        type=Path,
        help="time this SQLite ledger instead of building one (with --reuse-postgresql)",
    )
    parser.add_argument(
        "--reuse-postgresql",
        help="time the ledger at this PostgreSQL URL, built from the same events as --reuse-sqlite",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "ledger_engines.json")
    args = parser.parse_args()

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-engines-") as tmp:
        state = Path(tmp) / "state"
        if args.reuse_sqlite is not None and args.reuse_postgresql is not None:
            urls = {
                "sqlite": sqlite_url(args.reuse_sqlite),
                "postgresql": parse_database_url(args.reuse_postgresql),
            }
            ledgers = {engine: counts(url) for engine, url in urls.items()}
            if ledgers["sqlite"] != ledgers["postgresql"]:
                raise SystemExit(f"not the same ledger: {ledgers}")
            results, settings = measure(urls, state, args.repeat)
        else:
            print(f"generating {args.events:,} events ...", flush=True)
            data = generate(args.events, args.seed)
            with PostgresCluster.start(settings=SERVER_SETTINGS) as cluster:
                urls = {
                    "sqlite": sqlite_url(state / "ledger.db"),
                    "postgresql": parse_database_url(cluster.create_database("bench")),
                }
                ledgers = {}
                for engine, url in urls.items():
                    print(f"building the {engine} ledger ...", flush=True)
                    ledgers[engine] = build(url, data)
                    print(json.dumps(ledgers[engine]), flush=True)
                results, settings = measure(urls, state, args.repeat)

    worst = max(results, key=lambda name: results[name]["ratio"])
    doc = {
        "benchmark": "cost report on PostgreSQL vs SQLite, same ledger",
        "events": ledgers["sqlite"]["events"],
        "repeat": args.repeat,
        "target_ratio": args.target,
        "worst_group": worst,
        "worst_ratio": results[worst]["ratio"],
        "met": results[worst]["ratio"] <= args.target,
        "ledgers": ledgers,
        "report": results,
        "postgresql": settings,
        "notes": "CostService.report() per group-by (run and slice: the 50 costliest, as the table shows "
        "them), each engine's median of --repeat rounds, the engines alternated within each round; ratio = "
        "PostgreSQL median / SQLite median; judged on the worst group. PostgreSQL: a throwaway cluster on "
        "loopback (fsync off, autovacuum off, as the tests'; shared_buffers 1 GB), VACUUM ANALYZEd after the "
        "load, one untimed report on each engine first; each report "
        "opens its own connection, as `tpuctl cost report` does, and sets its own jit, work_mem, "
        "random_page_cost and temp_buffers (`postgresql` below: the server's defaults). The machine is "
        "shared: load is the 1-minute load average before and "
        "after each group's rounds.",
        "started": started,
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        "machine": machine(sqlite=sqlite3.sqlite_version),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: worst ratio {doc['worst_ratio']:.2f}x ({worst}), target {args.target}x "
          f"{'met' if doc['met'] else 'not met'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
