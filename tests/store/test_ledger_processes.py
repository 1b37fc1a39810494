"""Two tpuctl processes writing at once, and tpuctl killed (SIGKILL) in the middle of writes."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tpuctl.store import EventKind, Ledger

WRITER = Path(__file__).with_name("ledger_writer.py")


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WRITER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_processes_write_500_events_each_without_loss(tmp_path: Path) -> None:
    state = tmp_path / "state"  # fresh: both processes also race to create and migrate it
    procs = [spawn(str(state), "count", tag, "500") for tag in ("alpha", "beta")]
    for proc in procs:
        _out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "locked" not in err and "Traceback" not in err
    with Ledger(state) as ledger:
        events = list(ledger.events())
        assert len(events) == 1000
        assert all(e.detail is not None for e in events)
        details = {e.id: e.detail or {} for e in events}
        by_tag = Counter(d["tag"] for d in details.values())
        assert by_tag == {"alpha": 500, "beta": 500}
        # Each writer's events are in its own order and none is missing or doubled.
        for tag in ("alpha", "beta"):
            seqs = [details[i]["seq"] for i in sorted(details) if details[i]["tag"] == tag]
            assert seqs == list(range(500))
        assert len({e.id for e in events}) == 1000
        pods = ledger.list_pods()
        assert len(pods) == 250  # 125 pods per writer, 4 lifecycle events each
        assert all(p.state == "DELETED" and p.ready_at is not None for p in pods)
        assert ledger.check_view() == []
        assert ledger.integrity_check() == "ok"


def test_sigkill_mid_write_leaves_a_consistent_ledger(tmp_path: Path) -> None:
    state = tmp_path / "state"
    rng = random.Random(20240607)
    kills = 24
    seen_counts: list[int] = []
    for i in range(kills):
        proc = spawn(str(state), "forever", f"w{i}")
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
        with Ledger(state) as ledger:
            assert ledger.integrity_check() == "ok"
            assert ledger.check_view() == []  # no event without its pods change, or the reverse
        with sqlite3.connect(state / "ledger.db") as raw:
            seen_counts.append(raw.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    assert seen_counts == sorted(seen_counts)  # nothing committed was ever lost
    assert seen_counts[-1] > 0
    print("events after each kill:", seen_counts)

    # Whole events only: every row is complete and self-consistent, every bulk batch is all or nothing,
    # and every attempt row has its event and vice versa.
    conn = sqlite3.connect(state / "ledger.db")
    try:
        batches: Counter[str] = Counter()
        sizes: dict[str, int] = {}
        for kind, pod, zone, detail in conn.execute("SELECT kind, pod, zone, detail FROM events"):
            data = json.loads(detail)
            if kind == EventKind.GC:
                batches[data["batch"]] += 1
                sizes[data["batch"]] = data["size"]
                assert data["check"].startswith(f"gc|{pod}|{zone}|")
            elif kind == EventKind.ATTEMPT:
                assert data["detail"]["check"].startswith(f"attempt|{pod}|{zone}|")
            else:
                assert data["check"] == f"{kind}|{pod}|{zone}|{data['seq']}"
        assert batches, "no bulk batch was ever committed"
        assert batches == sizes
        orphans = conn.execute(
            "SELECT COUNT(*) FROM events e WHERE kind = 'attempt' "
            "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.event_id = e.id)"
        ).fetchone()[0]
        assert orphans == 0
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()
