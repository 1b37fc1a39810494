"""TPU nodes: create (with quota and capacity checks), get, list, delete, stop, start and update.

Each mutation runs in one ``BEGIN IMMEDIATE`` transaction: the checks and the write they guard are
atomic even across processes. The state change itself completes later, in ``Timeline.advance``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from tpuctl.sim.api_errors import (
    already_exists,
    eid,
    failed_precondition,
    invalid_argument,
    not_found,
    rpc_status,
)
from tpuctl.sim.engine import maintenance
from tpuctl.sim.engine.capacity import Capacity
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.operations import answered_op, complete_op, insert_op
from tpuctl.sim.engine.plans import parse_node
from tpuctl.sim.engine.records import (
    existing_node_row,
    insert_node,
    node_json,
    node_row,
    rows_in,
    update_node,
)
from tpuctl.sim.engine.timeline import Timeline
from tpuctl.sim.shapes import node_name
from tpuctl.sim.wire import NODE_TYPE, check_labels, check_resource_id, check_zone, paginate
from tpuctl.sim.world import CapacityClass, World

_UPDATABLE_NODE_FIELDS = {"description", "labels", "metadata", "tags"}


def start_delete(conn: sqlite3.Connection, world: World, row: sqlite3.Row, now: float) -> str:
    """Begin deleting the node in ``row`` (DELETING, gone when the world's delete duration has passed);
    returns the delete operation's name."""
    key = (row["project"], row["zone"], row["node_id"])
    if row["op_name"]:
        # The create (or stop/start) it interrupts ends with an error, as on GCP.
        complete_op(
            conn,
            row["op_name"],
            now,
            error=rpc_status("ABORTED", "The operation was aborted: the node is being deleted."),
        )
    op_name = insert_op(conn, key[0], key[1], node_name(*key), "delete", now)
    update_node(
        conn,
        key,
        {
            "state": "DELETING",
            "next_state": "GONE",
            "op_name": op_name,
            "due_at": now + world.real_seconds(world.durations.node_delete_s),
            "preempt_at": None,
            "preempt_entry": None,
            "kill_at": None,
        },
    )
    return op_name


def _no_capacity_message(capacity_class: CapacityClass, zone: str) -> str:
    if capacity_class == "reserved":
        return (
            f"Insufficient reserved capacity. Contact customer support to increase your reservation. {eid()}"
        )
    return (
        f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
        "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) "
        f"{eid()}"
    )


class Nodes:
    """The nodes surface of the TPU API."""

    def __init__(self, ctx: Context, timeline: Timeline, capacity: Capacity) -> None:
        self.ctx = ctx
        self.timeline = timeline
        self.capacity = capacity

    def create(self, project: str, zone: str, node_id: str, body: dict[str, Any]) -> dict[str, Any]:
        check_zone(zone)
        check_resource_id(node_id, "nodeId")
        now = self.ctx.clock()
        self.timeline.advance(now)
        world = self.ctx.world
        plan = parse_node(self.ctx.catalog, world, zone, node_id, body, project=project, field_prefix="node")
        with self.ctx.db.write() as conn:
            if node_row(conn, project, zone, node_id) is not None:
                raise already_exists(node_name(project, zone, node_id))
            self.capacity.check_quota(conn, world, project, zone, [plan])
            placement = self.capacity.place(conn, world, zone, [plan])
            target = node_name(project, zone, node_id)
            if placement is None:
                # A stockout: the operation fails on its own after the world's stockout delay.
                message = _no_capacity_message(plan.capacity_class, zone)
                due = now + world.real_seconds(world.durations.stockout_s)
                # Reserved capacity short is FAILED_PRECONDITION (code 9), not a stockout's code 8: the
                # reservation, not the zone, is what is missing (docs/google-facts.md#tpu-api-errors).
                code = "FAILED_PRECONDITION" if plan.capacity_class == "reserved" else "RESOURCE_EXHAUSTED"
                error = rpc_status(code, message)
                op_name = insert_op(conn, project, zone, target, "create", now, due_at=due, error=error)
            else:
                op_name = insert_op(conn, project, zone, target, "create", now)
                due = now + world.real_seconds(world.durations.node_create_s)
                insert_node(conn, world.seed, project, zone, plan, placement[0], now, due, op_name=op_name)
            op = answered_op(conn, op_name)
        self.timeline.advance()  # zero durations complete at once
        return op

    def get(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        check_zone(zone)
        self.timeline.advance()
        with self.ctx.db.read() as conn:
            row = node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(node_name(project, zone, node_id))
            return node_json(self.ctx.catalog, row)

    def list(self, project: str, zone: str, page_size: int = 0, page_token: str = "") -> dict[str, Any]:
        check_zone(zone, allow_all=True)
        self.timeline.advance()
        with self.ctx.db.read() as conn:
            rows = rows_in(conn, "nodes", project, zone, "node_id")
            # A Compute Engine slice is not a TPU API node: "A TPU VM created on Compute Engine does
            # not appear in tpu-vm list" (docs/google-facts.md#two-surfaces).
            nodes = [node_json(self.ctx.catalog, r) for r in rows if r["surface"] == "tpu"]
        page, token = paginate(nodes, page_size, page_token)
        out: dict[str, Any] = {"nodes": page, "unreachable": []}
        if token:
            out["nextPageToken"] = token
        return out

    def delete(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        check_zone(zone)
        now = self.ctx.clock()
        self.timeline.advance(now)
        world = self.ctx.world
        with self.ctx.db.write() as conn:
            row = node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(node_name(project, zone, node_id))
            if row["state"] == "DELETING" and row["op_name"]:
                # Deleting again while a delete runs: the same operation (so a retried delete is harmless).
                return answered_op(conn, row["op_name"])
            op = answered_op(conn, start_delete(conn, world, row, now))
        self.timeline.advance()
        return op

    def stop_or_start(self, project: str, zone: str, node_id: str, *, stop: bool) -> dict[str, Any]:
        check_zone(zone)
        now = self.ctx.clock()
        self.timeline.advance(now)
        world = self.ctx.world
        with self.ctx.db.write() as conn:
            row = node_row(conn, project, zone, node_id)
            name = node_name(project, zone, node_id)
            if row is None:
                raise not_found(name)
            if stop and int(row["hosts"]) > 1:
                raise invalid_argument(
                    f"Node '{name}' is a multi-host TPU slice ({row['hosts']} hosts); only single-host "
                    "nodes can be stopped. Delete it instead.",
                    "name",
                )
            needed = "READY" if stop else "STOPPED"
            if row["state"] != needed:
                verb = "stopped" if stop else "started"
                raise failed_precondition(
                    f"Node '{name}' is {row['state']}; it can be {verb} only when it is {needed}."
                )
            op_name = insert_op(conn, project, zone, name, "stop" if stop else "start", now)
            duration = world.durations.node_stop_s if stop else world.durations.node_start_s
            update_node(
                conn,
                (project, zone, node_id),
                {
                    "state": "STOPPING" if stop else "STARTING",
                    "next_state": "STOPPED" if stop else "READY",
                    "due_at": now + world.real_seconds(duration),
                    "op_name": op_name,
                    "preempt_at": None,
                    "preempt_entry": None,
                },
            )
            op = answered_op(conn, op_name)
        self.timeline.advance()
        return op

    def update(
        self, project: str, zone: str, node_id: str, body: dict[str, Any], update_mask: str
    ) -> dict[str, Any]:
        """PATCH: only description, labels, metadata and tags here (GCP also allows network fields)."""
        check_zone(zone)
        now = self.ctx.clock()
        self.timeline.advance(now)
        paths = _update_paths(update_mask)
        if "labels" in paths:
            check_labels(body.get("labels"), "node.labels")
        with self.ctx.db.write() as conn:
            row = node_row(conn, project, zone, node_id)
            name = node_name(project, zone, node_id)
            if row is None:
                raise not_found(name)
            if row["state"] == "PREEMPTED":
                # Google fails an update of a preempted node with code 3 (docs/google-facts.md#preemption);
                # its operation carries it.
                op_name = insert_op(conn, project, zone, name, "update", now)
                message = f"Node '{name}' is PREEMPTED and cannot be updated; delete it and create it again."
                complete_op(conn, op_name, now, error=rpc_status("INVALID_ARGUMENT", message))
                return answered_op(conn, op_name)
            spec = json.loads(row["spec"])
            for path in paths:
                if path in body:
                    spec[path] = body[path]
                else:
                    spec.pop(path, None)
            update_node(conn, (project, zone, node_id), {"spec": json.dumps(spec)})
            op_name = insert_op(conn, project, zone, name, "update", now)
            node = node_json(self.ctx.catalog, existing_node_row(conn, project, zone, node_id))
            complete_op(conn, op_name, now, response={"@type": NODE_TYPE, **node})
            return answered_op(conn, op_name)

    def simulate_maintenance(
        self, project: str, zone: str, node_id: str, workers: Sequence[str]
    ) -> dict[str, Any]:
        """v2alpha1's simulateMaintenanceEvent: a done operation answering the node, and the host
        maintenance played as Google plays a real one (``tpuctl.sim.engine.maintenance``; a TPU VM cannot
        live-migrate: its VMs stop, and come back where Google keeps them). The whole node is maintained
        whatever ``workers`` names (the stricter reading: a slice is recovered whole)."""
        check_zone(zone)
        now = self.ctx.clock()
        self.timeline.advance(now)
        name = node_name(project, zone, node_id)
        with self.ctx.db.write() as conn:
            row = node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(name)
            for worker in workers:
                if not worker.isdigit() or int(worker) >= int(row["hosts"]):
                    raise invalid_argument(
                        f"Worker '{worker}' does not exist in node '{name}'.", "worker_ids"
                    )
            if row["state"] != "READY":
                raise failed_precondition(f"Node '{name}' is {row['state']}; maintenance needs it READY.")
            maintenance.start(conn, self.ctx.world, row, now)
            row = existing_node_row(conn, project, zone, node_id)
            op_name = insert_op(conn, project, zone, name, "simulateMaintenanceEvent", now)
            complete_op(conn, op_name, now, response={"@type": NODE_TYPE, **node_json(self.ctx.catalog, row)})
            return answered_op(conn, op_name)


def _update_paths(update_mask: str) -> list[str]:
    paths = [p.strip() for p in update_mask.split(",") if p.strip()]
    if not paths:
        raise invalid_argument("Field 'updateMask' is required.", "updateMask")
    for path in paths:
        if path not in _UPDATABLE_NODE_FIELDS:
            raise invalid_argument(
                f"Invalid value for field 'updateMask': {path!r} cannot be updated here; use one of "
                + ", ".join(sorted(_UPDATABLE_NODE_FIELDS)),
                "updateMask",
            )
    return paths
