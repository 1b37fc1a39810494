"""Multi-host slices (docs/google-facts.md#workload-policies and after): workload policies (regional
resourcePolicies), instance templates (global) and zonal MIGs whose workload policy names an accelerator
topology. A MIG's slice is one node row (``instanceGroupManagers/<name>``) whose hosts are its instances,
named ``<base>-<4 [a-z0-9]>`` and made all together (BULK)."""

from __future__ import annotations

import re
import secrets
import sqlite3
import string
from typing import Any

from tpuctl.catalog import AcceleratorType
from tpuctl.sim.compute import links, listing, quota, slices, store
from tpuctl.sim.compute.context import ComputeContext
from tpuctl.sim.compute.errors import already_exists, invalid, invalid_field, not_found
from tpuctl.sim.compute.machines import check_region, check_zone, machine_by_name, machine_in_zone
from tpuctl.sim.compute.networking import checked_interfaces
from tpuctl.sim.compute.operations import finish_op, insert_op, op_json_of
from tpuctl.sim.compute.progress import Progress
from tpuctl.sim.compute.specs import InstanceSpec, parse_properties
from tpuctl.sim.wire import paginate
from tpuctl.sim.world import World, region_of

_TOPOLOGY_RE = re.compile(r"^[0-9]+x[0-9]+(x[0-9]+)?$")
_SUFFIX = string.ascii_lowercase + string.digits
_NOT_IN_USE = ("DELETING",)


