"""Long-running operations: each mutation of the TPU API answers one, done at once or when the
transition it started completes (``complete_op``), and GET/List/Delete on them."""

from __future__ import annotations

import json
import secrets
import sqlite3
from typing import TYPE_CHECKING, Any, cast

from tpuctl.sim.api_errors import not_found
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.records import rows_in
from tpuctl.sim.shapes import split_op_name
from tpuctl.sim.wire import NODE_OPERATION_METADATA_TYPE, check_zone, paginate, rfc3339

if TYPE_CHECKING:
    from tpuctl.sim.engine.timeline import Timeline


def insert_op(
    conn: sqlite3.Connection,
    project: str,
    zone: str,
    target: str,
    verb: str,
    now: float,
    *,
    due_at: float | None = None,
    error: dict[str, Any] | None = None,
) -> str:
    """A new operation on ``target``; with ``due_at`` it fails on its own then (with ``error``)."""
    op_id = f"operation-{int(now * 1000)}-{secrets.token_hex(6)}"
    conn.execute(
        "INSERT INTO operations (project, zone, op_id, target, verb, create_time, due_at, error) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (project, zone, op_id, target, verb, now, due_at, json.dumps(error) if error else None),
    )
    return f"projects/{project}/locations/{zone}/operations/{op_id}"


def complete_op(
    conn: sqlite3.Connection,
    op_name: str,
    at: float,
    *,
    response: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> None:
    project, zone, op_id = split_op_name(op_name)
    conn.execute(
        "UPDATE operations SET done = 1, end_time = ?, due_at = NULL, response = ?, error = ? "
        "WHERE project = ? AND zone = ? AND op_id = ? AND done = 0",
        (
            at,
            json.dumps(response) if response is not None else None,
            json.dumps(error) if error is not None else None,
            project,
            zone,
            op_id,
        ),
    )


def op_row(conn: sqlite3.Connection, op_name: str) -> sqlite3.Row:
    project, zone, op_id = split_op_name(op_name)
    row = conn.execute(
        "SELECT * FROM operations WHERE project = ? AND zone = ? AND op_id = ?", (project, zone, op_id)
    ).fetchone()
    if row is None:
        raise not_found(op_name)
    return cast(sqlite3.Row, row)


def op_json(row: sqlite3.Row) -> dict[str, Any]:
    """An operation row as google.longrunning.Operation."""
    name = f"projects/{row['project']}/locations/{row['zone']}/operations/{row['op_id']}"
    metadata: dict[str, Any] = {
        "@type": NODE_OPERATION_METADATA_TYPE,
        "createTime": rfc3339(float(row["create_time"])),
        "target": row["target"],
        "verb": row["verb"],
        "statusDetail": "",
        "cancelRequested": False,
        "apiVersion": "v2",
    }
    done = bool(row["done"])
    if done and row["end_time"] is not None:
        metadata["endTime"] = rfc3339(float(row["end_time"]))
    out: dict[str, Any] = {"name": name, "metadata": metadata, "done": done}
    if done:
        if row["error"]:
            out["error"] = json.loads(row["error"])
        elif row["response"]:
            out["response"] = json.loads(row["response"])
    return out


def answered_op(conn: sqlite3.Connection, op_name: str) -> dict[str, Any]:
    """The operation named ``op_name``, as a mutation answers it."""
    return op_json(op_row(conn, op_name))


def remember_request(conn: sqlite3.Connection, project: str, request_id: str, op_name: str) -> None:
    """Record the operation a requestId got, so a retry of the request answers it again."""
    conn.execute(
        "INSERT OR IGNORE INTO request_ids (project, request_id, op_name) VALUES (?, ?, ?)",
        (project, request_id, op_name),
    )


def op_for_request(conn: sqlite3.Connection, project: str, request_id: str) -> dict[str, Any] | None:
    """The operation an earlier request with this requestId got, if any."""
    row = conn.execute(
        "SELECT op_name FROM request_ids WHERE project = ? AND request_id = ?", (project, request_id)
    ).fetchone()
    return answered_op(conn, row["op_name"]) if row is not None else None


class Operations:
    """The operations surface of the TPU API."""

    def __init__(self, ctx: Context, timeline: Timeline) -> None:
        self.ctx = ctx
        self.timeline = timeline

    def for_request(self, project: str, request_id: str) -> dict[str, Any] | None:
        """The operation an earlier request with this requestId got (a retried mutation), if any."""
        with self.ctx.db.read() as conn:
            return op_for_request(conn, project, request_id)

    def get(self, project: str, zone: str, op_id: str) -> dict[str, Any]:
        check_zone(zone)
        self.timeline.advance()
        with self.ctx.db.read() as conn:
            return answered_op(conn, f"projects/{project}/locations/{zone}/operations/{op_id}")

    def list(self, project: str, zone: str, page_size: int = 0, page_token: str = "") -> dict[str, Any]:
        check_zone(zone, allow_all=True)
        self.timeline.advance()
        with self.ctx.db.read() as conn:
            rows = rows_in(conn, "operations", project, zone, "create_time, op_id")
            ops = [op_json(r) for r in rows]
        page, token = paginate(ops, page_size, page_token)
        out: dict[str, Any] = {"operations": page}
        if token:
            out["nextPageToken"] = token
        return out

    def delete(self, project: str, zone: str, op_id: str) -> dict[str, Any]:
        check_zone(zone)
        name = f"projects/{project}/locations/{zone}/operations/{op_id}"
        with self.ctx.db.write() as conn:
            op_row(conn, name)
            conn.execute(
                "DELETE FROM operations WHERE project = ? AND zone = ? AND op_id = ?", (project, zone, op_id)
            )
        return {}
