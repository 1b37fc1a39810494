"""events(): a streaming, paged read of the log with time windows and filters."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ledger_sql import write_by_hand

from tpuctl.store import EventKind, EventRecord, Ledger, NewEvent
from tpuctl.store import ledger as ledger_module
from tpuctl.store.database import SqliteDatabase

Z = "us-central1-a"


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger]) -> Iterator[Ledger]:
    with open_ledger() as led:
        yield led


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> int:
    # Small pages so a few hundred events cross many page boundaries.
    monkeypatch.setattr(ledger_module, "_PAGE", 7)
    return 7


def key(e: EventRecord) -> tuple[float, int]:
    return (e.ts, e.id)


def test_events_is_a_lazy_iterator(ledger: Ledger) -> None:
    ledger.record_event(EventKind.GC, ts=1.0)
    it = ledger.events()
    assert isinstance(it, Iterator) and not isinstance(it, list)
    assert [e.ts for e in it] == [1.0]


def test_order_and_windows_across_pages(ledger: Ledger, small_pages: int) -> None:
    rng = random.Random(7)
    # Many equal timestamps, written out of order, so page boundaries fall inside runs of equal ts.
    stamps = [float(rng.randrange(0, 40)) for _ in range(300)]
    ledger.record_events_bulk(NewEvent(EventKind.GC, ts=ts, detail={"i": i}) for i, ts in enumerate(stamps))
    everything = list(ledger.events())
    assert len(everything) == 300
    assert everything == sorted(everything, key=key)
    assert len({e.id for e in everything}) == 300
    window = list(ledger.events(since=10.0, until=20.0))
    assert window == [e for e in everything if 10.0 <= e.ts < 20.0]  # since inclusive, until exclusive
    assert list(ledger.events(since=39.5)) == []
    assert list(ledger.events(until=0.0)) == []
    assert list(ledger.events(since=0.0, until=40.0)) == everything


def test_kind_and_run_filters(ledger: Ledger, small_pages: int) -> None:
    kinds = [EventKind.REQUESTED, EventKind.READY, EventKind.DELETED]
    ledger.record_events_bulk(
        NewEvent(kinds[i % 3], pod=f"p{i // 3}", zone=Z, run_id=f"r{i % 2}", ts=float(i)) for i in range(90)
    )
    ready = list(ledger.events(kinds=[EventKind.READY]))
    assert len(ready) == 30 and {e.kind for e in ready} == {EventKind.READY}
    two = list(ledger.events(kinds={EventKind.READY, EventKind.DELETED}, since=30.0))
    assert [e.ts for e in two] == [float(i) for i in range(30, 90) if i % 3]
    runs = list(ledger.events(run_id="r1", until=45.0))
    assert [e.ts for e in runs] == [float(i) for i in range(45) if i % 2]
    assert list(ledger.events(kinds=[])) == []


def test_price_changes_are_found_without_scanning_the_log(tmp_path: Path) -> None:
    # SQLite's plan (PostgreSQL's planner picks by statistics; the index is the same on both).
    with Ledger(tmp_path / "sqlite") as ledger:
        _find_price_changes_by_index(ledger)


def _find_price_changes_by_index(ledger: Ledger) -> None:
    ledger.record_event(EventKind.REQUESTED, pod="p", zone=Z, price_per_chip_hour=1.0, ts=1.0)
    ledger.record_events_bulk(NewEvent(EventKind.GC, ts=float(i)) for i in range(2, 500))
    ledger.record_event(EventKind.PRICE_CHANGE, pod="p", zone=Z, price_per_chip_hour=2.0, ts=600.0)
    changes = list(ledger.events(kinds=[EventKind.PRICE_CHANGE]))
    assert [(e.ts, e.price_per_chip_hour) for e in changes] == [(600.0, 2.0)]
    plan = (
        _raw(ledger)
        .execute("EXPLAIN QUERY PLAN SELECT * FROM events WHERE kind = 'price_change' ORDER BY ts, id")
        .fetchall()
    )
    assert "events_price" in str(plan)


def test_writing_while_iterating(ledger: Ledger, small_pages: int) -> None:
    ledger.record_events_bulk(NewEvent(EventKind.GC, ts=float(i)) for i in range(50))
    seen = []
    for event in ledger.events(until=50.0):
        seen.append(event.ts)
        ledger.record_event(EventKind.GC, ts=1000.0 + event.ts)  # the same connection writes mid-read
    assert seen == [float(i) for i in range(50)]
    assert sum(1 for _ in ledger.events()) == 100


def test_event_fields_round_trip(ledger: Ledger) -> None:
    ledger.record_event(
        EventKind.REQUESTED,
        pod="p",
        zone=Z,
        accelerator_type="v6e-8",
        chips=8,
        capacity="reserved",  # type: ignore[arg-type]
        price_per_chip_hour=2.7,
        labels={"k": "v"},
        run_id="r",
        request_id="q",
        detail={"path": Path("/x"), "n": [1, 2]},
        ts=5.0,
        hosts=2,
        queued_resource="qr",
        slice_index=0,
        backend="gcp",
        project="proj",
    )
    (e,) = ledger.events()
    assert (e.kind, e.pod, e.zone, e.accelerator_type, e.chips, e.capacity) == (
        EventKind.REQUESTED,
        "p",
        Z,
        "v6e-8",
        8,
        "reserved",
    )
    assert (e.price_per_chip_hour, e.labels, e.run_id, e.request_id) == (2.7, {"k": "v"}, "r", "q")
    assert e.detail == {"path": "/x", "n": [1, 2]}  # non-JSON values are written as text
    assert (e.hosts, e.queued_resource, e.slice_index, e.backend, e.project) == (2, "qr", 0, "gcp", "proj")


def test_a_kind_from_a_newer_tpuctl_reads_as_text(ledger: Ledger) -> None:
    write_by_hand(ledger, "INSERT INTO events (id, ts, kind) VALUES (1, 1.0, 'teleported')")
    (e,) = ledger.events()
    assert e.kind == "teleported" and not isinstance(e.kind, EventKind)


def _raw(ledger: Ledger) -> sqlite3.Connection:
    """The SQLite connection under ``ledger`` (for what only SQLite has: query plans, PRAGMAs)."""
    assert isinstance(ledger._db, SqliteDatabase)
    return ledger._db.raw
