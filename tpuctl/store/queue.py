"""The server's run queue in SQL: what an admission reads and writes, inside the replica's claim
transaction (``Ledger.admit_queued``), on either engine.

A queued run is a ``runs`` row with status ``queued``, ``queued_at`` set and ``admitted_at`` NULL; it waits
for ``queue_reason``. Admission turns it PENDING (or PROVISIONING), sets ``admitted_at`` and clears the
reason, in the same transaction that claims its lease, so a run is never admitted without a supervisor.

Why two replicas never admit past a limit: a limit is a workspace's, so admissions are serialised per
workspace. On PostgreSQL the transaction takes a transaction-scoped advisory lock per workspace with
waiting runs (in name order, so two replicas never wait on each other in a cycle) before it reads what is
in use; a second replica's admission into the same workspace waits for the first to commit, and then (READ
COMMITTED: each statement sees what committed before it) reads the first one's admissions as in use. On
SQLite the transaction is ``BEGIN IMMEDIATE``: one writer at a time already.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from tpuctl.store.records import LOCAL_WORKSPACE, RunRecord, RunStatus
from tpuctl.store.sql import SqlConnection, in_list

#: The statuses of runs that hold their workspace's chips: admitted (or never queued) and not finished.
_HOLDING: Final = ", ".join(f"'{s.value}'" for s in RunStatus if not s.finished and s is not RunStatus.QUEUED)
#: The key of a run's detail that keeps the reason it last waited for, once admitted.
WAITED_FOR: Final = "waited_for"
#: A run sent back to the queue for want of Google quota or capacity: how often (the detail's
#: ``REQUEUES``), and not admitted again before ``RETRY_AT`` (the ledger's clock). Quota and capacity come
#: back on Google's time, not the workspace's: the first retry after 30 s, doubling to 10 minutes.
REQUEUES: Final = "requeues"
RETRY_AT: Final = "queue_retry_at"
REQUEUE_FIRST_S: Final = 30.0
REQUEUE_MAX_S: Final = 600.0
#: The advisory locks' namespace, so a workspace's key never equals the ledger's write lock by design.
_KEY_PREFIX: Final = b"tpuctl-queue-workspace:"


@dataclass(frozen=True)
class QueueEntry:
    """A run entering the queue as it is recorded: whose it is, its band and why it waits."""

    workspace: str
    principal: str | None
    priority: str
    reason: str


@dataclass(frozen=True)
class QueueSnapshot:
    """What an admission decides from, read under the workspaces' locks: the waiting runs (those a
    replica could take up: their request saved), the runs that hold chips in the same workspaces, and the
    ledger's clock."""

    waiting: tuple[RunRecord, ...]
    holding: tuple[RunRecord, ...]
    now: float


@dataclass(frozen=True)
class QueueDecision:
    """The runs to admit, in order, and the reason each other waiting run waits now."""

    admit: tuple[str, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)


def workspace_of(record: RunRecord) -> str:
    """A run's workspace (a row from before workspaces is the local one's)."""
    return record.workspace or LOCAL_WORKSPACE


def waiting_workspaces(conn: SqlConnection, request_blob: str) -> list[str]:
    """The workspaces with runs waiting to be admitted, by name (read before their locks are taken: a
    workspace whose first run arrives just after is admitted into at the next tick)."""
    rows = conn.execute(
        "SELECT DISTINCT COALESCE(r.workspace, :local) FROM runs AS r WHERE r.status = :queued "
        f"AND {_REQUEST_SAVED}",
        {"local": LOCAL_WORKSPACE, "queued": RunStatus.QUEUED.value, "request": request_blob},
    ).fetchall()
    return sorted(str(r[0]) for r in rows)


def lock_workspaces(conn: SqlConnection, names: Iterable[str]) -> None:
    """Serialise admissions into ``names`` until the transaction ends (the module docstring)."""
    if conn.dialect.name == "sqlite":
        return  # BEGIN IMMEDIATE: this transaction is the only writer already
    for name in sorted(set(names)):
        conn.execute("SELECT pg_advisory_xact_lock(:key)", {"key": workspace_lock_key(name)})


