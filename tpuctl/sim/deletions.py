"""Who deleted each slice, and how: the simulator's deletion log (table ``deletions``, admin
``GET /sim/v1/deletions``).

A slice goes one of two ways that a caller asks for, and the log says which:

- ``api``: a ``DELETE`` of a TPU API node or of a Compute Engine instance or MIG, by the caller (tpuctl's
  own credentials: no token on the simulator) or by a host's service account: the request carries the
  token a simulated host's metadata server hands out (``metadata_values.FAKE_TOKEN``), which is how a
  run's backstop deadman deletes its slice. A bearer token the simulator never issued is refused with
  Google's 401, as Google refuses it. The request's ``X-Goog-Request-Reason`` (Google's system parameter
  for the audit log) is kept as the reason;
- ``scheduled termination``: Compute Engine ended an instance at its ``terminationTime`` or after its
  ``maxRunDuration`` (``tpuctl.sim.compute.progress``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuctl.sim.api_errors import ApiError
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.engine.metadata_values import FAKE_TOKEN
from tpuctl.sim.exchange import SimRequest

API = "api"
SCHEDULED = "scheduled termination"
REASON_HEADER = "x-goog-request-reason"
#: Google's 401 for a token it does not accept.
_INVALID_CREDENTIALS = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
    "valid authentication credential."
)


@dataclass(frozen=True)
class Caller:
    """Who sent a request: tpuctl's own credentials, or a host's service account (``principal``)."""

    principal: str
    host_token: bool


def caller_of(request: SimRequest, project: str, *, compute: bool = False) -> Caller:
    """The caller of a delete; 401 for a bearer token the simulator did not issue."""
    value = request.headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    if not value:
        return Caller("the caller (tpuctl's credentials)", host_token=False)
    if scheme.lower() == "bearer" and token.strip() == FAKE_TOKEN:
        return Caller(f"{project}-compute@developer.gserviceaccount.com (a host's token)", host_token=True)
    if compute:
        from tpuctl.sim.compute.errors import ComputeError

        raise ComputeError(401, _INVALID_CREDENTIALS, "authError")
    raise ApiError(401, "UNAUTHENTICATED", _INVALID_CREDENTIALS)


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
    compute: bool = False,
) -> Mapping[str, Any]:
    """``delete()``'s answer, the caller checked first and the deletion logged once accepted."""
    caller = caller_of(request, project, compute=compute)
    answer: Mapping[str, Any] = delete()
    note_api_delete(engine, request, caller, project=project, zone=zone, name=name, resource=resource)
    return answer
