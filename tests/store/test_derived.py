"""The triggers that keep the cost rollups and each closed slice's recomputed work, on both engines: the
same writes to a SQLite and a PostgreSQL ledger, both made by the migration history, must leave the same
rollups, recomputed figures and ``rolled`` marks, and each engine's rollups must equal its own checks."""

from __future__ import annotations

import hashlib
import math
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuctl.catalog import CapacityType
from tpuctl.store import Ledger, NewEvent, billing, derived, migrate, schema, shares_seen
from tpuctl.store.database import open_database
from tpuctl.store.engine import create_engine
from tpuctl.store.norun_rollup import NORUN
from tpuctl.store.owner_rollup import OWNER
from tpuctl.store.records import EventKind, SegmentKind
from tpuctl.store.run_closed_time import CLOSED_TIME
from tpuctl.store.run_waste import WASTE
from tpuctl.store.sql import (
    POSTGRESQL,
    SQLITE,
    Dialect,
    SqlAlchemyConnection,
    SqlConnection,
    SqliteConnection,
)
from tpuctl.store.url import parse_database_url
from tpuctl.store.view import POD_COLUMNS, Ev, PodRow, apply_event

DAY = 86400.0
#: A midnight (UTC), so a test's times read as offsets into its days.
D0 = 20_000 * DAY
Z = "us-west4-a"

_UPSERT_POD = (
    f"INSERT INTO pods ({', '.join(POD_COLUMNS)}) "
    f"VALUES ({', '.join(f':{c}' for c in POD_COLUMNS)}) ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in POD_COLUMNS if c != "id")
)  # what the ledger writes a pods row with: an update fires UPDATE OF every column the view keeps
_INSERT_EVENT = (
    "INSERT INTO events (id, ts, kind, pod, zone, pod_id) VALUES (:id, :ts, :kind, :pod, :zone, :pod_id)"
)


def _alembic_upgrade(connection: Any) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", migrate.SCRIPT_LOCATION)
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


@contextmanager
def _sqlite_connection(db: Path) -> Iterator[SqliteConnection]:
    """A connection to the SQLite ledger ``db`` in one open transaction (rolled back after)."""
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("BEGIN")
    try:
        yield SqliteConnection(raw)
    finally:
        raw.execute("ROLLBACK")
        raw.close()


@contextmanager
def _postgres_connection(url: str) -> Iterator[SqlAlchemyConnection]:
    """A connection to the PostgreSQL ledger at ``url`` in one open transaction (rolled back after)."""
    engine = create_engine(parse_database_url(url))
    try:
        with engine.connect() as conn:
            yield SqlAlchemyConnection(conn, POSTGRESQL)
            conn.rollback()
    finally:
        engine.dispose()


@contextmanager
def _sqlite_ledger(db: Path) -> Iterator[SqliteConnection]:
    """A SQLite ledger made by the migration history, in one open transaction (rolled back after)."""
    engine = create_engine(parse_database_url(f"sqlite:///{db}"))
    with engine.begin() as conn:
        _alembic_upgrade(conn)
    engine.dispose()
    with _sqlite_connection(db) as conn:
        yield conn


@contextmanager
def _postgres_ledger(url: str) -> Iterator[SqlAlchemyConnection]:
    """A PostgreSQL ledger made by the migration history, in one open transaction (rolled back after)."""
    engine = create_engine(parse_database_url(url))
    try:
        with engine.begin() as conn:
            _alembic_upgrade(conn)
    finally:
        engine.dispose()
    with _postgres_connection(url) as conn:
        yield conn


@contextmanager
def _savepoint(conn: SqlConnection) -> Iterator[None]:
    """Undo what the block wrote, so one ledger serves every example of a property test."""
    conn.execute("SAVEPOINT example")
    try:
        yield
    finally:
        conn.execute("ROLLBACK TO SAVEPOINT example")
        conn.execute("RELEASE SAVEPOINT example")


