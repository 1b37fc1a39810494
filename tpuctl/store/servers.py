"""The ledger's record of `tpuctl server` processes (replicas) and of the submissions they took.

Replicas: one row per live server (``server_replicas``), claimed at start, renewed by the server while
it lives and deleted when it stops. A row whose expiry passed by the ledger's clock belongs to a server
that died or lost the ledger; the next claim removes it. How many replicas an engine takes is the
engine's to say (``max_replicas`` of the ledger): an embedded file ledger has one writer machine and
one replica, so the guard lives here, in the ledger, not in a pid file beside it.

Submissions: a client's ``Idempotency-Key`` mapped to the run it created (``run_submissions``), written
before the run is, so a retry of the same submission, however late, finds the first run and never
creates a second. The request's digest is kept with it: the same key with another request is refused.

The SQL is plain (``ON CONFLICT DO NOTHING``, ``DELETE ... WHERE``); "now" is always the ledger's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuctl.errors import UsageError
from tpuctl.store.leases import check_ttl, db_now
from tpuctl.store.records import LeaseOwner
from tpuctl.store.sql import SqlConnection
from tpuctl.timefmt import iso

_REPLICA_COLS = "replica_id, host, pid, start_ticks, listen, started_at, renewed_at, expires_at"


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """One server process using the ledger. ``now`` is the ledger's clock at the read."""

    owner: LeaseOwner  # owner_id is the replica's id
    listen: str
    started_at: float
    renewed_at: float
    expires_at: float
    now: float

    @property
    def expired(self) -> bool:
        return self.expires_at <= self.now

    def describe(self) -> str:
        return f"pid {self.owner.pid} on host {self.owner.host}, listening on {self.listen}"


@dataclass(frozen=True, slots=True)
class Submission:
    """The run a client's idempotency key created (or is creating)."""

    key: str
    run_id: str
    request_sha256: str
    submitted_at: float


class ReplicaLimitError(UsageError):
    """The ledger already has as many live servers as its engine takes (exit 2, naming them)."""

    kind = "server_running"

    def __init__(self, others: list[ReplicaRecord], limit: int) -> None:
        first = others[0]
        super().__init__(
            f"another tpuctl server uses this ledger ({first.describe()}; its claim runs until "
            f"{iso(first.expires_at)}), and this ledger takes {limit} server at a time",
            field="--database",
            fix="stop the other server first, or point this one at another ledger with --database "
            "(an embedded SQLite ledger serves one server; its claim ends when it stops, or at its expiry "
            "if it was killed)",
        )
        self.others = others


def claim(
    conn: SqlConnection,
    owner: LeaseOwner,
    listen: str,
    ttl_s: float,
    *,
    limit: int,
    replacing: frozenset[str] = frozenset(),
) -> ReplicaRecord:
    """Add ``owner``'s row, after removing the expired rows and those in ``replacing`` (servers the
    caller proved dead); ``ReplicaLimitError`` when ``limit`` live others remain. The caller holds the
    write transaction."""
    ttl = check_ttl(ttl_s)
    now = db_now(conn)
    conn.execute("DELETE FROM server_replicas WHERE expires_at <= :now", {"now": now})
    for replica_id in replacing:
        conn.execute("DELETE FROM server_replicas WHERE replica_id = :id", {"id": replica_id})
    others = _rows(conn, now)
    if len(others) >= limit:
        raise ReplicaLimitError(others, limit)
    conn.execute(
        f"INSERT INTO server_replicas ({_REPLICA_COLS}) "
        "VALUES (:id, :host, :pid, :ticks, :listen, :now, :now, :expires_at)",
        {
            "id": owner.owner_id,
            "host": owner.host,
            "pid": owner.pid,
            "ticks": owner.start_ticks,
            "listen": listen,
            "now": now,
            "expires_at": now + ttl,
        },
    )
    return ReplicaRecord(owner, listen, now, now, now + ttl, now)


def renew(conn: SqlConnection, replica_id: str, ttl_s: float) -> bool:
    """Push the replica's expiry to now + ``ttl_s``; False when its row is gone or expired (another
    server may have taken its place: it must stop acting)."""
    now = db_now(conn)
    cur = conn.execute(
        "UPDATE server_replicas SET renewed_at = :now, expires_at = :expires_at "
        "WHERE replica_id = :id AND expires_at > :now",
        {"now": now, "expires_at": now + check_ttl(ttl_s), "id": replica_id},
    )
    return cur.rowcount == 1


def release(conn: SqlConnection, replica_id: str) -> None:
    conn.execute("DELETE FROM server_replicas WHERE replica_id = :id", {"id": replica_id})


def replicas(conn: SqlConnection) -> list[ReplicaRecord]:
    """Every server row, live or expired, oldest first."""
    return _rows(conn, db_now(conn), live_only=False)


def _rows(conn: SqlConnection, now: float, *, live_only: bool = True) -> list[ReplicaRecord]:
    where = " WHERE expires_at > :now" if live_only else ""
    params = {"now": now} if live_only else {}
    rows = conn.execute(
        f"SELECT {_REPLICA_COLS} FROM server_replicas{where} ORDER BY started_at", params
    ).fetchall()
    return [ReplicaRecord(LeaseOwner(r[0], r[1], r[2], r[3]), r[4], r[5], r[6], r[7], now) for r in rows]


def remember_submission(conn: SqlConnection, key: str, run_id: str, request_sha256: str) -> Submission:
    """The submission under ``key``: the one stored first (``run_id`` and the digest given here are
    stored only when the key is new)."""
    conn.execute(
        "INSERT INTO run_submissions (idempotency_key, run_id, request_sha256, submitted_at) "
        "VALUES (:key, :run_id, :sha, :at) ON CONFLICT (idempotency_key) DO NOTHING",
        {"key": key, "run_id": run_id, "sha": request_sha256, "at": db_now(conn)},
    )
    found = submission(conn, key)
    assert found is not None
    return found


def forget_submission(conn: SqlConnection, key: str, run_id: str) -> None:
    """Drop ``key``'s submission of ``run_id`` (its run could not be recorded: a retry may try again)."""
    conn.execute(
        "DELETE FROM run_submissions WHERE idempotency_key = :key AND run_id = :run_id",
        {"key": key, "run_id": run_id},
    )


def submission(conn: SqlConnection, key: str) -> Submission | None:
    row = conn.execute(
        "SELECT idempotency_key, run_id, request_sha256, submitted_at FROM run_submissions "
        "WHERE idempotency_key = :key",
        {"key": key},
    ).fetchone()
    return None if row is None else Submission(row[0], row[1], row[2], row[3])
