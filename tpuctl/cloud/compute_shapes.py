"""Compute Engine TPU slices as JSON: the request bodies tpuctl sends, and the ``Node`` a slice reads as.

Pure functions over the REST JSON form (camelCase, int64 as strings), the form Google's documentation, the
discovery document and ``--dry-run`` use; ``tpuctl.cloud.compute`` converts to and from the client
library's messages at its edge. The facts about Google these rely on, with their sources:
``docs/google-facts.md`` (cited by section, as ``docs/google-facts.md#flex-start``).

A tpuctl slice on Compute Engine is named once and that name is used for everything it is made of:

* one host: the instance ``NAME``;
* several hosts: the regional workload policy ``NAME`` (the topology), the global instance template
  ``NAME`` and the zonal MIG ``NAME``, whose instances are ``NAME-xxxx``
  (docs/google-facts.md#workload-policies and the two sections after it).

Every instance of a slice carries the label ``tpuctl-slice: NAME``; a MIG (which has no labels) keeps the
slice's type, capacity and labels in its description, as JSON, so a slice whose VMs do not exist yet
(being created, or out of stock) still reads as a tpuctl slice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from tpuctl.catalog import AcceleratorType, CapacityType, Surface, region_of_zone
from tpuctl.cloud.base import CLOUD_PLATFORM_SCOPE, NetworkEndpoint, Node, NodeRequest
from tpuctl.timefmt import iso

LABEL_SLICE = "tpuctl-slice"
#: The CE TPU image's default boot disk is 10 GB (docs/google-facts.md#images): too small for a run's
#: environment.
BOOT_DISK_GB = 100
#: The metadata key that turns a VM's guest attributes on (docs/google-facts.md#guest-attributes).
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"
#: A description starting with this holds the slice's JSON (MIGs have no labels).
_DESCRIPTION_PREFIX = "tpuctl-slice "

#: Instance.status -> the Node state the services know (the TPU API's vocabulary). TERMINATED is a
#: stopped VM; a spot or flex-start one tpuctl did not stop was preempted (``node_state``).
_STATE_OF_STATUS = {
    "PROVISIONING": "CREATING",
    "STAGING": "CREATING",
    "PENDING": "CREATING",  # flex-start: waiting for capacity (docs/google-facts.md#instance-status)
    "RUNNING": "READY",
    "STOPPING": "STOPPING",
    "PENDING_STOP": "STOPPING",
    "SUSPENDING": "STOPPING",
    "SUSPENDED": "STOPPED",
    "STOPPED": "STOPPED",
    "REPAIRING": "REPAIRING",
    "DEPROVISIONING": "DELETING",
}
_PROVISIONING_MODEL = {
    CapacityType.ON_DEMAND: "STANDARD",
    # Compute Engine's legacy `preemptible` is Spot's predecessor: tpuctl asks for Spot for both.
    CapacityType.SPOT: "SPOT",
    CapacityType.PREEMPTIBLE: "SPOT",
    CapacityType.RESERVED: "RESERVATION_BOUND",
}
_CAPACITY_OF_MODEL = {
    "STANDARD": CapacityType.ON_DEMAND,
    "SPOT": CapacityType.SPOT,
    "RESERVATION_BOUND": CapacityType.RESERVED,
    # Flex-start spends preemptible quota and is time-limited (docs/google-facts.md#provisioning-models):
    # tpuctl's preemptible class.
    "FLEX_START": CapacityType.PREEMPTIBLE,
}
#: Flex-start's wait for capacity (``params.requestValidForDuration``) is capped at 2 h
#: (docs/google-facts.md#flex-start).
FLEX_VALID_FOR_MAX_S = 7200
#: Flex-start requires ``maxRunDuration``, 10 min to 7 days (docs/google-facts.md#flex-start). tpuctl does
#: not know how long a run takes, so it asks for the longest (unc.: whether a longer request waits longer for
#: capacity).
FLEX_MAX_RUN_S = 7 * 86400


def scheduling(capacity: CapacityType, terminate_at: float | None = None) -> dict[str, Any]:
    """TPU VMs cannot live-migrate (docs/google-facts.md#instance-requests): TERMINATE on host maintenance,
    never restarted by Compute Engine behind tpuctl's back. A preempted spot VM is STOPPED (the API's default
    action), not deleted, so that it stays visible as preempted until tpuctl deletes it, as a TPU API node
    does.

    ``terminate_at`` (a run's backstop, docs/google-facts.md#backstop): Compute Engine itself deletes the VM
    at that moment (``terminationTime``), whatever tpuctl does. Not on spot: one termination action serves
    both a spot VM's preemption and its time limit, and STOP (which keeps preemptions visible) would only
    stop it; the run's deadman keeps the deadline there."""
    out: dict[str, Any] = {
        "provisioningModel": _PROVISIONING_MODEL[capacity],
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    if capacity.is_preemptible:
        out["instanceTerminationAction"] = "STOP"
    elif terminate_at is not None:
        out["terminationTime"] = iso(terminate_at)
        out["instanceTerminationAction"] = "DELETE"
    return out


def flex_scheduling() -> dict[str, Any]:
    """Flex-start (docs/google-facts.md#flex-start): a limited runtime, deleted at its end (the documented
    flows all pass DELETE), never live-migrated or restarted."""
    return {
        "provisioningModel": "FLEX_START",
        "maxRunDuration": {"seconds": str(FLEX_MAX_RUN_S)},
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }


def instance_properties(
    request: NodeRequest, accel: AcceleratorType, *, zone: str, project: str
) -> dict[str, Any]:
    """What an instance (or a template's ``properties``) of the slice is made of
    (docs/google-facts.md#instance-requests)."""
    compute = accel.generation.compute
    if compute is None or accel.machine_type is None:
        raise ValueError(f"{accel.friendly_name} has no Compute Engine machine type")
    props: dict[str, Any] = {
        "machineType": accel.machine_type,
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {"sourceImage": compute.source_image, "diskSizeGb": str(BOOT_DISK_GB)},
            }
        ],
        "networkInterfaces": [_network_interface(request, zone=zone, project=project)],
        # A Compute Engine TPU VM's scopes are not defaulted to cloud-platform (docs/google-facts.md#images),
        # unlike the TPU API's: the hosts need it for the run's bucket and the rest of Google Cloud.
        "serviceAccounts": [
            {"email": request.service_account or "default", "scopes": [CLOUD_PLATFORM_SCOPE]}
        ],
        "scheduling": flex_scheduling()
        if request.flex_valid_for_s is not None
        else scheduling(request.capacity),
        "labels": {**request.labels, LABEL_SLICE: request.name},
        "metadata": {"items": _metadata_items(request.metadata)},
    }
    if request.network.tags:
        props["tags"] = {"items": list(request.network.tags)}
    if request.description:
        props["description"] = request.description
    if request.capacity is CapacityType.RESERVED and request.reservation:
        props["reservationAffinity"] = {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [_reservation_path(request.reservation, project)],
        }
    return props