@dataclass
class _Writer:
    """Writes events, pods rows and run segments to every connection the way the ledger does: each event
    moves the pods view through ``apply_event``; a flush inserts the pending events, then upserts the
    changed rows in id order (one flush per event, or one per batch as the bulk path)."""

    conns: tuple[SqlConnection, ...]
    latest: dict[tuple[str, str], PodRow] = field(default_factory=dict)
    next_event: int = 1
    next_pod: int = 1
    events: list[dict[str, Any]] = field(default_factory=list)
    dirty: dict[int, PodRow] = field(default_factory=dict)

    def event(self, ts: float, kind: EventKind, pod: str, *, flush: bool = True, **attrs: Any) -> None:
        ev = Ev(
            ts, kind.value, pod, Z, attrs.get("accelerator_type"), attrs.get("chips"), attrs.get("capacity"),
            attrs.get("price"), attrs.get("labels"), None, None, None, None, None, None, None, None,
        )  # fmt: skip
        row, changed = apply_event(self.latest.get((Z, pod)), ev, self.next_event, self._new_pod_id)
        self.events.append({"id": self.next_event, "ts": ts, "kind": kind.value, "pod": pod, "zone": Z,
                            "pod_id": None if row is None else row.id})  # fmt: skip
        self.next_event += 1
        if row is not None:
            self.latest[(Z, pod)] = row
            if changed:
                self.dirty[row.id] = row
        if flush:
            self.flush()

    def _new_pod_id(self) -> int:
        self.next_pod += 1
        return self.next_pod - 1

    def flush(self) -> None:
        rows = [dict(zip(POD_COLUMNS, self.dirty[k].as_tuple(), strict=True)) for k in sorted(self.dirty)]
        for conn in self.conns:
            if self.events:
                conn.executemany(_INSERT_EVENT, self.events)
            if rows:
                conn.executemany(_UPSERT_POD, rows)
        self.events.clear()
        self.dirty.clear()

    def sql(self, statement: str, **params: Any) -> None:
        for conn in self.conns:
            conn.execute(statement, params)

    def segment(self, seg_id: int, started_at: float, pod: str | None, **steps: Any) -> None:
        """A run segment (each on a run of its own: a run has one open segment at most)."""
        run = f"r{seg_id}"
        self.sql("INSERT INTO runs (run_id, script, status, created_at, updated_at) "
                 "VALUES (:run, 'train.py', 'running', :at, :at)", run=run, at=started_at)  # fmt: skip
        self.sql("INSERT INTO run_segments (id, run_id, kind, started_at, ended_at, pod, zone, "
                 "steps_completed, steps_recomputed) VALUES (:id, :run, 'running', :at, :end, :pod, :zone, "
                 ":completed, :recomputed)", id=seg_id, run=run, at=started_at, end=steps.get("end"),
                 pod=pod, zone=Z, completed=steps.get("completed"),
                 recomputed=steps.get("recomputed"))  # fmt: skip


# --- what the triggers made ---------------------------------------------------------------------------


def _facts(conn: SqlConnection) -> dict[str, list[tuple[Any, ...]]]:
    """Every rollup's rows (the NULL stand-in read back as None) and every slice's recomputed figures
    and ``rolled`` mark, in key order."""
    null = billing.null_key(conn.dialect)
    out: dict[str, list[tuple[Any, ...]]] = {}
    for table in schema.ROLLUP_KEYS:
        rows = [tuple(None if v == null else v for v in r) for r in conn.execute(f"SELECT * FROM {table}")]
        out[table] = sorted(rows, key=repr)
    out["pods"] = [
        tuple(r) for r in conn.execute("SELECT id, rec_priced, rec_unpriced, rolled FROM pods ORDER BY id")
    ]
    return out


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return bool(a == b) and type(a) is type(b)


