"""The ledger: tpuctl's record of slices, placement attempts, runs and their lifecycle events, and of who
may act on each run (its lease, ``tpuctl.store.leases``).

One SQLite file, ``<state_dir>/ledger.db`` unless the ``database`` setting names another
(``Ledger.open(url)``), shared by every tpuctl process of a user (or of the machines that share it); or a
PostgreSQL database, shared by a team (``tpuctl.store.database``: what differs per engine). The SQL here
is written once for both (``tpuctl.store.sql``).

Durability and concurrency choices on SQLite (the why; PostgreSQL's: ``tpuctl.store.database``):

* WAL journal: readers (``pod list``, ``cost report``) never block a writer and a writer never blocks
  them, which matters when a detached run supervisor writes while the user runs other commands.
* ``synchronous=FULL``: every COMMIT fsyncs the WAL, so an event reported as written survives a power
  loss or a kernel crash, not only a killed process (NORMAL would already survive SIGKILL, but could
  drop the last commits on power loss, and an event lost there is a slice nobody pays attention to).
  tpuctl commits a handful of times per command, so one fsync each costs nothing a user can see; the
  bulk path commits once.
* Every write is one short ``BEGIN IMMEDIATE`` transaction: the write lock is taken up front, so two
  writers queue on ``busy_timeout`` instead of failing with SQLITE_BUSY half way through (a deferred
  transaction that upgrades from read to write cannot wait, it must fail). An event and the pods-view
  change it causes are in the same transaction, so the view and the log never disagree, and a tpuctl
  killed mid-write leaves either both or neither.
* The database file is created 0600 before SQLite opens it; SQLite gives the -wal and -shm files the
  mode of the database file, and they are chmod-ed again after opening in case an older file was
  looser. The state directory is 0700 (``paths.ensure_private_dir``). The process umask is never
  changed: it is process-global and other threads may be creating files.
* One connection per ``Ledger`` guarded by a lock, so a ``Ledger`` may be shared by the threads of one
  command (the allocator's race strategy). Other processes open their own ``Ledger``.
* Fencing: ``ledger.fenced(claim)`` is the same ledger (same connection) whose every write transaction
  first checks, inside the transaction, that ``claim`` still holds the run's lease (``leases.fence``);
  a supervisor routes all its writes through it and cannot write after losing the lease.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TypeAlias, TypeVar

from tpuctl.catalog import CapacityType
from tpuctl.errors import LeaseLostError, UsageError
from tpuctl.store import (
    audit,
    leases,
    norun_rollup,
    owner_rollup,
    queue,
    run_closed_time,
    run_waste,
    runstate,
    schema,
    servers,
    shares_seen,
)
from tpuctl.store.database import Database, SqliteDatabase, open_database
from tpuctl.store.records import (
    LOCAL_WORKSPACE,
    AmbiguousPodError,
    AttemptOutcome,
    AttemptRecord,
    BlobRecord,
    CancelRequest,
    EventKind,
    EventRecord,
    IntentAction,
    IntentRecord,
    LeaseClaim,
    LeaseHistoryRecord,
    LeaseHolder,
    LeaseOwner,
    LedgerError,
    LogLine,
    NewEvent,
    PodRecord,
    PodState,
    RunRecord,
    RunState,
    RunStatus,
    SegmentKind,
    SegmentRecord,
    SliceRef,
)
from tpuctl.store.secrets import SecretKey
from tpuctl.store.sql import Dialect, SqlConnection, in_list
from tpuctl.store.url import LEDGER_FILENAME, DatabaseUrl, parse_database_url
from tpuctl.store.view import EVENT_COLUMNS, POD_COLUMNS, POD_KINDS, Ev, PodRow, apply_event

__all__ = ["LEDGER_FILENAME", "UNSET", "Ledger", "ledger_file", "resolve_ledger_path"]

DEFAULT_BUSY_TIMEOUT_S: Final = 30.0

# Bulk writes go to SQLite in chunks so a million-event import holds bounded memory; the pods touched
# are flushed (and the cache dropped) every _POD_FLUSH rows for the same reason.
_EVENT_CHUNK: Final = 10_000
_POD_FLUSH: Final = 50_000
# events() reads the log in pages: each page is a short read, so a long iteration never pins an old
# WAL snapshot (which would stop checkpoints) and the caller may write to the ledger while iterating.
_PAGE: Final = 2_000


class _Unset(Enum):
    UNSET = "UNSET"


#: "Leave this field as it is" for ``update_run`` (``None`` means "set it to NULL").
UNSET: Final = _Unset.UNSET

_T = TypeVar("_T")
_Maybe: TypeAlias = _T | Literal[_Unset.UNSET]

_EVENT_COLS: Final = ", ".join(EVENT_COLUMNS)
_POD_COLS: Final = ", ".join(POD_COLUMNS)
#: An attempt's columns: the hand-written migrations' and whose placement it was (revision 0003).
ATTEMPT_COLUMNS: Final = (*schema.ATTEMPT_COLUMNS, "principal", "workspace")
_ATTEMPT_COLS: Final = ", ".join(ATTEMPT_COLUMNS)
#: A run's columns: the hand-written migrations' and what revision 0003 added (who, and the queue).
_RUN_COLUMNS: Final = (*schema.RUN_COLUMNS, "principal", "workspace", "priority", "queued_at", "admitted_at",
                       "queue_reason")  # fmt: skip
_RUN_COLS: Final = ", ".join(_RUN_COLUMNS)
_RUN_COLS_R: Final = ", ".join(f"r.{c}" for c in _RUN_COLUMNS)
_SEGMENT_COLS: Final = ", ".join(schema.SEGMENT_COLUMNS)
#: A run (``runs AS r``) someone must supervise: not finished, and resumable from the ledger (its saved
#: request, parameter ``:request``, is here). Whether anyone holds it is the lease's to say.
#: A run a replica takes up as it is: unfinished, admitted (a QUEUED one waits for ``admit_queued``) and
#: with its saved request in the ledger.
_RESUMABLE: Final = (
    "r.status IN ({}) AND EXISTS (SELECT 1 FROM run_blobs AS b WHERE b.run_id = r.run_id "
    "AND b.name = :request)".format(
        ", ".join(f"'{s.value}'" for s in RunStatus if not s.finished and s is not RunStatus.QUEUED)
    )
)
_INSERT_EVENT: Final = (
    f"INSERT INTO events ({_EVENT_COLS}) VALUES ({', '.join(f':{c}' for c in EVENT_COLUMNS)})"
)
_UPSERT_POD: Final = (
    f"INSERT INTO pods ({_POD_COLS}) VALUES ({', '.join(f':{c}' for c in POD_COLUMNS)}) "
    "ON CONFLICT (id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in POD_COLUMNS if c != "id")
)
_SEGMENT_BY_ID: Final = f"SELECT {_SEGMENT_COLS} FROM run_segments WHERE id = :id"
_ATTEMPT_COLUMNS_BUT_ID: Final = ATTEMPT_COLUMNS[1:]
_ATTEMPT_COLS_BUT_ID: Final = ", ".join(_ATTEMPT_COLUMNS_BUT_ID)
_LATEST_POD: Final = (
    f"SELECT {_POD_COLS} FROM pods WHERE zone = :zone AND name = :name ORDER BY incarnation DESC LIMIT 1"
)

# Decoding tables: a dict lookup is much cheaper than an Enum call per row, and unknown values
# (written by a newer tpuctl) come back as plain strings instead of failing the whole read.
_KINDS: Final[dict[str, EventKind]] = {k.value: k for k in EventKind}
_KIND_VALUES: Final[dict[str, str]] = {k.value: k.value for k in EventKind}
_CAPACITY_VALUES: Final[dict[str, str]] = {c.value: c.value for c in CapacityType}
_CAPACITIES: Final[dict[str, CapacityType]] = {c.value: c for c in CapacityType}
_OUTCOMES: Final[dict[str, AttemptOutcome]] = {o.value: o for o in AttemptOutcome}
_RUN_STATUSES: Final[dict[str, RunStatus]] = {s.value: s for s in RunStatus}
_SEGMENT_KINDS: Final[dict[str, SegmentKind]] = {s.value: s for s in SegmentKind}


def resolve_ledger_path(path_or_state_dir: str | os.PathLike[str]) -> Path:
    """``<dir>/ledger.db`` for a state directory; the path itself for a ``*.db`` or an existing file."""
    p = Path(path_or_state_dir).expanduser()
    if p.suffix == ".db" or p.is_file():
        return p
    return p / LEDGER_FILENAME


def ledger_file(url: DatabaseUrl) -> Path:
    """The SQLite file of the ledger at ``url``, for what only a file has (tests, SQLite's own tools); a
    ``UsageError`` (exit 2) naming the URL, its password hidden, for a PostgreSQL ledger, which has none."""
    if url.path is None:
        raise UsageError(
            f"the ledger on PostgreSQL ({url.text}) is a database, not a file",
            field="database",
            value=url.text,
            fix="use a SQLite ledger, sqlite:////ABSOLUTE/PATH/ledger.db, for what needs the file itself",
        )
    return url.path


class Ledger:
    """The ledger. ``Ledger(state_dir)`` or ``Ledger(path/to/file.db)`` (SQLite), ``Ledger(database)`` on a
    ``tpuctl.store.database.Database`` (either engine); use as a context manager.

    Given a state directory, it is created (or tightened) to 0700. Given a file path, a missing parent is
    created 0700 but an existing one is left alone (it may be a shared directory such as /tmp).
    ``clock`` supplies the timestamp of any write that does not pass ``ts``.
    """

    def __init__(
        self,
        where: str | os.PathLike[str] | Database,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    ) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._fence: LeaseClaim | None = None  # set on the views fenced() returns
        self._on_lost: Callable[[LeaseLostError], None] | None = None  # ... and who hears of a loss
        self._owns_connection = True
        if isinstance(where, (str, os.PathLike)):
            db = resolve_ledger_path(where)
            private_parent = db.parent == Path(where).expanduser()
            where = SqliteDatabase(db, busy_timeout_s=busy_timeout_s, private_parent=private_parent)
        self._db: Database = where

    @classmethod
    def open(
        cls,
        url: DatabaseUrl | str,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    ) -> Ledger:
        """The ledger at ``url`` (the ``database`` setting: ``sqlite:////abs/path/ledger.db`` or
        ``postgresql://…``), opened and brought to the newest schema; a string is parsed first (a bad one
        is a ``UsageError`` naming it and the fix)."""
        return cls(open_database(parse_database_url(url), busy_timeout_s=busy_timeout_s), clock=clock)

    @property
    def url(self) -> DatabaseUrl:
        return self._db.url

    @property
    def database(self) -> Database:
        """The open database: a cost report given it reads through its connections (a PostgreSQL
        ledger's pool, where a report given the URL connects anew: 10 ms a report)."""
        return self._db

    @property
    def path(self) -> Path:
        """The SQLite file of this ledger (what the cost report reads; refused for a PostgreSQL ledger)."""
        return ledger_file(self._db.url)

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; a no-op on a ``fenced`` view (the ledger it came from owns it)."""
        if not self._owns_connection:
            return
        with self._lock:
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        with self._lock, self._db.translate():
            return self._db.schema_version()

    @property
    def identity(self) -> str:
        """This ledger's random id (made once, with the ledger): the ``tpuctl-ledger`` label of the slices
        it creates, by which `pod gc` tells its own orphans from another machine's live slices."""
        with self._read() as conn:
            row = conn.execute("SELECT value FROM ledger_meta WHERE key = 'identity'").fetchone()
        return str(row[0])

    # -- transactions ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self, fence: LeaseClaim | None = None) -> Iterator[SqlConnection]:
        """One write transaction; fenced by ``fence`` and by this view's claim, when either is set: a
        claim that no longer holds its run's lease commits only the loss (to the lease history) and
        raises ``LeaseLostError`` before the caller's statements run."""
        db = self._db
        try:
            with self._lock, db.translate():
                conn = db.begin(write=True)
                try:
                    for claim in _distinct_claims(self._fence, fence):
                        lost = leases.fence(conn, claim)
                        if lost is not None:
                            db.commit()
                            raise lost
                    yield conn
                    db.commit()
                except BaseException:
                    db.rollback()
                    raise
        except LeaseLostError as lost:
            if self._on_lost is not None:  # told outside the lock: the listener may read the ledger
                self._on_lost(lost)
            raise

    @contextlib.contextmanager
    def _lease_write(self) -> Iterator[SqlConnection]:
        """One write transaction of a lease's own (claim, renewal, release): on PostgreSQL it locks the
        lease rows it touches instead of taking the ledger's write lock (``tpuctl.store.leases``), so
        replicas claim and renew side by side; never fenced (it is the lease's own bookkeeping)."""
        db = self._db
        with self._lock, db.translate():
            conn = db.begin(write=True, row_locked=True)
            try:
                yield conn
                db.commit()
            except BaseException:
                db.rollback()
                raise

    @contextlib.contextmanager
    def _read(self) -> Iterator[SqlConnection]:
        # A read transaction so multi-statement reads see one snapshot.
        db = self._db
        with self._lock, db.translate():
            conn = db.begin(write=False)
            try:
                yield conn
            finally:
                db.commit()

    # -- events and the pods view ------------------------------------------------------------------

    def record_event(
        self,
        kind: EventKind,
        *,
        pod: str | None = None,
        zone: str | None = None,
        accelerator_type: str | None = None,
        chips: int | None = None,
        capacity: CapacityType | None = None,
        price_per_chip_hour: float | None = None,
        labels: Mapping[str, str] | None = None,
        run_id: str | None = None,
        request_id: str | None = None,
        detail: Mapping[str, Any] | None = None,
        ts: float | None = None,
        hosts: int | None = None,
        queued_resource: str | None = None,
        slice_index: int | None = None,
        backend: str | None = None,
        project: str | None = None,
        principal: str | None = None,
        workspace: str | None = None,
    ) -> int:
        """Append one event and apply it to the pods view in the same transaction; return its id.

        Lifecycle kinds (requested, queued, created, ready, preempted, failed, deleted, gone,
        price_change) need ``pod`` and ``zone``; price_change needs ``price_per_chip_hour``. See
        ``tpuctl.store.view`` for exactly how each kind moves the view.

        ``principal``/``workspace``: who it is done for, given only for a slice outside any run (``pod
        create``). Left out, the event is the run's (``run_id``, or the run of the slice it names: whoever
        writes it, a replica that took the run over too), else the slice's own (``_Owners``).
        """
        ev = self._normalize(
            NewEvent(
                kind, pod, zone, accelerator_type, chips, capacity, price_per_chip_hour, labels, run_id,
                request_id, detail, ts, hosts, queued_resource, slice_index, backend, project, principal,
                workspace,
            )
        )  # fmt: skip
        with self._write() as conn:
            return self._apply(conn, (ev,))[0][0]

    def record_events_bulk(self, events: Iterable[NewEvent]) -> int:
        """Record many events in ONE transaction (imports, tests, benchmarks); return how many.

        Same semantics as calling ``record_event`` for each, in order, but all or nothing. The write lock
        is held throughout, so other tpuctl writers wait (up to their busy timeout).
        """
        with self._write() as conn, self._db.bulk():
            return self._apply(conn, (self._normalize(e) for e in events), return_ids=False)[1]

    def replay_events(
        self, events: Sequence[Ev], *, then: Callable[[SqlConnection, list[int]], None]
    ) -> list[int]:
        """Append events read from another ledger (its stored rows, as ``check_view`` replays them:
        validated there, JSON as stored) in ONE transaction, moving this ledger's view and rollups as if
        they had happened here; return their ids here. ``then(conn, ids)`` runs in the same transaction
        (``db copy``: the rows that point at these events, and how far it got, all or nothing)."""
        with self._write() as conn, self._db.bulk():
            ids = self._apply(conn, events, known=_latest_pods(conn, events))[0]
            then(conn, ids)
            return ids

    def _normalize(self, e: NewEvent) -> Ev:
        # Dict lookups rather than Enum calls: this runs a million times in a bulk import, and a
        # StrEnum member hashes and compares equal to its value, so both spellings are accepted.
        kind = _KIND_VALUES.get(e.kind)
        if kind is None:
            raise ValueError(f"unknown event kind {e.kind!r}; known: {', '.join(_KIND_VALUES)}")
        if kind in POD_KINDS and (not e.pod or not e.zone):
            raise ValueError(f"a {kind!r} event needs both pod and zone (got pod={e.pod!r}, zone={e.zone!r})")
        if kind == EventKind.PRICE_CHANGE and e.price_per_chip_hour is None:
            raise ValueError("a 'price_change' event needs price_per_chip_hour")
        ts = self._clock() if e.ts is None else float(e.ts)
        if not math.isfinite(ts):
            raise ValueError(f"event timestamp must be finite, got {ts!r}")
        price = e.price_per_chip_hour
        if price is not None and not (math.isfinite(price) and price >= 0):
            raise ValueError(f"price_per_chip_hour must be a finite number >= 0, got {price!r}")
        if e.chips is not None and e.chips < 0:
            raise ValueError(f"chips must be >= 0, got {e.chips!r}")
        if e.hosts is not None and e.hosts < 0:
            raise ValueError(f"hosts must be >= 0, got {e.hosts!r}")
        if e.slice_index is not None and e.slice_index < 0:
            raise ValueError(f"slice_index must be >= 0, got {e.slice_index!r}")
        return Ev(
            ts,
            kind,
            e.pod,
            e.zone,
            e.accelerator_type,
            e.chips,
            None if e.capacity is None else _capacity_value(e.capacity),
            None if price is None else float(price),
            None if e.labels is None else _labels_json(e.labels),
            e.run_id,
            e.request_id,
            _json_or_none(e.detail),
            e.hosts,
            e.queued_resource,
            e.slice_index,
            e.backend,
            e.project,
            e.principal,
            e.workspace,
        )

    def _apply(
        self,
        conn: SqlConnection,
        events: Iterable[Ev],
        *,
        return_ids: bool = True,
        known: dict[tuple[str, str], PodRow | None] | None = None,
    ) -> tuple[list[int], int]:
        """Insert ``events`` and move the pods view; the caller holds the write transaction. ``known``:
        the latest incarnation of (zone, name)s already read (None: not in the ledger).

        Ids are allocated here (max + 1) rather than by SQLite because a pod row records the id of the
        last event that changed it before either is inserted; ``BEGIN IMMEDIATE`` makes this safe.
        """
        next_event = int(conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM events").fetchone()[0])
        next_pod = int(conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM pods").fetchone()[0])

        def new_pod_id() -> int:
            nonlocal next_pod
            next_pod += 1
            return next_pod - 1

        cache: dict[tuple[str, str], PodRow | None] = {} if known is None else known
        dirty: dict[int, PodRow] = {}
        rows: list[dict[str, Any]] = []
        ids: list[int] = []
        owners = _Owners(conn, bulk=not return_ids)
        count = 0
        for ev in events:
            event_id = next_event
            next_event += 1
            count += 1
            row: PodRow | None = None
            if ev.pod is not None and ev.zone is not None:
                key = (ev.zone, ev.pod)
                if key in cache:
                    cur = cache[key]
                else:
                    found = conn.execute(_LATEST_POD, {"zone": ev.zone, "name": ev.pod}).fetchone()
                    cur = None if found is None else PodRow.from_tuple(found)
                ev = owners.attribute(ev, cur)
                row, changed = apply_event(cur, ev, event_id, new_pod_id)
                cache[key] = row
                if changed:
                    assert row is not None
                    dirty[row.id] = row
            else:
                ev = owners.attribute(ev, None)
            rows.append(dict(zip(EVENT_COLUMNS, _event_row(event_id, ev, row), strict=True)))
            if return_ids:
                ids.append(event_id)
            if len(rows) >= _EVENT_CHUNK:
                conn.executemany(_INSERT_EVENT, rows)
                rows.clear()
            if len(dirty) >= _POD_FLUSH:
                # The events first: the triggers a pod row fires read its events (a slice whose price
                # changed is never rolled up as crossing midnight at one price).
                conn.executemany(_INSERT_EVENT, rows)
                rows.clear()
                _flush_pods(conn, dirty)
                cache.clear()
        if rows:
            conn.executemany(_INSERT_EVENT, rows)
        _flush_pods(conn, dirty)
        return ids, count

    def get_pod(self, name: str, zone: str | None = None) -> PodRecord | None:
        """The latest incarnation of ``name`` (in ``zone``), or None.

        Without a zone: the one open incarnation if exactly one zone has the name open; if none is open,
        the latest incarnation when the name was only ever used in one zone. Otherwise the name is
        ambiguous and ``AmbiguousPodError`` (a usage error, exit 2) names the zones.
        """
        with self._read() as conn:
            if zone is not None:
                found = conn.execute(_LATEST_POD, {"zone": zone, "name": name}).fetchone()
                return None if found is None else _pod_record(found)
            latest = conn.execute(
                f"SELECT {_POD_COLS} FROM pods AS p WHERE name = :name AND incarnation = "
                "(SELECT MAX(incarnation) FROM pods WHERE zone = p.zone AND name = p.name) ORDER BY zone",
                {"name": name},
            ).fetchall()
        if not latest:
            return None
        if len(latest) == 1:
            return _pod_record(latest[0])
        open_rows = [r for r in latest if r[POD_COLUMNS.index("ended_at")] is None]
        if len(open_rows) == 1:
            return _pod_record(open_rows[0])
        candidates = open_rows or latest
        raise AmbiguousPodError(name, [str(r[1]) for r in candidates])

    def list_pods(
        self,
        *,
        alive: bool | None = None,
        zone: str | None = None,
        run_id: str | None = None,
        state: PodState | None = None,
        since: float | None = None,
        until: float | None = None,
        workspaces: Collection[str] | None = None,
    ) -> list[PodRecord]:
        """Pods, every incarnation, oldest first. ``alive`` True: not ended; False: ended.

        ``since``/``until``: only pods whose life (first known time .. ended_at) overlaps
        ``[since, until)``, which is what a cost report over a window needs. ``workspaces``: only the
        slices of these (None: every workspace; a slice from before workspaces is in ``LOCAL_WORKSPACE``).
        """
        where: list[str] = []
        params: dict[str, Any] = {}
        if workspaces is not None:
            where.append(_in_workspaces(workspaces, params))
        if alive is True:
            where.append("ended_at IS NULL")
        elif alive is False:
            where.append("ended_at IS NOT NULL")
        if zone is not None:
            where.append("zone = :zone")
            params["zone"] = zone
        if run_id is not None:
            where.append("run_id = :run_id")
            params["run_id"] = run_id
        if state is not None:
            where.append("state = :state")
            params["state"] = PodState(state).value
            if state == PodState.PREEMPTED:
                # Implied by the view (only a preemption makes a slice PREEMPTED; deleting it makes it
                # DELETED), and what lets SQLite read the partial index pods_preempted instead of every
                # row: reconciliation asks this on every cost report.
                where.append("end_reason = 'preempted' AND deleted_at IS NULL")
        if since is not None:
            where.append("(ended_at IS NULL OR ended_at >= :since)")
            params["since"] = float(since)
        if until is not None:
            where.append("COALESCE(requested_at, created_at, ready_at, ended_at) < :until")
            params["until"] = float(until)
        sql = f"SELECT {_POD_COLS} FROM pods"
        if where:
            sql += " WHERE " + " AND ".join(where)
        # Live or preempted slices are a few rows of a table that may hold hundreds of thousands: "+id"
        # lets SQLite find them through the partial index (pods_open, pods_preempted) and sort those few,
        # where it would otherwise walk every row in id order to save that sort.
        narrow = alive is True or state == PodState.PREEMPTED
        sql += " ORDER BY +id" if narrow else " ORDER BY id"
        with self._read() as conn:
            return [_pod_record(r) for r in conn.execute(sql, params)]

    def pod_events(self, name: str, zone: str | None = None) -> list[EventRecord]:
        """The events of the incarnation ``get_pod(name, zone)`` resolves to, in order."""
        pod = self.get_pod(name, zone)
        if pod is None:
            return []
        return list(self.events(pod_id=pod.id))

    def events(
        self,
        since: float | None = None,
        until: float | None = None,
        kinds: Iterable[EventKind] | None = None,
        run_id: str | None = None,
        *,
        pod_id: int | None = None,
    ) -> Iterator[EventRecord]:
        """Stream events with ``since <= ts < until``, ordered by (ts, id), read in pages.

        Events appended during the iteration with a later ts may or may not be seen.
        """
        where: list[str] = []
        params: dict[str, Any] = {}
        if until is not None:
            where.append("ts < :until")
            params["until"] = float(until)
        if kinds is not None:
            values = sorted({EventKind(k).value for k in kinds})
            if not values:
                return iter(())
            # Literals, not parameters (they are our own enum values): the planner can only use the
            # partial ``events_price`` index when it sees ``kind = 'price_change'`` in the SQL.
            where.append(
                f"kind = '{values[0]}'"
                if len(values) == 1
                else f"kind IN ({', '.join(repr(v) for v in values)})"
            )
        if run_id is not None:
            where.append("run_id = :run_id")
            params["run_id"] = run_id
        if pod_id is not None:
            where.append("pod_id = :pod_id")
            params["pod_id"] = pod_id
        return self._paged_events(where, params, None if since is None else float(since))

    def _paged_events(
        self, where: list[str], params: dict[str, Any], since: float | None
    ) -> Iterator[EventRecord]:
        # Keyset pagination on (ts, id). Each page has exactly one lower bound on ts (the window's start,
        # then the last ts seen) so the planner ranges on the ts index instead of rescanning from the
        # start; only rows sharing the previous page's final ts are re-filtered by id.
        first = " AND ".join(["ts >= :since", *where] if since is not None else where) or "TRUE"
        more = " AND ".join(["ts >= :last_ts", "(ts > :last_ts OR id > :last_id)", *where])
        sql_first = f"SELECT {_EVENT_COLS} FROM events WHERE {first} ORDER BY ts, id LIMIT {_PAGE:d}"
        sql_more = f"SELECT {_EVENT_COLS} FROM events WHERE {more} ORDER BY ts, id LIMIT {_PAGE:d}"
        with self._read() as conn:
            page = conn.execute(
                sql_first, {**params, "since": since} if since is not None else params
            ).fetchall()
        while True:
            for r in page:
                yield _event_record(r)
            if len(page) < _PAGE:
                return
            last_ts, last_id = page[-1][1], page[-1][0]
            with self._read() as conn:
                page = conn.execute(sql_more, {**params, "last_ts": last_ts, "last_id": last_id}).fetchall()

    # -- attempts ----------------------------------------------------------------------------------

    def record_attempt(
        self,
        request_id: str,
        *,
        zone: str,
        outcome: AttemptOutcome,
        capacity: CapacityType | None = None,
        message: str | None = None,
        duration_s: float | None = None,
        pod: str | None = None,
        accelerator_type: str | None = None,
        detail: Mapping[str, Any] | None = None,
        ts: float | None = None,
        run_id: str | None = None,
        principal: str | None = None,
        workspace: str | None = None,
    ) -> int:
        """Record one placement attempt (a row in ``attempts`` and an ``attempt`` event); return its id.
        Whose it is: the run's when it places a slice for ``run_id``, else ``principal``/``workspace``
        (who asked for a slice outside any run)."""
        outcome_value = AttemptOutcome(outcome).value
        event_detail: dict[str, Any] = {"outcome": outcome_value}
        if message is not None:
            event_detail["message"] = message
        if duration_s is not None:
            event_detail["duration_s"] = duration_s
        if detail:
            event_detail["detail"] = dict(detail)
        ev = self._normalize(
            NewEvent(
                EventKind.ATTEMPT,
                pod=pod,
                zone=zone,
                accelerator_type=accelerator_type,
                capacity=capacity,
                request_id=request_id,
                detail=event_detail,
                ts=ts,
                principal=principal,
                workspace=workspace,
            )
        )
        with self._write() as conn:
            owner = _Owners(conn).of_run(run_id) if run_id is not None else None
            if owner is not None:
                ev = ev._replace(principal=owner[0], workspace=owner[1])
            event_id = self._apply(conn, (ev,))[0][0]
            cur = conn.execute(
                f"INSERT INTO attempts ({_ATTEMPT_COLS_BUT_ID}) VALUES ({_named(_ATTEMPT_COLUMNS_BUT_ID)}) "
                "RETURNING id",
                {
                    "request_id": request_id, "ts": ev.ts, "zone": zone, "capacity": ev.capacity,
                    "outcome": outcome_value, "message": message,
                    "duration_s": None if duration_s is None else float(duration_s), "pod": pod,
                    "accelerator_type": accelerator_type, "event_id": event_id,
                    "detail": _json_or_none(detail), "principal": ev.principal, "workspace": ev.workspace,
                },
            )  # fmt: skip
            return int(cur.fetchone()[0])

    def attempts(self, request_id: str) -> list[AttemptRecord]:
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE request_id = :request_id ORDER BY ts, id",
                {"request_id": request_id},
            ).fetchall()
        return [
            AttemptRecord(
                id=r[0],
                request_id=r[1],
                ts=r[2],
                zone=r[3],
                capacity=_capacity(r[4]),
                outcome=_OUTCOMES.get(r[5], r[5]),
                message=r[6],
                duration_s=r[7],
                pod=r[8],
                accelerator_type=r[9],
                event_id=r[10],
                detail=_loads(r[11]),
                principal=r[12],
                workspace=r[13],
            )
            for r in rows
        ]

    # -- runs and their segments -------------------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        *,
        script: str,
        args: Sequence[str] = (),
        status: RunStatus = RunStatus.PENDING,
        pod: str | None = None,
        zone: str | None = None,
        accelerator_type: str | None = None,
        capacity: CapacityType | None = None,
        labels: Mapping[str, str] | None = None,
        detail: Mapping[str, Any] | None = None,
        ts: float | None = None,
        principal: str | None = None,
        workspace: str | None = None,
        priority: str | None = None,
        queue_reason: str | None = None,
    ) -> RunRecord:
        """A new run. ``principal`` and ``workspace``: who submitted it and whose share it uses (None: an
        unknown principal, the implicit local workspace). ``queue_reason``: it enters the server's queue
        now (``queued_at`` is the run's creation), waiting for that reason."""
        now = self._now(ts)
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE run_id = :run_id", {"run_id": run_id}).fetchone():
                raise LedgerError(f"run {run_id!r} already exists in the ledger", fix="use a new run id")
            values = (
                run_id, script, json.dumps(list(args)), RunStatus(status).value, pod, zone,
                accelerator_type, None if capacity is None else CapacityType(capacity).value, now,
                None, None, 0, 0, 0, _labels_json(labels or {}), _json_or_none(detail), now,
                principal, workspace, priority, None if queue_reason is None else now, None, queue_reason,
            )  # fmt: skip
            conn.execute(
                f"INSERT INTO runs ({_RUN_COLS}) VALUES ({_named(_RUN_COLUMNS)})",
                dict(zip(_RUN_COLUMNS, values, strict=True)),
            )
            return self._get_run(conn, run_id)

    def update_run(
        self,
        run_id: str,
        *,
        status: _Maybe[RunStatus] = UNSET,
        pod: _Maybe[str | None] = UNSET,
        zone: _Maybe[str | None] = UNSET,
        accelerator_type: _Maybe[str | None] = UNSET,
        capacity: _Maybe[CapacityType | None] = UNSET,
        ended_at: _Maybe[float | None] = UNSET,
        exit_code: _Maybe[int | None] = UNSET,
        restarts: _Maybe[int] = UNSET,
        preemptions: _Maybe[int] = UNSET,
        steps: _Maybe[int] = UNSET,
        labels: _Maybe[Mapping[str, str]] = UNSET,
        detail: _Maybe[Mapping[str, Any] | None] = UNSET,
        ts: float | None = None,
    ) -> RunRecord:
        """Set the given fields (``UNSET`` leaves one alone). A finished status sets ``ended_at`` too,
        unless given or already set."""
        now = self._now(ts)
        changes: dict[str, Any] = {}
        if status is not UNSET:
            changes["status"] = RunStatus(status).value
        for column, value in (
            ("pod", pod),
            ("zone", zone),
            ("accelerator_type", accelerator_type),
            ("ended_at", ended_at),
            ("exit_code", exit_code),
            ("restarts", restarts),
            ("preemptions", preemptions),
            ("steps", steps),
        ):
            if value is not UNSET:
                changes[column] = value
        if capacity is not UNSET:
            changes["capacity"] = None if capacity is None else CapacityType(capacity).value
        if labels is not UNSET:
            changes["labels"] = _labels_json(labels)
        if detail is not UNSET:
            changes["detail"] = _json_or_none(detail)
        with self._write() as conn:
            existing = self._get_run(conn, run_id)
            if (
                status is not UNSET
                and RunStatus(status).finished
                and ended_at is UNSET
                and existing.ended_at is None
            ):
                changes["ended_at"] = now
            changes["updated_at"] = now
            # Column names are this method's own (never the caller's): safe to name them in the SQL.
            assignments = ", ".join(f"{c} = :{c}" for c in changes)
            conn.execute(
                f"UPDATE runs SET {assignments} WHERE run_id = :run_id", {**changes, "run_id": run_id}
            )
            return self._get_run(conn, run_id)

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {_RUN_COLS} FROM runs WHERE run_id = :run_id", {"run_id": run_id}
            ).fetchone()
        return None if row is None else _run_record(row)

    def run_ids_around(
        self, fragment: str, *, limit: int = 20, workspaces: Collection[str] | None = None
    ) -> list[str]:
        """Run ids that start or end with ``fragment`` (literally: no wildcards), newest first; only those
        of ``workspaces`` when given (as ``list_runs``)."""
        escaped = fragment.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        params: dict[str, Any] = {"prefix": f"{escaped}%", "suffix": f"%{escaped}", "limit": limit}
        scope = "" if workspaces is None else f"AND {_in_workspaces(workspaces, params)} "
        sql = (
            "SELECT run_id FROM runs WHERE (run_id LIKE :prefix ESCAPE '\\' "
            f"OR run_id LIKE :suffix ESCAPE '\\') {scope}"
            "ORDER BY created_at DESC, run_id LIMIT :limit"
        )
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [str(r[0]) for r in rows]

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        limit: int | None = None,
        workspaces: Collection[str] | None = None,
        principal: str | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first; only those of ``workspaces`` (None: every workspace; a run from before
        workspaces is in ``LOCAL_WORKSPACE``) and of ``principal`` when given."""
        sql = f"SELECT {_RUN_COLS} FROM runs"
        where: list[str] = []
        params: dict[str, Any] = {}
        if status is not None:
            where.append("status = :status")
            params["status"] = RunStatus(status).value
        if workspaces is not None:
            where.append(_in_workspaces(workspaces, params))
        if principal is not None:
            where.append("principal = :principal")
            params["principal"] = principal
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, run_id"
        if limit is not None:
            sql += " LIMIT :limit"
            params["limit"] = int(limit)
        with self._read() as conn:
            return [_run_record(r) for r in conn.execute(sql, params)]

    def add_segment(
        self,
        run_id: str,
        kind: SegmentKind,
        *,
        start: float | None = None,
        pod: str | None = None,
        zone: str | None = None,
        capacity: CapacityType | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> int:
        """Open a segment of ``run_id``; return its id.

        A run's segments are consecutive, so a segment still open is closed at ``start`` in the same
        transaction (close it yourself first to record its step counts).
        """
        begin = self._now(start)
        kind_value = SegmentKind(kind).value
        with self._write() as conn:
            self._get_run(conn, run_id)  # a clear error for an unknown run, not a FOREIGN KEY failure
            conn.execute(
                "UPDATE run_segments SET ended_at = :at WHERE run_id = :run_id AND ended_at IS NULL",
                {"at": begin, "run_id": run_id},
            )
            cur = conn.execute(
                "INSERT INTO run_segments (run_id, kind, started_at, pod, zone, capacity, detail) "
                "VALUES (:run_id, :kind, :at, :pod, :zone, :capacity, :detail) RETURNING id",
                {
                    "run_id": run_id, "kind": kind_value, "at": begin, "pod": pod, "zone": zone,
                    "capacity": None if capacity is None else CapacityType(capacity).value,
                    "detail": _json_or_none(detail),
                },
            )  # fmt: skip
            return int(cur.fetchone()[0])

    def close_segment(
        self,
        segment_id: int,
        *,
        end: float | None = None,
        steps_completed: int | None = None,
        steps_recomputed: int | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> SegmentRecord:
        """Close an open segment (``detail`` and the step counts, when given, replace the segment's)."""
        finish = self._now(end)
        with self._write() as conn:
            row = conn.execute(_SEGMENT_BY_ID, {"id": segment_id}).fetchone()
            if row is None:
                raise LedgerError(f"no run segment with id {segment_id}")
            if row[4] is not None:
                raise LedgerError(f"run segment {segment_id} is already closed (at {row[4]})")
            # Step counts, like detail, keep what update_segment() already set when not given here.
            conn.execute(
                "UPDATE run_segments SET ended_at = :at, "
                "steps_completed = COALESCE(:completed, steps_completed), "
                "steps_recomputed = COALESCE(:recomputed, steps_recomputed), "
                "detail = COALESCE(:detail, detail) WHERE id = :id",
                {
                    "at": finish, "completed": steps_completed, "recomputed": steps_recomputed,
                    "detail": _json_or_none(detail), "id": segment_id,
                },
            )  # fmt: skip
            row = conn.execute(_SEGMENT_BY_ID, {"id": segment_id}).fetchone()
        return _segment_record(row)

    def update_segment(
        self,
        segment_id: int,
        *,
        pod: _Maybe[str | None] = UNSET,
        zone: _Maybe[str | None] = UNSET,
        capacity: _Maybe[CapacityType | None] = UNSET,
        steps_completed: _Maybe[int | None] = UNSET,
        steps_recomputed: _Maybe[int | None] = UNSET,
        detail: _Maybe[Mapping[str, Any] | None] = UNSET,
    ) -> SegmentRecord:
        """Set fields of a segment, open or closed (what was learnt after it was opened: the zone a
        placement chose, the steps a running segment did once its host output is in)."""
        changes: dict[str, Any] = {}
        for column, value in (
            ("pod", pod),
            ("zone", zone),
            ("steps_completed", steps_completed),
            ("steps_recomputed", steps_recomputed),
        ):
            if value is not UNSET:
                changes[column] = value
        if capacity is not UNSET:
            changes["capacity"] = None if capacity is None else CapacityType(capacity).value
        if detail is not UNSET:
            changes["detail"] = _json_or_none(detail)
        with self._write() as conn:
            if changes:
                assignments = ", ".join(f"{c} = :{c}" for c in changes)
                conn.execute(
                    f"UPDATE run_segments SET {assignments} WHERE id = :segment_id",
                    {**changes, "segment_id": segment_id},
                )
            row = conn.execute(_SEGMENT_BY_ID, {"id": segment_id}).fetchone()
        if row is None:
            raise LedgerError(f"no run segment with id {segment_id}")
        return _segment_record(row)

    def segments(self, run_id: str) -> list[SegmentRecord]:
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_SEGMENT_COLS} FROM run_segments WHERE run_id = :run_id ORDER BY started_at, id",
                {"run_id": run_id},
            ).fetchall()
        return [_segment_record(r) for r in rows]

    def _get_run(self, conn: SqlConnection, run_id: str) -> RunRecord:
        row = conn.execute(
            f"SELECT {_RUN_COLS} FROM runs WHERE run_id = :run_id", {"run_id": run_id}
        ).fetchone()
        if row is None:
            raise LedgerError(f"no run {run_id!r} in the ledger", fix="see `tpuctl runs list`")
        return _run_record(row)

    # -- runs as leased records --------------------------------------------------------------------
    #
    # Who may act on a run, and everything a new owner needs to carry it on from any machine. The lease
    # protocol is ``tpuctl.store.leases``; times here are the ledger's clock (``db_now``).

    def db_now(self) -> float:
        """The ledger's clock (the database's, never this process's): what lease expiry is judged by."""
        with self._read() as conn:
            return leases.db_now(conn)

    def claim_lease(self, run_id: str, owner: LeaseOwner, ttl_s: float) -> LeaseClaim:
        """Take the run's lease, in one write transaction: a free or expired lease is taken (generation
        + 1, a new token, expiry now + ``ttl_s`` by the ledger's clock; taking another owner's expired
        lease is a takeover in the history). A live lease held by anyone, ``owner`` included, is refused
        with ``LeaseHeldError`` (exit 9), naming the holder and when its lease expires."""
        with self._lease_write() as conn:
            self._get_run(conn, run_id)
            return leases.claim(conn, run_id, owner, ttl_s)

    def renew_lease(self, claim: LeaseClaim, ttl_s: float) -> LeaseClaim:
        """``claim`` with its expiry moved to now + ``ttl_s`` and the run's cancel request (``cancel``)
        read. ``LeaseLostError`` when the lease is no longer ``claim``'s: its token or generation changed,
        or it expired (expired is lost: another owner may be taking it), the loss in the history."""
        with self._lease_write() as conn:
            renewed = leases.renew(conn, claim, ttl_s)
        if isinstance(renewed, LeaseLostError):
            raise renewed  # after the commit: the loss stays in the history
        return renewed

    def release_lease(self, claim: LeaseClaim) -> bool:
        """Give the lease back (the next claim needs no wait); False when it was no longer ``claim``'s."""
        with self._lease_write() as conn:
            return leases.release(conn, claim)

    def orphans(self, *, limit: int | None = None) -> list[str]:
        """Runs someone must supervise and nobody does: not finished, resumable from the ledger (their
        saved request is here), and their lease never claimed, released or expired by the ledger's
        clock; oldest first, read only. A server's tick does not read them first: it claims them in one
        transaction (``claim_orphans``, the same condition), so nothing is free between pick and claim."""
        sql = (
            "SELECT r.run_id FROM runs AS r LEFT JOIN run_leases AS l ON l.run_id = r.run_id "
            f"WHERE {_RESUMABLE} AND (l.token IS NULL OR l.expires_at <= :now) "
            "ORDER BY r.created_at, r.run_id"
        )
        params: dict[str, Any] = {"request": runstate.REQUEST_BLOB}
        if limit is not None:
            sql += " LIMIT :limit"
            params["limit"] = int(limit)
        with self._read() as conn:
            params["now"] = leases.db_now(conn)
            return [str(r[0]) for r in conn.execute(sql, params)]

    def claim_orphans(
        self, owner: LeaseOwner, ttl_s: float, *, limit: int, excluding: Iterable[str] = ()
    ) -> list[LeaseClaim]:
        """Claim, in one write transaction, up to ``limit`` of the runs ``orphans`` lists (less those in
        ``excluding``), oldest first, for ``owner``: what a server takes up each tick. On PostgreSQL the
        leases others are claiming or renewing at that moment are skipped, not waited for, so servers
        that claim at once take disjoint runs (``leases.claim_orphans``). Each claim is the run's own
        (``claim_lease``'s): a generation of 1 is the run's first ever."""
        if limit <= 0:
            return []
        skip = sorted(set(excluding))
        wanted = _RESUMABLE
        params: dict[str, Any] = {"request": runstate.REQUEST_BLOB}
        if skip:
            params.update({f"skip{i}": run_id for i, run_id in enumerate(skip)})
            wanted += f" AND r.run_id NOT IN ({', '.join(f':skip{i}' for i in range(len(skip)))})"
        with self._lease_write() as conn:
            return leases.claim_orphans(conn, owner, ttl_s, wanted=wanted, params=params, limit=limit)

    def admit_queued(
        self,
        owner: LeaseOwner,
        ttl_s: float,
        *,
        decide: Callable[[queue.QueueSnapshot], queue.QueueDecision],
        limit: int,
    ) -> list[LeaseClaim]:
        """Admit waiting runs and claim them for ``owner``, in one transaction (``tpuctl.store.queue``
        says why two replicas never admit past a limit): the workspaces with waiting runs are locked, the
        queue and what holds chips read, ``decide`` (the server's admission: order, limits, reasons)
        chooses, and each chosen run, up to ``limit``, is claimed and admitted; a run that cannot be
        claimed (a `runs cancel` busy with it) stays waiting. The others' reasons are written."""
        if limit <= 0:
            return []
        blob = runstate.REQUEST_BLOB
        with self._lease_write() as conn:
            names = queue.waiting_workspaces(conn, blob)
            if not names:
                return []
            queue.lock_workspaces(conn, names)
            now = leases.db_now(conn)
            snap = queue.snapshot(
                conn, columns=_RUN_COLS_R, record=_run_record, workspaces=names, request_blob=blob, now=now
            )
            decision = decide(snap)
            waiting = {r.run_id: r for r in snap.waiting}
            claims: list[LeaseClaim] = []
            for run_id in decision.admit:
                if len(claims) >= limit or run_id not in waiting:
                    break
                claim = leases.claim_free(conn, run_id, owner, ttl_s)
                if claim is not None and queue.admit(conn, waiting[run_id], now):
                    claims.append(claim)
            queue.note_reasons(conn, decision.reasons, snap.waiting)
            return claims

    def requeue_run(self, run_id: str, reason: str) -> bool:
        """Put an admitted run that never started back in the server's queue (no quota or capacity at
        Google at its first placement), waiting for ``reason`` with a back-off, its age kept
        (``queue.requeue``); False when it had started or ended. Fenced on a fenced view: only the run's
        supervisor sends it back."""
        with self._write() as conn:
            return queue.requeue(conn, self._get_run(conn, run_id), reason, leases.db_now(conn))

    def lease_of(self, run_id: str) -> LeaseHolder | None:
        """Who holds the run's lease, with the ledger's clock at the read (``expired`` tells whether it
        may be taken); None when it was never claimed or was released."""
        with self._read() as conn:
            return leases.holder(conn, run_id)

    def lease_history(self, run_id: str) -> list[LeaseHistoryRecord]:
        """Every claim, takeover, renewal, loss and release of the run's lease, oldest first."""
        with self._read() as conn:
            return leases.history(conn, run_id)

    def fenced(self, claim: LeaseClaim, *, on_lost: Callable[[LeaseLostError], None] | None = None) -> Ledger:
        """This ledger, with every write fenced by ``claim``: the same connection, reads as they are, and
        each write transaction (``update_run``, ``add_segment``, ``close_segment``, ``update_segment``,
        ``record_event(s)``, ``record_attempt``, the blobs, secrets and the rest) first checks, in that
        transaction, that ``claim`` still holds its run's lease by the ledger's clock. If not, the write
        does nothing, the loss goes to the lease history, and ``LeaseLostError`` is raised: a supervisor
        that hands this view to everything it runs (its session's ledger) cannot write after losing the
        run. ``on_lost`` hears of every such loss (the lease's keeper: its holder then knows the run is
        no longer its own even before a renewal finds out). Closing the view does nothing; close the
        ledger it came from."""
        view = copy.copy(self)
        view._fence = claim
        view._on_lost = on_lost
        view._owns_connection = False
        return view

    @property
    def fence(self) -> LeaseClaim | None:
        """The claim this view's writes are fenced by (None: an unfenced ledger)."""
        return self._fence

    def request_cancel(self, run_id: str, by: str) -> CancelRequest:
        """Ask the run to stop, from any machine and without its lease; its owner sees the request (in
        ``renew_lease``'s result, or ``cancel_requested``) and stops the run. The first request stands."""
        with self._write() as conn:
            self._get_run(conn, run_id)
            return leases.request_cancel(conn, run_id, by)

    def clear_cancel(self, claim: LeaseClaim) -> None:
        """Forget, fenced by ``claim``, the cancel request of its run: a supervisor that resumes the run
        clears one an earlier owner already acted on, so only a cancel asked after the resume stops it."""
        with self._write(claim) as conn:
            leases.clear_cancel(conn, claim.run_id)

    def cancel_requested(self, run_id: str) -> CancelRequest | None:
        with self._read() as conn:
            return leases.cancel_request(conn, run_id)

    # -- servers (``tpuctl.store.servers``) ----------------------------------------------------------

    @property
    def max_replicas(self) -> int:
        """How many `tpuctl server` processes this ledger takes at once (``Database.max_replicas``)."""
        return self._db.max_replicas

    def claim_replica(
        self, owner: LeaseOwner, listen: str, ttl_s: float, *, replacing: frozenset[str] = frozenset()
    ) -> servers.ReplicaRecord:
        """Record ``owner`` as a server using this ledger until now + ``ttl_s`` (renew it with
        ``renew_replica``); expired rows and ``replacing`` (servers the caller proved dead) are removed
        first. ``ReplicaLimitError`` (exit 2, naming the others) when ``max_replicas`` live ones remain."""
        with self._write() as conn:
            return servers.claim(conn, owner, listen, ttl_s, limit=self.max_replicas, replacing=replacing)

    def renew_replica(self, replica_id: str, ttl_s: float) -> bool:
        """False when the server's row is gone or expired: it no longer counts as one of the ledger's."""
        with self._write() as conn:
            return servers.renew(conn, replica_id, ttl_s)

    def release_replica(self, replica_id: str) -> None:
        with self._write() as conn:
            servers.release(conn, replica_id)

    def replicas(self) -> list[servers.ReplicaRecord]:
        """Every server row, live or expired (``expired``), oldest first."""
        with self._read() as conn:
            return servers.replicas(conn)

    def remember_submission(self, key: str, run_id: str, request_sha256: str) -> servers.Submission:
        """The submission an idempotency key names: the first one stored under ``key`` (this one when
        the key is new). Written before the run it names is created."""
        with self._write() as conn:
            return servers.remember_submission(conn, key, run_id, request_sha256)

    def forget_submission(self, key: str, run_id: str) -> None:
        """Drop ``key``'s submission of ``run_id``, whose run could not be recorded."""
        with self._write() as conn:
            servers.forget_submission(conn, key, run_id)

    def submission(self, key: str) -> servers.Submission | None:
        with self._read() as conn:
            return servers.submission(conn, key)

    def record_audit(self, record: audit.AuditRecord) -> None:
        """One row of the audit log (``tpuctl.store.audit``), at the ledger's clock."""
        with self._write() as conn:
            audit.write(conn, record)

    def audit_entries(self, **query: Any) -> list[audit.AuditEntry]:
        """Audit rows newest first (``audit.entries``' filters)."""
        with self._read() as conn:
            return audit.entries(conn, **query)

    def record_intent(
        self,
        claim: LeaseClaim,
        action: IntentAction,
        pod: str,
        zone: str,
        detail: Mapping[str, Any] | None = None,
    ) -> IntentRecord:
        """Record, fenced by ``claim``, that its owner is about to create or delete the slice ``pod`` in
        ``zone``: written before every such cloud request, so a new owner can reconcile what the old one
        may have done, and a supervisor that lost the lease fails here, before it touches the cloud."""
        with self._write(claim) as conn:
            return runstate.record_intent(conn, claim, action, pod, zone, detail)

    def intents(self, run_id: str) -> list[IntentRecord]:
        """The run's recorded slice creates and deletes, oldest first."""
        with self._read() as conn:
            return runstate.intents(conn, run_id)

    def update_run_state(
        self,
        claim: LeaseClaim,
        *,
        phase: _Maybe[str | None] = UNSET,
        attempt: _Maybe[int | None] = UNSET,
        slices: _Maybe[Sequence[SliceRef]] = UNSET,
    ) -> RunState:
        """Set, fenced by ``claim``, the given fields of where the run stands (``UNSET`` keeps one)."""
        changes = {
            k: v for k, v in (("phase", phase), ("attempt", attempt), ("slices", slices)) if v is not UNSET
        }
        with self._write(claim) as conn:
            return runstate.update_run_state(conn, claim, changes)

    def run_state(self, run_id: str) -> RunState | None:
        with self._read() as conn:
            return runstate.run_state(conn, run_id)

    def save_run_request(self, run_id: str, request_json: str) -> BlobRecord:
        """Store the run's saved request (the JSON a supervisor prepares the run again from); text that
        is not JSON is a ``ValueError`` (a bug in the caller), not stored for a later owner to trip on."""
        json.loads(request_json)
        return self._save_blob(run_id, runstate.REQUEST_BLOB, request_json.encode("utf-8"))

    def run_request(self, run_id: str) -> str | None:
        with self._read() as conn:
            data = runstate.blob(conn, run_id, runstate.REQUEST_BLOB)
        return None if data is None else data.decode("utf-8")

    def save_bundle(self, run_id: str, data: bytes) -> BlobRecord:
        """Store the run's bundle (at most ``runstate.MAX_BLOB_BYTES``, else ``BlobTooLargeError``)."""
        return self._save_blob(run_id, runstate.BUNDLE_BLOB, data)

    def bundle(self, run_id: str) -> bytes | None:
        """The run's bundle, checked against its stored SHA-256; None when none was saved."""
        with self._read() as conn:
            return runstate.blob(conn, run_id, runstate.BUNDLE_BLOB)

    def _save_blob(self, run_id: str, name: str, data: bytes) -> BlobRecord:
        with self._write() as conn:
            self._get_run(conn, run_id)
            return runstate.save_blob(conn, run_id, name, data)

    def put_secret(self, run_id: str, name: str, plaintext: bytes, key: SecretKey) -> None:
        """Store the run's secret ``name`` encrypted with ``key`` (the plaintext is never written)."""
        ciphertext = key.encrypt(plaintext)
        with self._write() as conn:
            self._get_run(conn, run_id)
            runstate.put_secret(conn, run_id, name, key.key_id, ciphertext)

    def get_secret(self, run_id: str, name: str, key: SecretKey) -> bytes | None:
        """The run's secret ``name`` decrypted with ``key``; None when it has none. ``SecretKeyError``
        (naming the setting to change) when it was stored with another key."""
        with self._read() as conn:
            found = runstate.secret(conn, run_id, name)
        if found is None:
            return None
        key_id, ciphertext = found
        return key.decrypt(ciphertext, key_id=key_id, what=f"the secret {name!r} of run {run_id}")

    def append_log_lines(
        self, claim: LeaseClaim, worker: int, first_seq: int, lines: Iterable[tuple[float, str]]
    ) -> int:
        """Store host ``worker``'s lines numbered from ``first_seq``, each ``(arrival time, text)``, fenced
        by ``claim``. Idempotent on (run, worker, seq): a line already stored stays as it is, so a new
        owner may re-send from where it is unsure. Returns how many lines were new."""
        with self._write(claim) as conn:
            return runstate.append_log_lines(conn, claim, worker, first_seq, lines)

    def log_lines(
        self, run_id: str, *, worker: int | None = None, after_seq: int = -1, limit: int | None = None
    ) -> list[LogLine]:
        """The run's host lines with ``seq > after_seq``: one worker's in order, or every worker's in the
        order they arrived."""
        with self._read() as conn:
            return runstate.log_lines(conn, run_id, worker=worker, after_seq=after_seq, limit=limit)

    def next_log_seq(self, run_id: str, worker: int) -> int:
        """The seq of ``worker``'s next line: where a new owner appends."""
        with self._read() as conn:
            return runstate.next_log_seq(conn, run_id, worker)

    # -- checks --------------------------------------------------------------------------------------

    def integrity_check(self) -> str:
        """The engine's own checks (SQLite: ``integrity_check`` and ``foreign_key_check``): "ok", or the
        problems, one a line."""
        with self._read():
            problems = self._db.integrity_problems()
        return "\n".join(problems) if problems else "ok"

    def check_view(self) -> list[str]:
        """Replay the whole event log from an empty view and compare with ``pods``; [] when they agree.

        Reads every event: for ``doctor`` and tests, not for every command.
        """
        replayed: dict[int, PodRow] = {}
        latest: dict[tuple[str, str], PodRow] = {}
        next_pod = 1

        def new_pod_id() -> int:
            nonlocal next_pod
            next_pod += 1
            return next_pod - 1

        with self._read() as conn:
            for r in conn.execute(f"SELECT {_EVENT_COLS} FROM events ORDER BY id"):
                ev = Ev(r[1], r[2], r[3], r[4], *r[6:])
                if ev.pod is None or ev.zone is None:
                    continue
                key = (ev.zone, ev.pod)
                row, changed = apply_event(latest.get(key), ev, r[0], new_pod_id)
                if row is not None:
                    latest[key] = row
                    if changed:
                        replayed[row.id] = row
                if r[5] != (None if row is None else row.id):
                    return [
                        f"event {r[0]} points at pod {r[5]}, replay says {None if row is None else row.id}"
                    ]
            stored = {r[0]: r for r in conn.execute(f"SELECT {_POD_COLS} FROM pods")}
            recomputed = conn.execute(schema.rec_check_sql(conn.dialect)).fetchall()
            rollups = [
                (table, keys, conn.execute(stored).fetchall(), conn.execute(check).fetchall())
                for table, keys, stored, check in _rollup_checks(conn.dialect)
            ]
            wrongly_rolled = conn.execute(schema.rolled_check_sql(conn.dialect)).fetchall()
            problems: list[str] = shares_seen.problems(conn)
        for table, keys, rows, derived in rollups:
            problems += _rollup_differences(table, keys, rows, derived)
        problems += [
            f"pod {r[0]}: rolled up as crossing midnight, but it is not such a slice" for r in wrongly_rolled
        ]
        for pod_id, priced, unpriced, want_priced, want_unpriced in recomputed:
            # Triggers keep these; the tolerance is for float sums taken in another order.
            if not (
                math.isclose(priced, want_priced, rel_tol=1e-9, abs_tol=1e-6)
                and math.isclose(unpriced, want_unpriced, rel_tol=1e-9, abs_tol=1e-6)
            ):
                problems.append(
                    f"pod {pod_id}: stored recomputed work ({priced}, {unpriced}), its segments give "
                    f"({want_priced}, {want_unpriced})"
                )
        for pod_id in sorted(stored.keys() | replayed.keys()):
            want = replayed[pod_id].as_tuple() if pod_id in replayed else None
            have = stored.get(pod_id)
            if want != have:
                problems.append(f"pod {pod_id}: view has {have}, replayed log gives {want}")
        return problems

    def _now(self, ts: float | None) -> float:
        return self._clock() if ts is None else float(ts)