def instance_body(request: NodeRequest, accel: AcceleratorType, *, project: str) -> dict[str, Any]:
    """``instances.insert`` of a one-host slice: the machine type is zonal there."""
    props = instance_properties(request, accel, zone=request.zone, project=project)
    props["machineType"] = f"zones/{request.zone}/machineTypes/{props['machineType']}"
    if request.terminate_at is not None and request.flex_valid_for_s is None:
        # A one-host slice only: whether a TPU MIG makes a VM its time limit deleted again is unc., so a
        # multi-host slice's deadline is the deadman's. Flex-start keeps its required maxRunDuration
        # alone (terminationTime is its alternative; unc. whether both are taken).
        props["scheduling"] = scheduling(request.capacity, request.terminate_at)
    body: dict[str, Any] = {"name": request.name, **props}
    if request.flex_valid_for_s is not None:
        # Input-only: how long the insert waits PENDING for capacity before it fails
        # (docs/google-facts.md#flex-start).
        seconds = flex_valid_for_seconds(request.flex_valid_for_s)
        body["params"] = {"requestValidForDuration": {"seconds": str(seconds)}}
    return body


def flex_valid_for_seconds(valid_for_s: float) -> int:
    """Whole seconds, at least 1; above the API's 2 h cap is refused where the request is built."""
    return max(1, math.ceil(valid_for_s))


