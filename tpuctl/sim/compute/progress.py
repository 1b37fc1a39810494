"""What time does to Compute Engine's resources: the timeline step run after the TPU API's transitions,
in the same transaction, over the node rows they changed.

- operations with a due time complete (stockouts, quick operations);
- an instance whose slice became READY completes its insert operation;
- instances whose slice row is gone (deleted) go, completing their delete operation;
- a preempted slice's instances: a ``compute.instances.preempted`` operation each (DONE, "Instance was
  preempted.", docs/google-facts.md#preemption), then TERMINATED (termination action STOP) or gone (DELETE);
- a slice stopped by a host maintenance (``tpuctl.sim.engine.maintenance``): a
  ``compute.instances.terminateOnHostMaintenance`` operation each, and TERMINATED;
- PENDING flex-start instances take capacity, or give up at their deadline (docs/google-facts.md#flex-start);
- an instance past its time limit (``terminationTime``, or ``maxRunDuration`` from RUNNING, in simulated
  time) is deleted, which the deletion log records as a scheduled termination (docs/google-facts.md#backstop;
  a MIG's members are left alone: whether a MIG makes them again is unc.);
- MIGs make, repair or tear down their slices (``groups``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from tpuctl.sim import deletions
from tpuctl.sim.compute import links, store
from tpuctl.sim.compute.context import ComputeContext
from tpuctl.sim.compute.operations import any_due, finish_due, finish_op, insert_op
from tpuctl.sim.compute.specs import termination_time
from tpuctl.sim.engine.hosts import VmOrder
from tpuctl.sim.engine.records import delete_node_rows
from tpuctl.sim.world import World

GroupStep = Callable[[sqlite3.Connection, World, float], None]

_JOINED = """
    SELECT i.*, n.state AS node_state, n.ready_time AS node_ready FROM compute_resources i
    LEFT JOIN nodes n ON n.project = i.project AND n.zone = substr(i.location, 7) AND n.node_id = i.node_id
    WHERE i.collection = 'instances' AND i.node_id IS NOT NULL
