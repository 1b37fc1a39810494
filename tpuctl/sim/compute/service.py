"""``ComputeService``: Compute Engine's surface over the engine (the facade the routes call)."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

from tpuctl.sim.compute import general, links, quota, store
from tpuctl.sim.compute.context import ComputeContext
from tpuctl.sim.compute.errors import invalid, not_found
from tpuctl.sim.compute.instances import Instances
from tpuctl.sim.compute.listing import matches
from tpuctl.sim.compute.machines import (
    check_region,
    check_zone,
    machine_not_found,
    machine_type_json,
    zone_json,
    zone_machines,
)
from tpuctl.sim.compute.operations import op_json, op_row
from tpuctl.sim.compute.progress import Progress
from tpuctl.sim.engine.capacity import Capacity
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.records import update_node
from tpuctl.sim.engine.timeline import Timeline
from tpuctl.sim.iam import default_service_account
from tpuctl.sim.wire import paginate

#: zoneOperations.wait returns when the operation is DONE or after this long (Google: up to 2 min).
WAIT_LIMIT_S = 120.0
_WAIT_POLL_S = 0.02


def _list(
    kind: str, self_link: str, items: list[dict[str, Any]], page_size: int, token: str
) -> dict[str, Any]:
    page, next_token = paginate(items, page_size, token)
    out: dict[str, Any] = {
        "kind": kind,
        "id": self_link.split("/compute/v1/")[-1],
        "items": page,
        "selfLink": self_link,
    }
    if next_token:
        out["nextPageToken"] = next_token
    return out


class ComputeService:
    """Compute Engine's TPU surface; registers its step in the engine's timeline."""

    def __init__(self, ctx: Context, timeline: Timeline, capacity: Capacity) -> None:
        self.cc = ComputeContext(ctx, timeline, capacity)
        self.progress = Progress(self.cc)
        timeline.steps.append(self.progress)
        self.instances = Instances(self.cc)
        from tpuctl.sim.compute.groups import Groups  # after Progress: it registers its steps there

        self.groups = Groups(self.cc, self.progress)

    # --- the project ------------------------------------------------------------------------------

    def get_project(self, project: str) -> dict[str, Any]:
        """projects.get: the project and its common instance metadata (what every VM inherits where its
        own metadata does not set a key: ``enable-oslogin`` among them)."""
        from tpuctl.sim.engine.oslogin import project_metadata

        items = [{"key": k, "value": v} for k, v in sorted(project_metadata(self.cc.ctx.world).items())]
        digest = hashlib.sha256(repr(items).encode()).digest()[:8]
        return {
            "kind": "compute#project",
            "id": str(int.from_bytes(hashlib.sha256(project.encode()).digest()[:7], "big")),
            "name": project,
            "selfLink": links.link(project),
            "commonInstanceMetadata": {
                "kind": "compute#metadata",
                "fingerprint": base64.b64encode(digest).decode("ascii"),
                "items": items,
            },
            "defaultServiceAccount": default_service_account(project),
            "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS",
        }

    # --- zones and machine types -----------------------------------------------------------------

    def list_zones(self, project: str, page_size: int, token: str) -> dict[str, Any]:
        items = [zone_json(project, z) for z in sorted(self.cc.ctx.world.zones)]
        return _list("compute#zoneList", links.link(project, "zones"), items, page_size, token)

    def get_zone(self, project: str, zone: str) -> dict[str, Any]:
        if zone not in self.cc.ctx.world.zones:
            raise not_found(links.path(project, "zones", zone))
        return zone_json(project, zone)

    def list_machine_types(self, project: str, zone: str, page_size: int, token: str) -> dict[str, Any]:
        world = self.cc.ctx.world
        check_zone(world, zone)
        items = [machine_type_json(project, zone, m) for m in zone_machines(self.cc.ctx.catalog, world, zone)]
        # General-purpose types in every zone (E2 is offered in every zone the simulator has, unc.).
        items += [general.machine_type_json(project, zone, m) for m in general.general_machines().values()]
        items.sort(key=lambda item: str(item["name"]))
        return _list(
            "compute#machineTypeList",
            links.link(project, "zones", zone, "machineTypes"),
            items,
            page_size,
            token,
        )

    def get_machine_type(self, project: str, zone: str, name: str) -> dict[str, Any]:
        world = self.cc.ctx.world
        check_zone(world, zone)
        for machine in zone_machines(self.cc.ctx.catalog, world, zone):
            if machine.name == name:
                return machine_type_json(project, zone, machine)
        if name in general.general_machines():
            return general.machine_type_json(project, zone, general.general_machines()[name])
        raise machine_not_found(project, zone, name)

    # --- operations ------------------------------------------------------------------------------

    def _location(self, scope: str, where: str) -> str:
        world = self.cc.ctx.world
        if scope == "zones":
            check_zone(world, where)
        elif scope == "regions":
            check_region(world, where)
        return f"{scope}/{where}" if where else "global"

    def get_operation(self, project: str, scope: str, where: str, name: str) -> dict[str, Any]:
        location = self._location(scope, where)
        self.cc.timeline.advance()
        with self.cc.ctx.db.read() as conn:
            return op_json(op_row(conn, project, location, name))

    def wait_operation(self, project: str, scope: str, where: str, name: str) -> dict[str, Any]:
        """Returns when the operation is DONE or after WAIT_LIMIT_S, as Google's wait does."""
        deadline = time.monotonic() + WAIT_LIMIT_S
        while True:
            op = self.get_operation(project, scope, where, name)
            if op["status"] == "DONE" or time.monotonic() >= deadline:
                return op
            time.sleep(_WAIT_POLL_S)

    def list_operations(
        self, project: str, scope: str, where: str, filter_text: str, page_size: int, token: str
    ) -> dict[str, Any]:
        location = self._location(scope, where)
        self.cc.timeline.advance()
        with self.cc.ctx.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM compute_operations WHERE project = ? AND location = ? "
                "ORDER BY insert_time, name",
                (project, location),
            ).fetchall()
        items = [op for op in map(op_json, rows) if matches(op, filter_text)]
        return _list(
            "compute#operationList", links.link(project, location, "operations"), items, page_size, token
        )

    # --- Cloud Quotas ----------------------------------------------------------------------------

    def quota_infos(self, project: str) -> list[dict[str, Any]]:
        return quota.quota_infos(self.cc.ctx.catalog, self.cc.ctx.world, project)

    # --- the operator's hand ---------------------------------------------------------------------

    def preempt(
        self, zone: str, name: str, *, notice: bool = True, project: str | None = None
    ) -> dict[str, Any]:
        """Preempt now the slice of instance or MIG ``name`` (any provisioning model: the operator's
        hand). One host lost is the whole slice lost (docs/google-facts.md#losing-a-host)."""
        ctx = self.cc.ctx
        project = project or ctx.world.project
        now = ctx.clock()
        self.cc.timeline.advance(now)
        with ctx.db.write() as conn:
            found = store.row(conn, project, f"zones/{zone}", store.INSTANCES, name) or store.row(
                conn, project, f"zones/{zone}", store.MIGS, name
            )
            if found is None:
                raise not_found(links.path(project, "zones", zone, "instances", name))
            node = store.node_of(conn, found)
            if node is not None and node["surface"] == "vm":
                # A general-purpose VM (the team server's) is standard provisioning: Google never
                # preempts it, so the operator's hand does not either (it has no TPU slice to lose).
                raise invalid(f"'{name}' is a general-purpose VM, not a TPU slice: it is never preempted.")
            if node is None or node["state"] != "READY" or node["kill_at"] is not None:
                raise invalid(f"'{name}' has no running slice to preempt.")
            update_node(
                conn,
                (project, zone, node["node_id"]),
                {"preempt_at": now, "preempt_notice": int(notice), "preempt_entry": None},
            )
            collection = found["collection"]
        self.cc.timeline.advance(now)
        return {"zone": zone, "name": name, "kind": collection, "preempted_at": links.timestamp(now)}
