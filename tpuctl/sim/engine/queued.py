"""Queued resources: create (idempotent per requestId), get, list, delete (with force) and reset.

A queued resource waits in the queue until all of its nodes fit; ``Timeline`` moves it through its
states (ACCEPTED, WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE, SUSPENDING, SUSPENDED, FAILED).
"""

from __future__ import annotations

import json
import signal
import sqlite3
from typing import Any

from tpuctl.sim.api_errors import already_exists, failed_precondition, not_found
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.hosts import VmOrder, host_signals, send
from tpuctl.sim.engine.nodes import start_delete
from tpuctl.sim.engine.operations import (
    Operations,
    answered_op,
    complete_op,
    insert_op,
    op_for_request,
    remember_request,
)
from tpuctl.sim.engine.plans import QueuedPlan, parse_queued_resource
from tpuctl.sim.engine.records import delete_node_rows, existing_qr_row, node_row, qr_json, qr_row, rows_in
from tpuctl.sim.engine.timeline import Timeline
from tpuctl.sim.shapes import node_name, qr_name, validity_window
from tpuctl.sim.wire import EMPTY_TYPE, QUEUED_RESOURCE_TYPE, check_resource_id, check_zone, paginate


class QueuedResources:
    """The queued-resources surface of the TPU API."""

    def __init__(self, ctx: Context, timeline: Timeline, operations: Operations) -> None:
        self.ctx = ctx
        self.timeline = timeline
        self.operations = operations

    def create(
        self, project: str, zone: str, qr_id: str, body: dict[str, Any], request_id: str = ""
    ) -> dict[str, Any]:
        check_zone(zone)
        check_resource_id(qr_id, "queuedResourceId")
        now = self.ctx.clock()
        self.timeline.advance(now)
        if request_id:
            replay = self.operations.for_request(project, request_id)
            if replay is not None:
                return replay
        world = self.ctx.world
        request = parse_queued_resource(self.ctx.catalog, world, project, zone, qr_id, body)
        window = validity_window(request.spec.get("queueingPolicy"), now, world)
        with self.ctx.db.write() as conn:
            if request_id:
                # Another process may have answered the same request since the look above.
                replay = op_for_request(conn, project, request_id)
                if replay is not None:
                    return replay
            if qr_row(conn, project, zone, qr_id) is not None:
                raise already_exists(qr_name(project, zone, qr_id))
            for plan in request.plans:
                if node_row(conn, project, zone, plan.node_id) is not None:
                    raise already_exists(node_name(project, zone, plan.node_id))
            _insert(conn, project, zone, qr_id, request, now, window)
            op_name = insert_op(conn, project, zone, qr_name(project, zone, qr_id), "create", now)
            qr = qr_json(existing_qr_row(conn, project, zone, qr_id))
            # The create itself completes at once; provisioning is the queued resource's own state.
            complete_op(conn, op_name, now, response={"@type": QUEUED_RESOURCE_TYPE, **qr})
            if request_id:
                remember_request(conn, project, request_id, op_name)
            self.timeline.queue_now(conn, world, project, zone, qr_id, now)
            return answered_op(conn, op_name)

    def get(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        check_zone(zone)
        self.timeline.advance()
        with self.ctx.db.read() as conn:
            row = qr_row(conn, project, zone, qr_id)
            if row is None:
                raise not_found(qr_name(project, zone, qr_id))
            return qr_json(row)

    def list(self, project: str, zone: str, page_size: int = 0, page_token: str = "") -> dict[str, Any]:
        check_zone(zone, allow_all=True)
        self.timeline.advance()
        with self.ctx.db.read() as conn:
            items = [qr_json(r) for r in rows_in(conn, "queued_resources", project, zone, "qr_id")]
        page, token = paginate(items, page_size, page_token)
        out: dict[str, Any] = {"queuedResources": page, "unreachable": []}
        if token:
            out["nextPageToken"] = token
        return out

    def delete(
        self, project: str, zone: str, qr_id: str, *, force: bool = False, request_id: str = ""
    ) -> dict[str, Any]:
        check_zone(zone)
        now = self.ctx.clock()
        self.timeline.advance(now)
        if request_id:
            replay = self.operations.for_request(project, request_id)
            if replay is not None:
                return replay
        world = self.ctx.world
        name = qr_name(project, zone, qr_id)
        with self.ctx.db.write() as conn:
            row = qr_row(conn, project, zone, qr_id)
            if row is None:
                raise not_found(name)
            if row["state"] == "DELETING" and row["op_name"]:
                return answered_op(conn, row["op_name"])
            nodes = conn.execute(
                "SELECT * FROM nodes WHERE project = ? AND zone = ? AND queued_resource = ?",
                (project, zone, qr_id),
            ).fetchall()
            if not force and nodes and row["state"] not in ("ACCEPTED", "FAILED", "SUSPENDED"):
                raise failed_precondition(
                    f"Queued resource '{name}' is {row['state']} and its nodes still exist; delete its nodes "
                    "first, or delete it with force=true to delete them too."
                )
            op_name = insert_op(conn, project, zone, name, "delete", now)
            for node in nodes:
                if node["state"] != "DELETING":
                    start_delete(conn, world, node, now)
            if nodes:
                # Gone once its nodes are (Timeline completes the operation then).
                conn.execute(
                    "UPDATE queued_resources SET state = 'DELETING', state_initiator = 'USER', op_name = ? "
                    "WHERE project = ? AND zone = ? AND qr_id = ?",
                    (op_name, project, zone, qr_id),
                )
            else:
                conn.execute(
                    "DELETE FROM queued_resources WHERE project = ? AND zone = ? AND qr_id = ?",
                    (project, zone, qr_id),
                )
                complete_op(conn, op_name, now, response={"@type": EMPTY_TYPE})
            if request_id:
                remember_request(conn, project, request_id, op_name)
            op = answered_op(conn, op_name)
        self.timeline.advance()
        return op

    def reset(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        """Put a SUSPENDED or FAILED queued resource back in the queue (its leftover nodes go away)."""
        check_zone(zone)
        now = self.ctx.clock()
        self.timeline.advance(now)
        world = self.ctx.world
        orders: list[VmOrder] = []
        name = qr_name(project, zone, qr_id)
        with self.ctx.db.write() as conn:
            row = qr_row(conn, project, zone, qr_id)
            if row is None:
                raise not_found(name)
            if row["state"] not in ("SUSPENDED", "FAILED"):
                raise failed_precondition(
                    f"Queued resource '{name}' is {row['state']}; only a SUSPENDED or FAILED queued resource "
                    "can be reset."
                )
            for node in conn.execute(
                "SELECT node_id FROM nodes WHERE project = ? AND zone = ? AND queued_resource = ?",
                (project, zone, qr_id),
            ).fetchall():
                orders.extend(host_signals(conn, project, zone, node["node_id"], signal.SIGKILL, wipe=True))
                delete_node_rows(conn, (project, zone, node["node_id"]))
            valid_after, valid_until = validity_window(
                json.loads(row["spec"]).get("queueingPolicy"), now, world
            )
            conn.execute(
                "UPDATE queued_resources SET state = 'ACCEPTED', state_initiator = 'USER', error = NULL, "
                "valid_after = ?, valid_until = ? WHERE project = ? AND zone = ? AND qr_id = ?",
                (valid_after, valid_until, project, zone, qr_id),
            )
            op_name = insert_op(conn, project, zone, name, "reset", now)
            qr = qr_json(existing_qr_row(conn, project, zone, qr_id))
            complete_op(conn, op_name, now, response={"@type": QUEUED_RESOURCE_TYPE, **qr})
            self.timeline.queue_now(conn, world, project, zone, qr_id, now)
            op = answered_op(conn, op_name)
        send(self.ctx.vm_root, orders)
        return op


def _insert(
    conn: sqlite3.Connection,
    project: str,
    zone: str,
    qr_id: str,
    request: QueuedPlan,
    now: float,
    window: tuple[float | None, float | None],
) -> None:
    """A new ACCEPTED queued resource; ``window`` is its (validAfter, validUntil) in epoch seconds."""
    valid_after, valid_until = window
    conn.execute(
        """
        INSERT INTO queued_resources (project, zone, qr_id, spec, plan, capacity_class, reservation,
                                      state, state_initiator, create_time, valid_after, valid_until)
        VALUES (?, ?, ?, ?, ?, ?, ?, 'ACCEPTED', 'USER', ?, ?, ?)
        """,
        (
            project,
            zone,
            qr_id,
            json.dumps(request.spec),
            json.dumps([p.to_json() for p in request.plans]),
            request.capacity_class,
            request.reservation,
            now,
            valid_after,
            valid_until,
        ),
    )
