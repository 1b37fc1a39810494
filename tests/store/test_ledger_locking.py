"""Sharing one Ledger between threads, and a write lock held too long by someone else."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from tpuctl.store import EventKind, Ledger, LedgerBusyError


def test_threads_share_one_ledger(tmp_path: Path) -> None:
    with Ledger(tmp_path) as ledger:
        errors: list[BaseException] = []

        def work(tag: str) -> None:
            try:
                for i in range(100):
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
        assert sum(1 for _ in ledger.events()) == 400
        assert ledger.check_view() == []


def test_a_lock_held_past_the_busy_timeout_is_a_clear_error(tmp_path: Path) -> None:
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