def _in_workspaces(workspaces: Collection[str], params: dict[str, Any]) -> str:
    """A condition: the row is in one of ``workspaces`` (NULL counts as ``LOCAL_WORKSPACE``); its
    parameters are added to ``params``."""
    params["local_ws"] = LOCAL_WORKSPACE
    return f"COALESCE(workspace, :local_ws) IN ({in_list('ws', sorted(workspaces), params)})"


def _named(columns: Sequence[str]) -> str:
    """The named parameters of an INSERT of ``columns``: ``:a, :b, ...``."""
    return ", ".join(f":{c}" for c in columns)


def _distinct_claims(*claims: LeaseClaim | None) -> list[LeaseClaim]:
    """The claims a write is fenced by, each once (a fenced view's method given its own claim again)."""
    out: list[LeaseClaim] = []
    for claim in claims:
        if claim is not None and all(claim.token != c.token for c in out):
            out.append(claim)
    return out


def _rollup_checks(dialect: Dialect) -> list[tuple[str, int, str, str]]:
    """(table, number of key columns, its rows, the SQL that recomputes them from ``pods``) of every
    rollup the triggers keep."""
    by_key = [(r.table, len(r.key), r.check_sql(dialect)) for r in (owner_rollup.OWNER, norun_rollup.NORUN)]
    return [
        *((table, keys, f"SELECT * FROM {table}", check) for table, keys, check in (
            *schema.rollup_checks(dialect), *by_key)),
        *((sums.table, 1, sums.stored_sql(), sums.check_sql())
          for sums in (run_waste.WASTE, run_closed_time.CLOSED_TIME)),
    ]  # fmt: skip