"""


class Progress:
    """The Compute Engine step of the engine's timeline."""

    def __init__(self, cc: ComputeContext) -> None:
        self.cc = cc
        self.group_steps: list[GroupStep] = []
        self.group_due: list[Callable[[sqlite3.Connection], bool]] = []

    def due(self, conn: sqlite3.Connection, now: float) -> bool:
        if any_due(conn, now):
            return True
        pending = conn.execute(
            "SELECT 1 FROM compute_resources WHERE collection = 'instances' AND status = 'PENDING' LIMIT 1"
        ).fetchone()
        if pending is not None or any(check(conn) for check in self.group_due):
            return True
        return bool(self._past_limit(conn, self.cc.ctx.world, now))

    def _past_limit(
        self, conn: sqlite3.Connection, world: World, now: float
    ) -> list[tuple[sqlite3.Row, str]]:
        """The running one-host instances past their time limit, each with what the limit was."""
        out = []
        for row in conn.execute(_JOINED + " AND n.state = 'READY' AND i.status IS NULL").fetchall():
            extra = store.extra(row)
            if extra.get("mig") or extra.get("deleting"):
                continue
            scheduling = store.body(row).get("scheduling") or {}
            limits: list[tuple[float, str]] = []
            if "terminationTime" in scheduling:
                at = termination_time(scheduling, "instance")
                limits.append((at, f"terminationTime {scheduling['terminationTime']}"))
            if "maxRunDuration" in scheduling and row["node_ready"] is not None:
                run_s = links.duration_seconds(scheduling["maxRunDuration"], "maxRunDuration")
                at = float(row["node_ready"]) + world.real_seconds(run_s)
                limits.append((at, f"maxRunDuration {run_s:g} s"))
            due = [why for at, why in limits if now >= at]
            if due:
                out.append((row, due[0]))
        return out

    def advance(self, conn: sqlite3.Connection, world: World, now: float, orders: list[VmOrder]) -> None:
        finish_due(conn, now)
        for row in conn.execute(_JOINED + " AND i.op_name IS NOT NULL AND n.state = 'READY'").fetchall():
            if not store.extra(row).get("deleting"):
                finish_op(conn, row["project"], row["op_name"], float(row["node_ready"]))
                store.update(conn, row, op_name=None)
        for row in conn.execute(_JOINED + " AND n.node_id IS NULL").fetchall():
            if row["op_name"]:
                finish_op(conn, row["project"], row["op_name"], now)
            store.delete(conn, row)
        self._preempted(conn, now)
        self._maintained(conn, now)
        self._time_limits(conn, world, now)
        self._flex_queue(conn, world, now)
        for step in self.group_steps:
            step(conn, world, now)

    def _preempted(self, conn: sqlite3.Connection, now: float) -> None:
        rows = conn.execute(_JOINED + " AND n.state = 'PREEMPTED' AND i.status IS NULL").fetchall()
        slices: set[tuple[str, str, str]] = set()
        for row in rows:
            zone = store.zone_of(row)
            target = f"https://www.googleapis.com/compute/v1/projects/{row['project']}/zones/{zone}/instances/{row['name']}"
            op = insert_op(
                conn,
                row["project"],
                row["location"],
                "compute.instances.preempted",
                target,
                row["id"],
                now,
                status_message="Instance was preempted.",
            )
            finish_op(conn, row["project"], op, now)
            action = store.body(row).get("scheduling", {}).get("instanceTerminationAction", "STOP")
            if action == "DELETE":
                store.delete(conn, row)
            else:
                store.update(conn, row, status="TERMINATED", extra={**store.extra(row), "last_stop": now})
            slices.add((row["project"], zone, row["node_id"]))
        for project, zone, node_id in slices:
            left = conn.execute(
                "SELECT 1 FROM compute_resources WHERE project = ? AND location = ? AND node_id = ? "
                "AND collection = 'instances'",
                (project, f"zones/{zone}", node_id),
            ).fetchone()
            if left is None:  # every VM of the slice deleted (DELETE): its row goes, its hardware is back
                delete_node_rows(conn, (project, zone, node_id))

    def _maintained(self, conn: sqlite3.Connection, now: float) -> None:
        """Instances whose slice a host maintenance stopped: TERMINATED, each with the operation Compute
        Engine records (docs/google-facts.md#host-maintenance). Never restarted: tpuctl asks
        ``automaticRestart: false``."""
        for row in conn.execute(_JOINED + " AND n.state = 'TERMINATED' AND i.status IS NULL").fetchall():
            zone = store.zone_of(row)
            target = links.link(row["project"], "zones", zone, store.INSTANCES, row["name"])
            op = insert_op(
                conn,
                row["project"],
                row["location"],
                "compute.instances.terminateOnHostMaintenance",
                target,
                row["id"],
                now,
                status_message="Instance terminated for host maintenance.",
            )
            finish_op(conn, row["project"], op, now)
            store.update(conn, row, status="TERMINATED", extra={**store.extra(row), "last_stop": now})

    def _time_limits(self, conn: sqlite3.Connection, world: World, now: float) -> None:
        """Delete each instance past its time limit (specs refuses a limit whose action is not DELETE),
        as an API delete would: the slice DELETING, its VMs gone when that ends."""
        for row, why in self._past_limit(conn, world, now):
            node = store.node_of(conn, row)
            if node is None:
                continue
            self.cc.start_node_delete(conn, world, node, now)
            store.update(conn, row, status=None, extra={**store.extra(row), "deleting": True})
            deletions.note(
                conn,
                at=now,
                project=row["project"],
                zone=store.zone_of(row),
                name=row["name"],
                resource="instance",
                path=deletions.SCHEDULED,
                reason=f"its time limit passed ({why})",
            )

    def _flex_queue(self, conn: sqlite3.Connection, world: World, now: float) -> None:
        for row in conn.execute(
            "SELECT * FROM compute_resources WHERE collection = 'instances' AND status = 'PENDING' "
            "ORDER BY creation_time"
        ).fetchall():
            if store.extra(row).get("mig"):
                continue  # a MIG's flex-start instances wait for their whole slice (groups)
            if row["deadline"] is not None and now >= float(row["deadline"]):
                # Gone, leaving only its operation with the stockout (docs/google-facts.md#flex-start).
                machine = json.loads(row["body"])["machineType"].rsplit("/", 1)[-1]
                error = self.cc.stockout(row["project"], store.zone_of(row), machine)
                if row["op_name"]:
                    finish_op(conn, row["project"], row["op_name"], float(row["deadline"]), error=error)
                store.delete(conn, row)
                continue
            self.cc.try_flex(conn, world, row, now)
