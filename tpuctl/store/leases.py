"""The lease on a run: who may act on it, judged by the ledger's own clock, and the fence every write of
run state passes. The one module a change of database engine re-implements for leases.

The protocol (what ``Ledger.claim_lease`` and friends run, each inside one write transaction). Claims,
renewals and releases run in row-locked transactions: on PostgreSQL they lock the lease row instead of
the ledger's write lock, so servers claim and renew side by side; every other write, fenced ones
included, still takes the write lock. Why that stays correct: docs/architecture.md, "Claims on
PostgreSQL". Each locks the row first and reads the clock after, so a transaction that waited for a lock
judges expiry as of when it holds the row.

* **claim**: a run's lease is free (no row, or released) or expired (``expires_at <= now``) or held. A free
  or expired one is taken with a new random token and ``generation + 1``; a held one is refused with
  ``LeaseHeldError`` naming the holder and when its lease expires. The row is locked ``FOR UPDATE SKIP
  LOCKED`` (``claim``, ``claim_orphans``: what to do with a row another transaction holds). The write is
  a conditional upsert (``ON CONFLICT ... DO UPDATE ... WHERE`` the old lease is free or expired), which
  also settles two claimers inserting a never-claimed run's first row at once.
* **renew**: pushes ``expires_at`` to ``now + ttl`` only where token, generation and an unexpired lease
  all still match; anything else is a loss. Expired means lost even if nobody took it yet: another owner
  may be claiming it at this moment, and "cannot tell" never counts as "still mine".
* **fence**: the first statement of every fenced write transaction locks the lease row for share and
  checks token, generation and ``expires_at > now``. A match: the write goes on, and no claim can commit
  until it does (a claim locks for update). No match: the loss is appended to the history and committed
  alone, and the caller gets ``LeaseLostError``: nothing of its write happened.
* **release**: clears token and owner where token and generation match (the generation stays, so the
  next claim's is still higher).

"Now" is always the database's clock (``db_now``: ``Dialect.now_epoch``), read once per transaction,
never a caller's: two machines with skewed clocks still agree on whether a lease expired. (On SQLite the
database's clock is the clock of the machine the file is on, the only one its writers share.) Every
claim, takeover, loss and release is appended to ``run_lease_history`` with that time, the owner and
the generation (a claim's consecutive renewals are one row, moved on with each); the token never is.

The SQL here is plain (upsert, RETURNING, NOT EXISTS) with named parameters, as both engines take it
(``tpuctl.store.sql``); only the clock and the row locks come from the connection's dialect.
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
from collections.abc import Mapping
from typing import Any, Final

from tpuctl.errors import LeaseHeldError, LeaseLostError
from tpuctl.store.records import (
    CancelRequest,
    LeaseAction,
    LeaseClaim,
    LeaseHistoryRecord,
    LeaseHolder,
    LeaseOwner,
    LedgerError,
)
from tpuctl.store.sql import RowLock, SqlConnection
from tpuctl.timefmt import iso

_LEASE_COLS: Final = (
    "run_id, generation, token, owner_id, host, pid, start_ticks, claimed_at, renewed_at, expires_at"
)
_HISTORY_COLS: Final = (
    "id, run_id, at, action, generation, owner_id, host, pid, start_ticks, expires_at, detail"
)

_CLAIM_SQL: Final = f"""INSERT INTO run_leases ({_LEASE_COLS})
    VALUES (:run_id, 1, :token, :owner_id, :host, :pid, :start_ticks, :now, :now, :expires_at)
    ON CONFLICT (run_id) DO UPDATE SET generation = run_leases.generation + 1, token = excluded.token,
        owner_id = excluded.owner_id, host = excluded.host, pid = excluded.pid,
        start_ticks = excluded.start_ticks, claimed_at = excluded.claimed_at,
        renewed_at = excluded.renewed_at, expires_at = excluded.expires_at
    WHERE run_leases.token IS NULL OR run_leases.expires_at <= :now
    RETURNING generation"""
_MATCHES: Final = "run_id = :run_id AND token = :token AND generation = :generation"
_ACTIONS: Final[dict[str, LeaseAction]] = {a.value: a for a in LeaseAction}


@dataclasses.dataclass(frozen=True, slots=True)
class _LeaseRow:
    run_id: str
    generation: int
    token: str | None
    owner: LeaseOwner | None
    claimed_at: float | None
    renewed_at: float | None
    expires_at: float | None


def db_now(conn: SqlConnection) -> float:
    """The database's clock now, in epoch seconds (``Dialect.now_epoch``)."""
    return float(conn.execute(f"SELECT {conn.dialect.now_epoch}").fetchone()[0])