def _same_rows(have: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> bool:
    return len(have) == len(want) and all(
        len(h) == len(w) and all(_close(x, y) for x, y in zip(h, w, strict=True))
        for h, w in zip(have, want, strict=True)
    )


def _own_check_problems(conn: SqlConnection) -> list[str]:
    """Where the engine's rollups, recomputed figures or ``rolled`` marks differ from what its own check
    SQL recomputes from ``pods`` (``schema``'s checks for its dialect)."""
    dialect: Dialect = conn.dialect
    problems = []
    for table, keys, check in schema.rollup_checks(dialect):
        stored = sorted(
            (tuple(r) for r in conn.execute(f"SELECT * FROM {table}")), key=lambda r: repr(r[:keys])
        )
        derived_rows = sorted((tuple(r) for r in conn.execute(check)), key=lambda r: repr(r[:keys]))
        if not _same_rows(stored, derived_rows):
            problems.append(f"{dialect.name} {table}: holds {stored}, pods give {derived_rows}")
    for pod_id, priced, unpriced, want_priced, want_unpriced in conn.execute(schema.rec_check_sql(dialect)):
        if not (_close(priced, want_priced) and _close(unpriced, want_unpriced)):
            problems.append(f"{dialect.name} pod {pod_id}: recomputed ({priced}, {unpriced}), "
                            f"segments give ({want_priced}, {want_unpriced})")  # fmt: skip
    problems += [
        f"{dialect.name} pod {r[0]} wrongly rolled" for r in conn.execute(schema.rolled_check_sql(dialect))
    ]
    return problems


def _assert_engines_agree(
    sqlite_conn: SqlConnection, pg_conn: SqlConnection
) -> dict[str, list[tuple[Any, ...]]]:
    assert _own_check_problems(sqlite_conn) == []
    assert _own_check_problems(pg_conn) == []
    lite, pg = _facts(sqlite_conn), _facts(pg_conn)
    for name in lite:
        assert _same_rows(pg[name], lite[name]), f"{name}: PostgreSQL {pg[name]}, SQLite {lite[name]}"
    return lite


# --- the slices ---------------------------------------------------------------------------------------


def _life(w: _Writer, name: str, ready: float, end: float, end_kind: EventKind = EventKind.DELETED, *,
          deleted: float | None = None, price_change: float | None = None, flush: bool = True,
          **attrs: Any) -> None:  # fmt: skip
    """A slice: requested a minute before READY, ended at ``end`` (and deleted at ``deleted``)."""
    opening = {"chips": 8, "accelerator_type": "v5e-8", "capacity": "on-demand", "price": 1.2, **attrs}
    w.event(ready - 60, EventKind.REQUESTED, name, flush=flush, **opening)
    w.event(ready, EventKind.READY, name, flush=flush)
    if price_change is not None:
        w.event(price_change, EventKind.PRICE_CHANGE, name, flush=flush, price=2.4)
    w.event(end, end_kind, name, flush=flush)
    if deleted is not None:
        w.event(deleted, EventKind.DELETED, name, flush=flush)
    w.flush()


def _write_the_slices(w: _Writer) -> None:
    w.event(D0 + 100, EventKind.REQUESTED, "opening", chips=8, capacity="spot", price=0.5)
    w.event(D0 + 200, EventKind.READY, "opening")  # still billing: in no rollup
    _life(w, "same-day", D0 + 3600, D0 + 7200, labels='{"team":"a"}')
    _life(w, "same-day-bulk", D0 + 3600, D0 + 9000, flush=False)  # inserted already closed
    _life(w, "to-midnight", D0 + 80000, D0 + DAY)  # ends at midnight exactly: one day
    _life(w, "crossing", D0 + 80000, D0 + DAY + 5000, capacity="spot")
    _life(w, "three-days", D0 + 1000, D0 + 3 * DAY + 500)
    _life(w, "three-days-bulk", D0 + 1000, D0 + 3 * DAY + 500, flush=False)
    _life(w, "free", D0 + 5000, D0 + 5030, EventKind.PREEMPTED, deleted=D0 + 9000, capacity="spot")
    _life(w, "held", D0 + 5000, D0 + 12000, EventKind.PREEMPTED, deleted=D0 + 2 * DAY + 10, capacity="spot")
    _life(w, "held-unpriced", D0 + 5000, D0 + 12000, EventKind.PREEMPTED, deleted=D0 + 13000,
          capacity="preemptible", price=None)  # fmt: skip
    _life(w, "unpriced", D0 + 5000, D0 + DAY + 7000, price=None)
    _life(w, "untyped", D0 + 5000, D0 + 8000, accelerator_type=None, capacity=None)  # the NULL stand-in
    _life(w, "untyped-x", D0 + 5000, D0 + DAY + 8000, accelerator_type=None, capacity=None)
    _life(w, "repriced", D0 + 5000, D0 + 8000, price_change=D0 + 6000)
    _life(w, "repriced-x", D0 + 5000, D0 + DAY + 8000, price_change=D0 + 6000)  # never rolled as crossing
    _life(w, "failed", D0 + 5000, D0 + 5500, EventKind.FAILED)
    _life(w, "before-epoch", -DAY - 5000, -DAY + 100)  # SQLite's day truncates toward zero; so must PG's
    _life(w, "before-epoch-x", -DAY - 5000, -100)
    # Recomputed work: a segment recorded before its slice opens, then the slice closing; one recorded
    # on a closed slice, updated, moved off and back; an open one; one deleted; a reused name.
    _life(w, "rec", D0 + 1000, D0 + 5000, capacity="spot")
    w.segment(1, D0 + 1500, "rec-open", completed=100, recomputed=25)
    w.event(D0 + 1000, EventKind.REQUESTED, "rec-open", chips=4, capacity="spot", price=0.8)
    w.event(D0 + 1100, EventKind.READY, "rec-open")
    w.event(D0 + 4000, EventKind.DELETED, "rec-open")
    w.segment(2, D0 + 2000, "rec", completed=40, recomputed=10, end=D0 + 4000)
    w.sql("UPDATE run_segments SET steps_completed = 50, steps_recomputed = 30 WHERE id = 2")
    w.segment(3, D0 + 900, "rec", completed=10, recomputed=20)  # open; more recomputed than completed
    w.sql("UPDATE run_segments SET pod = NULL WHERE id = 3")
    w.sql("UPDATE run_segments SET pod = 'rec' WHERE id = 3")
    w.segment(4, D0 + 3000, "unpriced", completed=10, recomputed=5, end=D0 + DAY)
    w.segment(5, D0 + 3000, "free", completed=10, recomputed=5, end=D0 + DAY)  # not billed: nothing
    w.segment(6, D0 + 3000, "rec", completed=0, recomputed=0, end=D0 + 4000)  # redid nothing
    w.segment(7, D0 + 1200, "same-day", completed=8, recomputed=8, end=D0 + 9000)
    w.sql("DELETE FROM run_segments WHERE id = 7")
    _life(w, "rec", D0 + 2 * DAY, D0 + 2 * DAY + 600, capacity="spot")  # the name again: its own facts
    w.segment(8, D0 + 2 * DAY, "rec", completed=2, recomputed=1, end=D0 + 2 * DAY + 300)


def test_the_triggers_give_the_same_rollups_on_both_engines(tmp_path: Path, postgres_url: str) -> None:
    with _sqlite_ledger(tmp_path / "ledger.db") as lite, _postgres_ledger(postgres_url) as pg:
        _write_the_slices(_Writer((lite, pg)))
        facts = _assert_engines_agree(lite, pg)
    # Each rollup holds what the slices above make of it (so the agreement above is not of empty tables).
    assert len(facts["cost_rollup"]) >= 5
    by_first_day = {(r[0], r[1]): r for r in facts["cost_rollup_x"]}
    three_days = by_first_day[(int(D0 / DAY), int(D0 / DAY) + 4)]
    assert three_days[6] == 2 and three_days[7] == pytest.approx(2 * (3 * DAY - 500))  # two slices, billed s
    assert sorted({r[0] - r[1] for r in facts["cost_rollup_xdays"]}) == [1, 2, 3]
    held = {(r[0], r[1]): r for r in facts["cost_rollup_held"]}
    assert held[(int(D0 / DAY), int(D0 / DAY) + 3)][7] == pytest.approx(8 * (2 * DAY + 10 - 12000))
    assert any(r[2] is None and r[3] is None for r in facts["cost_rollup"])  # the untyped slice's key
    assert any(r[0] == -1 for r in facts["cost_rollup"])  # before the epoch: SQLite's truncated day
    rec = {r[0]: r[1:] for r in facts["pods"]}
    assert sum(1 for priced, _u, _r in rec.values() if priced > 0) == 3  # rec, rec-open, rec (again)
    assert (
        sum(1 for _p, _u, rolled in rec.values() if rolled) == 5
    )  # crossing, 2 x three-days, unpriced, untyped-x


def _through_the_ledger(ledger: Ledger) -> None:
    """Slices and segments recorded by the ledger itself: one by one and in bulk, with a price change, a
    preemption held then deleted, and segments that redid work, closed, updated and moved."""

    def life(name: str, ready: float, end: float, kind: EventKind, **attrs: Any) -> list[NewEvent]:
        opening = {"chips": 8, "accelerator_type": "v5e-8", "capacity": CapacityType.ON_DEMAND,
                   "price_per_chip_hour": 1.2, **attrs}  # fmt: skip
        return [NewEvent(EventKind.REQUESTED, pod=name, zone=Z, ts=ready - 60, **opening),
                NewEvent(EventKind.READY, pod=name, zone=Z, ts=ready),
                NewEvent(kind, pod=name, zone=Z, ts=end)]  # fmt: skip

    ledger.record_events_bulk([*life("day", D0 + 3600, D0 + 7200, EventKind.DELETED),
                               *life("days", D0 + 1000, D0 + 3 * DAY + 500, EventKind.DELETED),
                               *life("untyped", D0 + 1000, D0 + 5000, EventKind.DELETED,
                                     accelerator_type=None, capacity=None)])  # fmt: skip
    for event in life("held", D0 + 5000, D0 + 80_000, EventKind.PREEMPTED, capacity=CapacityType.SPOT):
        ledger.record_event(**event._asdict())
    ledger.record_event(EventKind.DELETED, pod="held", zone=Z, ts=D0 + DAY + 3000)
    for event in life("repriced", D0 + 5000, D0 + DAY + 5000, EventKind.DELETED, price_per_chip_hour=None):
        ledger.record_event(**event._asdict())
        if event.kind == EventKind.READY:
            ledger.record_event(EventKind.PRICE_CHANGE, pod="repriced", zone=Z, ts=D0 + 9000,
                                price_per_chip_hour=2.0)  # fmt: skip
    for run in ("r1", "r2"):
        ledger.create_run(run, script="train.py", ts=D0)
    first = ledger.add_segment("r1", SegmentKind.RUNNING, start=D0 + 2000, pod="day", zone=Z)
    ledger.close_segment(first, end=D0 + 6000, steps_completed=100, steps_recomputed=40)
    second = ledger.add_segment("r2", SegmentKind.RUNNING, start=D0 + 4000, pod="days", zone=Z)
    ledger.update_segment(second, steps_completed=10, steps_recomputed=10)
    ledger.update_segment(first, pod="untyped")


def test_the_ledger_on_either_engine_keeps_the_same_rollups(tmp_path: Path, postgres_url: str) -> None:
    url = parse_database_url(postgres_url)
    with Ledger(tmp_path / "state") as lite_ledger, Ledger(open_database(url)) as pg_ledger:
        for ledger in (lite_ledger, pg_ledger):
            _through_the_ledger(ledger)
        db = lite_ledger.path
    with _sqlite_connection(db) as lite, _postgres_connection(postgres_url) as pg:
        facts = _assert_engines_agree(lite, pg)
    assert {len(facts[t]) > 0 for t in schema.ROLLUP_KEYS} == {True}
    assert sum(1 for _id, priced, unpriced, _rolled in facts["pods"] if priced or unpriced) == 2


def test_postgresql_gets_the_triggers_in_sqlite_order(postgres_url: str) -> None:
    import sqlalchemy as sa

    engine = create_engine(parse_database_url(postgres_url))
    try:
        with engine.begin() as conn:
            _alembic_upgrade(conn)
        with engine.connect() as conn:
            names = [r[0] for r in conn.execute(sa.text(
                "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal ORDER BY oid"))]  # fmt: skip
            offsets = conn.execute(sa.text("SELECT COUNT(*), MIN(n), MAX(n) FROM cost_day_offsets")).one()
    finally:
        engine.dispose()
    lite = [s.split()[2] for s in derived.statements(SQLITE) if s.lstrip().startswith("CREATE TRIGGER")]
    assert len(lite) == 11
    # then revisions 0004 to 0007's and 0009's
    revisions = [
        *OWNER.triggers,
        *WASTE.triggers,
        *CLOSED_TIME.triggers,
        *NORUN.triggers,
        *shares_seen.TRIGGERS,
    ]
    assert names == [*lite, *revisions]
    assert tuple(offsets) == (schema.ROLLUP_MAX_DAYS + 1, 0, schema.ROLLUP_MAX_DAYS)


def test_the_rollup_keys_are_the_tables_primary_keys() -> None:
    from tpuctl.store.tables import build_metadata

    tables = build_metadata().tables
    for table, keys in schema.ROLLUP_KEYS.items():
        assert tuple(c.name for c in tables[table].primary_key.columns) == keys


def test_sqlite_keeps_its_trigger_text() -> None:
    """A new SQLite ledger gets the very statements the released migrations put in every ledger (their
    digest, taken before the SQL learnt PostgreSQL): a change to SQLite's text must be deliberate."""
    text = "\n".join(derived.statements(SQLITE))
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "cb1b86e3a0ee37b035aeedc328fd18f54327e26b12cd96fb055c45ae17077f12"
    )
    assert f"BEGIN {schema.rollup_add_sql()} END" in derived.statements(SQLITE)[0]