def workload_policy_body(name: str, topology: str) -> dict[str, Any]:
    """The multi-host slice's topology (docs/google-facts.md#workload-policies): required for a TPU MIG of
    several hosts."""
    return {"name": name, "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": topology}}


def template_body(request: NodeRequest, accel: AcceleratorType, *, project: str) -> dict[str, Any]:
    props = instance_properties(request, accel, zone=request.zone, project=project)
    return {"name": request.name, "properties": props}


def mig_body(
    request: NodeRequest, accel: AcceleratorType, *, template_url: str, policy_url: str
) -> dict[str, Any]:
    """A BULK MIG of all the slice's hosts at once; DO_NOTHING, so that Compute Engine does not repair one VM
    of a slice (the topology needs all of them, docs/google-facts.md#losing-a-host): tpuctl recovers the
    slice. Flex-start: created at size 0 and resized to the host count afterwards
    (docs/google-facts.md#flex-start: a FLEX_START template cannot make a MIG of non-zero size, and resize
    requests are refused for TPU MIGs)."""
    return {
        "name": request.name,
        "baseInstanceName": request.name,
        "description": slice_description(request, accel),
        "versions": [{"instanceTemplate": template_url}],
        "targetSize": 0 if request.flex_valid_for_s is not None else accel.hosts,
        "targetSizePolicy": {"mode": "BULK"},
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
        "resourcePolicies": {"workloadPolicy": policy_url},
    }


def slice_description(request: NodeRequest, accel: AcceleratorType) -> str:
    meta = {
        "accelerator_type": accel.api_name,
        "capacity": request.capacity.value,
        "labels": {**request.labels, LABEL_SLICE: request.name},
    }
    return _DESCRIPTION_PREFIX + json.dumps(meta, sort_keys=True, separators=(",", ":"))


def parse_slice_description(text: str) -> dict[str, Any] | None:
    if not text.startswith(_DESCRIPTION_PREFIX):
        return None
    try:
        meta = json.loads(text[len(_DESCRIPTION_PREFIX) :])
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def _metadata_items(metadata: Mapping[str, str]) -> list[dict[str, str]]:
    """The request's metadata with guest attributes on: a Compute Engine VM publishes its SSH host keys
    only then (docs/google-facts.md#guest-attributes), and tpuctl connects to no host whose key it has
    not read from there."""
    merged = {**metadata, GUEST_ATTRIBUTES_KEY: "TRUE"}
    return [{"key": k, "value": v} for k, v in sorted(merged.items())]