def check_ttl(ttl_s: float) -> float:
    if not (math.isfinite(ttl_s) and ttl_s > 0):
        raise ValueError(f"a lease's ttl must be a finite number of seconds > 0, got {ttl_s!r}")
    return float(ttl_s)


def claim(conn: SqlConnection, run_id: str, owner: LeaseOwner, ttl_s: float) -> LeaseClaim:
    """Take the run's lease if it is free or expired; ``LeaseHeldError`` if another holds it live. The
    caller holds a (row-locked) write transaction and has checked that the run exists.

    The lease row is locked first, skipping it if another transaction has it: then a live lease (its
    holder renewing it or writing under it) is refused at once, never waited for; a free or expired one
    that someone else is claiming, releasing or losing right now is waited for (a few statements) so the
    answer names whoever took it."""
    ttl = check_ttl(ttl_s)
    before = _locked(conn, run_id, "update", skip_locked=True)
    if before is None and (committed := _row(conn, run_id)) is not None:  # locked by another
        now = db_now(conn)
        if committed.owner is not None and _live(committed, now):
            raise _held(committed, committed.owner, now)
        before = _locked(conn, run_id, "update")
    now = db_now(conn)
    if before is not None and before.owner is not None and _live(before, now):
        raise _held(before, before.owner, now)
    return _take(conn, run_id, owner, ttl, before, now)


def claim_orphans(
    conn: SqlConnection,
    owner: LeaseOwner,
    ttl_s: float,
    *,
    wanted: str,
    params: Mapping[str, Any],
    limit: int,
) -> list[LeaseClaim]:
    """Claim up to ``limit`` of the runs that ``wanted`` (a condition on ``runs AS r``, with ``params``)
    selects and nobody holds, oldest first, in the caller's row-locked write transaction.

    A lease another transaction has locked is skipped, not waited for (``SKIP LOCKED``), so two
    replicas claiming at once take disjoint runs and neither waits on the other's. A run never claimed
    has no lease row to lock: its first claim inserts one, and of two claimers inserting at once the
    second waits for the first to commit and then finds it held, and skips it."""
    ttl = check_ttl(ttl_s)
    lock = conn.dialect.row_lock("update", of="l", skip_locked=True)
    order = " ORDER BY r.created_at, r.run_id LIMIT :limit"
    both = {**params, "now": db_now(conn), "limit": int(limit)}
    expired = conn.execute(
        "SELECT r.created_at, r.run_id FROM run_leases AS l JOIN runs AS r ON r.run_id = l.run_id "
        f"WHERE ({wanted}) AND (l.token IS NULL OR l.expires_at <= :now){order}{lock}",
        both,
    ).fetchall()
    never = conn.execute(
        f"SELECT r.created_at, r.run_id FROM runs AS r WHERE ({wanted}) AND NOT EXISTS "
        f"(SELECT 1 FROM run_leases AS l WHERE l.run_id = r.run_id){order}",
        both,
    ).fetchall()
    claims: list[LeaseClaim] = []
    for _created, run_id in sorted(expired + never)[: max(int(limit), 0)]:
        now = db_now(conn)  # after the lock: later than the check, so what was expired still is
        try:
            claims.append(_take(conn, run_id, owner, ttl, _row(conn, run_id), now))
        except (LeaseHeldError, LedgerError):
            continue  # a never-claimed run another claimer inserted first: theirs
    return claims


def claim_free(conn: SqlConnection, run_id: str, owner: LeaseOwner, ttl_s: float) -> LeaseClaim | None:
    """Take the run's lease if it is free or expired and nobody else is busy with it; None otherwise
    (another transaction has the row locked, or a live lease: a `runs cancel` cleaning a queued run up).
    What an admission claims with, in its own transaction: a run it cannot claim it does not admit."""
    ttl = check_ttl(ttl_s)
    before = _locked(conn, run_id, "update", skip_locked=True)
    if before is None and _row(conn, run_id) is not None:
        return None  # locked by another transaction
    now = db_now(conn)
    if before is not None and before.owner is not None and _live(before, now):
        return None
    try:
        return _take(conn, run_id, owner, ttl, before, now)
    except (LeaseHeldError, LedgerError):
        return None  # a first claim another claimer inserted first


