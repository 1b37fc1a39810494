"""Sharing one Ledger between threads (on both engines), and a write lock held too long by someone else
(SQLite's)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tpuctl.store import EventKind, Ledger, LedgerBusyError


def test_threads_share_one_ledger(open_ledger: Callable[..., Ledger]) -> None:
    with open_ledger() as ledger:
        # Fewer on PostgreSQL, whose every write is a round trip (the suite's time): still 4 threads
        # writing in turn and reading between writes.
        per_thread = 100 if ledger.url.path is not None else 21
        errors: list[BaseException] = []

        def work(tag: str) -> None:
            try:
                for i in range(per_thread):
                    kind = (EventKind.REQUESTED, EventKind.READY, EventKind.DELETED)[i % 3]
                    ledger.record_event(kind, pod=f"{tag}-{i // 3}", zone="us-central1-a")
                    if i % 10 == 0:
                        ledger.list_pods(alive=True)
            except BaseException as exc:  # surfaced below: a thread's exception is otherwise lost
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(f"t{n}",)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sum(1 for _ in ledger.events()) == 4 * per_thread
        assert ledger.check_view() == []


def test_a_lock_held_past_the_busy_timeout_is_a_clear_error(tmp_path: Path) -> None:
    """SQLite only: the lock is SQLite's file lock (another connection's BEGIN IMMEDIATE), its busy
    timeout, and WAL letting readers through. PostgreSQL's writers queue on a transaction-scoped advisory
    lock instead, with no busy timeout to run past."""
    with Ledger(tmp_path, busy_timeout_s=0.2) as ledger:
        other = sqlite3.connect(ledger.path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another tpuctl in the middle of a (very long) write
            with pytest.raises(LedgerBusyError) as info:
                ledger.record_event(EventKind.GC)
            assert "wait for the other tpuctl" in (info.value.fix or "")
            assert list(ledger.events()) == []  # readers are not blocked by a writer in WAL mode
            other.execute("ROLLBACK")
        finally:
            other.close()
        ledger.record_event(EventKind.GC)  # and the ledger works once the lock is released
        assert len(list(ledger.events())) == 1