class Groups:
    """Workload policies, instance templates and MIGs."""

    def __init__(self, cc: ComputeContext, progress: Progress) -> None:
        self.cc = cc
        progress.group_steps.append(self._advance)
        # Due: a MIG that wants its slice, or one being deleted (a MIG that never got its VMs, out of
        # stock, has no node row whose deletion would wake the timeline: its delete finishes here).
        progress.group_due.append(
            lambda conn: (
                conn.execute(
                    "SELECT 1 FROM compute_resources WHERE collection = ? AND "
                    "(json_extract(extra, '$.pending') = 1 OR json_extract(extra, '$.deleting') IS NOT NULL)",
                    (store.MIGS,),
                ).fetchone()
                is not None
            )
        )

    def _quick_op(
        self,
        conn: sqlite3.Connection,
        project: str,
        location: str,
        verb: str,
        collection: str,
        name: str,
        rid: str,
        now: float,
    ) -> dict[str, Any]:
        """An operation on a record that changes no VM: done after the world's compute_op_s. Operation
        types are ``compute.<collection>.<verb>`` (unc.)."""
        world = self.cc.ctx.world
        target = links.link(project, *([] if location == "global" else location.split("/")), collection, name)
        done = now + world.real_seconds(world.durations.compute_op_s)
        op = insert_op(
            conn, project, location, f"compute.{collection}.{verb}", target, rid, now, done_at=done
        )
        return op_json_of(conn, project, op)

    # --- workload policies (regional resourcePolicies) -------------------------------------------

    def insert_policy(self, project: str, region: str, body: dict[str, Any]) -> dict[str, Any]:
        ctx = self.cc.ctx
        check_region(ctx.world, region)
        name = links.check_name(body.get("name"))
        kept: dict[str, Any] = {
            k: body[k] for k in ("description", "workloadPolicy", "groupPlacementPolicy") if k in body
        }
        policy = body.get("workloadPolicy")
        if policy is not None:
            kept["workloadPolicy"] = _workload_policy(policy)
        now = ctx.clock()
        location = f"regions/{region}"
        with ctx.db.write() as conn:
            if store.row(conn, project, location, store.POLICIES, name) is not None:
                raise already_exists(links.path(project, location, store.POLICIES, name))
            rid = links.resource_id(ctx.world.seed, project, location, name, now)
            store.insert(conn, project, location, store.POLICIES, name, rid, now, kept)
            return self._quick_op(conn, project, location, "insert", store.POLICIES, name, rid, now)

    def get_policy(self, project: str, region: str, name: str) -> dict[str, Any]:
        check_region(self.cc.ctx.world, region)
        with self.cc.ctx.db.read() as conn:
            row = self._existing(conn, project, f"regions/{region}", store.POLICIES, name)
            return _policy_json(project, region, row)

    def list_policies(self, project: str, region: str, query: listing.ListQuery) -> dict[str, Any]:
        """resourcePolicies.list: the region's policies, filtered and paged as Compute's lists are."""
        check_region(self.cc.ctx.world, region)
        with self.cc.ctx.db.read() as conn:
            rows = store.rows(conn, project, f"regions/{region}", store.POLICIES)
            items = [_policy_json(project, region, r) for r in rows]
        kept = [item for item in items if listing.matches(item, query.filter_text)]
        page, next_token = paginate(kept, query.page_size, query.page_token)
        out: dict[str, Any] = {
            "kind": "compute#resourcePolicyList",
            "id": f"projects/{project}/regions/{region}/resourcePolicies",
            "items": page,
            "selfLink": links.link(project, "regions", region, store.POLICIES),
        }
        if next_token:
            out["nextPageToken"] = next_token
        return out

    def delete_policy(self, project: str, region: str, name: str) -> dict[str, Any]:
        return self._delete_record(project, f"regions/{region}", store.POLICIES, name, "workloadPolicy")

    # --- instance templates (global) -------------------------------------------------------------

    def insert_template(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        ctx = self.cc.ctx
        name = links.check_name(body.get("name"))
        props = body.get("properties")
        if not isinstance(props, dict):
            raise invalid_field("resource.properties", props or "", "Properties must be specified.")
        machine = machine_by_name(ctx.catalog, props.get("machineType"), "resource.properties.machineType")
        spec = parse_properties(ctx.world, props, machine, "resource.properties")
        # A global template: the network checked now, its subnetwork's region where a MIG uses it.
        checked_interfaces(ctx.world, project, None, props, "resource.properties")
        stored = {
            "description": body.get("description", ""),
            "properties": {"machineType": machine.name, **spec.body},
        }
        now = ctx.clock()
        with ctx.db.write() as conn:
            if store.row(conn, project, "global", store.TEMPLATES, name) is not None:
                raise already_exists(links.path(project, "global", store.TEMPLATES, name))
            rid = links.resource_id(ctx.world.seed, project, "global", name, now)
            store.insert(conn, project, "global", store.TEMPLATES, name, rid, now, stored)
            return self._quick_op(conn, project, "global", "insert", store.TEMPLATES, name, rid, now)

    def get_template(self, project: str, name: str) -> dict[str, Any]:
        with self.cc.ctx.db.read() as conn:
            row = self._existing(conn, project, "global", store.TEMPLATES, name)
            return {
                "kind": "compute#instanceTemplate",
                "id": row["id"],
                "creationTimestamp": links.timestamp(float(row["creation_time"])),
                "name": name,
                "selfLink": links.link(project, "global", store.TEMPLATES, name),
                **store.body(row),
            }

    def delete_template(self, project: str, name: str) -> dict[str, Any]:
        return self._delete_record(project, "global", store.TEMPLATES, name, "instanceTemplate")

    def _existing(
        self, conn: sqlite3.Connection, project: str, location: str, collection: str, name: str
    ) -> sqlite3.Row:
        row = store.row(conn, project, location, collection, name)
        if row is None:
            raise not_found(links.path(project, location, collection, name))
        return row

    def _delete_record(
        self, project: str, location: str, collection: str, name: str, used_as: str
    ) -> dict[str, Any]:
        """A policy or template goes, unless a MIG uses it (Compute's "already being used by")."""
        ctx = self.cc.ctx
        now = ctx.clock()
        with ctx.db.write() as conn:
            row = self._existing(conn, project, location, collection, name)
            for mig in store.rows(conn, project, None, store.MIGS):
                if links.short_name(str(store.extra(mig).get(used_as, ""))) == name:
                    kind = "resource_policy" if collection == store.POLICIES else "instance_template"
                    raise invalid(
                        f"The {kind} resource '{links.path(project, location, collection, name)}' is already "
                        f"being used by '{links.path(project, mig['location'], store.MIGS, mig['name'])}'"
                    )
            store.delete(conn, row)
            return self._quick_op(conn, project, location, "delete", collection, name, row["id"], now)

    # --- MIGs ------------------------------------------------------------------------------------

    def insert_mig(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        ctx, world = self.cc.ctx, self.cc.ctx.world
        check_zone(world, zone)
        now = ctx.clock()
        self.cc.timeline.advance(now)
        name = links.check_name(body.get("name"))
        base = links.check_name(body.get("baseInstanceName"), "resource.baseInstanceName")
        target_size = _int(body.get("targetSize", 0), "resource.targetSize")
        location = f"zones/{zone}"
        with ctx.db.write() as conn:
            if store.row(conn, project, location, store.MIGS, name) is not None:
                raise already_exists(links.path(project, location, store.MIGS, name))
            template, spec = self._template_of(conn, project, zone, body)
            policy, accel, hosts = self._gang_of(conn, project, zone, body, spec)
            _check_target(target_size, hosts, accel is not None)
            if spec.provisioning_model == "FLEX_START" and target_size:
                # A flex-start template makes a MIG at size 0, resized afterwards (inferred from the GPU
                # docs: docs/google-facts.md#flex-start). Text unc.
                raise invalid_field(
                    "resource.targetSize",
                    target_size,
                    "A managed instance group with a FLEX_START instance template must be created with "
                    "target size 0 and resized.",
                )
            if accel is None:
                accel = spec.machine.single_host_type()
            assert accel is not None
            rid = links.resource_id(world.seed, project, zone, name, now)
            kept: dict[str, Any] = {
                k: body[k]
                for k in ("description", "targetSizePolicy", "instanceLifecyclePolicy", "resourcePolicies")
                if k in body
            }
            extra: dict[str, Any] = {
                "instanceTemplate": template,
                "workloadPolicy": policy,
                "accel": accel.api_name,
                "hosts": hosts,
                "base": base,
                "target": target_size,
                "names": [],
                "pending": int(target_size > 0),
            }
            store.insert(
                conn,
                project,
                location,
                store.MIGS,
                name,
                rid,
                now,
                kept,
                node_id=store.mig_node_id(name),
                extra=extra,
            )
            self._try_create(conn, world, self._existing(conn, project, location, store.MIGS, name), now)
            answer = self._quick_op(conn, project, location, "insert", store.MIGS, name, rid, now)
        self.cc.timeline.advance()
        return answer

    def _template_of(
        self, conn: sqlite3.Connection, project: str, zone: str, body: dict[str, Any]
    ) -> tuple[str, InstanceSpec]:
        versions = body.get("versions") or []
        given = body.get("instanceTemplate") or (versions[0].get("instanceTemplate") if versions else None)
        if not given:
            raise invalid_field("resource.instanceTemplate", "", "An instance template must be specified.")
        if "/global/instanceTemplates/" not in f"/{given}":
            raise invalid_field("resource.instanceTemplate", given, "The URL is malformed.")
        row = self._existing(conn, project, "global", store.TEMPLATES, links.short_name(str(given)))
        props = store.body(row)["properties"]
        world = self.cc.ctx.world
        # The MIG's zone must create the template's machine type (a ct5lp template is refused here).
        machine = machine_in_zone(
            self.cc.ctx.catalog,
            world,
            zone,
            f"zones/{zone}/machineTypes/{props['machineType']}",
            "resource.instanceTemplate",
        )
        spec = parse_properties(world, props, machine, "resource.properties")
        spec.body["networkInterfaces"] = checked_interfaces(
            world, project, region_of(zone), props, "resource.properties"
        )
        return links.link(project, "global", store.TEMPLATES, row["name"]), spec

    def _gang_of(
        self, conn: sqlite3.Connection, project: str, zone: str, body: dict[str, Any], spec: InstanceSpec
    ) -> tuple[str | None, AcceleratorType | None, int]:
        """(workload policy link, slice type, hosts) of a MIG body
        (docs/google-facts.md#managed-instance-groups)."""
        given = (body.get("resourcePolicies") or {}).get("workloadPolicy")
        if not given:
            # Without a workload policy each VM is a slice of its own; this simulator makes such a MIG of
            # at most one VM (stricter than Google: a MIG with a single VM,
            # docs/google-facts.md#two-surfaces).
            return None, None, 1
        field = "resource.resourcePolicies.workloadPolicy"
        if "/resourcePolicies/" not in f"/{given}":
            raise invalid_field(field, given, "The URL is malformed.")  # a bare name (observed)
        region = str(given).split("/regions/")[-1].split("/")[0] if "/regions/" in f"/{given}" else ""
        if region != region_of(zone):
            raise invalid_field(
                field, given, f"The workload policy must be in the MIG's region '{region_of(zone)}'."
            )
        row = self._existing(conn, project, f"regions/{region}", store.POLICIES, links.short_name(str(given)))
        workload = store.body(row).get("workloadPolicy")
        if not isinstance(workload, dict):
            raise invalid_field(field, given, "The resource policy is not a workload policy.")
        mode = (body.get("targetSizePolicy") or {}).get("mode", "INDIVIDUAL")
        if mode != "BULK":
            raise invalid("MIGs with TPU accelerator topology require BULK mode in target size policy")
        topology = str(workload.get("acceleratorTopology") or "")
        accel = spec.machine.slice_type(topology)
        if accel is None:
            raise invalid_field(
                field,
                given,
                f"Accelerator topology '{topology}' is not supported by machine type '{spec.machine.name}'.",
            )
        link = links.link(project, "regions", region, store.POLICIES, row["name"])
        return link, accel, accel.chips // spec.machine.chips

    def _try_create(self, conn: sqlite3.Connection, world: World, mig: sqlite3.Row, now: float) -> None:
        """A MIG that wants its slice tries to make it: all its VMs at once (BULK), or none. On a
        stockout (or quota) it keeps trying, each instance CREATING with the error as its last attempt,
        and never becomes stable: an inference, unconfirmed (docs/google-facts.md#slice-readiness)."""
        extra = store.extra(mig)
        if not extra.get("pending") or store.node_of(conn, mig) is not None:
            return
        project, zone = mig["project"], store.zone_of(mig)
        template = self._existing(
            conn, project, "global", store.TEMPLATES, links.short_name(extra["instanceTemplate"])
        )
        props = store.body(template)["properties"]
        spec = self.cc.spec_of(
            world, {**props, "machineType": f"zones/{zone}/machineTypes/{props['machineType']}"}
        )
        accel = _accel(spec, extra["accel"])
        names = extra["names"] or _names(extra["base"], extra["hosts"])
        ids = [links.resource_id(world.seed, project, zone, n, now) for n in names]
        flex = spec.provisioning_model == "FLEX_START"
        instance_body = {
            "machineType": links.link(project, "zones", zone, "machineTypes", spec.machine.name),
            **spec.body,
        }
        if flex:
            self._ensure_pending(conn, mig, names, ids, instance_body, now)
        demand = quota.demand_of(spec.machine.generation, spec.capacity_class, zone, accel.chips)
        error = quota.check(conn, self.cc.ctx.catalog, world, project, demand)
        key = (project, zone, store.mig_node_id(mig["name"]))
        if error is None and not slices.place(
            conn, self.cc.capacity, world, key, accel, spec, names, ids, now
        ):
            error = self.cc.stockout(project, zone, spec.machine.name)
        if error is not None:
            store.update(
                conn, mig, extra={**extra, "names": names, "last_error": None if flex else error["errors"]}
            )
            return
        for worker, (name, rid) in enumerate(zip(names, ids, strict=True)):
            location = mig["location"]
            row = store.row(conn, project, location, store.INSTANCES, name)
            if row is not None:
                store.update(conn, row, status=None, node_id=key[2], worker=worker)
            else:
                store.insert(
                    conn,
                    project,
                    location,
                    store.INSTANCES,
                    name,
                    rid,
                    now,
                    {"name": name, **instance_body},
                    node_id=key[2],
                    worker=worker,
                    extra={"mig": mig["name"]},
                )
        store.update(conn, mig, extra={**extra, "names": names, "pending": 0, "last_error": None})

    def _ensure_pending(
        self,
        conn: sqlite3.Connection,
        mig: sqlite3.Row,
        names: list[str],
        ids: list[str],
        body: dict[str, Any],
        now: float,
    ) -> None:
        """A flex-start MIG's VMs exist, PENDING, while it waits for capacity
        (docs/google-facts.md#flex-start)."""
        for name, rid in zip(names, ids, strict=True):
            if store.row(conn, mig["project"], mig["location"], store.INSTANCES, name) is None:
                store.insert(
                    conn,
                    mig["project"],
                    mig["location"],
                    store.INSTANCES,
                    name,
                    rid,
                    now,
                    {"name": name, **body},
                    status="PENDING",
                    extra={"mig": mig["name"]},
                )

    def _advance(self, conn: sqlite3.Connection, world: World, now: float) -> None:
        for mig in conn.execute(
            "SELECT * FROM compute_resources WHERE collection = ?", (store.MIGS,)
        ).fetchall():
            extra = store.extra(mig)
            members = self._members(conn, mig)
            node = store.node_of(conn, mig)
            if extra.get("deleting"):
                if node is None:
                    for member in members:
                        store.delete(conn, member)
                    finish_op(conn, mig["project"], extra["deleting"], now)
                    store.delete(conn, mig)
                continue
            if node is None and extra["target"] and not extra.get("pending") and not members:
                # Its slice is gone (a member deleted, or preempted with DELETE): made again.
                store.update(conn, mig, extra={**extra, "pending": 1})
                mig = self._existing(conn, mig["project"], mig["location"], store.MIGS, mig["name"])
            self._try_create(conn, world, mig, now)

    def _members(self, conn: sqlite3.Connection, mig: sqlite3.Row) -> list[sqlite3.Row]:
        return [
            r
            for r in store.rows(conn, mig["project"], mig["location"], store.INSTANCES)
            if store.extra(r).get("mig") == mig["name"]
        ]

    def get_mig(self, project: str, zone: str, name: str) -> dict[str, Any]:
        check_zone(self.cc.ctx.world, zone)
        now = self.cc.ctx.clock()
        self.cc.timeline.advance(now)
        with self.cc.ctx.db.read() as conn:
            return self._mig_json(conn, self._existing(conn, project, f"zones/{zone}", store.MIGS, name), now)

    def list_migs(self, project: str, zone: str, page_size: int, token: str) -> dict[str, Any]:
        check_zone(self.cc.ctx.world, zone)
        now = self.cc.ctx.clock()
        self.cc.timeline.advance(now)
        with self.cc.ctx.db.read() as conn:
            items = [
                self._mig_json(conn, r, now) for r in store.rows(conn, project, f"zones/{zone}", store.MIGS)
            ]
        page, next_token = paginate(items, page_size, token)
        out: dict[str, Any] = {
            "kind": "compute#instanceGroupManagerList",
            "id": f"projects/{project}/zones/{zone}/instanceGroupManagers",
            "items": page,
            "selfLink": links.link(project, "zones", zone, store.MIGS),
        }
        if next_token:
            out["nextPageToken"] = next_token
        return out

    def aggregated_list_migs(self, project: str, query: listing.ListQuery) -> dict[str, Any]:
        """Every region and zone of the project (MIGs can be regional: Google lists both scopes), each
        with its MIGs or a NO_RESULTS_ON_PAGE warning. This simulator makes zonal MIGs only."""
        now = self.cc.ctx.clock()
        self.cc.timeline.advance(now)
        with self.cc.ctx.db.read() as conn:
            items = [
                (r["location"], self._mig_json(conn, r, now))
                for r in store.rows(conn, project, None, store.MIGS)
            ]
        world = self.cc.ctx.world
        return listing.aggregated(
            kind="compute#instanceGroupManagerAggregatedList",
            project=project,
            collection=store.MIGS,
            scopes=[*listing.region_scopes(world), *listing.zone_scopes(world)],
            items=items,
            query=query,
        )

    def _statuses(self, conn: sqlite3.Connection, mig: sqlite3.Row, now: float) -> dict[str, str]:
        """Each existing member's status, by name."""
        return {
            r["name"]: slices.instance_status(r, store.node_of(conn, r), now)
            for r in self._members(conn, mig)
        }

    def _mig_json(self, conn: sqlite3.Connection, mig: sqlite3.Row, now: float) -> dict[str, Any]:
        project, zone, name = mig["project"], store.zone_of(mig), mig["name"]
        extra = store.extra(mig)
        statuses = self._statuses(conn, mig, now)
        target = int(extra["target"])
        actions = _action_counts(extra, statuses, target)
        settled = all(s in ("RUNNING", "TERMINATED") for s in statuses.values())
        stable = (
            not extra.get("deleting") and not extra.get("pending") and len(statuses) == target and settled
        )
        counts = {
            k: 0
            for k in (
                "running",
                "provisioning",
                "staging",
                "pending",
                "stopping",
                "terminated",
                "nonExistent",
            )
        }
        for member_status in statuses.values():
            key = member_status.lower()
            if key in counts:
                counts[key] += 1
        counts["nonExistent"] = max(0, target - len(statuses))
        status: dict[str, Any] = {
            "isStable": stable,
            "currentInstanceStatuses": {k: v for k, v in counts.items() if v},
            "versionTarget": {"isReached": stable},
        }
        policy = extra.get("workloadPolicy")
        if policy and target:
            status["appliedAcceleratorTopologies"] = [
                {"acceleratorTopology": _accel_topology(extra), "state": _topology_state(statuses, target)}
            ]
        template = extra["instanceTemplate"]
        body = store.body(mig)
        return {
            "kind": "compute#instanceGroupManager",
            "id": mig["id"],
            "creationTimestamp": links.timestamp(float(mig["creation_time"])),
            "name": name,
            "zone": links.zone_link(project, zone),
            "selfLink": links.link(project, "zones", zone, store.MIGS, name),
            "instanceGroup": links.link(project, "zones", zone, "instanceGroups", name),
            "baseInstanceName": extra["base"],
            "instanceTemplate": template,
            "versions": [{"instanceTemplate": template}],
            "targetSize": target,
            "fingerprint": "c2ltLW1pZw==",
            "listManagedInstancesResults": "PAGELESS",
            **body,
            "targetSizePolicy": body.get("targetSizePolicy") or {"mode": "INDIVIDUAL"},
            "instanceLifecyclePolicy": {
                "defaultActionOnFailure": _on_failure(body),
                "forceUpdateOnRepair": "NO",
            },
            "currentActions": actions,
            "status": status,
        }

    def list_managed_instances(
        self, project: str, zone: str, name: str, page_size: int, token: str
    ) -> dict[str, Any]:
        check_zone(self.cc.ctx.world, zone)
        now = self.cc.ctx.clock()
        self.cc.timeline.advance(now)
        with self.cc.ctx.db.read() as conn:
            mig = self._existing(conn, project, f"zones/{zone}", store.MIGS, name)
            extra = store.extra(mig)
            rows = {r["name"]: r for r in self._members(conn, mig)}
            statuses = self._statuses(conn, mig, now)
            items = []
            for member in extra["names"] or []:
                item: dict[str, Any] = {
                    "name": member,
                    "instance": links.link(project, "zones", zone, "instances", member),
                    "targetStatus": "RUNNING",
                    "version": {"instanceTemplate": extra["instanceTemplate"]},
                }
                status = statuses.get(member)
                if member in rows:
                    item["id"] = rows[member]["id"]
                    item["instanceStatus"] = status
                item["currentAction"] = _action(extra, status)
                if extra.get("last_error") and member not in rows:
                    item["lastAttempt"] = {"errors": {"errors": extra["last_error"]}}
                items.append(item)
        page, next_token = paginate(items, page_size, token)
        out: dict[str, Any] = {"managedInstances": page}
        if next_token:
            out["nextPageToken"] = next_token
        return out

    def resize(self, project: str, zone: str, name: str, size_text: str) -> dict[str, Any]:
        ctx, world = self.cc.ctx, self.cc.ctx.world
        check_zone(world, zone)
        size = _int(size_text, "size")
        now = ctx.clock()
        self.cc.timeline.advance(now)
        location = f"zones/{zone}"
        with ctx.db.write() as conn:
            mig = self._existing(conn, project, location, store.MIGS, name)
            extra = store.extra(mig)
            _check_target(size, int(extra["hosts"]), bool(extra.get("workloadPolicy")))
            if size and not extra["target"]:
                store.update(conn, mig, extra={**extra, "target": size, "pending": 1, "names": []})
                self._try_create(conn, world, self._existing(conn, project, location, store.MIGS, name), now)
            elif not size and extra["target"]:
                self._tear_down(conn, world, mig, extra, now)
                store.update(
                    conn, mig, extra={**extra, "target": 0, "pending": 0, "names": [], "last_error": None}
                )
            answer = self._quick_op(conn, project, location, "resize", store.MIGS, name, mig["id"], now)
        self.cc.timeline.advance()
        return answer

    def _tear_down(
        self, conn: sqlite3.Connection, world: World, mig: sqlite3.Row, extra: dict[str, Any], now: float
    ) -> None:
        node = store.node_of(conn, mig)
        if node is not None:
            self.cc.start_node_delete(conn, world, node, now)
        for member in self._members(conn, mig):
            if member["node_id"] is None:
                store.delete(conn, member)  # a PENDING flex-start VM: nothing to take down
            else:
                store.update(conn, member, status=None)

    def delete_mig(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """The MIG goes with its instances (docs/google-facts.md#managed-instance-groups): DONE once the
        slice's VMs are gone."""
        ctx, world = self.cc.ctx, self.cc.ctx.world
        check_zone(world, zone)
        now = ctx.clock()
        self.cc.timeline.advance(now)
        location = f"zones/{zone}"
        with ctx.db.write() as conn:
            mig = self._existing(conn, project, location, store.MIGS, name)
            extra = store.extra(mig)
            if extra.get("deleting"):
                return op_json_of(conn, project, extra["deleting"])
            target = links.link(project, "zones", zone, store.MIGS, name)
            op = insert_op(
                conn, project, location, "compute.instanceGroupManagers.delete", target, mig["id"], now
            )
            self._tear_down(conn, world, mig, extra, now)
            store.update(conn, mig, extra={**extra, "deleting": op, "pending": 0})
            answer = op_json_of(conn, project, op)
        self.cc.timeline.advance()
        return answer

    def insert_resize_request(self, project: str, zone: str, name: str) -> dict[str, Any]:
        check_zone(self.cc.ctx.world, zone)
        with self.cc.ctx.db.read() as conn:
            self._existing(conn, project, f"zones/{zone}", store.MIGS, name)
        # Every MIG here is a TPU MIG (docs/google-facts.md#flex-start; whether this is permanent is unc.).
        raise invalid("Creating resize requests for managed instance group with TPU is not allowed")


def _workload_policy(policy: Any) -> dict[str, Any]:
    field = "resource.workloadPolicy"
    if not isinstance(policy, dict):
        raise invalid_field(field, policy, "Must be an object.")
    if policy.get("type") not in ("HIGH_AVAILABILITY", "HIGH_THROUGHPUT"):
        raise invalid_field(
            f"{field}.type", policy.get("type", ""), "Must be HIGH_AVAILABILITY or HIGH_THROUGHPUT."
        )
    topology = policy.get("acceleratorTopology")
    if topology is not None and policy.get("maxTopologyDistance") is not None:
        # Mutually exclusive (docs/google-facts.md#workload-policies).
        raise invalid_field(
            f"{field}.maxTopologyDistance",
            policy["maxTopologyDistance"],
            "Cannot be set with acceleratorTopology.",
        )
    if topology is not None and not _TOPOLOGY_RE.match(str(topology)):
        raise invalid_field(
            f"{field}.acceleratorTopology", topology, "An accelerator topology looks like 2x2x4."
        )
    return dict(policy)


def _int(value: Any, field: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise invalid_field(field, value, "Must be an integer.") from None
    if number < 0:
        raise invalid_field(field, value, "Must be at least 0.")
    return number


def _check_target(size: int, hosts: int, gang: bool) -> None:
    """A TPU topology MIG is a gang: its size is the slice's host count, or 0 (flex-start;
    docs/google-facts.md#managed-instance-groups)."""
    if size not in (0, hosts):
        if gang:
            raise invalid(
                f"Requested invalid target size '{size}' for a Managed Instance Group in the gang mode "
                f"of size '{hosts}'. Should be equal to the gang size."
            )
        raise invalid_field(
            "resource.targetSize", size, "A TPU MIG without a workload policy holds at most one VM here."
        )


def _names(base: str, count: int) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        names.add(f"{base}-{''.join(secrets.choice(_SUFFIX) for _ in range(4))}")
    return sorted(names)


def _accel(spec: InstanceSpec, api_name: str) -> AcceleratorType:
    size = int(api_name.rsplit("-", 1)[1])
    return AcceleratorType(generation=spec.machine.generation, size=size)


def _accel_topology(extra: dict[str, Any]) -> str:
    from tpuctl.catalog import Catalog

    prefix, size = extra["accel"].rsplit("-", 1)
    gen = next(g for g in Catalog.load().generations.values() if g.api_prefix == prefix)
    return dict(gen.sizes)[int(size)]


def _on_failure(body: dict[str, Any]) -> str:
    return str((body.get("instanceLifecyclePolicy") or {}).get("defaultActionOnFailure") or "REPAIR")


def _action(extra: dict[str, Any], status: str | None) -> str:
    if extra.get("deleting") or status == "STOPPING":
        return "DELETING"
    if status in ("RUNNING", "TERMINATED"):
        return "NONE"
    return "CREATING"


def _action_counts(extra: dict[str, Any], statuses: dict[str, str], target: int) -> dict[str, int]:
    counts = {
        k: 0
        for k in (
            "none",
            "creating",
            "creatingWithoutRetries",
            "recreating",
            "deleting",
            "abandoning",
            "restarting",
            "refreshing",
            "verifying",
            "starting",
            "stopping",
            "suspending",
            "resuming",
        )
    }
    names = extra.get("names") or []
    for name in names:
        key = _action(extra, statuses.get(name)).lower()
        counts[key] = counts.get(key, 0) + 1
    return counts


def _topology_state(statuses: dict[str, str], target: int) -> str:
    """ACTIVATING until every VM runs, then ACTIVE; INCOMPLETE ("insufficient number of running VMs")
    once one is lost (inferred: docs/google-facts.md#slice-readiness)."""
    running = sum(s == "RUNNING" for s in statuses.values())
    if running == target and len(statuses) == target:
        return "ACTIVE"
    if any(s in ("TERMINATED", "STOPPING") for s in statuses.values()):
        return "INCOMPLETE"
    return "ACTIVATING"


def _policy_json(project: str, region: str, row: sqlite3.Row) -> dict[str, Any]:
    """A resource policy as resourcePolicies.get and .list answer it."""
    return {
        "kind": "compute#resourcePolicy",
        "id": row["id"],
        "creationTimestamp": links.timestamp(float(row["creation_time"])),
        "name": row["name"],
        "region": links.region_link(project, region),
        "selfLink": links.link(project, "regions", region, store.POLICIES, row["name"]),
        "status": "READY",
        **store.body(row),
    }
