"""A Compute Engine slice's node row (placed on the engine's capacity, marked ``surface = 'compute'``),
and its instances as Compute's Instance JSON."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from tpuctl.catalog import AcceleratorType
from tpuctl.sim.compute import links, store
from tpuctl.sim.compute.specs import InstanceSpec
from tpuctl.sim.engine.capacity import Capacity
from tpuctl.sim.engine.plans import NodePlan
from tpuctl.sim.engine.records import host_addresses, insert_node
from tpuctl.sim.vpc import full_paths
from tpuctl.sim.world import World


def place(
    conn: sqlite3.Connection,
    capacity: Capacity,
    world: World,
    key: tuple[str, str, str],
    accel: AcceleratorType,
    spec: InstanceSpec,
    names: list[str],
    ids: list[str],
    now: float,
) -> bool:
    """Take capacity for a slice of ``len(names)`` VMs and write its node row (CREATING, RUNNING after the
    world's node_create_s), or False when the pool (or reservation) has no room for all of it."""
    project, zone, node_id = key
    spec_json = {
        "metadata": spec.metadata,  # what the hosts' sshd reads ssh-keys from, as for TPU API nodes
        "compute": {
            "names": names,
            "ids": ids,
            "provisioning_model": spec.provisioning_model,
            "machine_type": spec.machine.name,
        },
    }
    account = _service_account(spec.body)
    if account is not None:
        spec_json["serviceAccount"] = {"email": account}  # the hosts' account, as a TPU API node's
    plan = NodePlan(node_id, accel, spec.capacity_class, spec.reservation, spec_json)
    placement = capacity.place(conn, world, zone, [plan])
    if placement is None:
        return False
    due = now + world.real_seconds(world.durations.node_create_s)
    insert_node(
        conn,
        world.seed,
        project,
        zone,
        plan,
        placement[0],
        now,
        due,
        op_name=None,
        hosts=len(names),
        surface="compute",
    )
    return True


def instance_status(inst: sqlite3.Row, node: sqlite3.Row | None, now: float) -> str:
    """An instance's status: its own (PENDING, TERMINATED) or its slice's node row's, seen the Compute
    Engine way: PROVISIONING, then STAGING for the second half of node_create_s (flex-start: PENDING ->
    STAGING -> RUNNING, docs/google-facts.md#instance-status), RUNNING; STOPPING in a preemption's grace or
    while deleting."""
    if inst["status"]:
        return str(inst["status"])
    if node is None:
        return "STOPPING"
    state = node["state"]
    if state == "CREATING":
        flex = json.loads(node["spec"])["compute"]["provisioning_model"] == "FLEX_START"
        created, due = float(node["create_time"]), float(node["due_at"] or node["create_time"])
        return "STAGING" if flex or now >= created + (due - created) / 2 else "PROVISIONING"
    if state == "READY":
        return "STOPPING" if node["kill_at"] is not None else "RUNNING"
    if state in ("PREEMPTED", "TERMINATED"):  # TERMINATED: stopped by a host maintenance
        return "TERMINATED"
    return "STOPPING"


def instance_json(inst: sqlite3.Row, node: sqlite3.Row | None, now: float) -> dict[str, Any]:
    """An instance row as Compute's Instance."""
    project, zone, name = inst["project"], store.zone_of(inst), inst["name"]
    body = store.body(inst)
    status = instance_status(inst, node, now)
    address = None
    if node is not None and node["host_base"] is not None:
        address = host_addresses(node)[int(inst["worker"] or 0)]
    live = status in ("STAGING", "RUNNING", "STOPPING")
    out: dict[str, Any] = {
        "kind": "compute#instance",
        "id": inst["id"],
        "creationTimestamp": links.timestamp(float(inst["creation_time"])),
        "name": name,
        **{k: v for k, v in body.items() if k not in ("networkInterfaces", "disks", "name")},
        "status": status,
        "zone": links.zone_link(project, zone),
        "selfLink": links.link(project, "zones", zone, "instances", name),
        "canIpForward": bool(body.get("canIpForward", False)),
        "deletionProtection": bool(body.get("deletionProtection", False)),
        "startRestricted": False,
        "cpuPlatform": "AMD Genoa" if live else "Unknown CPU Platform",
        "fingerprint": _fingerprint(inst, status),
        "labelFingerprint": _fingerprint(inst, json.dumps(body.get("labels") or {})),
        "networkInterfaces": _nics(project, zone, body.get("networkInterfaces") or [], address, live),
        "disks": _disks(project, zone, name, body.get("disks") or []),
    }
    extra = store.extra(inst)
    if node is not None and node["ready_time"] is not None:
        out["lastStartTimestamp"] = links.timestamp(float(node["ready_time"]))
    if extra.get("last_stop") is not None:
        out["lastStopTimestamp"] = links.timestamp(float(extra["last_stop"]))
    return out


def _fingerprint(inst: sqlite3.Row, salt: str) -> str:
    from tpuctl.sim.compute.specs import fingerprint

    return fingerprint((inst["id"], salt))


def _nics(
    project: str, zone: str, given: list[dict[str, Any]], address: str | None, live: bool
) -> list[dict[str, Any]]:
    """The network interfaces: nic0's networkIP is the host's own loopback address; an accessConfig's
    natIP (the same address, the only one there is) only where the request asked for one and the VM
    runs (an ephemeral external IP goes with a stopped VM)."""
    out: list[dict[str, Any]] = []
    for index, nic in enumerate(given):
        paths = full_paths(project, zone, nic.get("network"), nic.get("subnetwork"))
        item: dict[str, Any] = {
            "kind": "compute#networkInterface",
            "name": f"nic{index}",
            "network": links.BASE + paths["network"],
            "subnetwork": links.BASE + paths["subnetwork"],
            "fingerprint": "c2ltLW5pYw==",
            "stackType": str(nic.get("stackType") or "IPV4_ONLY"),
        }
        if nic.get("nicType"):
            item["nicType"] = nic["nicType"]
        if index == 0 and address is not None:
            item["networkIP"] = address
        if nic.get("accessConfigs"):
            item["accessConfigs"] = [
                {
                    "kind": "compute#accessConfig",
                    "type": str(ac.get("type") or "ONE_TO_ONE_NAT"),
                    "name": str(ac.get("name") or "External NAT"),
                    "networkTier": str(ac.get("networkTier") or "PREMIUM"),
                    **({"natIP": address} if index == 0 and live and address is not None else {}),
                }
                for ac in nic["accessConfigs"]
            ]
        out.append(item)
    return out


def _disks(project: str, zone: str, name: str, given: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index, disk in enumerate(given):
        params = disk.get("initializeParams") or {}
        disk_name = params.get("diskName") or (name if index == 0 else f"{name}-{index}")
        out.append(
            {
                "kind": "compute#attachedDisk",
                "type": str(disk.get("type") or "PERSISTENT"),
                "mode": str(disk.get("mode") or "READ_WRITE"),
                "source": links.link(project, "zones", zone, "disks", disk_name),
                "deviceName": str(disk.get("deviceName") or f"persistent-disk-{index}"),
                "index": index,
                "boot": bool(disk.get("boot", False)),
                "autoDelete": bool(disk.get("autoDelete", False)),
                "interface": str(disk.get("interface") or "NVME"),
                # 10 GB when not given: the CE image's default boot disk (docs/google-facts.md#images).
                "diskSizeGb": str(params.get("diskSizeGb") or 10),
                "architecture": "X86_64",
            }
        )
    return out


def _service_account(body: dict[str, Any]) -> str | None:
    """The account an instance's ``serviceAccounts`` names, None for the project's default (``default``
    or none given)."""
    accounts = body.get("serviceAccounts") or []
    email = accounts[0].get("email") if accounts and isinstance(accounts[0], dict) else None
    return str(email) if email and email != "default" else None
