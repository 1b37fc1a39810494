"""An instance's properties (an instances.insert body, or a template's ``properties``), parsed and
validated as docs/google-facts.md#instance-requests describes, and normalized for echoing back."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from tpuctl.sim.compute import links
from tpuctl.sim.compute.errors import invalid, invalid_field
from tpuctl.sim.compute.machines import Machine
from tpuctl.sim.world import CapacityClass, World

PROVISIONING_MODELS = ("STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND")
#: The fields of an instance (or a template's properties) kept as given and echoed back.
_KEPT = (
    "description",
    "labels",
    "serviceAccounts",
    "tags",
    "resourcePolicies",
    "reservationAffinity",
    "shieldedInstanceConfig",
    "canIpForward",
    "deletionProtection",
    "networkInterfaces",
    "disks",
)
#: maxRunDuration's range: 10 minutes to 7 days (observed: docs/google-facts.md#flex-start).
_MIN_RUN_S, _MAX_RUN_S = 600, 7 * 86400


@dataclass(frozen=True)
class InstanceSpec:
    """What an instance (or each instance of a template) is."""

    machine: Machine
    capacity_class: CapacityClass
    provisioning_model: str
    termination_action: str  # STOP or DELETE: what a preemption does to it
    reservation: str | None
    metadata: dict[str, str]
    body: dict[str, Any]  # the normalized fields echoed back (scheduling and metadata included)


def fingerprint(value: Any) -> str:
    digest = hashlib.sha256(repr(value).encode()).digest()[:8]
    return base64.b64encode(digest).decode()


def parse_properties(world: World, props: Any, machine: Machine, field: str) -> InstanceSpec:
    """``props`` as an InstanceSpec; ``field`` is the prefix errors name (``resource``,
    ``resource.properties``)."""
    if not isinstance(props, dict):
        raise invalid_field(field, props, "Must be an object.")
    if props.get("guestAccelerators"):
        # The TPUs come with the machine type, as for A3/A4 GPUs (inferred:
        # docs/google-facts.md#instance-requests). Text unc.
        raise invalid_field(
            f"{field}.guestAccelerators",
            props["guestAccelerators"],
            f"Machine type '{machine.name}' comes with its TPUs; guestAccelerators must not be set.",
        )
    _check_disks_and_nics(props, field)
    scheduling, model, action, capacity_class = _scheduling(props.get("scheduling"), machine, field)
    reservation = _reservation(world, props, machine, model, field) if model == "RESERVATION_BOUND" else None
    if reservation is not None:
        capacity_class = "reserved"
    metadata = _metadata(props.get("metadata"), f"{field}.metadata")
    labels = props.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise invalid_field(f"{field}.labels", labels, "Labels are a map of strings.")
    body = {k: props[k] for k in _KEPT if k in props}
    body["scheduling"] = scheduling
    items = [{"key": k, "value": v} for k, v in metadata.items()]
    body["metadata"] = {
        "kind": "compute#metadata",
        "fingerprint": fingerprint(items),
        **({"items": items} if items else {}),
    }
    return InstanceSpec(machine, capacity_class, model, action, reservation, metadata, body)


def _check_disks_and_nics(props: dict[str, Any], field: str) -> None:
    disks = props.get("disks")
    if not isinstance(disks, list) or not any(isinstance(d, dict) and d.get("boot") for d in disks):
        raise invalid_field(f"{field}.disks", disks or "", "Boot disk must be specified.")
    nics = props.get("networkInterfaces")
    if not isinstance(nics, list) or not nics:
        raise invalid_field(
            f"{field}.networkInterfaces", nics or "", "At least one network interface is required."
        )


def _scheduling(given: Any, machine: Machine, field: str) -> tuple[dict[str, Any], str, str, CapacityClass]:
    """The normalized scheduling, the provisioning model, the termination action and capacity class."""
    scheduling = dict(given) if isinstance(given, dict) else {}
    on_host = scheduling.get("onHostMaintenance", "MIGRATE")
    if on_host != "TERMINATE":
        # TPU VMs cannot live-migrate (docs/google-facts.md#instance-requests); Google's text for TPUs is unc.
        raise invalid_field(
            f"{field}.scheduling.onHostMaintenance",
            on_host,
            f"Instances with machine type '{machine.name}' do not support live migration; "
            "onHostMaintenance must be TERMINATE.",
        )
    model = str(
        scheduling.get("provisioningModel") or ("SPOT" if scheduling.get("preemptible") else "STANDARD")
    )
    if model not in PROVISIONING_MODELS:
        raise invalid_field(f"{field}.scheduling.provisioningModel", model, "Unknown provisioning model.")
    if "maxRunDuration" in scheduling:
        seconds = links.duration_seconds(scheduling["maxRunDuration"], f"{field}.scheduling.maxRunDuration")
        if not _MIN_RUN_S <= seconds <= _MAX_RUN_S:
            raise invalid_field(
                f"{field}.scheduling.maxRunDuration",
                int(seconds),
                "Max run duration must be between 10 minutes and 7 days.",
            )
    elif model == "FLEX_START":
        # maxRunDuration is required with FLEX_START (docs/google-facts.md#flex-start). Text unc.
        raise invalid_field(
            f"{field}.scheduling.maxRunDuration",
            "",
            "Max run duration must be specified for the FLEX_START provisioning model.",
        )
    if "terminationTime" in scheduling:
        termination_time(scheduling, field)
        if "maxRunDuration" in scheduling:
            # Google documents the two as alternatives (docs/google-facts.md#backstop); unc. whether it
            # refuses both: refused here, the stricter reading.
            raise invalid_field(
                f"{field}.scheduling.terminationTime",
                scheduling["terminationTime"],
                "Specify either maxRunDuration or terminationTime, not both.",
            )
    # Spot's default action is STOP (docs/google-facts.md#provisioning-models); flex-start VMs are deleted at
    # their end (unc.: the documented flows always pass DELETE).
    action = str(
        scheduling.get("instanceTerminationAction") or ("DELETE" if model == "FLEX_START" else "STOP")
    )
    if action not in ("STOP", "DELETE"):
        raise invalid_field(
            f"{field}.scheduling.instanceTerminationAction", action, "Must be STOP or DELETE."
        )
    if action != "DELETE" and ("terminationTime" in scheduling or "maxRunDuration" in scheduling):
        # Google stops such a VM at its limit; the simulator enforces time limits only by deleting
        # (``progress``), so a limit that would stop is refused rather than silently never kept.
        raise invalid_field(
            f"{field}.scheduling.instanceTerminationAction",
            action,
            "The simulator keeps a time limit (maxRunDuration, terminationTime) only with DELETE.",
        )
    scheduling["provisioningModel"] = model
    scheduling["onHostMaintenance"] = "TERMINATE"
    scheduling.setdefault("automaticRestart", model == "STANDARD")
    scheduling.setdefault("preemptible", False)
    if model != "STANDARD":
        scheduling["instanceTerminationAction"] = action
    capacity_class: CapacityClass = "preemptible" if model in ("SPOT", "FLEX_START") else "on_demand"
    return scheduling, model, action, capacity_class


def termination_time(scheduling: dict[str, Any], field: str) -> float:
    """``scheduling.terminationTime`` (RFC 3339) as epoch seconds; 400 when it is not one."""
    from tpuctl.sim.api_errors import ApiError
    from tpuctl.sim.wire import parse_rfc3339

    raw = scheduling["terminationTime"]
    try:
        return parse_rfc3339(str(raw), f"{field}.scheduling.terminationTime")
    except ApiError:
        raise invalid_field(
            f"{field}.scheduling.terminationTime", raw, "Must be an RFC 3339 timestamp."
        ) from None


def _reservation(world: World, props: dict[str, Any], machine: Machine, model: str, field: str) -> str:
    affinity = props.get("reservationAffinity") or {}
    values = affinity.get("values") or [] if isinstance(affinity, dict) else []
    if (
        not isinstance(affinity, dict)
        or affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION"
        or not values
    ):
        raise invalid_field(
            f"{field}.reservationAffinity",
            affinity,
            "The RESERVATION_BOUND provisioning model needs a SPECIFIC_RESERVATION reservation affinity.",
        )
    name = links.short_name(str(values[0]))
    found = world.reservation(name)
    if found is None or found.generation != machine.generation.name:
        raise invalid(f"The resource 'projects/{world.project}/reservations/{name}' was not found")
    return name


def _metadata(given: Any, field: str) -> dict[str, str]:
    if given is None:
        return {}
    items = given.get("items", []) if isinstance(given, dict) else None
    if not isinstance(items, list):
        raise invalid_field(field, given, "Metadata is an object with a list of items.")
    out: dict[str, str] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise invalid_field(f"{field}.items", item, "Each item needs a key.")
        if item["key"] in out:
            raise invalid_field(f"{field}.items", item["key"], "Duplicate metadata key.")
        out[item["key"]] = str(item.get("value", ""))
    return out


def request_valid_for(body: dict[str, Any], model: str) -> float | None:
    """``params.requestValidForDuration`` in simulated seconds, capped at 2 h
    (docs/google-facts.md#flex-start); only with FLEX_START (the stricter reading: Google documents it for
    flex-start only)."""
    params = body.get("params") or {}
    if not isinstance(params, dict) or "requestValidForDuration" not in params:
        return None
    field = "resource.params.requestValidForDuration"
    seconds = links.duration_seconds(params["requestValidForDuration"], field)
    if model != "FLEX_START":
        raise invalid_field(field, int(seconds), "Only the FLEX_START provisioning model waits for capacity.")
    if not 0 < seconds <= 7200:
        raise invalid_field(field, int(seconds), "Must be more than 0 and at most 2 hours.")
    return seconds
