"""General-purpose VMs on the simulated Compute Engine (E2: what the team server runs on): listed by
``machineTypes.list`` in every zone, created by ``instances.insert`` as one simulated host with its sshd and
metadata server, like a TPU VM's, but with no accelerator and no TPU attributes in its metadata.

Their node rows are marked ``surface = 'vm'``: no TPU capacity pool, TPU quota or TPU listing counts them.
Checked as Google checks (docs/google-facts.md#server-vm, #instance-requests): a boot disk and a network
interface are required; ``guestAccelerators`` are refused (E2 takes none); a spot VM must not
live-migrate or restart itself. Where the simulator is kinder than Google, said plainly: no vCPU quota
(``CPUS``, ``E2_CPUS``) is counted, and only a zone-wide stockout (the admin API's) stops an insert.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from tpuctl.sim.compute import links, store
from tpuctl.sim.compute.context import ComputeContext
from tpuctl.sim.compute.errors import already_exists, invalid_field
from tpuctl.sim.compute.networking import checked_interfaces
from tpuctl.sim.compute.operations import insert_op, op_json_of
from tpuctl.sim.engine.capacity import is_stocked_out
from tpuctl.sim.engine.records import insert_vm_node
from tpuctl.sim.world import region_of

SURFACE = "vm"
_KEPT = ("description", "labels", "serviceAccounts", "tags", "disks", "canIpForward", "deletionProtection")


@dataclass(frozen=True)
class GeneralMachine:
    name: str
    vcpus: int
    memory_gb: int
    shared_core: bool

    @property
    def family(self) -> str:
        return self.name.split("-", 1)[0]


@functools.cache
def general_machines() -> dict[str, GeneralMachine]:
    """The general-purpose types the catalog knows (``tpuctl/catalog/data/server_vm_prices.yaml``)."""
    from tpuctl.catalog.server_vm_prices import general_machine_types

    return {
        name: GeneralMachine(name, int(m["vcpus"]), int(m["memory_gb"]), bool(m["shared_core"]))
        for name, m in general_machine_types().items()
    }


def general_machine_of(given: Any) -> GeneralMachine | None:
    """The general-purpose type an instance's ``machineType`` names, None for any other."""
    return general_machines().get(links.short_name(str(given or "")))


def machine_type_json(project: str, zone: str, machine: GeneralMachine) -> dict[str, Any]:
    shared = " (shared physical core)" if machine.shared_core else ""
    return {
        "kind": "compute#machineType",
        "id": links.resource_id("machineType", machine.name),
        "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
        "name": machine.name,
        "description": f"{machine.name.split('-', 1)[1].title()} machine type with {machine.vcpus} vCPUs, "
        f"{machine.memory_gb} GB of memory{shared}",
        "guestCpus": machine.vcpus,
        "memoryMb": machine.memory_gb * 1024,
        "maximumPersistentDisks": 16 if machine.shared_core else 128,
        "maximumPersistentDisksSizeGb": "3072" if machine.shared_core else "263168",
        "zone": zone,
        "selfLink": links.link(project, "zones", zone, "machineTypes", machine.name),
        "isSharedCpu": machine.shared_core,
        "architecture": "X86_64",
    }


def insert(
    cc: ComputeContext, project: str, zone: str, body: dict[str, Any], machine: GeneralMachine
) -> dict[str, Any]:
    """``instances.insert`` of a general-purpose VM: its operation, DONE when the VM is RUNNING."""
    ctx, world = cc.ctx, cc.ctx.world
    now = ctx.clock()
    cc.timeline.advance(now)
    name = links.check_name(body.get("name"))
    url_zone = str(body.get("machineType", "")).split("/machineTypes/")[0].rsplit("/", 1)[-1]
    if url_zone != zone:
        raise invalid_field(
            "resource.machineType",
            body.get("machineType"),
            f"Machine type with name '{machine.name}' does not exist in zone '{zone}'.",
        )
    stored, metadata, model = _properties(body, machine)
    stored["networkInterfaces"] = checked_interfaces(world, project, region_of(zone), body, "resource")
    location = f"zones/{zone}"
    target = links.link(project, "zones", zone, "instances", name)
    with ctx.db.write() as conn:
        if store.row(conn, project, location, store.INSTANCES, name) is not None:
            raise already_exists(links.path(project, "zones", zone, "instances", name))
        rid = links.resource_id(world.seed, project, zone, name, now)
        stored = {
            "name": name,
            "machineType": links.link(project, "zones", zone, "machineTypes", machine.name),
            **stored,
        }
        if is_stocked_out(conn, zone):
            due = now + world.real_seconds(world.durations.stockout_s)
            error = cc.stockout(project, zone, machine.name)
            op = insert_op(conn, project, location, "insert", target, rid, now, done_at=due, error=error)
            return op_json_of(conn, project, op)
        node_id = store.instance_node_id(name)
        spec_json: dict[str, Any] = {
            "metadata": metadata,
            "compute": {
                "names": [name],
                "ids": [rid],
                "provisioning_model": model,
                "machine_type": machine.name,
            },
        }
        account = _service_account(stored)
        if account is not None:
            spec_json["serviceAccount"] = {"email": account}
        capacity_class = "preemptible" if model == "SPOT" else "on_demand"
        due = now + world.real_seconds(world.durations.node_create_s)
        insert_vm_node(
            conn,
            world.seed,
            (project, zone, node_id),
            machine.name,
            machine.family,
            capacity_class,
            spec_json,
            now,
            due,
        )
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
            node_id=node_id,
            worker=0,
            op_name=op,
        )
        answer = op_json_of(conn, project, op)
    cc.timeline.advance()
    return answer


