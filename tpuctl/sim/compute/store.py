"""The rows of ``compute_resources``: find, write and delete them."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

INSTANCES = "instances"
MIGS = "instanceGroupManagers"
TEMPLATES = "instanceTemplates"
POLICIES = "resourcePolicies"


def instance_node_id(name: str) -> str:
    """The node row of a lone instance's slice (TPU API node ids have no '/': no clash)."""
    return f"{INSTANCES}/{name}"


def mig_node_id(name: str) -> str:
    return f"{MIGS}/{name}"


def row(
    conn: sqlite3.Connection, project: str, location: str, collection: str, name: str
) -> sqlite3.Row | None:
    found: sqlite3.Row | None = conn.execute(
        "SELECT * FROM compute_resources WHERE project = ? AND location = ? AND collection = ? AND name = ?",
        (project, location, collection, name),
    ).fetchone()
    return found


def rows(conn: sqlite3.Connection, project: str, location: str | None, collection: str) -> list[sqlite3.Row]:
    """A collection's rows at ``location`` (None: everywhere), by location then name."""
    if location is None:
        return conn.execute(
            "SELECT * FROM compute_resources WHERE project = ? AND collection = ? ORDER BY location, name",
            (project, collection),
        ).fetchall()
    return conn.execute(
        "SELECT * FROM compute_resources WHERE project = ? AND location = ? AND collection = ? ORDER BY name",
        (project, location, collection),
    ).fetchall()


def insert(
    conn: sqlite3.Connection,
    project: str,
    location: str,
    collection: str,
    name: str,
    rid: str,
    now: float,
    body: dict[str, Any],
    **columns: Any,
) -> None:
    values = {
        "body": json.dumps(body),
        **{k: (json.dumps(v) if k == "extra" else v) for k, v in columns.items()},
    }
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    conn.execute(
        f"INSERT INTO compute_resources (project, location, collection, name, id, creation_time, {names}) "
        f"VALUES (?, ?, ?, ?, ?, ?, {marks})",
        (project, location, collection, name, rid, now, *values.values()),
    )


def update(conn: sqlite3.Connection, found: sqlite3.Row, **columns: Any) -> None:
    values = {k: (json.dumps(v) if k in ("extra", "body") else v) for k, v in columns.items()}
    sets = ", ".join(f"{k} = ?" for k in values)
    conn.execute(
        f"UPDATE compute_resources SET {sets} "
        "WHERE project = ? AND location = ? AND collection = ? AND name = ?",
        (*values.values(), found["project"], found["location"], found["collection"], found["name"]),
    )


def delete(conn: sqlite3.Connection, found: sqlite3.Row) -> None:
    conn.execute(
        "DELETE FROM compute_resources WHERE project = ? AND location = ? AND collection = ? AND name = ?",
        (found["project"], found["location"], found["collection"], found["name"]),
    )


def body(found: sqlite3.Row) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(found["body"])
    return out


def extra(found: sqlite3.Row) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(found["extra"] or "{}")
    return out


def zone_of(found: sqlite3.Row) -> str:
    return str(found["location"]).removeprefix("zones/")


def node_of(conn: sqlite3.Connection, found: sqlite3.Row) -> sqlite3.Row | None:
    """The node row of an instance's (or a MIG's) slice, if placed and not gone."""
    if not found["node_id"]:
        return None
    node: sqlite3.Row | None = conn.execute(
        "SELECT * FROM nodes WHERE project = ? AND zone = ? AND node_id = ?",
        (found["project"], zone_of(found), found["node_id"]),
    ).fetchone()
    return node