def _network_interface(request: NodeRequest, *, zone: str, project: str) -> dict[str, Any]:
    """nic0: the network, and the subnetwork as a full path (a global template's must be one,
    docs/google-facts.md#networks); a subnetwork named without its region is the zone's region's."""
    network = request.network
    nic: dict[str, Any] = {"network": network.network_path(project), "nicType": "GVNIC"}
    subnetwork = network.subnetwork_path(project, region_of_zone(zone))
    if subnetwork is not None:
        nic["subnetwork"] = subnetwork
    if request.external_ips:
        nic["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
    return nic


def _reservation_path(reservation: str, project: str) -> str:
    if reservation.startswith("projects/"):
        return reservation
    return f"projects/{project}/reservations/{reservation.rsplit('/', 1)[-1]}"


# --- reading -------------------------------------------------------------------------------------------


def last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def capacity_of(instance_or_props: Mapping[str, Any]) -> CapacityType:
    model = str((instance_or_props.get("scheduling") or {}).get("provisioningModel", "STANDARD"))
    return _CAPACITY_OF_MODEL.get(model, CapacityType.ON_DEMAND)


def node_state(instance: Mapping[str, Any]) -> str:
    status = str(instance.get("status", ""))
    if status == "TERMINATED":
        # tpuctl never stops a Compute Engine slice (``stop_node`` refuses), and a TPU VM is never
        # restarted after host maintenance (``automaticRestart: false``): a TERMINATED one is dead.
        model = str((instance.get("scheduling") or {}).get("provisioningModel", ""))
        return "PREEMPTED" if model in ("SPOT", "FLEX_START") else "TERMINATED"
    return _STATE_OF_STATUS.get(status, status or "CREATING")


def endpoint_of(instance: Mapping[str, Any]) -> NetworkEndpoint | None:
    nics = instance.get("networkInterfaces") or []
    if not nics or not nics[0].get("networkIP"):
        return None
    nat = next((a.get("natIP") for a in nics[0].get("accessConfigs") or [] if a.get("natIP")), None)
    return NetworkEndpoint(ip_address=str(nics[0]["networkIP"]), port=8470, external_ip=nat)


def slice_state(
    instances: Sequence[Mapping[str, Any]],
    hosts: int,
    topology_state: str | None,
    capacity: CapacityType = CapacityType.ON_DEMAND,
) -> str:
    """The state of a multi-host slice from its VMs: READY when every host runs and the topology is ACTIVE
    (docs/google-facts.md#slice-readiness); PREEMPTED or TERMINATED when any host is (one host lost is the
    slice lost, docs/google-facts.md#losing-a-host), or when the topology went INCOMPLETE (a host deleted by
    its termination action, which a ``DO_NOTHING`` MIG does not replace, while the MIG itself stays
    stable)."""
    states = [node_state(i) for i in instances]
    for dead in ("PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING", "REPAIRING"):
        if dead in states:
            return dead
    if topology_state == "INCOMPLETE":
        return "PREEMPTED" if capacity.is_preemptible else "TERMINATED"
    ready = len(states) == hosts and all(s == "READY" for s in states)
    return "READY" if ready and topology_state in (None, "ACTIVE") else "CREATING"


def node_from_instance(instance: Mapping[str, Any], zone: str, accel: AcceleratorType) -> Node:
    """A one-host slice; its image family is its generation's (the instance names only its disk)."""
    endpoint = endpoint_of(instance)
    return Node(
        name=str(instance["name"]),
        zone=zone,
        accelerator_type=accel.api_name,
        state=node_state(instance),
        capacity=capacity_of(instance),
        runtime_version=accel.runtime_version,
        topology=accel.topology,
        labels=dict(instance.get("labels") or {}),
        metadata=_metadata(instance),
        network_endpoints=(endpoint,) if endpoint else (),
        create_time=_timestamp(instance.get("creationTimestamp")),
        description=str(instance.get("description", "")),
        id=str(instance.get("id", "")),
        surface=Surface.COMPUTE,
    )


def node_from_mig(
    mig: Mapping[str, Any],
    instances: Sequence[Mapping[str, Any]],
    zone: str,
    meta: Mapping[str, Any],
    accel: AcceleratorType,
) -> Node:
    """A multi-host slice: its MIG, and its VMs in worker order (by instance name, unc.: the order the
    hosts' ``worker-network-endpoints`` metadata lists them is not readable through the API)."""
    ordered = sorted(instances, key=lambda i: str(i.get("name", "")))
    applied = (mig.get("status") or {}).get("appliedAcceleratorTopologies") or []
    topology_state = str(applied[0].get("state")) if applied else None
    endpoints = tuple(e for e in (endpoint_of(i) for i in ordered) if e is not None)
    capacity = CapacityType(str(meta.get("capacity", CapacityType.ON_DEMAND.value)))
    return Node(
        name=str(mig["name"]),
        zone=zone,
        accelerator_type=accel.api_name,
        state=slice_state(ordered, accel.hosts, topology_state, capacity),
        capacity=capacity,
        runtime_version=accel.runtime_version,
        topology=accel.topology,
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        metadata=_metadata(ordered[0]) if ordered else {},
        network_endpoints=endpoints if len(endpoints) == len(ordered) else (),
        create_time=_timestamp(mig.get("creationTimestamp")),
        id=str(mig.get("id", "")),
        surface=Surface.COMPUTE,
    )


def _metadata(instance: Mapping[str, Any]) -> dict[str, str]:
    items = (instance.get("metadata") or {}).get("items") or []
    return {str(i["key"]): str(i.get("value", "")) for i in items if "key" in i}


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