def _take(
    conn: SqlConnection, run_id: str, owner: LeaseOwner, ttl: float, before: _LeaseRow | None, now: float
) -> LeaseClaim:
    """Write the claim of a lease judged free or expired at ``now`` (its row, ``before``, locked by this
    transaction, or not there yet), with its history entry."""
    token = secrets.token_hex(16)
    expires_at = now + ttl
    returned = conn.execute(
        _CLAIM_SQL,
        {
            "run_id": run_id, "token": token, "owner_id": owner.owner_id, "host": owner.host,
            "pid": owner.pid, "start_ticks": owner.start_ticks, "now": now, "expires_at": expires_at,
        },
    ).fetchall()  # fmt: skip
    if not returned:  # no row to lock yet, and another claimer's insert committed first
        after = _row(conn, run_id)
        if after is None or after.owner is None:
            raise LedgerError(f"run {run_id}'s lease changed while it was being claimed", fix="try again")
        raise _held(after, after.owner, now)
    generation = int(returned[0][0])
    action, detail = LeaseAction.CLAIM, None
    if before is not None and before.owner is not None and before.owner.owner_id != owner.owner_id:
        action = LeaseAction.TAKEOVER
        detail = {
            "previous_owner": dataclasses.asdict(before.owner),
            "previous_generation": before.generation,
            "previous_expired_at": before.expires_at,
        }
    _append(conn, run_id, now, action, owner, generation, expires_at, detail)
    return LeaseClaim(run_id, owner, token, generation, expires_at, cancel_request(conn, run_id))


def renew(conn: SqlConnection, held: LeaseClaim, ttl_s: float) -> LeaseClaim | LeaseLostError:
    """``held`` with its expiry pushed to now + ``ttl_s`` (and the run's cancel request read), or the
    loss (already appended to the history) when the lease is no longer ``held``'s."""
    ttl = check_ttl(ttl_s)
    _locked(conn, held.run_id, "update")  # waits out a write fenced by it, or a claim in progress
    now = db_now(conn)
    expires_at = now + ttl
    cur = conn.execute(
        f"UPDATE run_leases SET renewed_at = :now, expires_at = :expires_at WHERE {_MATCHES} "
        "AND expires_at > :now",
        {"now": now, "expires_at": expires_at, **_matching(held)},
    )
    if cur.rowcount != 1:
        return lost(conn, held, now, during="renewal")
    _note_renewal(conn, held, now, expires_at)
    return dataclasses.replace(held, expires_at=expires_at, cancel=cancel_request(conn, held.run_id))


def _note_renewal(conn: SqlConnection, held: LeaseClaim, now: float, expires_at: float) -> None:
    """A renewal in the history: the claim's renewals since its last other entry are one row, moved to
    the latest one's time and expiry and counting them (``detail["renewals"]``). A run renewed every 15 s
    for days keeps a history of its claims, not tens of thousands of rows that `runs describe` reads."""
    last = conn.execute(
        "SELECT id, action, owner_id, generation, detail FROM run_lease_history WHERE run_id = :run_id "
        "ORDER BY id DESC LIMIT 1",
        {"run_id": held.run_id},
    ).fetchone()
    if last is not None and (last[1], last[2], last[3]) == (
        LeaseAction.RENEW.value,
        held.owner.owner_id,
        held.generation,
    ):
        count = int(json.loads(last[4] or "{}").get("renewals", 1)) + 1
        conn.execute(
            "UPDATE run_lease_history SET at = :at, expires_at = :expires_at, detail = :detail "
            "WHERE id = :id",
            {"at": now, "expires_at": expires_at, "detail": _json({"renewals": count}), "id": last[0]},
        )
        return
    detail = {"renewals": 1}
    _append(conn, held.run_id, now, LeaseAction.RENEW, held.owner, held.generation, expires_at, detail)