def workspace_lock_key(name: str) -> int:
    """The advisory lock key of a workspace: a signed 64-bit number from its name."""
    digest = hashlib.sha256(_KEY_PREFIX + name.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def snapshot(
    conn: SqlConnection,
    *,
    columns: str,
    record: Callable[[tuple[Any, ...]], RunRecord],
    workspaces: list[str],
    request_blob: str,
    now: float,
) -> QueueSnapshot:
    """The waiting and holding runs of ``workspaces`` (``columns`` of ``runs AS r``, made records by
    ``record``)."""
    params: dict[str, Any] = {
        "local": LOCAL_WORKSPACE,
        "queued": RunStatus.QUEUED.value,
        "request": request_blob,
    }
    in_workspaces = f"COALESCE(r.workspace, :local) IN ({in_list('ws', workspaces, params)})"
    waiting = conn.execute(
        f"SELECT {columns} FROM runs AS r WHERE r.status = :queued AND {_REQUEST_SAVED} AND {in_workspaces}",
        params,
    ).fetchall()
    holding = conn.execute(
        f"SELECT {columns} FROM runs AS r WHERE r.status IN ({_HOLDING}) AND {in_workspaces}", params
    ).fetchall()
    return QueueSnapshot(tuple(record(r) for r in waiting), tuple(record(r) for r in holding), now)


def admit(conn: SqlConnection, record: RunRecord, now: float) -> bool:
    """Admit a waiting run: PROVISIONING when it creates its slice, else PENDING (what it was recorded as
    before the queue existed); False when it was no longer waiting."""
    detail = dict(record.detail or {})
    status = RunStatus.PROVISIONING if detail.get("created_pod") else RunStatus.PENDING
    # The reason it waited is kept (the column says why it waits now, so it is cleared): `runs describe`
    # says how long the run waited, and why.
    detail[WAITED_FOR] = record.queue_reason
    cur = conn.execute(
        "UPDATE runs SET status = :status, admitted_at = :now, queue_reason = NULL, updated_at = :now, "
        "detail = :detail WHERE run_id = :run_id AND status = :queued",
        {
            "status": status.value, "now": now, "run_id": record.run_id, "queued": RunStatus.QUEUED.value,
            "detail": json.dumps(detail, sort_keys=True),
        },
    )  # fmt: skip
    return cur.rowcount == 1


def note_reasons(conn: SqlConnection, reasons: dict[str, str], waiting: Iterable[RunRecord]) -> None:
    """Write each waiting run's reason where it changed (a tick that changes nothing writes nothing)."""
    before = {r.run_id: r.queue_reason for r in waiting}
    for run_id, reason in sorted(reasons.items()):
        if run_id in before and before[run_id] != reason:
            conn.execute(
                "UPDATE runs SET queue_reason = :reason WHERE run_id = :run_id AND status = :queued",
                {"reason": reason, "run_id": run_id, "queued": RunStatus.QUEUED.value},
            )


def requeue(conn: SqlConnection, record: RunRecord, reason: str, now: float) -> bool:
    """Put an admitted run that never started back in the queue, waiting for ``reason`` (no quota or
    capacity at Google), not admitted again before its back-off ends (``RETRY_AT`` in its detail: the
    first after ``REQUEUE_FIRST_S``, doubling to ``REQUEUE_MAX_S``); it keeps its ``queued_at`` (its age
    in the order). False when it had started or ended meanwhile."""
    detail = dict(record.detail or {})
    detail.pop("supervisor", None)  # none until it is admitted again
    tries = int(detail.get(REQUEUES, 0) or 0) + 1
    detail[REQUEUES] = tries
    detail[RETRY_AT] = now + min(REQUEUE_FIRST_S * 2 ** (tries - 1), REQUEUE_MAX_S)
    cur = conn.execute(
        "UPDATE runs SET status = :queued, admitted_at = NULL, queue_reason = :reason, updated_at = :now, "
        "detail = :detail, queued_at = COALESCE(queued_at, created_at) WHERE run_id = :run_id "
        "AND status IN (:pending, :provisioning)",
        {
            "queued": RunStatus.QUEUED.value, "reason": reason, "now": now, "run_id": record.run_id,
            "detail": json.dumps(detail, sort_keys=True), "pending": RunStatus.PENDING.value,
            "provisioning": RunStatus.PROVISIONING.value,
        },
    )  # fmt: skip
    return cur.rowcount == 1


_REQUEST_SAVED: Final = (
    "EXISTS (SELECT 1 FROM run_blobs AS b WHERE b.run_id = r.run_id AND b.name = :request)"
)