def _rollup_differences(
    table: str, keys: int, have: list[tuple[Any, ...]], want: list[tuple[Any, ...]]
) -> list[str]:
    """Rows of a rollup table (``keys`` key columns, then sums) that differ from what ``pods`` gives; sums
    compared with a tolerance, as the triggers add them in another order than a GROUP BY."""
    stored = {r[:keys]: r[keys:] for r in have}
    derived = {r[:keys]: r[keys:] for r in want}
    out = []
    for key in sorted(stored.keys() | derived.keys(), key=repr):
        a, b = stored.get(key), derived.get(key)
        if (
            a is None
            or b is None
            or not all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6) for x, y in zip(a, b, strict=True))
        ):
            out.append(f"{table} {key}: holds {a}, pods give {b}")
    return out


# -- row <-> record helpers ------------------------------------------------------------------------


class _Owners:
    """Whose each event of one write is: what the caller gave (a slice outside any run; a copied row),
    else its run's owner (``run_id``, or the run the slice was made for: a run's rows stay its owner's
    whoever writes them, a replica or another supervisor that took the run over), else its slice's.
    Each run is read once per write; a bulk write over a ledger with no attributed run (an import, a
    benchmark) reads none."""

    def __init__(self, conn: SqlConnection, *, bulk: bool = False) -> None:
        self._conn = conn
        self._runs: dict[str, tuple[str | None, str | None] | None] = {}
        self._any: bool | None = None if bulk else True

    def of_run(self, run_id: str) -> tuple[str | None, str | None] | None:
        """The run's (principal, workspace); None when it has neither (or is not in this ledger)."""
        if run_id in self._runs:
            return self._runs[run_id]
        if self._any is None:
            self._any = bool(
                self._conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM runs WHERE principal IS NOT NULL OR workspace IS NOT NULL)"
                ).fetchone()[0]
            )
        found = None
        if self._any:
            row = self._conn.execute(
                "SELECT principal, workspace FROM runs WHERE run_id = :run_id", {"run_id": run_id}
            ).fetchone()
            if row is not None and (row[0] is not None or row[1] is not None):
                found = (row[0], row[1])
        self._runs[run_id] = found
        return found

    def attribute(self, ev: Ev, cur: PodRow | None) -> Ev:
        """``ev`` with its principal and workspace (as given, the run's, the slice's, or none known)."""
        if ev.principal is not None or ev.workspace is not None:
            return ev
        run_id = ev.run_id if ev.run_id is not None else (None if cur is None else cur.run_id)
        owner = None if run_id is None else self.of_run(run_id)
        if owner is None and cur is not None and (cur.principal is not None or cur.workspace is not None):
            owner = (cur.principal, cur.workspace)
        return ev if owner is None else ev._replace(principal=owner[0], workspace=owner[1])