# --- randomized ---------------------------------------------------------------------------------------

_SECONDS = st.sampled_from([3000.0, 50_000.0, 20.0, 61.0, DAY, 20_000.0, 2.5 * DAY, 59.0, 0.0])
_SLICE = st.tuples(
    st.just("slice"),
    st.fixed_dictionaries({
        "name": st.sampled_from("abc"), "gap": _SECONDS, "length": _SECONDS,
        "end": st.sampled_from([EventKind.DELETED, EventKind.PREEMPTED, EventKind.PREEMPTED,
                                EventKind.GONE, EventKind.FAILED, None]),
        "deleted_after": st.sampled_from([3000.0, 10.0, 2 * DAY, None]),
        "capacity": st.sampled_from(["spot", "on-demand", "preemptible", None]),
        "price": st.sampled_from([1.5, None]), "accelerator_type": st.sampled_from(["v5e-8", None]),
        "chips": st.sampled_from([4, 4, 4, None]), "repriced": st.sampled_from([False, False, True]),
        "batched": st.booleans(),
    }),
)  # fmt: skip
_SEGMENT = st.tuples(
    st.just("segment"),
    st.fixed_dictionaries({
        "pod": st.sampled_from(["last", "a", "b", "c", None]),
        "after": st.sampled_from([20.0, -3000.0, 3000.0, -DAY, 0.0]),
        "length": st.sampled_from([3000.0, 100.0, DAY, None]),
        "completed": st.sampled_from([20, 5, 0, None]), "recomputed": st.sampled_from([5, 3, 20, 0, None]),
    }),
)  # fmt: skip
_CHANGE = st.one_of(
    st.tuples(st.just("move"), st.integers(1, 4), st.sampled_from([None, "a", "b", "c"])),
    st.tuples(st.just("steps"), st.integers(1, 4), st.integers(0, 20), st.integers(0, 20)),
    st.tuples(st.just("delete"), st.integers(1, 4)),
)
_OPS = st.lists(st.one_of(_SLICE, _SLICE, _SEGMENT, _CHANGE), min_size=6, max_size=14)


