"""What a new owner of a run needs from the ledger, on any machine: the slice creates and deletes the old
owner intended, the run's phase, attempt and slices, its saved request and bundle, its secrets (only
encrypted) and its hosts' log lines.

Functions over a connection inside a transaction the ``Ledger`` opened (fenced by the caller's lease where
the ``Ledger`` method says so). Times are the ledger's clock (``leases.db_now``), as the lease's are.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from tpuctl.store import leases
from tpuctl.store.records import (
    BlobRecord,
    BlobTooLargeError,
    IntentAction,
    IntentRecord,
    LeaseClaim,
    LedgerError,
    LogLine,
    RunState,
    SliceRef,
)
from tpuctl.store.sql import SqlConnection

#: The most one blob (a run's bundle, its saved request) may hold in the ledger. A blob is read whole
#: into memory and written in one transaction that holds the write lock, and every supervisor of a team
#: reads it from a shared database: the default bundle limit (``tpuctl run --max-bundle-mb 64``).
MAX_BLOB_BYTES: Final = 64 * 1024 * 1024

#: The names of the blobs every run may have.
REQUEST_BLOB: Final = "request.json"
BUNDLE_BLOB: Final = "bundle"

_INTENT_COLS: Final = "id, run_id, at, action, pod, zone, generation, owner_id, detail"
_INTENT_ACTIONS: Final = {a.value: a for a in IntentAction}


def record_intent(
    conn: SqlConnection,
    claim: LeaseClaim,
    action: IntentAction,
    pod: str,
    zone: str,
    detail: Mapping[str, Any] | None,
) -> IntentRecord:
    now = leases.db_now(conn)
    row = conn.execute(
        "INSERT INTO run_intents (run_id, at, action, pod, zone, generation, owner_id, detail) "
        "VALUES (:run_id, :at, :action, :pod, :zone, :generation, :owner_id, :detail) "
        f"RETURNING {_INTENT_COLS}",
        {
            "run_id": claim.run_id, "at": now, "action": IntentAction(action).value, "pod": pod, "zone": zone,
            "generation": claim.generation, "owner_id": claim.owner.owner_id,
            "detail": None if detail is None else _json(detail),
        },
    ).fetchone()  # fmt: skip
    return _intent_record(row)


def intents(conn: SqlConnection, run_id: str) -> list[IntentRecord]:
    rows = conn.execute(
        f"SELECT {_INTENT_COLS} FROM run_intents WHERE run_id = :run_id ORDER BY id", {"run_id": run_id}
    ).fetchall()
    return [_intent_record(r) for r in rows]


def _intent_record(r: tuple[Any, ...]) -> IntentRecord:
    return IntentRecord(
        id=r[0],
        run_id=r[1],
        at=r[2],
        action=_INTENT_ACTIONS.get(r[3], r[3]),
        pod=r[4],
        zone=r[5],
        generation=r[6],
        owner_id=r[7],
        detail=None if r[8] is None else json.loads(r[8]),
    )


def update_run_state(
    conn: SqlConnection,
    claim: LeaseClaim,
    changes: Mapping[str, Any],
) -> RunState:
    """Set the given fields of the run's state (``phase``, ``attempt``, ``slices``), keeping the others."""
    now = leases.db_now(conn)
    current = run_state(conn, claim.run_id)
    phase = changes.get("phase", None if current is None else current.phase)
    attempt = changes.get("attempt", None if current is None else current.attempt)
    slices: tuple[SliceRef, ...] = (
        tuple(changes["slices"]) if "slices" in changes else (() if current is None else current.slices)
    )
    conn.execute(
        "INSERT INTO run_state (run_id, phase, attempt, slices, generation, updated_at) "
        "VALUES (:run_id, :phase, :attempt, :slices, :generation, :at) "
        "ON CONFLICT (run_id) DO UPDATE SET phase = excluded.phase, "
        "attempt = excluded.attempt, slices = excluded.slices, generation = excluded.generation, "
        "updated_at = excluded.updated_at",
        {
            "run_id": claim.run_id,
            "phase": phase,
            "attempt": attempt,
            "slices": _slices_json(slices),
            "generation": claim.generation,
            "at": now,
        },
    )
    return RunState(claim.run_id, phase, attempt, slices, claim.generation, now)


def run_state(conn: SqlConnection, run_id: str) -> RunState | None:
    row = conn.execute(
        "SELECT phase, attempt, slices, generation, updated_at FROM run_state WHERE run_id = :run_id",
        {"run_id": run_id},
    ).fetchone()
    if row is None:
        return None
    slices = tuple(SliceRef(str(s["name"]), str(s["zone"])) for s in json.loads(row[2]))
    return RunState(run_id, row[0], row[1], slices, row[3], row[4])


