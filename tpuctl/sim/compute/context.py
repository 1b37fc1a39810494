"""What Compute Engine's resources share: the engine's context, timeline and capacity, and the few
steps several of them take (a flex-start instance's try for capacity, a slice's delete)."""

from __future__ import annotations

import sqlite3
from typing import Any

from tpuctl.sim.compute import errors, links, quota, slices, store
from tpuctl.sim.compute.machines import all_machines
from tpuctl.sim.compute.specs import InstanceSpec, parse_properties
from tpuctl.sim.engine.capacity import Capacity
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.records import update_node
from tpuctl.sim.engine.timeline import Timeline
from tpuctl.sim.world import World


class ComputeContext:
    def __init__(self, ctx: Context, timeline: Timeline, capacity: Capacity) -> None:
        self.ctx = ctx
        self.timeline = timeline
        self.capacity = capacity

    def stockout(self, project: str, zone: str, machine_type: str) -> dict[str, Any]:
        return errors.stockout(project, zone, machine_type)

    def spec_of(self, world: World, body: dict[str, Any]) -> InstanceSpec:
        """The spec of a stored instance (or template properties) body, parsed again."""
        machine = all_machines(self.ctx.catalog)[links.short_name(str(body["machineType"]))]
        return parse_properties(world, body, machine, "resource")

    def start_node_delete(
        self, conn: sqlite3.Connection, world: World, node: sqlite3.Row, now: float
    ) -> None:
        """A slice's VMs go: DELETING now, the row (and the VMs, disks wiped) gone after node_delete_s."""
        if node["state"] == "DELETING":
            return
        update_node(
            conn,
            (node["project"], node["zone"], node["node_id"]),
            {
                "state": "DELETING",
                "next_state": "GONE",
                "due_at": now + world.real_seconds(world.durations.node_delete_s),
                "preempt_at": None,
                "preempt_entry": None,
                "kill_at": None,
            },
        )

    def try_flex(self, conn: sqlite3.Connection, world: World, inst: sqlite3.Row | None, now: float) -> None:
        """A PENDING flex-start instance takes capacity when its quota and the pool have room."""
        if inst is None or inst["status"] != "PENDING":
            return
        spec = self.spec_of(world, store.body(inst))
        accel = spec.machine.single_host_type()
        assert accel is not None
        zone = store.zone_of(inst)
        demand = quota.demand_of(spec.machine.generation, spec.capacity_class, zone, accel.chips)
        if quota.check(conn, self.ctx.catalog, world, inst["project"], demand) is not None:
            return
        key = (inst["project"], zone, store.instance_node_id(inst["name"]))
        if slices.place(conn, self.capacity, world, key, accel, spec, [inst["name"]], [inst["id"]], now):
            store.update(conn, inst, status=None, node_id=key[2], worker=0)