def _run_ops(w: _Writer, ops: list[tuple[Any, ...]]) -> None:
    """Slices (a life each, its events flushed one by one or as one batch), segments recorded before,
    during or after the slices they ran on (most near the latest slice's READY, often on it), and
    segments changed: moved, their steps updated, deleted."""
    ts, segments, last = D0 + 70_000.0, 0, "a"
    for op in ops:
        if op[0] == "slice":
            s = op[1]
            ts += s["gap"]
            last = s["name"]
            flush = not s["batched"]
            attrs = {k: s[k] for k in ("capacity", "price", "accelerator_type", "chips")}
            w.event(ts - 30, EventKind.REQUESTED, s["name"], flush=flush, **attrs)
            w.event(ts, EventKind.READY, s["name"], flush=flush)
            if s["repriced"]:
                w.event(ts + s["length"] / 2, EventKind.PRICE_CHANGE, s["name"], flush=flush, price=2.0)
            if s["end"] is not None:
                w.event(ts + s["length"], s["end"], s["name"], flush=flush)
                if s["deleted_after"] is not None:
                    w.event(ts + s["length"] + s["deleted_after"], EventKind.DELETED, s["name"], flush=flush)
            w.flush()
        elif op[0] == "segment":
            g = op[1]
            segments += 1
            start, pod = ts + g["after"], last if g["pod"] == "last" else g["pod"]
            end = None if g["length"] is None else start + g["length"]
            w.segment(segments, start, pod, completed=g["completed"], recomputed=g["recomputed"], end=end)
        elif op[0] == "move":
            w.sql("UPDATE run_segments SET pod = :pod WHERE id = :id", pod=op[2], id=op[1])
        elif op[0] == "steps":
            w.sql("UPDATE run_segments SET steps_completed = :c, steps_recomputed = :r WHERE id = :id",
                  c=op[2], r=op[3], id=op[1])  # fmt: skip
        else:
            w.sql("DELETE FROM run_segments WHERE id = :id", id=op[1])


def test_random_ledgers_roll_up_alike_on_both_engines(tmp_path: Path, postgres_url: str) -> None:
    with _sqlite_ledger(tmp_path / "ledger.db") as lite, _postgres_ledger(postgres_url) as pg:

        @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(ops=_OPS)
        def check(ops: list[tuple[Any, ...]]) -> None:
            with _savepoint(lite), _savepoint(pg):
                _run_ops(_Writer((lite, pg)), ops)
                _assert_engines_agree(lite, pg)

        check()