def _latest_pods(conn: SqlConnection, events: Sequence[Ev]) -> dict[tuple[str, str], PodRow | None]:
    """The latest incarnation of each slice ``events`` name (None: not in the ledger), read by name a
    thousand names a query: one query per slice, as ``_apply`` reads them, is a round trip each on
    PostgreSQL, and most of a replayed chunk's time."""
    found: dict[tuple[str, str], PodRow | None] = {
        (e.zone, e.pod): None for e in events if e.pod is not None and e.zone is not None
    }
    names = sorted({name for _zone, name in found})
    for start in range(0, len(names), 1000):
        params = {f"n{i}": name for i, name in enumerate(names[start : start + 1000])}
        sql = f"SELECT {_POD_COLS} FROM pods WHERE name IN ({_named(list(params))})"
        for r in conn.execute(sql, params):
            row = PodRow.from_tuple(r)
            key = (row.zone, row.name)
            if key in found and ((have := found[key]) is None or row.incarnation > have.incarnation):
                found[key] = row
    return found


def _flush_pods(conn: SqlConnection, dirty: dict[int, PodRow]) -> None:
    # In id order: updates of existing rows (which may close an incarnation) come before the insert of
    # a newer incarnation of the same zone+name, so the "one open incarnation" index never trips.
    conn.executemany(
        _UPSERT_POD, [dict(zip(POD_COLUMNS, dirty[k].as_tuple(), strict=True)) for k in sorted(dirty)]
    )
    dirty.clear()


