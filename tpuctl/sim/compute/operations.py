"""Compute Engine operations: zonal (``zones/Z``), regional (``regions/R``) and global. A mutation
answers one, not DONE while its work takes time (world durations). A failed one ends DONE with
``httpErrorStatusCode`` AND ``httpErrorMessage`` and ``error.errors[]``: without both HTTP fields the
client library takes it for a success (docs/google-facts.md#compute-engine-client)."""

from __future__ import annotations

import json
import secrets
import sqlite3
from typing import Any

from tpuctl.sim.compute import links
from tpuctl.sim.compute.errors import not_found

#: The account operations name as their user (Compute writes the caller's email).
USER = "tpuctl-sim-user@tpuctl-sim.iam.gserviceaccount.com"


def insert_op(
    conn: sqlite3.Connection,
    project: str,
    location: str,
    operation_type: str,
    target_link: str,
    target_id: str | None,
    now: float,
    *,
    done_at: float | None = None,
    error: dict[str, Any] | None = None,
    status_message: str | None = None,
) -> str:
    """A new operation at ``location`` (``zones/Z``, ``regions/R`` or ``global``); with ``done_at`` it
    completes on its own then (with ``error`` if given). Returns its reference, ``<location>/operations/
    <name>``, which ``finish_op`` and ``op_json_of`` take."""
    name = f"operation-{int(now * 1000)}-{secrets.token_hex(6)}-{secrets.token_hex(4)}-{secrets.token_hex(4)}"
    conn.execute(
        "INSERT INTO compute_operations (project, location, name, id, operation_type, target_link, "
        "target_id, insert_time, done_at, error, status_message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            project,
            location,
            name,
            links.resource_id("operation", project, location, name),
            operation_type,
            target_link,
            target_id,
            now,
            done_at,
            json.dumps(error) if error is not None else None,
            status_message,
        ),
    )
    return f"{location}/operations/{name}"


def _split(ref: str) -> tuple[str, str]:
    location, _, name = ref.rpartition("/operations/")
    return location, name


def finish_op(
    conn: sqlite3.Connection, project: str, ref: str, at: float, *, error: dict[str, Any] | None = None
) -> None:
    """Complete a running operation at ``at`` (with ``error``, or as stored)."""
    location, name = _split(ref)
    conn.execute(
        "UPDATE compute_operations SET end_time = ?, done_at = NULL, error = COALESCE(?, error) "
        "WHERE project = ? AND location = ? AND name = ? AND end_time IS NULL",
        (at, json.dumps(error) if error is not None else None, project, location, name),
    )


def finish_due(conn: sqlite3.Connection, now: float) -> None:
    conn.execute(
        "UPDATE compute_operations SET end_time = done_at, done_at = NULL "
        "WHERE end_time IS NULL AND done_at <= ?",
        (now,),
    )


def any_due(conn: sqlite3.Connection, now: float) -> bool:
    row = conn.execute(
        "SELECT 1 FROM compute_operations WHERE end_time IS NULL AND done_at <= ? LIMIT 1", (now,)
    ).fetchone()
    return row is not None


def op_row(conn: sqlite3.Connection, project: str, location: str, name: str) -> sqlite3.Row:
    row: sqlite3.Row | None = conn.execute(
        "SELECT * FROM compute_operations WHERE project = ? AND location = ? AND name = ?",
        (project, location, name),
    ).fetchone()
    if row is None:
        raise not_found(links.path(project, location, "operations", name))
    return row


def op_json_of(conn: sqlite3.Connection, project: str, ref: str) -> dict[str, Any]:
    return op_json(op_row(conn, project, *_split(ref)))


def op_json(row: sqlite3.Row) -> dict[str, Any]:
    """An operation row as Compute's Operation."""
    project, location = row["project"], row["location"]
    done = row["end_time"] is not None
    out: dict[str, Any] = {
        "kind": "compute#operation",
        "id": row["id"],
        "name": row["name"],
        "operationType": row["operation_type"],
        "targetLink": row["target_link"],
        "status": "DONE" if done else "RUNNING",
        "user": USER,
        "progress": 100 if done else 0,
        "insertTime": links.timestamp(float(row["insert_time"])),
        "startTime": links.timestamp(float(row["insert_time"])),
        "selfLink": links.link(project, location, "operations", row["name"]),
    }
    if row["target_id"]:
        out["targetId"] = row["target_id"]
    kind, _, where = location.partition("/")
    if kind == "zones":
        out["zone"] = links.zone_link(project, where)
    elif kind == "regions":
        out["region"] = links.region_link(project, where)
    if row["status_message"]:
        out["statusMessage"] = row["status_message"]
    if done:
        out["endTime"] = links.timestamp(float(row["end_time"]))
        if row["error"]:
            error = json.loads(row["error"])
            out["httpErrorStatusCode"], out["httpErrorMessage"] = error["http"]
            out["error"] = {"errors": error["errors"]}
    return out
