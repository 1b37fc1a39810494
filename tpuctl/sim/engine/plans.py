"""What a create request asks for, parsed and validated: the nodes to make (``NodePlan``) of a node or
queued-resource body, with the field paths Google names in its INVALID_ARGUMENT answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from tpuctl.catalog import AcceleratorType, Catalog, Surface
from tpuctl.sim import vpc
from tpuctl.sim.api_errors import eid, invalid_argument
from tpuctl.sim.shapes import size_for_topology
from tpuctl.sim.wire import ACCELERATOR_TYPE_ENUM, check_labels, check_resource_id
from tpuctl.sim.world import CapacityClass, World, region_of

#: The node fields kept as the request gave them and echoed back.
_KEPT_NODE_FIELDS = (
    "description",
    "runtimeVersion",
    "networkConfig",
    "networkConfigs",
    "cidrBlock",
    "serviceAccount",
    "schedulingConfig",
    "labels",
    "metadata",
    "tags",
    "dataDisks",
    "shieldedInstanceConfig",
    "autocheckpointEnabled",  # v2alpha1 only; a v2 read projects it away
)
#: The queued-resource fields kept as the request gave them and echoed back.
_KEPT_QR_FIELDS = ("tpu", "spot", "guaranteed", "bestEffort", "queueingPolicy", "reservationName")
#: Runtime versions offered in every zone with TPUs besides each generation's default (GCP lists more).
COMMON_RUNTIME_VERSIONS = ("tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-tf-2.16.1-pjrt", "tpu-vm-v4-base")


def zone_runtime_versions(catalog: Catalog, world: World, zone: str) -> list[str]:
    """The runtime versions a zone offers: its generations' defaults and the common ones."""
    gens = [catalog.generations[g] for g in world.zones.get(zone, {})]
    # A Compute-Engine-only generation (TPU7x) boots an image, not a TPU API runtime version.
    versions = {g.runtime_version for g in gens if Surface.TPU_API in g.surfaces}
    if versions:
        versions.update(COMMON_RUNTIME_VERSIONS)
    return sorted(versions)


@dataclass(frozen=True)
class NodePlan:
    """A node to create, parsed and validated from a request."""

    node_id: str
    accel: AcceleratorType
    capacity_class: CapacityClass
    reservation: str | None  # a named reservation (queued resources); None = any (reserved nodes)
    spec: dict[str, Any]
    multislice: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "accelerator_type": self.accel.api_name,
            "capacity_class": self.capacity_class,
            "reservation": self.reservation,
            "spec": self.spec,
            "multislice": self.multislice,
        }


class QueuedPlan(NamedTuple):
    """A queued resource to create: the body's kept fields, its nodes, and its class and reservation."""

    spec: dict[str, Any]
    plans: list[NodePlan]
    capacity_class: CapacityClass
    reservation: str | None


def plan_from_json(catalog: Catalog, item: dict[str, Any]) -> NodePlan:
    """A plan as ``NodePlan.to_json`` stored it."""
    accel = accelerator_by_api_name(catalog, item["accelerator_type"])
    assert accel is not None, item
    return NodePlan(
        node_id=item["node_id"],
        accel=accel,
        capacity_class=item["capacity_class"],
        reservation=item.get("reservation"),
        spec=item["spec"],
        multislice=bool(item.get("multislice")),
    )


def accelerator_by_api_name(catalog: Catalog, name: str) -> AcceleratorType | None:
    prefix, _, size_text = name.rpartition("-")
    if not size_text.isdigit():
        return None
    for gen in catalog.generations.values():
        if Surface.TPU_API not in gen.surfaces:
            continue  # TPU7x and later: not a TPU API type (the API answers it as unknown)
        if gen.api_prefix == prefix and int(size_text) in dict(gen.sizes):
            return AcceleratorType(generation=gen, size=int(size_text))
    return None