def save_blob(conn: SqlConnection, run_id: str, name: str, data: bytes) -> BlobRecord:
    if len(data) > MAX_BLOB_BYTES:
        raise BlobTooLargeError(
            f"the {name} of run {run_id} is {_mib(len(data))}, more than the {_mib(MAX_BLOB_BYTES)} the "
            "ledger stores per item (MAX_BLOB_BYTES)",
            field=name,
            value=len(data),
            fix="make it smaller: leave data sets and environments out of the run's directory "
            "(.tpuctlignore) and read them from a bucket",
        )
    now = leases.db_now(conn)
    digest = hashlib.sha256(data).hexdigest()
    conn.execute(
        "INSERT INTO run_blobs (run_id, name, sha256, size, data, saved_at) "
        "VALUES (:run_id, :name, :sha256, :size, :data, :at) "
        "ON CONFLICT (run_id, name) DO UPDATE SET sha256 = excluded.sha256, size = excluded.size, "
        "data = excluded.data, saved_at = excluded.saved_at",
        {"run_id": run_id, "name": name, "sha256": digest, "size": len(data), "data": bytes(data), "at": now},
    )
    return BlobRecord(run_id, name, digest, len(data), now)


def blob(conn: SqlConnection, run_id: str, name: str) -> bytes | None:
    """The blob's bytes, checked against the SHA-256 saved with them; None when the run has none."""
    row = conn.execute(
        "SELECT sha256, data FROM run_blobs WHERE run_id = :run_id AND name = :name",
        {"run_id": run_id, "name": name},
    ).fetchone()
    if row is None:
        return None
    data = bytes(row[1])
    if hashlib.sha256(data).hexdigest() != row[0]:
        raise LedgerError(
            f"the {name} of run {run_id} in the ledger does not match its SHA-256 (the stored bytes changed)",
            fix="save it again (start the run again with `tpuctl run`)",
        )
    return data


def put_secret(conn: SqlConnection, run_id: str, name: str, key_id: str, ciphertext: bytes) -> None:
    now = leases.db_now(conn)
    conn.execute(
        "INSERT INTO run_secrets (run_id, name, key_id, ciphertext, saved_at) "
        "VALUES (:run_id, :name, :key_id, :ciphertext, :at) "
        "ON CONFLICT (run_id, name) DO UPDATE SET key_id = excluded.key_id, "
        "ciphertext = excluded.ciphertext, saved_at = excluded.saved_at",
        {"run_id": run_id, "name": name, "key_id": key_id, "ciphertext": ciphertext, "at": now},
    )


def secret(conn: SqlConnection, run_id: str, name: str) -> tuple[str, bytes] | None:
    """The key id and the ciphertext of the run's secret ``name``; None when it has none."""
    row = conn.execute(
        "SELECT key_id, ciphertext FROM run_secrets WHERE run_id = :run_id AND name = :name",
        {"run_id": run_id, "name": name},
    ).fetchone()
    return None if row is None else (str(row[0]), bytes(row[1]))


def append_log_lines(
    conn: SqlConnection,
    claim: LeaseClaim,
    worker: int,
    first_seq: int,
    lines: Iterable[tuple[float, str]],
) -> int:
    """Add lines ``first_seq``, ``first_seq + 1``, ... of ``worker``; a line whose (run, worker, seq) is
    already there is left as it is (a new owner re-sending what the old one stored). Returns how many
    were new."""
    if worker < 0 or first_seq < 0:
        raise ValueError(f"worker and first_seq must be >= 0, got {worker!r} and {first_seq!r}")
    rows = [
        {"run_id": claim.run_id, "worker": worker, "seq": first_seq + i, "at": float(at), "text": text}
        for i, (at, text) in enumerate(lines)
    ]
    if not rows:
        return 0
    # The rows inserted: a conflict that did nothing is not counted.
    return conn.executemany(
        "INSERT INTO run_log_lines (run_id, worker, seq, at, text) "
        "VALUES (:run_id, :worker, :seq, :at, :text) ON CONFLICT (run_id, worker, seq) DO NOTHING",
        rows,
    )


def log_lines(
    conn: SqlConnection,
    run_id: str,
    *,
    worker: int | None,
    after_seq: int,
    limit: int | None,
) -> list[LogLine]:
    where = ["run_id = :run_id", "seq > :after_seq"]
    params: dict[str, Any] = {"run_id": run_id, "after_seq": after_seq}
    if worker is not None:
        where.append("worker = :worker")
        params["worker"] = worker
    # One worker: in its own order. All: as they arrived, a worker's own order within one instant.
    order = "seq" if worker is not None else "at, worker, seq"
    sql = f"SELECT worker, seq, at, text FROM run_log_lines WHERE {' AND '.join(where)} ORDER BY {order}"
    if limit is not None:
        sql += " LIMIT :limit"
        params["limit"] = int(limit)
    return [LogLine(r[0], r[1], r[2], r[3]) for r in conn.execute(sql, params)]


def next_log_seq(conn: SqlConnection, run_id: str, worker: int) -> int:
    """Where ``worker``'s next line goes: one past the last stored (0 for none)."""
    row = conn.execute(
        "SELECT MAX(seq) FROM run_log_lines WHERE run_id = :run_id AND worker = :worker",
        {"run_id": run_id, "worker": worker},
    ).fetchone()
    return 0 if row[0] is None else int(row[0]) + 1


def _slices_json(slices: Sequence[SliceRef]) -> str:
    return json.dumps([{"name": s.name, "zone": s.zone} for s in slices], separators=(",", ":"))


def _json(data: Mapping[str, Any]) -> str:
    # default=str: detail is a log; a Path in it should be written, not fail the write.
    return json.dumps(dict(data), sort_keys=True, separators=(",", ":"), default=str)


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"
