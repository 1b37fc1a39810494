#!/usr/bin/env python3
"""Benchmark: admission latency of the server's queue at 100 queued runs, on PostgreSQL and SQLite in one
run (figures and the PostgreSQL / SQLite ratio).

A workspace of 32 v5e chips is full (two v5e-16 runs hold it) and ``--queued`` v5e-16 runs wait behind
them, from ten principals, with their saved requests (what a submission records). Each round, one holding
run ends (room appears: the clock starts), and a replica's admission runs as its tick does it
(``Ledger.admit_queued`` with ``Admission.decide``: the workspace locked, the queue and what holds chips
read, the order decided, the head run claimed and admitted, every other waiting run's reason written),
until the run is admitted (the clock stops). A new run is queued after each round, outside the clock, so
the queue stays at ``--queued``. Rounds alternate the engines so the machine's load falls on both alike.

What a user waits beyond this figure is the replica's tick: a replica wakes at once when one of its own
runs ends (``Replica``), else at its next tick (every min(lease renewal, 2 s)); docs/queue.md says so.

    .venv/bin/python scripts/bench_queue.py [--queued 100] [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_machine import machine  # noqa: E402

from tpuctl.catalog import CapacityType, Catalog  # noqa: E402
from tpuctl.server.admission import Admission  # noqa: E402
from tpuctl.services.cost.monthly_spend import MonthSpend, Spend  # noqa: E402
from tpuctl.store.database import open_database  # noqa: E402
from tpuctl.store.ledger import Ledger  # noqa: E402
from tpuctl.store.records import LeaseOwner, RunStatus  # noqa: E402
from tpuctl.store.url import parse_database_url  # noqa: E402
from tpuctl.teams.workspaces import Workspaces  # noqa: E402
from tpuctl.testing.postgres import PostgresCluster  # noqa: E402

WORKSPACES = Workspaces.model_validate(
    {"workspaces": {"team-a": {"chips": {"v5e": 32}, "usd_per_month": 50}}}
)
OWNER = LeaseOwner("bench-replica", "bench", 1, 1)
SPEND = MonthSpend(
    "2026-11", by_principal={("team-a", f"u{i}@example.com"): Spend(float(i)) for i in range(10)}
)


class Bench:
    """One engine's ledger: two holding runs, ``queued`` waiting ones."""

    def __init__(self, ledger: Ledger, queued: int) -> None:
        self.ledger = ledger
        self.count = 0
        self.holding = [self.add(RunStatus.RUNNING) for _ in range(2)]
        for _ in range(queued):
            self.add(RunStatus.QUEUED)
        self.decide = Admission(WORKSPACES, Catalog.load(), SPEND, room=1).decide

    def add(self, status: RunStatus) -> str:
        self.count += 1
        run_id = f"run-{self.count:05d}"
        self.ledger.create_run(
            run_id, script="train.py", status=status, accelerator_type="v5litepod-16",
            capacity=CapacityType.SPOT, detail={"slices": 1, "created_pod": True},
            principal=f"u{self.count % 10}@example.com", workspace="team-a", priority="batch",
            queue_reason="submitted" if status is RunStatus.QUEUED else None,
        )  # fmt: skip
        self.ledger.save_run_request(run_id, '{"job": {}}')
        return run_id

    def round(self) -> float:
        """Seconds from a holding run's end to the next run's admission."""
        ended = self.holding.pop(0)
        self.ledger.update_run(ended, status=RunStatus.SUCCEEDED)
        started = time.perf_counter()  # the end committed: room is there
        claims = self.ledger.admit_queued(OWNER, 300.0, decide=self.decide, limit=1)
        took = time.perf_counter() - started
        assert len(claims) == 1, claims
        self.holding.append(claims[0].run_id)
        self.ledger.release_lease(claims[0])
        self.add(RunStatus.QUEUED)
        return took


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queued", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "queue.json")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"sqlite": [], "postgresql": []}
    print(f"load at start: {os.getloadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp, PostgresCluster.start() as cluster:
        url = parse_database_url(cluster.create_database("bench"))
        with Ledger(Path(tmp) / "state") as lite, Ledger(open_database(url)) as pg:
            benches = {"sqlite": Bench(lite, args.queued), "postgresql": Bench(pg, args.queued)}
            for _ in range(args.rounds):
                for engine, bench in benches.items():
                    times[engine].append(bench.round())
    medians = {engine: statistics.median(t) for engine, t in times.items()}
    result: dict[str, Any] = {
        "queued": args.queued,
        "rounds": args.rounds,
        "median_ms": {engine: round(m * 1000, 2) for engine, m in medians.items()},
        "p90_ms": {e: round(sorted(t)[int(0.9 * (len(t) - 1))] * 1000, 2) for e, t in times.items()},
        "ratio_postgresql_over_sqlite": round(medians["postgresql"] / medians["sqlite"], 2),
        "machine": machine(load_at_end=os.getloadavg()),
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