def _event_row(event_id: int, ev: Ev, row: PodRow | None) -> tuple[Any, ...]:
    if row is None:
        return (
            event_id, ev.ts, ev.kind, ev.pod, ev.zone, None, ev.accelerator_type, ev.chips, ev.capacity,
            ev.price_per_chip_hour, ev.labels, ev.run_id, ev.request_id, ev.detail, ev.hosts,
            ev.queued_resource, ev.slice_index, ev.backend, ev.project, ev.principal, ev.workspace,
        )  # fmt: skip
    # The pod's attributes in force at this moment fill what the caller left out (see EventRecord).
    return (
        event_id, ev.ts, ev.kind, ev.pod, ev.zone, row.id,
        row.accelerator_type if ev.accelerator_type is None else ev.accelerator_type,
        row.chips if ev.chips is None else ev.chips,
        row.capacity if ev.capacity is None else ev.capacity,
        row.price_per_chip_hour if ev.price_per_chip_hour is None else ev.price_per_chip_hour,
        ev.labels,
        row.run_id if ev.run_id is None else ev.run_id,
        row.request_id if ev.request_id is None else ev.request_id,
        ev.detail, ev.hosts, ev.queued_resource, ev.slice_index, ev.backend, ev.project, ev.principal,
        ev.workspace,
    )  # fmt: skip