def fence(conn: SqlConnection, held: LeaseClaim, *, during: str = "write") -> LeaseLostError | None:
    """The fence of a write transaction, its first statement: None while ``held`` still holds the lease,
    else the loss, already appended to the history; the caller then commits only that and raises it.

    The lease row is locked for share first and judged after, by the clock read then: no claim can
    take the lease from the check until the write commits (a claimer skips the row, or waits for it),
    and a check that waited for a claim in progress judges what that claim left."""
    row = _locked(conn, held.run_id, "share")
    now = db_now(conn)
    holds = row is not None and (row.token, row.generation) == (held.token, held.generation)
    return None if holds and row is not None and _live(row, now) else lost(conn, held, now, during=during)


def release(conn: SqlConnection, held: LeaseClaim) -> bool:
    """Give the lease back; False (and nothing written) when it was no longer ``held``'s."""
    _locked(conn, held.run_id, "update")
    now = db_now(conn)
    cur = conn.execute(
        "UPDATE run_leases SET token = NULL, owner_id = NULL, host = NULL, pid = NULL, start_ticks = NULL, "
        f"claimed_at = NULL, renewed_at = NULL, expires_at = NULL WHERE {_MATCHES}",
        _matching(held),
    )
    if cur.rowcount != 1:
        return False
    _append(conn, held.run_id, now, LeaseAction.RELEASE, held.owner, held.generation, None, None)
    return True


def holder(conn: SqlConnection, run_id: str) -> LeaseHolder | None:
    """Who holds the run's lease (also after it expired, until someone takes or releases it); None when
    it was never claimed or was released."""
    row = _row(conn, run_id)
    if row is None or row.owner is None:
        return None
    assert row.claimed_at is not None and row.renewed_at is not None and row.expires_at is not None
    return LeaseHolder(
        run_id, row.owner, row.generation, row.claimed_at, row.renewed_at, row.expires_at, db_now(conn)
    )


def history(conn: SqlConnection, run_id: str) -> list[LeaseHistoryRecord]:
    rows = conn.execute(
        f"SELECT {_HISTORY_COLS} FROM run_lease_history WHERE run_id = :run_id ORDER BY id",
        {"run_id": run_id},
    ).fetchall()
    return [_history_record(r) for r in rows]


def _history_record(r: tuple[Any, ...]) -> LeaseHistoryRecord:
    return LeaseHistoryRecord(
        id=r[0],
        run_id=r[1],
        at=r[2],
        action=_ACTIONS.get(r[3], r[3]),
        generation=r[4],
        owner=LeaseOwner(r[5], r[6], r[7], r[8]),
        expires_at=r[9],
        detail=None if r[10] is None else json.loads(r[10]),
    )


def request_cancel(conn: SqlConnection, run_id: str, by: str) -> CancelRequest:
    """Record that ``by`` asks the run to stop (needs no lease: any machine may ask); the first request
    stands, a repeat returns it."""
    now = db_now(conn)
    conn.execute(
        "INSERT INTO run_cancel_requests (run_id, requested_at, requested_by) VALUES (:run_id, :at, :by) "
        "ON CONFLICT (run_id) DO NOTHING",
        {"run_id": run_id, "at": now, "by": by},
    )
    found = cancel_request(conn, run_id)
    assert found is not None
    return found


def clear_cancel(conn: SqlConnection, run_id: str) -> None:
    """Forget the run's cancel request (the caller's write is fenced: only the lease's holder clears)."""
    conn.execute("DELETE FROM run_cancel_requests WHERE run_id = :run_id", {"run_id": run_id})


def cancel_request(conn: SqlConnection, run_id: str) -> CancelRequest | None:
    row = conn.execute(
        "SELECT requested_at, requested_by FROM run_cancel_requests WHERE run_id = :run_id",
        {"run_id": run_id},
    ).fetchone()
    return None if row is None else CancelRequest(run_id, float(row[0]), str(row[1]))


