#!/usr/bin/env python3
"""Benchmark: `tpuctl db copy` of a laptop's SQLite ledger into PostgreSQL (default 100,000 events).

Builds the ledger as ``bench_cost`` does (its seeded mix of slices, runs and segments), starts a throwaway
PostgreSQL cluster (``tpuctl.testing.postgres``: loopback, durability off, so the figure is tpuctl's work
and the round trips, not the disk), and times ``copy_database`` end to end: the runs, the events replayed
through the target's view in chunks, and the check (row counts and the cost report's totals on both
sides). The ratio to the bulk write of the same events into SQLite (the same build, the same run) says what
replaying into PostgreSQL costs over writing them once. Writes docs/bench/copy.json.

    .venv/bin/python scripts/bench_copy.py [--events 100000] [--out docs/bench/copy.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_cost import SPAN_S, START, build  # noqa: E402
from bench_machine import machine  # noqa: E402

from tpuctl.services.db_copy import copy_database  # noqa: E402
from tpuctl.services.prices import load_catalog  # noqa: E402
from tpuctl.store.copy import CopyStep  # noqa: E402
from tpuctl.store.ledger import Ledger  # noqa: E402
from tpuctl.store.records import EventKind  # noqa: E402
from tpuctl.store.url import parse_database_url, sqlite_url  # noqa: E402
from tpuctl.testing.postgres import PostgresCluster  # noqa: E402


def quiet_ledger(state: Path, events: int, seed: int) -> dict[str, Any]:
    """``bench_cost``'s ledger of ``events`` events, its last slices (cut off by the count) deleted an
    hour after they were ready: `db copy` copies only a ledger with no live slice."""
    info = build(state, events, seed)
    conn = sqlite3.connect(state / "ledger.db")
    open_slices = conn.execute("SELECT name, zone, COALESCE(ready_at, requested_at) FROM pods "
                               "WHERE ended_at IS NULL").fetchall()  # fmt: skip
    conn.close()
    with Ledger(state) as ledger:
        for name, zone, since in open_slices:
            ledger.record_event(EventKind.DELETED, pod=name, zone=zone, ts=since + 3600)
    return {**info, "events": info["events"] + len(open_slices)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "copy.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-copy-") as tmp:
        state = Path(tmp) / "state"
        print(f"building a ledger of {args.events:,} events ...", flush=True)
        ledger_info = quiet_ledger(state, args.events, args.seed)
        print(json.dumps(ledger_info), flush=True)
        catalog, prices = load_catalog(state, "sim")
        now = START + SPAN_S + 86400
        steps: list[tuple[float, CopyStep]] = []
        with PostgresCluster.start() as cluster:
            target = parse_database_url(cluster.create_database("bench_copy"))
            load = os.getloadavg()[0]
            started, cpu = time.perf_counter(), time.process_time()
            result = copy_database(
                sqlite_url(state / "ledger.db"),
                target,
                catalog=catalog,
                prices=prices,
                clock=lambda: now,
                on_step=lambda step: steps.append((time.perf_counter(), step)),
            )
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            again_started = time.perf_counter()
            copy_database(sqlite_url(state / "ledger.db"), target, catalog=catalog, prices=prices,
                          clock=lambda: now)  # fmt: skip
            again = time.perf_counter() - again_started
    copied = max(t for t, step in steps if step.phase == "events") - started
    doc: dict[str, Any] = {
        "benchmark": f"db copy of a SQLite ledger of {args.events:,} events into PostgreSQL",
        "machine": machine(),
        "ledger": ledger_info,
        "copy_s": round(wall, 2),
        "copy_cpu_s": round(cpu, 2),
        "written_s": round(copied, 2),
        "checked_s": round(wall - copied, 2),
        "second_copy_s": round(again, 2),
        "events_per_s": round(ledger_info["events"] / copied),
        "vs_sqlite_bulk_write": round(copied / ledger_info["bulk_write_s"], 2),
        "verified": result.scope,
        "cost_usd": round(result.source_cost["cost_usd"], 2),
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(doc, indent=2), flush=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
