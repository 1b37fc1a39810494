"""Who deleted each slice, and how: the simulator's deletion log (table ``deletions``, admin
``GET /sim/v1/deletions``).

A slice goes one of two ways that a caller asks for, and the log says which:

- ``api``: a ``DELETE`` of a TPU API node or of a Compute Engine instance or MIG, by the caller (tpuctl's
  own credentials: the simulated Application Default Credentials) or by a host's service account: the
  request carries the account's own token, which a simulated host's metadata server hands out
  (``tpuctl.sim.iam``), and which is how a run's backstop deadman deletes its slice. The API's guard has
  refused a token the simulator never issued (401) and a caller without the delete permission (403)
  before the delete gets here. The request's ``X-Goog-Request-Reason`` (Google's system parameter for
  the audit log) is kept as the reason;
- ``scheduled termination``: Compute Engine ended an instance at its ``terminationTime`` or after its
  ``maxRunDuration`` (``tpuctl.sim.compute.progress``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuctl.sim import iam
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.exchange import SimRequest

API = "api"
SCHEDULED = "scheduled termination"
REASON_HEADER = "x-goog-request-reason"


@dataclass(frozen=True)
class Caller:
    """Who sent a request: tpuctl's own credentials, or an account's own token (a host's service account,
    ``principal``)."""

    principal: str
    host_token: bool


def caller_of(engine: SimEngine, request: SimRequest) -> Caller:
    """The caller of a delete the API's guard let through (so its token is one the simulator issued)."""
    token = iam.bearer_token(request.headers)
    email = iam.account_of(engine.world, token)
    if token == iam.ADC_TOKEN or email is None:
        return Caller("the caller (tpuctl's credentials)", host_token=False)
    return Caller(f"{email} (a host's token)", host_token=True)


def note(
    conn: sqlite3.Connection,
    *,
    at: float,
    project: str,
    zone: str,
    name: str,
    resource: str,
    path: str,
    principal: str | None = None,
    reason: str | None = None,
) -> None:
    """Add one deletion to the log (in the caller's transaction)."""
    conn.execute(
        "INSERT INTO deletions (at, project, zone, name, resource, path, principal, reason) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (at, project, zone, name, resource, path, principal, reason),
    )


def note_api_delete(
    engine: SimEngine,
    request: SimRequest,
    caller: Caller,
    *,
    project: str,
    zone: str,
    name: str,
    resource: str,
) -> None:
    """An API delete the engine accepted."""
    with engine.db.write() as conn:
        note(
            conn,
            at=engine.clock(),
            project=project,
            zone=zone,
            name=name,
            resource=resource,
            path=API,
            principal=caller.principal,
            reason=request.headers.get(REASON_HEADER),
        )


def log(engine: SimEngine) -> dict[str, Any]:
    """The admin API's answer: every deletion, oldest first."""
    with engine.db.read() as conn:
        rows = conn.execute("SELECT * FROM deletions ORDER BY at, rowid").fetchall()
    return {"deletions": [dict(row) for row in rows]}


def delete_answer(
    engine: SimEngine,
    request: SimRequest,
    delete: Any,
    *,
    project: str,
    zone: str,
    name: str,
    resource: str,
) -> Mapping[str, Any]:
    """``delete()``'s answer, the deletion logged once accepted with who asked."""
    caller = caller_of(engine, request)
    answer: Mapping[str, Any] = delete()
    note_api_delete(engine, request, caller, project=project, zone=zone, name=name, resource=resource)
    return answer