def lost(conn: SqlConnection, held: LeaseClaim, now: float, *, during: str) -> LeaseLostError:
    """Why ``held`` no longer holds the lease, appended to the history once per claim (a supervisor that
    keeps trying adds no more rows), as the error its holder gets."""
    row = _row(conn, held.run_id)
    reason = _why_lost(row, held, now)
    conn.execute(
        "INSERT INTO run_lease_history (run_id, at, action, generation, owner_id, host, pid, start_ticks, "
        "expires_at, detail) SELECT :run_id, :at, :action, :generation, :owner_id, :host, :pid, "
        ":start_ticks, NULL, :detail WHERE NOT EXISTS (SELECT 1 FROM run_lease_history "
        "WHERE run_id = :run_id AND action = :action AND owner_id = :owner_id AND generation = :generation)",
        {
            "run_id": held.run_id, "at": now, "action": LeaseAction.LOST.value, "generation": held.generation,
            "owner_id": held.owner.owner_id, "host": held.owner.host, "pid": held.owner.pid,
            "start_ticks": held.owner.start_ticks, "detail": _json({"during": during, "reason": reason}),
        },
    )  # fmt: skip
    return LeaseLostError(
        f"the lease on run {held.run_id} (generation {held.generation}) is no longer this supervisor's: "
        f"{reason}. The {during} was not recorded; this supervisor stops acting on the run",
        run_id=held.run_id,
        generation=held.generation,
        fix=f"nothing to do if another supervisor carries the run on; `tpuctl runs describe {held.run_id}` "
        "shows who owns it",
    )


def _why_lost(row: _LeaseRow | None, held: LeaseClaim, now: float) -> str:
    if row is None:
        return "the run has no lease"
    if row.owner is None or row.expires_at is None:
        return "it was released"
    if row.generation != held.generation:
        return f"{row.owner.describe()} claimed it since (generation {row.generation})"
    if row.token != held.token:
        return "its token was changed by someone else"
    return f"it expired at {iso(row.expires_at)}, {now - row.expires_at:.1f} s ago by the ledger's clock"


def _row(conn: SqlConnection, run_id: str) -> _LeaseRow | None:
    r = conn.execute(
        f"SELECT {_LEASE_COLS} FROM run_leases WHERE run_id = :run_id", {"run_id": run_id}
    ).fetchone()
    return None if r is None else _lease_row(r)


def _lease_row(r: tuple[Any, ...]) -> _LeaseRow:
    owner = None if r[3] is None else LeaseOwner(r[3], r[4], r[5], r[6])
    return _LeaseRow(r[0], r[1], r[2], owner, r[7], r[8], r[9])


def _locked(
    conn: SqlConnection, run_id: str, strength: RowLock, *, skip_locked: bool = False
) -> _LeaseRow | None:
    """The run's lease row, locked until the transaction ends (``Dialect.row_lock``); None when there is
    none, or (``skip_locked``) when another transaction has it locked."""
    lock = conn.dialect.row_lock(strength, skip_locked=skip_locked)
    r = conn.execute(
        f"SELECT {_LEASE_COLS} FROM run_leases WHERE run_id = :run_id{lock}", {"run_id": run_id}
    ).fetchone()
    return None if r is None else _lease_row(r)


def _live(row: _LeaseRow, now: float) -> bool:
    return row.expires_at is not None and row.expires_at > now


def _held(row: _LeaseRow, owner: LeaseOwner, now: float) -> LeaseHeldError:
    assert row.expires_at is not None  # an owned lease has an expiry (the table's CHECK)
    return LeaseHeldError(
        run_id=row.run_id,
        owner_id=owner.owner_id,
        host=owner.host,
        pid=owner.pid,
        generation=row.generation,
        expires_at=row.expires_at,
        now=now,
    )


def _append(
    conn: SqlConnection,
    run_id: str,
    at: float,
    action: LeaseAction,
    owner: LeaseOwner,
    generation: int,
    expires_at: float | None,
    detail: dict[str, Any] | None,
) -> None:
    conn.execute(
        "INSERT INTO run_lease_history (run_id, at, action, generation, owner_id, host, pid, start_ticks, "
        "expires_at, detail) VALUES (:run_id, :at, :action, :generation, :owner_id, :host, :pid, "
        ":start_ticks, :expires_at, :detail)",
        {
            "run_id": run_id, "at": at, "action": action.value, "generation": generation,
            "owner_id": owner.owner_id, "host": owner.host, "pid": owner.pid,
            "start_ticks": owner.start_ticks, "expires_at": expires_at,
            "detail": None if detail is None else _json(detail),
        },
    )  # fmt: skip


def _matching(held: LeaseClaim) -> dict[str, Any]:
    """The parameters of ``_MATCHES``: the lease is still ``held``'s."""
    return {"run_id": held.run_id, "token": held.token, "generation": held.generation}


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))