def _labels_json(labels: Mapping[str, str]) -> str:
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"labels must map str to str, got {key!r}: {value!r}")
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":"))


def _json_or_none(data: Mapping[str, Any] | None) -> str | None:
    # default=str: detail is a log, and a Path or datetime in it should be written, not crash the write.
    return (
        None if data is None else json.dumps(dict(data), sort_keys=True, separators=(",", ":"), default=str)
    )


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _capacity_value(capacity: CapacityType | str) -> str:
    value = _CAPACITY_VALUES.get(capacity)
    if value is None:
        # CapacityType.parse gives the user-facing error (with the valid choices) for a bad string.
        return CapacityType.parse(str(capacity)).value
    return value


def _capacity(value: str | None) -> CapacityType | None:
    return None if value is None else _CAPACITIES[value]


def _event_record(r: tuple[Any, ...]) -> EventRecord:
    return EventRecord(
        r[0], r[1], _KINDS.get(r[2], r[2]), r[3], r[4], r[5], r[6], r[7],
        None if r[8] is None else _CAPACITIES[r[8]], r[9],
        None if r[10] is None else json.loads(r[10]), r[11], r[12],
        None if r[13] is None else json.loads(r[13]), r[14], r[15], r[16], r[17], r[18], r[19], r[20],
    )  # fmt: skip