def parse_node(
    catalog: Catalog,
    world: World,
    zone: str,
    node_id: str,
    body: Any,
    *,
    project: str,
    field_prefix: str,
    tier_class: CapacityClass | None = None,
    reservation: str | None = None,
    multislice: bool = False,
) -> NodePlan:
    """A node body (of a node create, or one node of a queued resource) as a plan. ``tier_class`` is
    the queued resource's spot/guaranteed tier; ``reservation`` its named reservation."""
    if not isinstance(body, dict):
        raise invalid_argument(f"Field '{field_prefix}' is required.", field_prefix)
    accel = _accelerator_for(catalog, body, field_prefix)
    if not world.offers(zone, accel.generation.name):
        offered = sorted(catalog.generations[g].api_prefix for g in world.zones.get(zone, {})) or ["none"]
        raise invalid_argument(
            f"Accelerator type '{accel.api_name}' is not available in zone '{zone}'. Generations "
            f"offered there: {', '.join(offered)}.",
            f"{field_prefix}.acceleratorType",
        )
    _check_node_fields(body, field_prefix)
    _check_network(world, project, zone, body, field_prefix)
    _check_runtime_version(catalog, world, zone, body["runtimeVersion"], field_prefix)
    scheduling = body.get("schedulingConfig") or {}
    if not isinstance(scheduling, dict):
        raise invalid_argument(
            "Field 'schedulingConfig' must be an object.", f"{field_prefix}.schedulingConfig"
        )
    preemptible = bool(scheduling.get("preemptible")) or bool(scheduling.get("spot"))
    reserved = bool(scheduling.get("reserved"))
    if reserved and preemptible:
        raise invalid_argument(
            "schedulingConfig.reserved cannot be combined with spot or preemptible.",
            f"{field_prefix}.schedulingConfig",
        )
    capacity_class: CapacityClass = (
        "reserved" if reserved else ("preemptible" if preemptible else "on_demand")
    )
    if reservation is not None:
        capacity_class = "reserved"
    elif tier_class is not None and not reserved:
        capacity_class = tier_class
    spec = {k: body[k] for k in _KEPT_NODE_FIELDS if k in body}
    # A class the queued resource imposed shows in the node's schedulingConfig, as on GCP.
    if capacity_class == "preemptible" and not preemptible:
        spec["schedulingConfig"] = {**scheduling, "spot": True}
    elif capacity_class == "reserved" and not reserved:
        spec["schedulingConfig"] = {**scheduling, "reserved": True}
    return NodePlan(
        node_id=node_id,
        accel=accel,
        capacity_class=capacity_class,
        reservation=reservation,
        spec=spec,
        multislice=multislice,
    )


def _check_runtime_version(
    catalog: Catalog, world: World, zone: str, version: Any, field_prefix: str
) -> None:
    """An unknown runtime version is refused at once, in the words Cloud TPU used for the v1 API's
    ``tensorflowVersion`` ("Cloud TPU received an invalid argument. The field "TensorflowVersion" cannot
    be "2.4".", quoted in a public tensorflow/tpu bug report; docs/google-facts.md#images). That v2 refuses
    synchronously with the same words is unconfirmed: the stricter choice, so a typo never yields a READY node
    here that Google would refuse."""
    if version not in zone_runtime_versions(catalog, world, zone):
        message = (
            "Cloud TPU received an invalid argument. "
            f'The field "RuntimeVersion" cannot be "{version}". {eid()}'
        )
        raise invalid_argument(message, f"{field_prefix}.runtime_version")


