"""``instances``: insert, get, list, aggregatedList and delete of TPU VMs
(docs/google-facts.md#instance-requests)."""

from __future__ import annotations

import sqlite3
from typing import Any

from tpuctl.sim.compute import general as general_vms
from tpuctl.sim.compute import guest, links, listing, quota, slices, store
from tpuctl.sim.compute.context import ComputeContext
from tpuctl.sim.compute.errors import already_exists, invalid, not_found
from tpuctl.sim.compute.general import general_machine_of
from tpuctl.sim.compute.machines import check_zone, machine_in_zone
from tpuctl.sim.compute.networking import checked_interfaces
from tpuctl.sim.compute.operations import finish_op, insert_op, op_json_of
from tpuctl.sim.compute.specs import InstanceSpec, parse_properties, request_valid_for
from tpuctl.sim.wire import paginate
from tpuctl.sim.world import region_of

#: The error a pending insert ends with when its instance is deleted first (Compute's code).
CANCELED = {
    "http": [400, "BAD REQUEST"],
    "errors": [{"code": "OPERATION_CANCELED_BY_USER", "message": "Operation was canceled by user."}],
}


class Instances:
    def __init__(self, cc: ComputeContext) -> None:
        self.cc = cc

    def insert(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        ctx, world = self.cc.ctx, self.cc.ctx.world
        check_zone(world, zone)
        now = ctx.clock()
        self.cc.timeline.advance(now)
        general = general_machine_of(body.get("machineType"))
        if general is not None:
            return general_vms.insert(self.cc, project, zone, body, general)
        name = links.check_name(body.get("name"))
        machine = machine_in_zone(ctx.catalog, world, zone, body.get("machineType"), "resource.machineType")
        spec = parse_properties(world, body, machine, "resource")
        spec.body["networkInterfaces"] = checked_interfaces(world, project, region_of(zone), body, "resource")
        valid_for = request_valid_for(body, spec.provisioning_model)
        accel = machine.single_host_type()
        assert accel is not None, machine
        location = f"zones/{zone}"
        target = links.link(project, "zones", zone, "instances", name)
        with ctx.db.write() as conn:
            self._check_policies(conn, project, zone, spec)
            if store.row(conn, project, location, store.INSTANCES, name) is not None:
                raise already_exists(links.path(project, "zones", zone, "instances", name))
            rid = links.resource_id(world.seed, project, zone, name, now)
            stored = {
                "name": name,
                "machineType": links.link(project, "zones", zone, "machineTypes", machine.name),
                **spec.body,
            }
            if valid_for is not None:
                # Flex-start: PENDING until capacity (and quota: it waits for either), then STAGING ->
                # RUNNING; gone, with the stockout on its operation, at the deadline
                # (docs/google-facts.md#flex-start).
                op = insert_op(conn, project, location, "insert", target, rid, now)
                store.insert(
                    conn,
                    project,
                    location,
                    store.INSTANCES,
                    name,
                    rid,
                    now,
                    stored,
                    status="PENDING",
                    op_name=op,
                    deadline=now + world.real_seconds(valid_for),
                )
                self.cc.try_flex(conn, world, store.row(conn, project, location, store.INSTANCES, name), now)  # type: ignore[arg-type]
                return op_json_of(conn, project, op)
            demand = quota.demand_of(machine.generation, spec.capacity_class, zone, accel.chips)
            error = quota.check(conn, ctx.catalog, world, project, demand)
            if error is not None:
                op = insert_op(conn, project, location, "insert", target, rid, now, error=error)
                finish_op(conn, project, op, now)
                return op_json_of(conn, project, op)
            key = (project, zone, store.instance_node_id(name))
            if not slices.place(conn, self.cc.capacity, world, key, accel, spec, [name], [rid], now):
                # A stockout: the operation fails on its own after the world's stockout delay; no
                # instance is left behind (SPOT creates fail fast with the stockout:
                # docs/google-facts.md#provisioning-models).
                due = now + world.real_seconds(world.durations.stockout_s)
                error = self.cc.stockout(project, zone, machine.name)
                op = insert_op(conn, project, location, "insert", target, rid, now, done_at=due, error=error)
                return op_json_of(conn, project, op)
            op = insert_op(conn, project, location, "insert", target, rid, now)
            store.insert(
                conn,
                project,
                location,
                store.INSTANCES,
                name,
                rid,
                now,
                stored,
                node_id=key[2],
                worker=0,
                op_name=op,
            )
            answer = op_json_of(conn, project, op)
        self.cc.timeline.advance()
        return answer

    def _check_policies(self, conn: sqlite3.Connection, project: str, zone: str, spec: InstanceSpec) -> None:
        """A workload policy cannot attach to an instance (docs/google-facts.md#instance-requests)."""
        for given in spec.body.get("resourcePolicies") or []:
            region = region_of(zone)
            policy = store.row(
                conn, project, f"regions/{region}", store.POLICIES, links.short_name(str(given))
            )
            if policy is None:
                raise not_found(
                    links.path(project, "regions", region, "resourcePolicies", links.short_name(str(given)))
                )
            if "workloadPolicy" in store.body(policy):
                raise invalid(
                    "Resource policy must have one of [VmMaintenancePolicy, GroupPlacementPolicy, "
                    "InstanceSchedulePolicy]"
                )

    def get(self, project: str, zone: str, name: str) -> dict[str, Any]:
        check_zone(self.cc.ctx.world, zone)
        now = self.cc.ctx.clock()
        self.cc.timeline.advance(now)
        with self.cc.ctx.db.read() as conn:
            inst = store.row(conn, project, f"zones/{zone}", store.INSTANCES, name)
            if inst is None:
                raise not_found(links.path(project, "zones", zone, "instances", name))
            return slices.instance_json(inst, store.node_of(conn, inst), now)

    def get_guest_attributes(
        self, project: str, zone: str, name: str, query_path: str, variable_key: str
    ) -> dict[str, Any]:
        return guest.guest_attributes(self.cc, project, zone, name, query_path, variable_key)

    def list(self, project: str, zone: str, page_size: int, page_token: str) -> dict[str, Any]:
        check_zone(self.cc.ctx.world, zone)
        now = self.cc.ctx.clock()
        self.cc.timeline.advance(now)
        with self.cc.ctx.db.read() as conn:
            items = [
                slices.instance_json(r, store.node_of(conn, r), now)
                for r in store.rows(conn, project, f"zones/{zone}", store.INSTANCES)
            ]
        page, token = paginate(items, page_size, page_token)
        out: dict[str, Any] = {
            "kind": "compute#instanceList",
            "id": f"projects/{project}/zones/{zone}/instances",
            "items": page,
            "selfLink": links.link(project, "zones", zone, "instances"),
        }
        if token:
            out["nextPageToken"] = token
        return out

    def aggregated_list(self, project: str, query: listing.ListQuery) -> dict[str, Any]:
        """Every zone of the project, each with its instances or a NO_RESULTS_ON_PAGE warning.
        Instances are zonal: ``regions/`` scopes only with ``includeAllScopes`` (whether Google then
        adds ``global`` too is unc.; not here)."""
        now = self.cc.ctx.clock()
        self.cc.timeline.advance(now)
        with self.cc.ctx.db.read() as conn:
            items = [
                (r["location"], slices.instance_json(r, store.node_of(conn, r), now))
                for r in store.rows(conn, project, None, store.INSTANCES)
            ]
        return listing.aggregated(
            kind="compute#instanceAggregatedList",
            project=project,
            collection=store.INSTANCES,
            scopes=[
                *(listing.region_scopes(self.cc.ctx.world) if query.all_scopes else []),
                *listing.zone_scopes(self.cc.ctx.world),
            ],
            items=items,
            query=query,
        )

    def delete(self, project: str, zone: str, name: str) -> dict[str, Any]:
        ctx, world = self.cc.ctx, self.cc.ctx.world
        check_zone(world, zone)
        now = ctx.clock()
        self.cc.timeline.advance(now)
        location = f"zones/{zone}"
        with ctx.db.write() as conn:
            inst = store.row(conn, project, location, store.INSTANCES, name)
            if inst is None:
                raise not_found(links.path(project, "zones", zone, "instances", name))
            if store.extra(inst).get("deleting") and inst["op_name"]:
                return op_json_of(conn, project, inst["op_name"])  # a retried delete: the same operation
            target = links.link(project, "zones", zone, "instances", name)
            if inst["op_name"]:
                # Its insert is still running: it ends now (cancelled while the VM never came up).
                finish_op(
                    conn,
                    project,
                    inst["op_name"],
                    now,
                    error=CANCELED if inst["status"] == "PENDING" else None,
                )
            op = insert_op(conn, project, location, "delete", target, inst["id"], now)
            node = store.node_of(conn, inst)
            if node is None:
                store.delete(conn, inst)
                finish_op(conn, project, op, now)
            else:
                # One host lost is the whole slice lost (docs/google-facts.md#losing-a-host): a MIG
                # member's delete takes its slice down, and the MIG makes it again
                # (docs/google-facts.md#managed-instance-groups).
                self.cc.start_node_delete(conn, world, node, now)
                for member in conn.execute(
                    "SELECT * FROM compute_resources WHERE project = ? AND location = ? AND collection = ? "
                    "AND node_id = ?",
                    (project, location, store.INSTANCES, node["node_id"]),
                ).fetchall():
                    mine = member["name"] == name
                    extra = {**store.extra(member), "deleting": mine}
                    store.update(conn, member, status=None, op_name=op if mine else None, extra=extra)
            answer = op_json_of(conn, project, op)
        self.cc.timeline.advance()
        return answer
