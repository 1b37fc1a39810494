"""Schema v2: the per-slice billing facts the view function keeps (billed seconds, chip-seconds, USD at
the prices in force), the same on the single, bulk and replay paths, and backfilled by the migration.

The billing rules run on both engines (``open_ledger``: SQLite's triggers, PostgreSQL's PL/pgSQL); the
migration tests are SQLite's alone: they take a SQLite ledger back to a version the hand-written
migrations made, which no PostgreSQL database ever was (its history starts at the Alembic revisions)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from ledger_sql import undo_history

from tpuctl.catalog import CapacityType
from tpuctl.store import EventKind, Ledger, NewEvent
from tpuctl.store import schema as schema_module
from tpuctl.store.migrate import sqlite_user_version
from tpuctl.store.migrations import KNOWN
from tpuctl.store.sql import Dialect

Z = "us-central1-a"
T0 = 1_790_000_000.0


OpenLedger = Callable[..., Ledger]

#: Both engines, PostgreSQL's run only with --slow: the default suite keeps one PostgreSQL case of each
#: rule (facts, recomputed work, rollups), each PostgreSQL case being a fresh database migrated anew.
SLOW_ON_POSTGRESQL = pytest.mark.parametrize(
    "open_ledger", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)], indirect=True
)
#: Single and bulk writes on both engines; PostgreSQL's single writes only with --slow.
ENGINES_AND_PATHS = pytest.mark.parametrize(
    ("open_ledger", "path"),
    [
        ("sqlite", "single"),
        ("sqlite", "bulk"),
        pytest.param("postgresql", "single", marks=pytest.mark.slow),
        ("postgresql", "bulk"),
    ],
    indirect=["open_ledger"],
)


def _rows(
    ledger: Ledger, sql: str | Callable[[Dialect], str], params: Mapping[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    """``sql`` (named parameters; or made for the ledger's engine) in a read transaction of the ledger's."""
    with ledger._read() as conn:
        text = sql if isinstance(sql, str) else sql(conn.dialect)
        return [tuple(r) for r in conn.execute(text, dict(params or {})).fetchall()]


def _facts(ledger: Ledger, name: str) -> tuple[Any, ...]:
    (row,) = _rows(
        ledger,
        "SELECT bill_mark, billed_s, billed_chip_s, billed_usd_s, billed_unpriced_chip_s FROM pods "
        "WHERE name = :name ORDER BY incarnation DESC LIMIT 1",
        {"name": name},
    )
    return row


def _life(
    name: str,
    capacity: CapacityType,
    price: float | None,
    life_s: float,
    end: EventKind,
    chips: int = 64,
    change: tuple[float, float] | None = None,
) -> list[NewEvent]:
    events = [
        NewEvent(
            EventKind.REQUESTED,
            accelerator_type="v5litepod-64",
            chips=chips,
            capacity=capacity,
            price_per_chip_hour=price,
            ts=T0,
            pod=name,
            zone=Z,
        ),
        NewEvent(EventKind.CREATED, ts=T0 + 10, pod=name, zone=Z),
        NewEvent(EventKind.READY, ts=T0 + 100, pod=name, zone=Z),
    ]
    if change is not None:
        events.append(
            NewEvent(
                EventKind.PRICE_CHANGE,
                price_per_chip_hour=change[1],
                ts=T0 + 100 + change[0],
                pod=name,
                zone=Z,
            )
        )
    events.append(NewEvent(end, ts=T0 + 100 + life_s, pod=name, zone=Z))
    return events


CASES = {
    "spot90": (_life("spot90", CapacityType.SPOT, 0.245, 5400, EventKind.DELETED), 5400.0, 23.52),
    "free40": (_life("free40", CapacityType.PREEMPTIBLE, 0.245, 40, EventKind.PREEMPTED), 0.0, 0.0),
    "paid70": (
        _life("paid70", CapacityType.PREEMPTIBLE, 1.0, 70, EventKind.PREEMPTED, chips=8),
        70.0,
        8 * 70 / 3600,
    ),
    "ondemand40": (
        _life("ondemand40", CapacityType.ON_DEMAND, 1.0, 40, EventKind.PREEMPTED, chips=8),
        40.0,
        8 * 40 / 3600,
    ),
    # 1 h at 1.00 then 1 h at 2.00 on 8 chips: 8 + 16 USD.
    "change": (
        _life("change", CapacityType.ON_DEMAND, 1.0, 7200, EventKind.DELETED, chips=8, change=(3600, 2.0)),
        7200.0,
        24.0,
    ),
}


def _recorded(open_ledger: OpenLedger, path: str, events: list[NewEvent]) -> Ledger:
    """A ledger with ``events`` recorded one by one (``path`` "single") or in bulk."""
    ledger = open_ledger()
    if path == "bulk":
        ledger.record_events_bulk(events)
        return ledger
    for e in events:
        ledger.record_event(
            e.kind,
            pod=e.pod,
            zone=e.zone,
            accelerator_type=e.accelerator_type,
            chips=e.chips,
            capacity=e.capacity,
            price_per_chip_hour=e.price_per_chip_hour,
            ts=e.ts,
        )
    return ledger


@ENGINES_AND_PATHS
def test_hand_computed_billing_facts(open_ledger: OpenLedger, path: str) -> None:
    events = [e for evs, _s, _usd in CASES.values() for e in evs]
    ledger = _recorded(open_ledger, path, events)
    with ledger:
        for name, (_evs, billed_s, usd) in CASES.items():
            mark, s, chip_s, usd_s, unpriced = _facts(ledger, name)
            assert mark is None, name
            assert s == billed_s, name
            assert round(usd_s / 3600, 6) == round(usd, 6), name
            assert unpriced == 0.0
            assert chip_s == (0.0 if not billed_s else chip_s)
        assert ledger.check_view() == []


@SLOW_ON_POSTGRESQL
def test_open_slice_keeps_its_open_piece_and_unpriced_time(open_ledger: OpenLedger) -> None:
    events = _life("open", CapacityType.SPOT, None, 3600, EventKind.DELETED, chips=4, change=(1800, 3.0))[:-1]
    with open_ledger() as ledger:
        ledger.record_events_bulk(events)
        mark, s, chip_s, usd_s, unpriced = _facts(ledger, "open")
        # Still open: the first half hour had no price (unpriced chip-seconds); the rest runs from the mark.
        assert mark == T0 + 100 + 1800
        assert (s, chip_s, usd_s, unpriced) == (0.0, 4 * 1800.0, 0.0, 4 * 1800.0)
        ledger.record_event(EventKind.DELETED, pod="open", zone=Z, ts=T0 + 100 + 3600)
        mark, s, chip_s, usd_s, unpriced = _facts(ledger, "open")
        assert mark is None
        assert (s, chip_s, usd_s, unpriced) == (3600.0, 4 * 3600.0, 4 * 1800.0 * 3.0, 4 * 1800.0)
        assert ledger.check_view() == []


def test_migration_from_v1_backfills_the_facts(tmp_path: Path) -> None:
    """SQLite only: a ledger taken back to a version of the hand-written migrations (no PostgreSQL
    database was ever one)."""
    events = [e for evs, _s, _usd in CASES.values() for e in evs]
    with Ledger(tmp_path / "s") as ledger:
        ledger.record_events_bulk(events)
        db = ledger.path
    # Make it a v1 ledger: the columns v2 added, and the v3/v4 indexes and rollup over them, are not there.
    conn = sqlite3.connect(db)
    _undo_v7(conn)
    for index in ("pods_closed", "pods_preempted", "pods_ended", "pods_crossing", *_V5_INDEXES, *_V6_INDEXES):
        conn.execute(f"DROP INDEX {index}")
    conn.execute("CREATE INDEX pods_run ON pods (run_id) WHERE run_id IS NOT NULL")  # as v1 made it
    conn.execute("DROP TRIGGER pods_rollup_insert")
    conn.execute("DROP TRIGGER pods_rollup_close")
    conn.execute("DROP TABLE cost_rollup")
    for column in ("bill_mark", "billed_s", "billed_chip_s", "billed_usd_s", "billed_unpriced_chip_s"):
        conn.execute(f"ALTER TABLE pods DROP COLUMN {column}")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with Ledger(tmp_path / "s") as ledger:
        assert ledger.schema_version == sqlite_user_version()
        assert ledger.check_view() == []
        assert round(_facts(ledger, "spot90")[3] / 3600, 6) == 23.52
        _assert_rollup_matches_pods(ledger)


_V5_INDEXES = ("pods_run", "pods_norun", "run_segments_pod", "run_segments_recomputed")
_V6_INDEXES = ("pods_cost", "pods_unpriced")
_V7_TRIGGERS = (
    "pods_rec_insert",
    "pods_rec_update",
    "run_segments_rec_insert",
    "run_segments_rec_update",
    "run_segments_rec_delete",
)


#: The tables v10 added (runs as leased records).
_V10_TABLES = (
    "run_leases",
    "run_lease_history",
    "run_cancel_requests",
    "run_intents",
    "run_state",
    "run_blobs",
    "run_secrets",
    "run_log_lines",
)


def _undo_v11(conn: sqlite3.Connection) -> None:
    """Take a ledger back to v10, before the Alembic history: nothing its revisions added, no record of
    the history at all."""
    undo_history(conn)


def _undo_v10(conn: sqlite3.Connection) -> None:
    """Take a ledger back to v9: no leases nor the run state a new owner reads (nor v11)."""
    _undo_v11(conn)
    for table in _V10_TABLES:
        conn.execute(f"DROP TABLE {table}")


def _undo_v9(conn: sqlite3.Connection) -> None:
    """Take a ledger back to v8: no identity (nor v10)."""
    _undo_v10(conn)
    conn.execute("DROP TABLE ledger_meta")


def _undo_v8(conn: sqlite3.Connection) -> None:
    """Take a ledger back to v7: no rollups of slices crossing midnight or of quota held (nor v9)."""
    _undo_v9(conn)
    for trigger in (
        "pods_rollup_x_insert",
        "pods_rollup_x_close",
        "pods_rollup_held_insert",
        "pods_rollup_held_delete",
    ):
        conn.execute(f"DROP TRIGGER {trigger}")
    for index in (
        "pods_held",
        "pods_unrolled_crossing",
        "events_price_facts",
        "pods_preemptions",
        "events_end",
    ):
        conn.execute(f"DROP INDEX {index}")
    for table in ("cost_rollup_x", "cost_rollup_xdays", "cost_rollup_held", "cost_day_offsets"):
        conn.execute(f"DROP TABLE {table}")
    conn.execute("ALTER TABLE pods DROP COLUMN rolled")


def _undo_v7(conn: sqlite3.Connection) -> None:
    """Take a ledger back to v6: no stored recomputed work, its triggers or its index (nor v8)."""
    _undo_v8(conn)
    for trigger in _V7_TRIGGERS:
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute("DROP INDEX pods_rec")
    for column in ("rec_priced", "rec_unpriced"):
        conn.execute(f"ALTER TABLE pods DROP COLUMN {column}")


def _rec(ledger: Ledger, name: str) -> tuple[Any, ...]:
    (row,) = _rows(
        ledger,
        "SELECT rec_priced, rec_unpriced FROM pods WHERE name = :name ORDER BY incarnation DESC LIMIT 1",
        {"name": name},
    )
    return row


def _rec_problems(ledger: Ledger) -> list[tuple[Any, ...]]:
    rows = _rows(ledger, schema_module.rec_check_sql)
    return [r for r in rows if abs(r[1] - r[3]) > 1e-6 or abs(r[2] - r[4]) > 1e-6]


def test_recomputed_work_is_stored_as_segments_and_slices_change(open_ledger: OpenLedger) -> None:
    """v7: a closed slice's recomputed work (segment overlap x recomputed share x chips x price) follows
    every change the triggers watch: a segment opened before the slice closes, the slice closing, the
    segment closing with its step counts, a second segment, an update of the counts, a deletion."""
    from tpuctl.store.records import SegmentKind

    events = _life("s", CapacityType.SPOT, 1.2, 3600, EventKind.DELETED, chips=8)  # READY T0+100..T0+3700
    with open_ledger() as ledger:
        ledger.create_run("r1", script="train.py", ts=T0)
        ledger.record_events_bulk(events[:-1])
        seg = ledger.add_segment("r1", SegmentKind.RUNNING, start=T0 + 700, pod="s", zone=Z)
        assert _rec(ledger, "s") == (0.0, 0.0)  # still open: nothing stored
        ledger.record_event(EventKind.DELETED, pod="s", zone=Z, ts=T0 + 3700)
        assert _rec(ledger, "s") == (0.0, 0.0)  # the segment has redone nothing (yet)
        ledger.close_segment(seg, end=T0 + 3100, steps_completed=100, steps_recomputed=25)
        # 2400 s of overlap x 25/100 x 8 chips x 1.2 USD = 1.6 USD (5760 USD-seconds).
        assert _rec(ledger, "s") == pytest.approx((8 * 2400 * 0.25 * 1.2, 0.0))
        # An open segment on the closed slice counts up to the slice's end (T0+3700): 600 s x 10/20.
        seg2 = ledger.add_segment("r1", SegmentKind.RUNNING, start=T0 + 3100, pod="s", zone=Z)
        ledger.update_segment(seg2, steps_completed=20, steps_recomputed=10)
        assert _rec(ledger, "s") == pytest.approx((5760.0 + 8 * 600 * 0.5 * 1.2, 0.0))
        ledger.update_segment(seg2, pod=None)  # moved off the slice: its share goes
        assert _rec(ledger, "s") == pytest.approx((5760.0, 0.0))
        assert _rec_problems(ledger) == []
        assert ledger.check_view() == []


@SLOW_ON_POSTGRESQL
def test_recomputed_work_of_a_free_preemption_or_unpriced_slice(open_ledger: OpenLedger) -> None:
    from tpuctl.store.records import SegmentKind

    free = _life("free", CapacityType.SPOT, 1.2, 40, EventKind.PREEMPTED, chips=8)
    unpriced = _life("unpriced", CapacityType.ON_DEMAND, None, 3600, EventKind.DELETED, chips=8)
    with open_ledger() as ledger:
        ledger.record_events_bulk([*free, *unpriced])
        ledger.create_run("r1", script="train.py", ts=T0)
        for name in ("free", "unpriced"):
            seg = ledger.add_segment("r1", SegmentKind.RUNNING, start=T0, pod=name, zone=Z)
            ledger.close_segment(seg, end=T0 + 7200, steps_completed=10, steps_recomputed=5)
        assert _rec(ledger, "free") == (0.0, 0.0)  # preempted in its first minute: not billed at all
        assert _rec(ledger, "unpriced") == pytest.approx((0.0, 8 * 3600 * 0.5))  # chip-seconds to price
        assert _rec_problems(ledger) == []


def test_migration_to_v7_stores_the_recomputed_work(tmp_path: Path) -> None:
    """SQLite only: a ledger taken back to a version of the hand-written migrations (no PostgreSQL
    database was ever one)."""
    from tpuctl.store.records import SegmentKind

    with Ledger(tmp_path / "s") as ledger:
        ledger.record_events_bulk(_life("s", CapacityType.SPOT, 1.2, 3600, EventKind.DELETED, chips=8))
        ledger.create_run("r1", script="train.py", ts=T0)
        seg = ledger.add_segment("r1", SegmentKind.RUNNING, start=T0 + 700, pod="s", zone=Z)
        ledger.close_segment(seg, end=T0 + 3100, steps_completed=100, steps_recomputed=25)
        db = ledger.path
    conn = sqlite3.connect(db)
    _undo_v7(conn)
    conn.execute("PRAGMA user_version = 6")
    conn.commit()
    conn.close()
    with Ledger(tmp_path / "s") as ledger:
        assert ledger.schema_version == sqlite_user_version() == schema_module.SCHEMA_VERSION + len(KNOWN) - 1
        assert _rec(ledger, "s") == pytest.approx((5760.0, 0.0))
        assert ledger.check_view() == []


def _indexes(db: Path) -> dict[str, list[str]]:
    conn = sqlite3.connect(db)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")]
        return {n: [r[2] for r in conn.execute(f"PRAGMA index_info({n})")] for n in names}
    finally:
        conn.close()


def test_migration_from_v4_adds_the_report_indexes(tmp_path: Path) -> None:
    """SQLite only: a ledger taken back to a version of the hand-written migrations (no PostgreSQL
    database was ever one)."""
    events = [e for evs, _s, _usd in CASES.values() for e in evs]
    with Ledger(tmp_path / "s") as ledger:
        ledger.record_events_bulk(events)
        db = ledger.path
    conn = sqlite3.connect(db)  # back to v4: v5 added three indexes and widened pods_run, v6 added two
    _undo_v7(conn)
    for index in (*_V5_INDEXES, *_V6_INDEXES):
        conn.execute(f"DROP INDEX {index}")
    conn.execute("CREATE INDEX pods_run ON pods (run_id) WHERE run_id IS NOT NULL")
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()
    assert _indexes(db)["pods_run"] == ["run_id"]

    with Ledger(tmp_path / "s") as ledger:
        assert ledger.schema_version == sqlite_user_version() == schema_module.SCHEMA_VERSION + len(KNOWN) - 1
        assert ledger.check_view() == []
    indexes = _indexes(db)
    assert indexes["pods_run"][:3] == ["run_id", "ready_at", "ended_at"]  # covers billing a slice
    assert indexes["pods_norun"][:2] == ["zone", "name"] and "price_per_chip_hour" in indexes["pods_norun"]
    assert indexes["run_segments_pod"] == ["zone", "pod"]
    assert "steps_recomputed" in indexes["run_segments_recomputed"]
    assert indexes["pods_cost"][:3] == ["billed_usd_s", "ready_at", "ended_at"]
    assert indexes["pods_unpriced"] == ["billed_unpriced_chip_s"]


def _assert_rollup_matches_pods(ledger: Ledger) -> None:
    stored = _rows(ledger, "SELECT * FROM cost_rollup ORDER BY 1, 2, 3, 4, 5")
    want = _rows(ledger, schema_module.rollup_check_sql)
    assert stored == want
    assert stored  # the hand cases are single-day slices: all rolled up


@SLOW_ON_POSTGRESQL
@pytest.mark.parametrize("path", ["single", "bulk"])
def test_rollup_is_kept_in_the_events_transaction(open_ledger: OpenLedger, path: str) -> None:
    events = [e for evs, _s, _usd in CASES.values() for e in evs]
    ledger = _recorded(open_ledger, path, events)
    with ledger:
        _assert_rollup_matches_pods(ledger)
        # The free preemption is not billed, so not rolled up; the other four are.
        assert _rows(ledger, "SELECT SUM(slices) FROM cost_rollup") == [(4,)]


def _v8_events() -> list[NewEvent]:
    """A slice crossing two midnights, one crossing midnight whose price changed (not rolled up), quota
    held for 30 min after a preemption, and quota held across midnight."""
    day = 86400.0
    ready = T0 + 100  # 14:15 UTC
    held = _life("held", CapacityType.PREEMPTIBLE, 1.0, 3 * 3600, EventKind.PREEMPTED, chips=8)
    held.append(NewEvent(EventKind.DELETED, ts=ready + 3 * 3600 + 1800, pod="held", zone=Z))
    late = ((T0 // day) + 1) * day - 600 - ready  # preempted ten minutes before midnight
    heldx = _life("heldx", CapacityType.SPOT, 2.0, late, EventKind.PREEMPTED, chips=4)
    heldx.append(NewEvent(EventKind.DELETED, ts=ready + late + 1200, pod="heldx", zone=Z))
    return [
        *_life("cross2d", CapacityType.SPOT, 0.245, 2.2 * day, EventKind.DELETED, chips=8),
        *_life(
            "crosschg", CapacityType.SPOT, 0.245, 1.5 * day, EventKind.DELETED, chips=8, change=(3600, 0.5)
        ),
        *held,
        *heldx,
    ]


@ENGINES_AND_PATHS
def test_crossing_and_held_rollups_are_kept_in_the_events_transaction(
    open_ledger: OpenLedger, path: str
) -> None:
    events = sorted(_v8_events(), key=lambda e: e.ts or 0.0)
    ledger = _recorded(open_ledger, path, events)
    with ledger:
        assert ledger.check_view() == []  # every rollup equals what pods gives, and `rolled` is right
        rolled = dict(_rows(ledger, "SELECT name, rolled FROM pods"))
        assert rolled == {"cross2d": 1, "crosschg": 0, "held": 0, "heldx": 0}
        (slices, usd_s, d0_s), *more = _rows(ledger, "SELECT slices, billed_usd_s, d0_s FROM cost_rollup_x")
        assert not more and slices == 1
        assert usd_s == pytest.approx(8 * 2.2 * 86400 * 0.245)
        day = 86400.0
        assert d0_s == pytest.approx(((T0 + 100) // day + 1) * day - (T0 + 100))  # to the first midnight
        later = _rows(ledger, "SELECT day, s FROM cost_rollup_xdays ORDER BY day")
        assert len(later) == 2 and later[0][1] == day  # a whole second day, then the rest of the third
        assert d0_s + day + later[1][1] == pytest.approx(2.2 * day)
        held = _rows(
            ledger, "SELECT deleted_day - end_day, held_chip_s, held_usd_s FROM cost_rollup_held ORDER BY 2"
        )
        assert held == [
            (2, pytest.approx(4 * 1200.0), pytest.approx(4 * 1200.0 * 2.0)),  # across midnight
            (1, pytest.approx(8 * 1800.0), pytest.approx(8 * 1800.0 * 1.0)),
        ]