def _check_network(world: World, project: str, zone: str, body: dict[str, Any], field_prefix: str) -> None:
    """The node's network and subnetwork exist and fit its zone (``tpuctl.sim.vpc``); refused in the
    field form Compute Engine uses, the TPU API's own words being unconfirmed."""
    configs = body.get("networkConfigs") or [body.get("networkConfig") or {}]
    for index, config in enumerate(configs):
        where = (
            f"{field_prefix}.networkConfigs[{index}]"
            if "networkConfigs" in body
            else f"{field_prefix}.networkConfig"
        )
        if not isinstance(config, dict):
            raise invalid_argument(f"Field '{where}' must be an object.", where)
        try:
            vpc.attach(
                world,
                project,
                region_of(zone),
                config.get("network"),
                config.get("subnetwork"),
                network_from_subnetwork=False,
            )
        except vpc.VpcRefusal as refusal:
            field = f"{where}.{refusal.part}" if refusal.part else where
            raise invalid_argument(
                f"Invalid value for field '{field}': '{refusal.value}'. {refusal.why}", field
            ) from None


def _check_node_fields(body: dict[str, Any], field_prefix: str) -> None:
    """The node fields kept as given: runtime version, network config, description, labels, metadata."""
    if not body.get("runtimeVersion"):
        raise invalid_argument(
            f"Field '{field_prefix}.runtimeVersion' is required.", f"{field_prefix}.runtimeVersion"
        )
    if "networkConfig" in body and body.get("networkConfigs"):
        raise invalid_argument(
            "Fields 'networkConfig' and 'networkConfigs' cannot both be set.",
            f"{field_prefix}.networkConfigs",
        )
    description = body.get("description", "")
    if not isinstance(description, str) or len(description) > 512:
        raise invalid_argument(
            f"Field '{field_prefix}.description' must be a string of at most 512 characters.",
            f"{field_prefix}.description",
        )
    check_labels(body.get("labels"), f"{field_prefix}.labels")
    metadata = body.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())
    ):
        raise invalid_argument(
            f"Field '{field_prefix}.metadata' must be a map of strings.", f"{field_prefix}.metadata"
        )


def _accelerator_for(catalog: Catalog, body: dict[str, Any], field_prefix: str) -> AcceleratorType:
    type_name = body.get("acceleratorType")
    config = body.get("acceleratorConfig")
    if type_name:
        accel = accelerator_by_api_name(catalog, str(type_name))
        if accel is None:
            raise invalid_argument(
                f"Invalid value for field '{field_prefix}.acceleratorType': {type_name!r} is not a TPU "
                "accelerator type (e.g. v5litepod-8, v6e-8, v5p-32, v4-32).",
                f"{field_prefix}.acceleratorType",
            )
        return accel
    if isinstance(config, dict) and config.get("type") is not None:
        raw_type = config["type"]
        enum_name = ACCELERATOR_TYPE_ENUM.get(raw_type) if isinstance(raw_type, int) else str(raw_type)
        gen = catalog.generation_for_api_enum(enum_name or "")
        topology = str(config.get("topology", ""))
        size = size_for_topology(gen, topology) if gen is not None else None
        if gen is None or size is None:
            raise invalid_argument(
                f"Invalid value for field '{field_prefix}.acceleratorConfig': type {raw_type!r} with "
                f"topology {topology!r} is not a TPU slice shape.",
                f"{field_prefix}.acceleratorConfig",
            )
        return AcceleratorType(generation=gen, size=size)
    raise invalid_argument(
        f"One of '{field_prefix}.acceleratorType' or '{field_prefix}.acceleratorConfig' is required.",
        f"{field_prefix}.acceleratorType",
    )


