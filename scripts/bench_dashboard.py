#!/usr/bin/env python3
"""Benchmark: the dashboard's pages at team size (target: 500 ms of server time or less for the runs list
over 10,000 runs and the money page over 1,000,000 cost events).

Builds a ledger as ``bench_cost.py`` does (its seeded mix of slices, runs and segments, written in bulk),
gives its runs and slices a team's attribution (``attribute``: 6 workspaces, 40 principals, the first
week's rows none), then times each page's request through the app in process (FastAPI's TestClient: the
handler, the services it asks and the template, no socket), best and median of ``--repeat``, with the
process's CPU seconds in the best run (every thread's): the runs list (the 50 newest, with each one's
cost so far) and the money page grouped by type (the default view: the report's totals and groups, each
day split by the grouping, the runs that wasted most, the budget note), by capacity, zone and region
(the same, split by those), by workspace and user (the groups and days from one pass over the slices),
and by run (the 7 costliest runs and each day's rest). ``--events 1000000`` is the target's size.
``--postgresql``: the same pages over the same ledger copied into a throwaway PostgreSQL cluster (a team
server's ledger; the copy takes minutes at a million events), into docs/bench/dashboard_postgresql.json.

    .venv/bin/python scripts/bench_dashboard.py [--events 100000] [--repeat 3] [--postgresql] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_cost import SPAN_S, START, build, timed  # noqa: E402
from bench_machine import machine  # noqa: E402

PAGES = {
    "runs list (50 newest)": "/",
    "money, by type": "/money?group_by=type",
    "money, by capacity": "/money?group_by=capacity",
    "money, by zone": "/money?group_by=zone",
    "money, by region": "/money?group_by=region",
    "money, by workspace": "/money?group_by=workspace",
    "money, by user": "/money?group_by=user",
    "money, by run": "/money?group_by=run",
}

#: A team's workspaces and its people: each person works in one workspace (their runs and slices are
#: theirs and that workspace's).
WORKSPACES = ("nlp", "vision", "speech", "infra", "research", "platform")
PRINCIPALS = tuple(f"user-{i}@example.com" for i in range(40))
#: Runs and slices of the ledger's first week predate workspaces: their principal and workspace are NULL
#: (read as the local workspace and the unknown principal).
LEGACY_S = 7 * 86400.0


def attribute(db: Path, seed: int) -> dict[str, int]:
    """Whose each run and slice is (the money page's workspace and user groupings): a run's slices are
    its owner's, a slice no run made its maker's, picked with ``seed``; those of the first week NULL. Only
    the attribution columns change: every cost, and so the other pages' figures, stay as built."""
    rng = random.Random(seed)
    conn = sqlite3.connect(db)
    owners: dict[str, tuple[str | None, str | None]] = {}
    with conn:
        for run_id, created_at in conn.execute("SELECT run_id, created_at FROM runs ORDER BY run_id"):
            owners[run_id] = _owner(rng, created_at)
        conn.executemany(
            "UPDATE runs SET principal = ?, workspace = ? WHERE run_id = ?",
            [(p, w, r) for r, (p, w) in owners.items()],
        )
        pods = conn.execute("SELECT id, run_id, requested_at FROM pods ORDER BY id").fetchall()
        rows = [(*(owners[r] if r in owners else _owner(rng, t)), i) for i, r, t in pods]
        conn.executemany("UPDATE pods SET principal = ?, workspace = ? WHERE id = ?", rows)
        conn.execute(
            "UPDATE events SET (principal, workspace) = (SELECT principal, workspace FROM pods "
            "WHERE pods.id = events.pod_id) WHERE pod_id IS NOT NULL"
        )
        legacy = conn.execute("SELECT COUNT(*) FROM pods WHERE workspace IS NULL").fetchone()[0]
    conn.close()
    return {"workspaces": len(WORKSPACES), "principals": len(PRINCIPALS), "legacy_slices": legacy}


def _owner(rng: random.Random, at: float | None) -> tuple[str | None, str | None]:
    """A (principal, workspace) drawn from the team's, or NULLs for a row from before workspaces."""
    i = rng.randrange(len(PRINCIPALS))
    if at is None or at < START + LEGACY_S:
        return None, None
    return PRINCIPALS[i], WORKSPACES[i % len(WORKSPACES)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: docs/bench/dashboard[_postgresql].json"
    )
    parser.add_argument("--target-s", type=float, default=0.5)
    parser.add_argument("--pages", nargs="*", default=list(PAGES), help="which of the pages to time")
    parser.add_argument(
        "--postgresql",
        action="store_true",
        help="time the pages over the same ledger copied into a throwaway PostgreSQL cluster (minutes)",
    )
    args = parser.parse_args()
    engine = "postgresql" if args.postgresql else "sqlite"
    out = args.out or ROOT / "docs" / "bench" / (
        "dashboard_postgresql.json" if args.postgresql else "dashboard.json"
    )

    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-dashboard-") as tmp:
        state = Path(tmp) / "state"
        print(f"building a ledger of {args.events:,} events ...", flush=True)
        ledger = build(state, args.events, args.seed)
        ledger["attribution"] = attribute(state / "ledger.db", args.seed)
        print(json.dumps(ledger), flush=True)
        if args.postgresql:
            results, ledger["copy_s"] = _on_postgresql(state, args)
        else:
            results = time_pages(state, None, args.pages, args.repeat)
        document = {
            "benchmark": f"dashboard pages over a ledger of {args.events:,} events on {engine}",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine(load_average=list(os.getloadavg())),
            "ledger": ledger,
            "target_s": args.target_s,
            "pages": results,
            "notes": "server time = the request through the app in process (TestClient), template included; "
            "best and median of --repeat after one warm-up request; the machine may be shared: load "
            "is the 1-minute load average before and after each figure. On PostgreSQL the server's work is "
            "in PostgreSQL's processes: the wall time is the figure (cpu_s is this process's only); the "
            "ledger is the SQLite one copied with tpuctl's ledger copy, then VACUUM ANALYZE.",
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


def _on_postgresql(state: Path, args: argparse.Namespace) -> tuple[dict[str, Any], float]:
    """The pages timed over the ledger in ``state`` copied into a throwaway cluster (the engines bench's
    server settings, ``VACUUM ANALYZE`` after the load); and the copy's seconds."""
    from bench_ledger_engines import SERVER_SETTINGS, vacuum_analyze

    from tpuctl.store.copy import copy_ledger
    from tpuctl.store.database import open_database
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.url import parse_database_url, sqlite_url
    from tpuctl.testing.postgres import PostgresCluster

    with PostgresCluster.start(settings=SERVER_SETTINGS) as cluster:
        text = cluster.create_database("bench")
        url = parse_database_url(text)
        print("copying it into PostgreSQL ...", flush=True)
        t0 = time.perf_counter()
        target_db = open_database(url)
        with Ledger(target_db) as target:
            copy_ledger(open_database(sqlite_url(state / "ledger.db")), target, target_db)
        vacuum_analyze(url)
        copied = round(time.perf_counter() - t0, 1)
        return time_pages(state, text, args.pages, args.repeat), copied


def time_pages(state: Path, database: str | None, pages: list[str], repeat: int) -> dict[str, Any]:
    """Each page of ``pages`` timed through the app in process over the ledger of ``state`` (or the one at
    ``database``), its clock a day after the ledger's last event."""
    from dataclasses import replace

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from tpuctl.dashboard.routes import dashboard_router
    from tpuctl.services.session import open_session
    from tpuctl.settings import load_settings

    now = START + SPAN_S + 86400
    values: dict[str, Any] = {"state_dir": state, "backend": "sim"}
    if database is not None:
        values["database"] = database
    results: dict[str, Any] = {}
    with open_session(load_settings(values)) as session:
        frozen = replace(session, clock=lambda: now)
        app = FastAPI()
        app.include_router(dashboard_router(frozen))
        with TestClient(app) as client:
            for name in pages:
                path = PAGES[name]
                answer: dict[str, Any] = {}

                def get(path: str = path, answer: dict[str, Any] = answer) -> None:
                    response = client.get(path)
                    if response.status_code != 200:
                        raise SystemExit(f"{path}: HTTP {response.status_code}: {response.text[:500]}")
                    answer["bytes"] = len(response.content)

                get()  # warm: templates compiled, the ledger's pages in the page cache
                figures = timed(repeat, get)
                results[name] = {**figures, "path": path, "html_bytes": answer["bytes"]}
                print(f"{name:<28} best {figures['best_s']:.3f} s, median {figures['median_s']:.3f} s, "
                      f"cpu {figures['cpu_s']:.3f} s (load {figures['load']})", flush=True)  # fmt: skip
    return results


if __name__ == "__main__":
    raise SystemExit(main())
