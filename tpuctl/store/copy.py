"""Copying one ledger's history into another (`tpuctl db copy`: a laptop's SQLite file into the team's
PostgreSQL), on either engine: insert-if-absent, resumable, and a no-op the second time.

What is copied, table by table (``TABLES``; a test checks that it names every table of
``tpuctl.store.tables``, so a new table cannot be skipped unnoticed):

* **Runs go whole** (``WITH_RUN``): a run and every record of it, batch by batch, each batch in one
  transaction, and only when the target does not hold the run already (a run id is made unique by its
  time and a random part). A run the target holds is left as it is: a second copy writes nothing, and a
  copy stopped between two batches goes on where it stopped. Rows with a per-ledger serial ``id``
  (segments, lease history, intents) get the target's own ids, in the source's order: the source's ids
  would collide with the target's rows of other laptops.
* **Events are replayed** (``REPLAYED``), in the source's order, through the target's own view
  (``Ledger.replay_events``): the target's pods and billing rollups are derived there by its own code and
  triggers, never copied (``DERIVED``): copied rollups would count twice in a target that holds anything,
  and SQLite's stand-in for a NULL key (a NUL character) is not text PostgreSQL can hold. Each chunk of
  events is one transaction with the placement attempts that point at them (``WITH_EVENT``, their
  ``event_id`` renumbered to the target's) and the copy's progress marker, so a copy killed midway
  leaves whole chunks and a marker that says exactly which.
* **The progress marker**: ``ledger_meta`` row ``copied:<source identity>`` = JSON ``{"event": the last
  source event id copied, "events": how many, "attempts": how many}``; the next copy of that source starts
  after ``event`` (so one of a laptop that went on working copies only what is new).
* **Not copied** (``NOT_COPIED``): a run's secrets (encrypted with a key that stays with the source, and a
  finished run needs none), the source's servers (live processes of its own), the ledger's identity and
  schema version (the target's own).

Only a quiet ledger is copied (``refuse_live``): a run not finished or a slice not ended would be
supervised, or garbage-collected, from both ledgers at once. Runs that finish only after that check are
not copied either (the next copy takes them).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from tpuctl.errors import UsageError
from tpuctl.store.database import Database
from tpuctl.store.ledger import ATTEMPT_COLUMNS, Ledger
from tpuctl.store.records import LedgerError, RunStatus
from tpuctl.store.sql import SqlConnection
from tpuctl.store.view import EVENT_COLUMNS, Ev

__all__ = [
    "COUNTED",
    "TABLES",
    "Copied",
    "CopyOutcome",
    "CopyPlan",
    "CopyStep",
    "Progress",
    "copy_ledger",
    "ledger_identity",
    "plan",
    "progress_key",
    "refuse_live",
    "table_counts",
]

#: Events per transaction: big enough that a commit's cost disappears, small enough that a copy killed
#: midway redoes little and the target's other writers wait for one chunk at most.
EVENT_CHUNK: Final = 5_000
#: Runs per transaction (with all their records, log lines included).
RUN_BATCH: Final = 100
#: How many runs or slices a refusal names before "and N more".
_NAMED: Final = 10


class Copied(StrEnum):
    """How ``db copy`` carries a table over."""

    WITH_RUN = "with its run"
    REPLAYED = "replayed through the target's view"
    WITH_EVENT = "with its event, the event id renumbered"
    DERIVED = "derived by the target"
    NOT_COPIED = "not copied"


#: Every table of the ledger and how it is copied; the WITH_RUN ones in the order they are written (a
#: run before what refers to it).
TABLES: Final[Mapping[str, Copied]] = {
    "runs": Copied.WITH_RUN,
    "run_segments": Copied.WITH_RUN,
    "run_leases": Copied.WITH_RUN,  # released on a finished run; its generation goes on from there
    "run_lease_history": Copied.WITH_RUN,
    "run_cancel_requests": Copied.WITH_RUN,
    "run_intents": Copied.WITH_RUN,
    "run_state": Copied.WITH_RUN,
    "run_blobs": Copied.WITH_RUN,  # the run's request and bundle: what `runs describe` shows
    "run_log_lines": Copied.WITH_RUN,  # what `runs logs` shows
    "run_submissions": Copied.WITH_RUN,  # a server's idempotency key for the run
    "events": Copied.REPLAYED,
    "attempts": Copied.WITH_EVENT,
    "pods": Copied.DERIVED,
    "cost_rollup": Copied.DERIVED,
    "cost_rollup_x": Copied.DERIVED,
    "cost_rollup_xdays": Copied.DERIVED,
    "cost_rollup_held": Copied.DERIVED,
    "cost_rollup_owner": Copied.DERIVED,
    "cost_rollup_norun": Copied.DERIVED,
    "run_waste": Copied.DERIVED,
    "run_closed_time": Copied.DERIVED,
    "cost_day_offsets": Copied.DERIVED,  # fixed rows every ledger has
    "run_secrets": Copied.NOT_COPIED,
    "server_replicas": Copied.NOT_COPIED,
    "audit_log": Copied.NOT_COPIED,  # the requests a server took: its own, not a laptop's history
    "ledger_meta": Copied.NOT_COPIED,
}

#: The tables whose rows ``table_counts`` counts: what a copy writes, and the pods the replay rebuilds.
COUNTED: Final = (*(t for t, how in TABLES.items() if how is Copied.WITH_RUN), "events", "attempts", "pods")

_UNFINISHED: Final = ", ".join(f"'{s.value}'" for s in RunStatus if not s.finished)
_FINISHED: Final = ", ".join(f"'{s.value}'" for s in RunStatus if s.finished)
# With whose each row is (revision 0003): the replayed events give the pods theirs, the attempts keep
# theirs, exactly as in the source.
_EVENT_COLS: Final = ", ".join(EVENT_COLUMNS)
_ATTEMPT_COLS: Final = ", ".join(ATTEMPT_COLUMNS)
_ATTEMPT_BUT_ID: Final = ATTEMPT_COLUMNS[1:]
_ATTEMPT_EVENT: Final = ATTEMPT_COLUMNS.index("event_id")
_INSERT_ATTEMPT: Final = (
    f"INSERT INTO attempts ({', '.join(_ATTEMPT_BUT_ID)}) "
    f"VALUES ({', '.join(f':{c}' for c in _ATTEMPT_BUT_ID)})"
)


@dataclass(frozen=True, slots=True)
class Progress:
    """How far the copies of one source into one target got: the last source event id copied, and how
    many events and attempts they copied in all."""

    event: int = 0
    events: int = 0
    attempts: int = 0

    def to_json(self) -> str:
        return json.dumps({"event": self.event, "events": self.events, "attempts": self.attempts})

    @classmethod
    def from_json(cls, text: str) -> Progress:
        data = json.loads(text)
        return cls(int(data["event"]), int(data["events"]), int(data["attempts"]))


@dataclass(frozen=True, slots=True)
class CopyStep:
    """One step done, for a progress display: ``phase`` ("runs" or "events"), how many of its items are
    done out of ``total``."""

    phase: str
    done: int
    total: int


@dataclass(frozen=True, slots=True)
class CopyPlan:
    """What a copy would write now: runs absent from the target, and the events after its marker."""

    source_identity: str
    runs: int
    runs_present: int
    events: int
    events_copied_before: int


@dataclass(frozen=True, slots=True)
class CopyOutcome:
    """What one copy wrote, and the marker after it (all copies of this source so far)."""

    source_identity: str
    runs_copied: int
    runs_present: int
    events_copied: int
    attempts_copied: int
    progress: Progress


@dataclass(frozen=True, slots=True)
class _RunTable:
    """A WITH_RUN table: the columns copied (not a serial ``id``) and the order its rows are read in."""

    name: str
    columns: tuple[str, ...]
    order: str

    def select(self, placeholders: str) -> str:
        return (
            f"SELECT {', '.join(self.columns)} FROM {self.name} WHERE run_id IN ({placeholders}) "
            f"ORDER BY {self.order}"
        )

    @property
    def insert(self) -> str:
        # DO NOTHING: a run is copied only when absent, but a submission's key may be the target's own.
        values = ", ".join(f":{c}" for c in self.columns)
        return f"INSERT INTO {self.name} ({', '.join(self.columns)}) VALUES ({values}) ON CONFLICT DO NOTHING"


def progress_key(source_identity: str) -> str:
    """The target's ``ledger_meta`` key holding the copies' ``Progress`` from the ledger of that identity."""
    return f"copied:{source_identity}"


@contextlib.contextmanager
def _transaction(db: Database, *, write: bool) -> Iterator[SqlConnection]:
    """One transaction on ``db``, as ``Ledger`` runs its own (the copy's rows go in beside its writes)."""
    with db.translate():
        conn = db.begin(write=write)
        try:
            yield conn
            db.commit()
        except BaseException:
            db.rollback()
            raise


def ledger_identity(db: Database) -> str:
    """The ledger's random identity (``Ledger.identity``): what names a source in the target's marker."""
    with _transaction(db, write=False) as conn:
        return str(conn.execute("SELECT value FROM ledger_meta WHERE key = 'identity'").fetchone()[0])


def refuse_live(source: Database) -> None:
    """A ``UsageError`` (exit 2) naming the runs not finished and the slices not ended in ``source``, and
    what to do, when there are any: the source's supervisors and `pod gc` would still act on them."""
    with _transaction(source, write=False) as conn:
        runs = [f"{r[0]} ({r[1]})" for r in conn.execute(
            f"SELECT run_id, status FROM runs WHERE status IN ({_UNFINISHED}) ORDER BY created_at, run_id"
        )]  # fmt: skip
        pods = [f"{r[1]} in {r[0]} ({r[2]})" for r in conn.execute(
            "SELECT zone, name, state FROM pods WHERE ended_at IS NULL ORDER BY zone, name"
        )]  # fmt: skip
    if not runs and not pods:
        return
    what = []
    if runs:
        what.append(f"{len(runs)} unfinished run(s): {_some(runs)}")
    if pods:
        what.append(f"{len(pods)} live slice(s): {_some(pods)}")
    raise UsageError(
        f"the ledger {source.where} has {' and '.join(what)}; copied now, they would be supervised and "
        "cleaned up from both ledgers",
        field="source",
        value=source.where,
        fix="let the runs finish or cancel them (`tpuctl runs cancel RUN`), delete the slices "
        "(`tpuctl pod delete NAME`, or `tpuctl pod gc` for those already gone), then copy again",
    )


def _some(names: Sequence[str]) -> str:
    more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
    return ", ".join(names[:_NAMED]) + more


def table_counts(db: Database) -> dict[str, int]:
    """Rows of each ``COUNTED`` table, in one snapshot."""
    with _transaction(db, write=False) as conn:
        return {t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in COUNTED}


def plan(source: Database, target: Database | None, source_identity: str) -> CopyPlan:
    """What ``copy_ledger`` would write now; ``target`` None: a target that holds nothing yet."""
    before = Progress() if target is None else _read_progress(target, progress_key(source_identity))
    runs = present = 0
    for ids in _finished_run_batches(source):
        runs += len(ids)
        if target is not None:
            with _transaction(target, write=False) as conn:
                present += len(_present(conn, ids))
    with _transaction(source, write=False) as conn:
        events = int(conn.execute(
            "SELECT COUNT(*) FROM events WHERE id > :after", {"after": before.event}
        ).fetchone()[0])  # fmt: skip
    return CopyPlan(source_identity, runs - present, present, events, before.events)


def copy_ledger(
    source: Database,
    target: Ledger,
    target_db: Database,
    *,
    chunk: int = EVENT_CHUNK,
    on_step: Callable[[CopyStep], None] = lambda _step: None,
) -> CopyOutcome:
    """Copy ``source``'s finished runs and its events after the marker into ``target`` (the ledger over
    ``target_db``); ``on_step`` hears of each committed batch (and may raise to stop the copy there)."""
    identity = ledger_identity(source)
    if identity == ledger_identity(target_db):
        raise UsageError(
            f"{source.where} and {target_db.where} are the same ledger (or copies of one file): copying "
            "would count its history twice",
            field="target",
            value=target_db.where,
            fix="copy into another database",
        )
    copied, present = _copy_runs(source, target_db, on_step)
    key = progress_key(identity)
    before = _read_progress(target_db, key)
    after = _copy_events(source, target, key, before, chunk, on_step)
    return CopyOutcome(
        identity, copied, present, after.events - before.events, after.attempts - before.attempts, after
    )


# -- runs ---------------------------------------------------------------------------------------------


def _run_tables() -> tuple[_RunTable, ...]:
    from tpuctl.store.tables import build_metadata

    metadata = build_metadata()
    out = []
    for name, how in TABLES.items():
        if how is not Copied.WITH_RUN:
            continue
        table = metadata.tables[name]
        serial = "id" in table.columns
        columns = tuple(c.name for c in table.columns if not (serial and c.name == "id"))
        key = ", ".join(c.name for c in table.primary_key.columns)
        out.append(_RunTable(name, columns, "id" if serial else key))
    return tuple(out)


def _finished_run_batches(source: Database) -> Iterator[list[str]]:
    """The source's finished runs' ids, a batch at a time, by id (keyset: each batch a short read)."""
    after = ""
    while True:
        with _transaction(source, write=False) as conn:
            ids = [str(r[0]) for r in conn.execute(
                f"SELECT run_id FROM runs WHERE run_id > :after AND status IN ({_FINISHED}) "
                "ORDER BY run_id LIMIT :n",
                {"after": after, "n": RUN_BATCH},
            )]  # fmt: skip
        if not ids:
            return
        yield ids
        after = ids[-1]


def _present(conn: SqlConnection, ids: Sequence[str]) -> set[str]:
    names, params = _in_list(ids)
    return {str(r[0]) for r in conn.execute(f"SELECT run_id FROM runs WHERE run_id IN ({names})", params)}


def _in_list(ids: Sequence[str]) -> tuple[str, dict[str, Any]]:
    params = {f"r{i}": run_id for i, run_id in enumerate(ids)}
    return ", ".join(f":{name}" for name in params), params


def _copy_runs(source: Database, target: Database, on_step: Callable[[CopyStep], None]) -> tuple[int, int]:
    """Copy each finished run the target lacks, whole; return (copied, already there)."""
    tables = _run_tables()
    with _transaction(source, write=False) as conn:
        total = int(conn.execute(f"SELECT COUNT(*) FROM runs WHERE status IN ({_FINISHED})").fetchone()[0])
    copied = present = 0
    for ids in _finished_run_batches(source):
        with _transaction(target, write=True) as dst:
            there = _present(dst, ids)
            todo = [run_id for run_id in ids if run_id not in there]
            if todo:
                names, params = _in_list(todo)
                with _transaction(source, write=False) as src:
                    for table in tables:
                        rows = src.execute(table.select(names), params).fetchall()
                        dst.executemany(
                            table.insert, [dict(zip(table.columns, r, strict=True)) for r in rows]
                        )
        copied += len(todo)
        present += len(there)
        on_step(CopyStep("runs", copied + present, total))
    return copied, present


# -- events -------------------------------------------------------------------------------------------


def _read_progress(db: Database, key: str) -> Progress:
    with _transaction(db, write=False) as conn:
        return _progress_in(conn, key)


def _progress_in(conn: SqlConnection, key: str) -> Progress:
    row = conn.execute("SELECT value FROM ledger_meta WHERE key = :key", {"key": key}).fetchone()
    return Progress() if row is None else Progress.from_json(str(row[0]))


def _copy_events(
    source: Database,
    target: Ledger,
    key: str,
    start: Progress,
    chunk: int,
    on_step: Callable[[CopyStep], None],
) -> Progress:
    with _transaction(source, write=False) as conn:
        total = int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    progress = start
    while True:
        with _transaction(source, write=False) as conn:
            rows = conn.execute(
                f"SELECT {_EVENT_COLS} FROM events WHERE id > :after ORDER BY id LIMIT :n",
                {"after": progress.event, "n": chunk},
            ).fetchall()
            if not rows:
                return progress
            attempts = conn.execute(
                f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE event_id > :after AND event_id <= :last "
                "ORDER BY id",
                {"after": progress.event, "last": rows[-1][0]},
            ).fetchall()
        # The stored row as check_view replays it: pod_id (r[5]) is the target's to assign.
        events = [Ev(r[1], r[2], r[3], r[4], *r[6:]) for r in rows]
        done = Progress(rows[-1][0], progress.events + len(rows), progress.attempts + len(attempts))
        target.replay_events(events, then=_chunk_writer(key, progress, done, [r[0] for r in rows], attempts))
        progress = done
        on_step(CopyStep("events", progress.events, total))


def _chunk_writer(
    key: str, before: Progress, done: Progress, source_ids: list[int], attempts: list[Any]
) -> Callable[[SqlConnection, list[int]], None]:
    """What goes in the transaction of a chunk of events, after them: their attempts, and the marker."""

    def write(conn: SqlConnection, ids: list[int]) -> None:
        if _progress_in(conn, key) != before:
            # Another copy of the same source moved the marker since this one read it.
            raise LedgerError(
                "another `tpuctl db copy` of the same ledger is writing into this database",
                fix="let it finish; a copy run after it has nothing left to do",
            )
        renumbered = dict(zip(source_ids, ids, strict=True))
        conn.executemany(
            _INSERT_ATTEMPT,
            [
                {**dict(zip(_ATTEMPT_BUT_ID, a[1:], strict=True)), "event_id": renumbered[a[_ATTEMPT_EVENT]]}
                for a in attempts
            ],
        )
        conn.execute(
            "INSERT INTO ledger_meta (key, value) VALUES (:key, :value) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            {"key": key, "value": done.to_json()},
        )

    return write