def _pod_record(r: tuple[Any, ...]) -> PodRecord:
    return PodRecord(
        r[0], r[1], r[2], r[3], PodState(r[4]), r[5], r[6], r[7], _capacity(r[8]), r[9], json.loads(r[10]),
        r[11], r[12], r[13], r[14], r[15], r[16], r[17], r[18], r[19], r[20], r[21], r[22], r[23], r[24],
        r[30], r[31],
    )  # fmt: skip


def _run_record(r: tuple[Any, ...]) -> RunRecord:
    return RunRecord(
        run_id=r[0], script=r[1], args=tuple(json.loads(r[2])), status=_RUN_STATUSES.get(r[3], r[3]),
        pod=r[4], zone=r[5], accelerator_type=r[6], capacity=_capacity(r[7]), created_at=r[8],
        ended_at=r[9], exit_code=r[10], restarts=r[11], preemptions=r[12], steps=r[13],
        labels=json.loads(r[14]), detail=_loads(r[15]), updated_at=r[16], principal=r[17], workspace=r[18],
        priority=r[19], queued_at=r[20], admitted_at=r[21], queue_reason=r[22],
    )  # fmt: skip


def _segment_record(r: tuple[Any, ...]) -> SegmentRecord:
    return SegmentRecord(
        id=r[0], run_id=r[1], kind=_SEGMENT_KINDS.get(r[2], r[2]), start=r[3], end=r[4], pod=r[5],
        zone=r[6], capacity=_capacity(r[7]), steps_completed=r[8], steps_recomputed=r[9],
        detail=_loads(r[10]),
    )  # fmt: skip
