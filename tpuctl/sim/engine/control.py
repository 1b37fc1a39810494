"""The operator's hand on the simulated cloud (the admin API): status, reset, preempt now, host
maintenance now, stockouts and fault rates."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from tpuctl.sim.api_errors import ApiError, failed_precondition, not_found
from tpuctl.sim.engine import maintenance
from tpuctl.sim.engine.capacity import pool_in_use, reservation_in_use
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.nodes import Nodes
from tpuctl.sim.engine.records import existing_node_row, host_addresses, node_json, node_row, update_node
from tpuctl.sim.engine.timeline import Timeline
from tpuctl.sim.network import STORAGE_PORT
from tpuctl.sim.shapes import node_name
from tpuctl.sim.state import STATE_TABLES
from tpuctl.sim.vms.layout import services_address
from tpuctl.sim.wire import check_zone, rfc3339
from tpuctl.sim.world import Faults, World, region_of


class Control:
    """Status, reset, preemption on demand, stockouts and faults."""

    def __init__(self, ctx: Context, timeline: Timeline, nodes: Nodes) -> None:
        self.ctx = ctx
        self.timeline = timeline
        self.nodes = nodes

    def faults(self) -> Faults:
        """The fault rates in force: the world's, unless changed at runtime (admin API)."""
        world = self.ctx.world
        with self.ctx.db.read() as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'faults'").fetchone()
        return Faults.model_validate_json(row["value"]) if row is not None else world.faults

    def set_faults(
        self, *, transient_error_rate: float | None = None, ambiguous_error_rate: float | None = None
    ) -> Faults:
        current = self.faults()
        updated = Faults(
            transient_error_rate=current.transient_error_rate
            if transient_error_rate is None
            else transient_error_rate,
            ambiguous_error_rate=current.ambiguous_error_rate
            if ambiguous_error_rate is None
            else ambiguous_error_rate,
        )
        with self.ctx.db.write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('faults', ?)", (updated.model_dump_json(),)
            )
        return updated

    def status(self) -> dict[str, Any]:
        """Everything at a glance: pools and reservations with their use, nodes, queued resources."""
        now = self.ctx.clock()
        self.timeline.advance(now)
        world = self.ctx.world
        with self.ctx.db.read() as conn:
            epoch_row = conn.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
            epoch = float(epoch_row["value"]) if epoch_row is not None else now
            zones = _zones_status(conn, world)
            reservations = [
                {
                    **r.model_dump(),
                    "in_use_chips": reservation_in_use(conn, r.name),
                    "free_chips": max(0, r.chips - reservation_in_use(conn, r.name)),
                }
                for r in world.reservations
            ]
            nodes = _nodes_status(conn)
            queued = [
                {
                    "project": r["project"],
                    "zone": r["zone"],
                    "name": r["qr_id"],
                    "state": r["state"],
                    "node_count": len(json.loads(r["plan"])),
                    "capacity_class": r["capacity_class"],
                }
                for r in conn.execute(
                    "SELECT * FROM queued_resources ORDER BY project, zone, qr_id"
                ).fetchall()
            ]
        return {
            "backend": "sim",
            "project": world.project,
            "now": rfc3339(now),
            "speed": world.speed,
            "sim_time_s": (now - epoch) * world.speed,
            "zones": zones,
            "reservations": reservations,
            "nodes": nodes,
            "queued_resources": queued,
            "faults": self.faults().model_dump(),
            "world": world.summary(),
            "ssh_port": self.ctx.vm_ports[0],
            "metadata_port": self.ctx.vm_ports[1],
            # Where the simulated network's Cloud Storage answers, for clients whose state dir is not
            # the simulator's (a team server reaching a served simulator).
            "storage_url": f"http://{services_address(self.ctx.state_dir)}:{STORAGE_PORT}",
        }

    def reset(self, world: World | None = None) -> World:
        """Forget every node, queued resource, operation, imported OS Login key and stockout; with
        ``world``, put that world in force too. The VMs of forgotten nodes go at the fleet's next sweep."""
        now = self.ctx.clock()
        with self.ctx.db.write() as conn:
            for table in STATE_TABLES:
                conn.execute(f"DELETE FROM {table}")
            conn.execute("DELETE FROM meta WHERE key IN ('faults', 'epoch')")
            conn.execute("INSERT INTO meta (key, value) VALUES ('epoch', ?)", (repr(now),))
            if world is not None:
                self.ctx.store_world(conn, world.model_dump_json())
        return self.ctx.world

    def preempt(
        self, zone: str, node_id: str, *, notice: bool = True, project: str | None = None
    ) -> dict[str, Any]:
        """Preempt a READY node now (any capacity class: this is the operator's hand, not the model)."""
        now = self.ctx.clock()
        self.timeline.advance(now)
        project = project or self.ctx.world.project
        with self.ctx.db.write() as conn:
            row = node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(node_name(project, zone, node_id))
            if row["state"] != "READY" or row["kill_at"] is not None:
                raise failed_precondition(
                    f"Node '{node_id}' is {row['state']}"
                    + (" and already being preempted" if row["kill_at"] is not None else "")
                    + "; only a READY node can be preempted."
                )
            update_node(
                conn,
                (project, zone, node_id),
                {"preempt_at": now, "preempt_notice": int(notice), "preempt_entry": None},
            )
            marked = node_json(self.ctx.catalog, existing_node_row(conn, project, zone, node_id))
        self.timeline.advance(now)
        try:
            return self.nodes.get(project, zone, node_id)
        except ApiError as exc:
            # Preempted at once (no notice) and already deleted by whoever watched it (another thread of
            # this simulator): the preemption happened; say so with the node as it was marked.
            if exc.http_status != 404:
                raise
            return marked

    def maintain(self, zone: str, node_id: str, *, project: str | None = None) -> dict[str, Any]:
        """Start a host maintenance of a READY node now, as Google plays one (``maintenance``): the
        notice, then the VMs stop, then (where Google keeps them) they come back. ``node_id``: a TPU API
        node, or a Compute Engine slice's instance or MIG. Returns the node."""
        from tpuctl.sim.compute.store import instance_node_id, mig_node_id

        now = self.ctx.clock()
        self.timeline.advance(now)
        project = project or self.ctx.world.project
        with self.ctx.db.write() as conn:
            for candidate in (node_id, instance_node_id(node_id), mig_node_id(node_id)):
                row = node_row(conn, project, zone, candidate)
                if row is not None:
                    node_id = candidate
                    break
            else:
                raise not_found(node_name(project, zone, node_id))
            maintenance.start(conn, self.ctx.world, row, now)
            marked = node_json(self.ctx.catalog, existing_node_row(conn, project, zone, node_id))
        self.timeline.advance(now)  # a notice of 0 s stops the VMs at once
        try:
            return self.nodes.get(project, zone, node_id)
        except ApiError as exc:
            if exc.http_status != 404:
                raise
            return marked

    def set_stockout(self, zone: str, *, clear: bool = False) -> bool:
        check_zone(zone)
        now = self.ctx.clock()
        with self.ctx.db.write() as conn:
            if clear:
                conn.execute("DELETE FROM stockouts WHERE zone = ?", (zone,))
            else:
                conn.execute("INSERT OR IGNORE INTO stockouts (zone, since) VALUES (?, ?)", (zone, now))
        self.timeline.advance(now)
        return not clear


