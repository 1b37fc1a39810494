"""Resource names and JSON shapes of the simulated APIs that need no database: names, accelerator types,
locations, Cloud Quotas' QuotaInfo, the quota-exceeded error, queueing-policy windows, node ids."""

from __future__ import annotations

import hashlib
from typing import Any

from tpuctl.catalog import AcceleratorType, Catalog, Generation, QuotaFamily
from tpuctl.sim.api_errors import ApiError, not_found
from tpuctl.sim.wire import parse_duration, parse_rfc3339
from tpuctl.sim.world import World


def node_uid(seed: int, project: str, zone: str, node_id: str, create_time: float) -> str:
    # Deterministic (not random) so a run driven by an injected clock replays exactly, preemption draws
    # included (they are seeded by the uid). 19 digits, like GCP's node ids.
    digest = hashlib.sha256(f"{seed}:{project}/{zone}/{node_id}@{create_time!r}".encode()).digest()
    return str(10**18 + int.from_bytes(digest[:8], "big") % (8 * 10**18))  # < 2**63: int64


def node_name(project: str, zone: str, node_id: str) -> str:
    return f"projects/{project}/locations/{zone}/nodes/{node_id}"


def qr_name(project: str, zone: str, qr_id: str) -> str:
    return f"projects/{project}/locations/{zone}/queuedResources/{qr_id}"


def split_op_name(op_name: str) -> tuple[str, str, str]:
    parts = op_name.split("/")
    if len(parts) != 6 or parts[0] != "projects" or parts[2] != "locations" or parts[4] != "operations":
        raise not_found(op_name)
    return parts[1], parts[3], parts[5]


def size_for_topology(gen: Generation, topology: str) -> int | None:
    for size, shape in gen.sizes:
        if shape == topology:
            return size
    return None


def validity_window(policy: Any, now: float, world: World) -> tuple[float | None, float | None]:
    """(valid_after, valid_until) in real epoch seconds from a queueingPolicy. Durations are SIMULATED
    seconds (scaled by the world's speed, like every duration here); times are absolute."""
    if not isinstance(policy, dict):
        return None, None
    valid_after: float | None = None
    valid_until: float | None = None
    if "validUntilDuration" in policy:
        seconds = parse_duration(policy["validUntilDuration"], "queueingPolicy.validUntilDuration")
        valid_until = now + world.real_seconds(seconds)
    if "validUntilTime" in policy:
        valid_until = parse_rfc3339(str(policy["validUntilTime"]), "queueingPolicy.validUntilTime")
    if "validAfterDuration" in policy:
        seconds = parse_duration(policy["validAfterDuration"], "queueingPolicy.validAfterDuration")
        valid_after = now + world.real_seconds(seconds)
    if "validAfterTime" in policy:
        valid_after = parse_rfc3339(str(policy["validAfterTime"]), "queueingPolicy.validAfterTime")
    interval = policy.get("validInterval")
    if isinstance(interval, dict):
        if interval.get("startTime"):
            valid_after = parse_rfc3339(str(interval["startTime"]), "queueingPolicy.validInterval.startTime")
        if interval.get("endTime"):
            valid_until = parse_rfc3339(str(interval["endTime"]), "queueingPolicy.validInterval.endTime")
    return valid_after, valid_until


def quota_error(project: str, violations: list[tuple[str, int, str, str, int]]) -> ApiError:
    # One sentence per violated quota, each id quoted on its own (docs/google-facts.md#tpu-api-errors: joining
    # the ids into one quoted name, "Quota limit 'A,B'", reads as one quota that does not exist).
    message = " ".join(
        f"Quota limit '{quota_id}' has been exceeded. Limit: {limit} in {scope} {location}."
        for quota_id, limit, scope, location, _ in violations
    )
    details = [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [
                {
                    "subject": f"project:{project}",
                    "description": f"Quota limit '{quota_id}' has been exceeded. Limit: {limit} in {scope} "
                    f"{location}. In use: {used}.",
                    "apiService": "tpu.googleapis.com",
                    "quotaMetric": quota_metric(quota_id),
                    "quotaId": quota_id,
                    "quotaDimensions": {scope: location},
                    "quotaValue": str(limit),
                }
                for quota_id, limit, scope, location, used in violations
            ],
        }
    ]
    return ApiError(429, "RESOURCE_EXHAUSTED", message, details)


def quota_metric(quota_id: str) -> str:
    # Cloud Quotas names one metric per quota family (tpu.googleapis.com/tpu-v6e-preemptible counts both
    # the zone and the region quota); the catalog holds the names.
    found = Catalog.load().quota_family_of(quota_id)
    if found is not None:
        return found[1].metric
    base = quota_id.replace("PerProjectPerZone", "PerProject").replace("PerProjectPerRegion", "PerProject")
    return f"tpu.googleapis.com/{base}"


def accelerator_type_json(project: str, zone: str, accel: AcceleratorType) -> dict[str, Any]:
    return {
        "name": f"projects/{project}/locations/{zone}/acceleratorTypes/{accel.api_name}",
        "type": accel.api_name,
        "acceleratorConfigs": [{"type": accel.generation.api_enum, "topology": accel.topology}],
    }


def location_json(project: str, zone: str) -> dict[str, Any]:
    return {
        "name": f"projects/{project}/locations/{zone}",
        "locationId": zone,
        "displayName": zone,
        "labels": {},
    }


def quota_info_json(
    project: str,
    gen: Generation,
    family: QuotaFamily,
    quota_id: str,
    scope: str,
    default: int,
    locations: list[str],
    overrides: list[tuple[str, int]],
) -> dict[str, Any]:
    """A QuotaInfo as Cloud Quotas serves it: one entry with no ``dimensions`` that is the project default
    for every location in its ``applicableLocations``, then one entry per location whose limit differs;
    int64 values as JSON strings."""
    unit = "TensorCores" if gen.quota_unit == "cores" else "chips"
    kind = ("preemptible " if family.preemptible else "") + ("serving " if family.serving else "")
    overridden = {loc for loc, _ in overrides}
    default_entry: dict[str, Any] = {
        "details": {"value": str(default)},
        "applicableLocations": [loc for loc in locations if loc not in overridden],
    }
    return {
        "name": f"projects/{project}/locations/global/services/tpu.googleapis.com/quotaInfos/{quota_id}",
        "quotaId": quota_id,
        "metric": family.metric,
        "service": "tpu.googleapis.com",
        "isPrecise": True,
        "refreshInterval": "",
        "containerType": "PROJECT",
        "dimensions": [scope],
        "metricDisplayName": f"TPU {gen.name} {kind}{unit}",
        "quotaDisplayName": f"TPU {gen.name} {kind}{unit} per project per {scope} (TPU API)",
        "metricUnit": "1",
        "quotaIncreaseEligibility": {
            "isEligible": True,
            "ineligibilityReason": "INELIGIBILITY_REASON_UNSPECIFIED",
        },
        "isFixed": False,
        "isConcurrent": False,
        "serviceRequestQuotaUri": "",
        "dimensionsInfos": [default_entry]
        + [
            {
                "dimensions": {scope: location},
                "details": {"value": str(limit)},
                "applicableLocations": [location],
            }
            for location, limit in overrides
        ],
    }