def parse_queued_resource(
    catalog: Catalog, world: World, project: str, zone: str, qr_id: str, body: Any
) -> QueuedPlan:
    """A queued-resource body as the plans of all its nodes (a multislice request is several)."""
    if not isinstance(body, dict):
        raise invalid_argument("Field 'queuedResource' is required.", "queuedResource")
    if "spot" in body and "guaranteed" in body:
        raise invalid_argument("Only one of 'spot' and 'guaranteed' may be set.", "queuedResource.tier")
    if "bestEffort" in body and "guaranteed" in body:
        raise invalid_argument("Only one of 'bestEffort' and 'guaranteed' may be set.", "queuedResource.tier")
    reservation = _reservation_of(world, zone, body.get("reservationName"))
    tier_class: CapacityClass | None = None
    if "spot" in body:
        tier_class = "preemptible"
    elif "guaranteed" in body:
        tier_class = "on_demand"
    tpu = body.get("tpu")
    specs = tpu.get("nodeSpec") if isinstance(tpu, dict) else None
    if not isinstance(specs, list) or not specs:
        raise invalid_argument(
            "Field 'queuedResource.tpu.nodeSpec' is required.", "queuedResource.tpu.nodeSpec"
        )
    plans: list[NodePlan] = []
    for index, node_spec in enumerate(specs):
        prefix = f"queuedResource.tpu.nodeSpec[{index}]"
        node_ids, multislice = _node_ids(project, zone, qr_id, node_spec, prefix)
        for node_id in node_ids:
            check_resource_id(node_id, f"{prefix}.nodeId")
            plans.append(
                parse_node(
                    catalog,
                    world,
                    zone,
                    node_id,
                    node_spec.get("node"),
                    project=project,
                    field_prefix=f"{prefix}.node",
                    tier_class=tier_class,
                    reservation=reservation,
                    multislice=multislice,
                )
            )
    seen: set[str] = set()
    for plan in plans:
        if plan.node_id in seen:
            raise invalid_argument(
                f"Node id {plan.node_id!r} appears twice in the request.", "queuedResource.tpu.nodeSpec"
            )
        seen.add(plan.node_id)
    classes = {p.capacity_class for p in plans}
    capacity_class: CapacityClass = plans[0].capacity_class if len(classes) == 1 else "on_demand"
    kept = {k: body[k] for k in _KEPT_QR_FIELDS if k in body}
    return QueuedPlan(kept, plans, capacity_class, reservation)


def _reservation_of(world: World, zone: str, raw_reservation: Any) -> str | None:
    """The short name of the body's reservationName, which must exist in the zone."""
    if not raw_reservation:
        return None
    reservation = str(raw_reservation).rsplit("/", 1)[-1]
    found = world.reservation(reservation)
    if found is None or found.zone != zone:
        raise invalid_argument(
            f"Invalid value for field 'queuedResource.reservationName': reservation "
            f"{raw_reservation!r} does not exist in zone '{zone}'.",
            "queuedResource.reservationName",
        )
    return reservation


def _node_ids(project: str, zone: str, qr_id: str, node_spec: Any, prefix: str) -> tuple[list[str], bool]:
    """The node ids one nodeSpec asks for, and whether it is a multislice spec."""
    if not isinstance(node_spec, dict):
        raise invalid_argument(f"Field '{prefix}' must be an object.", prefix)
    parent = node_spec.get("parent", f"projects/{project}/locations/{zone}")
    if parent != f"projects/{project}/locations/{zone}":
        raise invalid_argument(
            f"Invalid value for field '{prefix}.parent': {parent!r}; it must be the queued "
            f"resource's own location 'projects/{project}/locations/{zone}'.",
            f"{prefix}.parent",
        )
    multi = node_spec.get("multisliceParams")
    if multi and node_spec.get("nodeId"):
        raise invalid_argument(
            f"Only one of '{prefix}.nodeId' and '{prefix}.multisliceParams' may be set.",
            f"{prefix}.nodeId",
        )
    if not multi:
        return [str(node_spec.get("nodeId") or "")], False
    count = int(multi.get("nodeCount", 0))
    if count <= 1:
        raise invalid_argument(
            f"Invalid value for field '{prefix}.multisliceParams.nodeCount': {count}; it must be "
            "greater than 1.",
            f"{prefix}.multisliceParams.nodeCount",
        )
    id_prefix = str(multi.get("nodeIdPrefix") or qr_id)
    return [f"{id_prefix}-{i}" for i in range(count)], True