def _zones_status(conn: sqlite3.Connection, world: World) -> list[dict[str, Any]]:
    """Each zone's pools: capacity (0 while stocked out), chips in use and free."""
    stockouts = {r["zone"] for r in conn.execute("SELECT zone FROM stockouts").fetchall()}
    zones: list[dict[str, Any]] = []
    for zone in sorted(world.zones):
        pools = []
        for gen_name in sorted(world.zones[zone]):
            for pool in ("on_demand", "preemptible"):
                capacity = 0 if zone in stockouts else world.pool_chips(zone, gen_name, pool)  # type: ignore[arg-type]
                in_use = pool_in_use(conn, zone, gen_name, pool)
                pools.append(
                    {
                        "generation": gen_name,
                        "capacity_class": pool,
                        "capacity_chips": capacity,
                        "in_use_chips": in_use,
                        "free_chips": max(0, capacity - in_use),
                    }
                )
        zones.append({"zone": zone, "region": region_of(zone), "stockout": zone in stockouts, "pools": pools})
    return zones


def _nodes_status(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every node of every project, with its hosts' addresses."""
    return [
        {
            "project": r["project"],
            "zone": r["zone"],
            "name": r["node_id"],
            "accelerator_type": r["accelerator_type"],
            "chips": r["chips"],
            "hosts": r["hosts"],
            "state": r["state"],
            "capacity_class": r["capacity_class"],
            "reservation": r["reservation"],
            "queued_resource": r["queued_resource"],
            "preempted": bool(r["preempted_flag"]),
            "preempt_at": rfc3339(float(r["preempt_at"])) if r["preempt_at"] is not None else None,
            "maintenance_event": r["maintenance_event"] or "NONE",
            "host_addresses": host_addresses(r),
        }
        for r in conn.execute("SELECT * FROM nodes ORDER BY project, zone, node_id").fetchall()
    ]
