"""The bulk path: one transaction, same semantics as single writes (on both engines), and a million
events."""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.store import EventKind, Ledger, NewEvent, PodState
from tpuctl.store import ledger as ledger_module

ZONES = ("us-central1-a", "us-east5-b", "europe-west4-b", "asia-east1-c")
CAPACITIES = (CapacityType.SPOT, CapacityType.ON_DEMAND, CapacityType.PREEMPTIBLE)


def fleet(n_events: int, seed: int = 1) -> Iterator[NewEvent]:
    """A plausible ledger: slices requested, created, ready, sometimes repriced, then preempted or deleted.

    Each slice takes 5 events (6 when preempted: the delete follows), in time order per slice; slices
    overlap in time. Yields exactly ``n_events`` events (the last slice may be cut short).
    """
    rng = random.Random(seed)
    produced = 0
    t = 1_700_000_000.0
    i = 0
    while produced < n_events:
        zone = ZONES[i % len(ZONES)]
        cap = CAPACITIES[i % len(CAPACITIES)]
        name = f"pod-{i}"
        run = f"run-{i // 3}"
        price = 0.245 if cap.is_preemptible else 1.2
        start = t + i * 60.0
        ready = start + rng.uniform(30, 300)
        end = ready + rng.uniform(60, 36_000)
        events = [
            NewEvent(
                EventKind.REQUESTED,
                pod=name,
                zone=zone,
                accelerator_type="v5litepod-64",
                chips=64,
                hosts=16,
                capacity=cap,
                price_per_chip_hour=price,
                labels={"tpuctl": "true", "team": f"t{i % 5}"},
                run_id=run,
                request_id=f"req-{i}",
                ts=start,
            ),
            NewEvent(EventKind.CREATED, pod=name, zone=zone, ts=start + 1),
            NewEvent(EventKind.READY, pod=name, zone=zone, ts=ready),
            NewEvent(
                EventKind.PRICE_CHANGE, pod=name, zone=zone, price_per_chip_hour=price * 1.1, ts=ready + 10
            ),
        ]
        if cap.is_preemptible and i % 2:
            events.append(NewEvent(EventKind.PREEMPTED, pod=name, zone=zone, ts=end))
            events.append(NewEvent(EventKind.DELETED, pod=name, zone=zone, ts=end + 30))
        else:
            events.append(NewEvent(EventKind.DELETED, pod=name, zone=zone, ts=end))
        yield from events[: n_events - produced]
        produced += len(events)
        i += 1


def test_bulk_is_all_or_nothing(open_ledger: Callable[..., Ledger]) -> None:
    with open_ledger() as ledger:
        ledger.record_event(EventKind.GC, ts=1.0)

        def poisoned() -> Iterator[NewEvent]:
            yield from fleet(100)
            yield NewEvent(EventKind.READY, pod="no-zone")  # invalid: rejected mid-stream

        with pytest.raises(ValueError):
            ledger.record_events_bulk(poisoned())
        assert sum(1 for _ in ledger.events()) == 1
        assert ledger.list_pods() == []
        assert ledger.record_events_bulk(fleet(100)) == 100
        assert ledger.check_view() == []


def test_bulk_flushes_in_chunks_and_matches_single_writes(
    open_ledger: Callable[..., Ledger], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bulk ledger on each engine against single writes to a SQLite one: the same slices and events
    (so PostgreSQL's bulk path also matches SQLite's view to the value and the type)."""
    # Tiny chunks so the mid-stream event and pod flushes (and the cache reload after them) run.
    monkeypatch.setattr(ledger_module, "_EVENT_CHUNK", 7)
    monkeypatch.setattr(ledger_module, "_POD_FLUSH", 5)
    with open_ledger() as bulk, Ledger(tmp_path / "single") as single:
        # Fewer on PostgreSQL (the suite's time): still dozens of flushes of each kind.
        events = list(fleet(600 if bulk.url.path is not None else 150, seed=3))
        assert bulk.record_events_bulk(events) == len(events)
        for ev in events:
            single.record_event(**ev._asdict())
        assert bulk.list_pods() == single.list_pods()
        assert list(bulk.events()) == list(single.events())
        assert bulk.check_view() == []


@pytest.mark.slow
def test_a_million_events(tmp_path: Path) -> None:
    """SQLite only: the file's size and ``PRAGMA integrity_check`` are SQLite's. PostgreSQL's million is
    built and reported on by ``scripts/bench_ledger_engines.py``."""
    n = 1_000_000
    with Ledger(tmp_path) as ledger:
        started, cpu = time.perf_counter(), time.process_time()
        assert ledger.record_events_bulk(fleet(n)) == n
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        size_mb = ledger.path.stat().st_size / 1e6
        print(f"\nbulk insert of {n} events: {elapsed:.1f} s wall, {cpu:.1f} s CPU, {size_mb:.0f} MB")
        db = ledger.path
        assert ledger.integrity_check() == "ok"
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == n
        n_pods, n_open = conn.execute(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE ended_at IS NULL) FROM pods"
        ).fetchone()
        assert n_pods > n // 6 and n_open <= 1  # only a slice cut short by the count may be open
        # The schema serves a cost report from the pods view (one row per slice, every group-by column
        # and the billing times on it) and the partial price-change index, without reading the log.
        started = time.perf_counter()
        rows = conn.execute(
            "SELECT zone, SUM(chips * price_per_chip_hour * (COALESCE(ended_at, ready_at) - ready_at)) "
            "/ 3600.0, COUNT(*) FROM pods WHERE ready_at IS NOT NULL GROUP BY zone ORDER BY zone"
        ).fetchall()
        repriced = conn.execute(
            "SELECT COUNT(DISTINCT pod_id) FROM events WHERE kind = 'price_change'"
        ).fetchone()[0]
        query_s = time.perf_counter() - started
        print(f"cost-style aggregate over the pods view: {query_s:.2f} s")
        assert [r[0] for r in rows] == sorted(ZONES)
        assert sum(r[2] for r in rows) >= n_pods - 1
        assert repriced >= n_pods - 1
        assert (
            conn.execute("SELECT COUNT(*) FROM pods WHERE state = ?", (PodState.DELETED,)).fetchone()[0] > 0
        )
    finally:
        conn.close()
