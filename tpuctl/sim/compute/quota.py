"""Compute Engine's TPU quotas: which one a slice draws on, whether it fits, and Cloud Quotas' view of
them (service ``compute.googleapis.com``). Disjoint from the TPU API's quotas
(docs/google-facts.md#compute-engine-quotas); the ids come from the catalog's ``ComputeQuota``, the limits
from the world's ``compute_quotas`` (chips)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from tpuctl.catalog import Catalog, ComputeQuota, Generation, Surface
from tpuctl.sim.compute import errors
from tpuctl.sim.world import CapacityClass, World, region_of

SERVICE = "compute.googleapis.com"


@dataclass(frozen=True)
class Demand:
    """Chips a slice takes of one quota at one location (a region or a zone, per the quota's scope)."""

    quota: ComputeQuota
    location: str
    chips: int

    @property
    def dimensions(self) -> dict[str, str]:
        dims = {self.quota.scope: self.location}
        if self.quota.tpu_family:
            dims["tpu_family"] = self.quota.tpu_family
        return dims


def demand_of(gen: Generation, capacity_class: CapacityClass, zone: str, chips: int) -> Demand | None:
    """The quota a slice draws on: on-demand the per-family one; SPOT and FLEX_START the preemptible
    one (docs/google-facts.md#provisioning-models: flex-start's fallback to standard quota is not
    modelled, the stricter reading); reserved capacity none (its reservation)."""
    compute = gen.compute
    if compute is None or capacity_class == "reserved":
        return None
    quota = compute.preemptible_quota if capacity_class == "preemptible" else compute.on_demand_quota
    return Demand(quota, region_of(zone) if quota.scope == "region" else zone, chips)


def metric_name(quota: ComputeQuota) -> str:
    # compute.googleapis.com/tpus_per_tpu_family is seen in monitoring code
    # (docs/google-facts.md#compute-engine-quotas); the preemptible metrics' names follow the same pattern
    # (unc.).
    return f"{SERVICE}/{errors.quota_name(quota.quota_id).lower()}"


def usage(conn: sqlite3.Connection, catalog: Catalog, project: str, demand: Demand) -> int:
    """Chips ``project`` holds of the quota at the demand's location: every Compute Engine slice in any
    state until deleted, TERMINATED ones included (unc.: the stricter reading)."""
    used = 0
    for row in conn.execute(
        "SELECT zone, generation, capacity_class, chips FROM nodes WHERE project = ? AND surface = 'compute'",
        (project,),
    ).fetchall():
        held = demand_of(catalog.generations[row["generation"]], row["capacity_class"], row["zone"], 0)
        if held is not None and held.quota == demand.quota and held.location == demand.location:
            used += int(row["chips"])
    return used


def check(
    conn: sqlite3.Connection, catalog: Catalog, world: World, project: str, demand: Demand | None
) -> dict[str, Any] | None:
    """None when the demand fits its quota, else the operation error (403 QUOTA_EXCEEDED)."""
    if demand is None:
        return None
    quota = demand.quota
    limit = world.compute_quota_limit(quota.quota_id, demand.location, quota.tpu_family)
    if limit < 0 or usage(conn, catalog, project, demand) + demand.chips <= limit:
        return None
    where = f"{quota.scope} {demand.location}"
    return errors.quota_exceeded(quota.quota_id, metric_name(quota), limit, demand.dimensions, where)


def quota_infos(catalog: Catalog, world: World, project: str) -> list[dict[str, Any]]:
    """Every Compute Engine TPU quota of the generations this world offers, as Cloud Quotas' QuotaInfo:
    dimensions ``region`` (or ``zone``) and, for the per-family quota, ``tpu_family``."""
    quotas: dict[str, tuple[ComputeQuota, set[str]]] = {}
    for gen_name in world.generations_offered():
        gen = catalog.generations[gen_name]
        if gen.compute is None or Surface.COMPUTE not in gen.surfaces:
            continue
        zones = [z for z in world.zones if world.offers(z, gen_name)]
        for quota in (gen.compute.on_demand_quota, gen.compute.preemptible_quota):
            locations = {region_of(z) if quota.scope == "region" else z for z in zones}
            _, seen = quotas.setdefault(quota.quota_id, (quota, set()))
            seen.update(locations)
    return [_info(project, world, quota, sorted(locs)) for _, (quota, locs) in sorted(quotas.items())]


def _info(project: str, world: World, quota: ComputeQuota, locations: list[str]) -> dict[str, Any]:
    per_family = quota.tpu_family is not None
    entries: list[dict[str, Any]] = []
    limits = [q for q in world.compute_quotas if q.quota_id == quota.quota_id]
    if not any(q.location is None and q.tpu_family is None for q in limits):
        entries.append({"details": {"value": "0"}, "applicableLocations": locations})
    for limit in sorted(limits, key=lambda q: (q.location or "", q.tpu_family or "")):
        dims: dict[str, str] = {}
        if limit.location is not None:
            dims[quota.scope] = limit.location
        if limit.tpu_family is not None:
            dims["tpu_family"] = limit.tpu_family
        entry: dict[str, Any] = {
            "details": {"value": str(limit.limit)},
            "applicableLocations": [limit.location] if limit.location else locations,
        }
        if dims:
            entry["dimensions"] = dims
        entries.append(entry)
    name = errors.quota_name(quota.quota_id)
    return {
        "name": f"projects/{project}/locations/global/services/{SERVICE}/quotaInfos/{quota.quota_id}",
        "quotaId": quota.quota_id,
        "metric": metric_name(quota),
        "service": SERVICE,
        "isPrecise": True,
        "refreshInterval": "",
        "containerType": "PROJECT",
        "dimensions": [quota.scope, "tpu_family"] if per_family else [quota.scope],
        "metricDisplayName": name,
        "quotaDisplayName": f"{name} per project per {quota.scope}",
        "metricUnit": "1",
        "quotaIncreaseEligibility": {
            "isEligible": True,
            "ineligibilityReason": "INELIGIBILITY_REASON_UNSPECIFIED",
        },
        "isFixed": False,
        "isConcurrent": False,
        "serviceRequestQuotaUri": "",
        "dimensionsInfos": entries,
    }