def _properties(body: dict[str, Any], machine: GeneralMachine) -> tuple[dict[str, Any], dict[str, str], str]:
    """The fields kept, the metadata, the provisioning model; 400 for what Google refuses."""
    if body.get("guestAccelerators"):
        # E2 takes no accelerator (docs/google-facts.md#server-vm); the text is the simulator's (unc.).
        raise invalid_field(
            "resource.guestAccelerators",
            body["guestAccelerators"],
            f"Machine type '{machine.name}' does not support accelerators.",
        )
    disks = body.get("disks")
    if not isinstance(disks, list) or not any(isinstance(d, dict) and d.get("boot") for d in disks):
        raise invalid_field("resource.disks", disks or "", "Boot disk must be specified.")
    if not isinstance(body.get("networkInterfaces"), list) or not body["networkInterfaces"]:
        raise invalid_field("resource.networkInterfaces", "", "At least one network interface is required.")
    scheduling = dict(body.get("scheduling") or {})
    model = str(
        scheduling.get("provisioningModel") or ("SPOT" if scheduling.get("preemptible") else "STANDARD")
    )
    if model not in ("STANDARD", "SPOT"):
        # Flex-start and reservation-bound E2 VMs: not simulated, refused (stricter than Google).
        raise invalid_field(
            "resource.scheduling.provisioningModel",
            model,
            "Unsupported provisioning model for this machine type.",
        )
    preemptible = model == "SPOT"
    on_host = str(scheduling.get("onHostMaintenance") or ("TERMINATE" if preemptible else "MIGRATE"))
    if preemptible and on_host != "TERMINATE":
        raise invalid_field(
            "resource.scheduling.onHostMaintenance",
            on_host,
            "Scheduling must have preemptible be false when OnHostMaintenance isn't TERMINATE.",
        )
    restart = bool(scheduling.get("automaticRestart", not preemptible))
    if preemptible and restart:
        raise invalid_field(
            "resource.scheduling.automaticRestart",
            True,
            "Scheduling must have preemptible be false when AutomaticRestart is true.",
        )
    scheduling.update(
        {
            "provisioningModel": model,
            "onHostMaintenance": on_host,
            "automaticRestart": restart,
            "preemptible": preemptible,
        }
    )
    items = (body.get("metadata") or {}).get("items") or []
    metadata = {str(i["key"]): str(i.get("value", "")) for i in items if isinstance(i, dict) and "key" in i}
    stored = {k: body[k] for k in _KEPT if k in body}
    stored["scheduling"] = scheduling
    stored["metadata"] = {"kind": "compute#metadata", **({"items": items} if items else {})}
    return stored, metadata, model


def _service_account(body: dict[str, Any]) -> str | None:
    accounts = body.get("serviceAccounts") or []
    email = accounts[0].get("email") if accounts and isinstance(accounts[0], dict) else None
    return str(email) if email and email != "default" else None


def metadata_values(row: Any, base: dict[str, str]) -> dict[str, str]:
    """What a general-purpose VM's metadata server answers: ``base`` (every simulated VM's keys, its
    service account's token among them) as this instance's, its own metadata as attributes, and no TPU
    attribute."""
    import json

    spec = json.loads(row["spec"])
    compute = spec["compute"]
    name = compute["names"][0]
    project, zone = row["project"], row["zone"]
    values = {k: v for k, v in base.items() if not k.startswith("instance/attributes/")}
    values.update(
        {
            "instance/name": name,
            "instance/hostname": f"{name}.{zone}.c.{project}.internal",
            "instance/id": compute["ids"][0],
            "instance/machine-type": f"projects/{project}/machineTypes/{compute['machine_type']}",
            "instance/scheduling/preemptible": "TRUE" if compute["provisioning_model"] == "SPOT" else "FALSE",
            "instance/scheduling/provisioning-model": compute["provisioning_model"],
        }
    )
    for key, value in (spec.get("metadata") or {}).items():
        values[f"instance/attributes/{key}"] = str(value)
    return values
