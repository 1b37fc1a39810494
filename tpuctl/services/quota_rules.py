"""Each TPU surface's quota rules, in one object per surface: which quotas a slice draws on, what they
count, which Cloud Quotas rows are the surface's, and whether the surface has queued resources.

The two surfaces draw on disjoint pools. A TPU API slice draws on the TPU API's quota ids
(``TPUV6EPerProjectPerZoneForTPUAPI``, per zone and per region), counted in chips or TensorCores per
generation. A Compute Engine slice draws on Compute Engine's (``TPUS-PER-TPU-FAMILY-per-project-region``
with its ``tpu_family`` dimension on demand, a per-generation ``PREEMPTIBLE-...`` one for spot and
flex-start), always counted in chips. Queued resources exist on the TPU API only (Compute Engine's
flex-start VMs take their place). ``QuotaBook`` asks these rules and never which surface it is counting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from tpuctl.catalog import AcceleratorType, CapacityType, Catalog, Surface, region_of_zone
from tpuctl.cloud.base import QuotaLimit
from tpuctl.cloud.quotas import COMPUTE_SERVICE, TPU_SERVICE


class QuotaKey(NamedTuple):
    """One quota at one location, for one TPU family where the quota has that dimension."""

    quota_id: str
    location: str
    tpu_family: str | None = None

    @property
    def order(self) -> tuple[str, str, str]:
        return (self.quota_id, self.location, self.tpu_family or "")


class SurfaceQuotaRules(Protocol):
    """How one surface's quotas work. One instance per surface: ``quota_rules(surface)``."""

    @property
    def surface(self) -> Surface: ...

    @property
    def queued_resources(self) -> bool:
        """Whether the surface has queued resources (which hold quota while dead)."""
        ...

    def keys(self, accel: AcceleratorType, zone: str, capacity: CapacityType) -> list[QuotaKey]:
        """The quotas a slice of ``accel`` and ``capacity`` in ``zone`` draws on (none for reserved
        capacity, which draws on its reservation)."""
        ...

    def unit(self, accel: AcceleratorType) -> str:
        """What those quotas count: ``chips`` or ``cores``."""
        ...

    def units(self, accel: AcceleratorType) -> int:
        """How much of each of them one slice of ``accel`` uses."""
        ...

    def catalog_quotas(self, catalog: Catalog) -> dict[str, str]:
        """Every quota id of this surface the catalog names, with the unit it counts."""
        ...

    def owns(self, limit: QuotaLimit) -> bool:
        """Whether a Cloud Quotas row is one of this surface's quotas."""
        ...


def _places(zone: str) -> dict[str, str]:
    return {"zone": zone, "region": region_of_zone(zone)}


@dataclass(frozen=True)
class TpuApiQuotaRules:
    """The Cloud TPU API's quotas: per zone and per region, in each generation's unit."""

    surface: Surface = Surface.TPU_API
    queued_resources: bool = True

    def keys(self, accel: AcceleratorType, zone: str, capacity: CapacityType) -> list[QuotaKey]:
        places = _places(zone)
        return [QuotaKey(quota_id, places[scope]) for scope, quota_id in accel.quota_ids(capacity)]

    def unit(self, accel: AcceleratorType) -> str:
        return accel.generation.quota_unit

    def units(self, accel: AcceleratorType) -> int:
        return accel.quota_units

    def catalog_quotas(self, catalog: Catalog) -> dict[str, str]:
        return {
            quota_id: gen.quota_unit
            for gen in catalog.generations.values()
            for family in gen.quota_families()
            for scope in ("zone", "region")
            if (quota_id := family.quota_id(scope))
        }

    def owns(self, limit: QuotaLimit) -> bool:
        return limit.metric.startswith(f"{TPU_SERVICE}/")


@dataclass(frozen=True)
class ComputeQuotaRules:
    """Compute Engine's TPU quotas: one per generation and capacity (the on-demand one per TPU family),
    always in chips; no queued resources."""

    surface: Surface = Surface.COMPUTE
    queued_resources: bool = False

    def keys(self, accel: AcceleratorType, zone: str, capacity: CapacityType) -> list[QuotaKey]:
        compute = accel.generation.compute
        quota = compute.quota(capacity) if compute is not None else None
        if quota is None:
            return []
        return [QuotaKey(quota.quota_id, _places(zone)[quota.scope], quota.tpu_family)]

    def unit(self, accel: AcceleratorType) -> str:
        return "chips"

    def units(self, accel: AcceleratorType) -> int:
        return accel.chips

    def catalog_quotas(self, catalog: Catalog) -> dict[str, str]:
        return {
            quota.quota_id: "chips"
            for gen in catalog.generations.values()
            if gen.compute is not None
            for quota in (gen.compute.on_demand_quota, gen.compute.preemptible_quota)
        }

    def owns(self, limit: QuotaLimit) -> bool:
        # Only Compute Engine's per-family quota has the tpu_family dimension.
        return limit.tpu_family is not None or limit.metric.startswith(f"{COMPUTE_SERVICE}/")


RULES: Mapping[Surface, SurfaceQuotaRules] = {
    Surface.TPU_API: TpuApiQuotaRules(),
    Surface.COMPUTE: ComputeQuotaRules(),
}


def quota_rules(surface: Surface) -> SurfaceQuotaRules:
    return RULES[surface]


def queued_resource_rules() -> SurfaceQuotaRules:
    """The rules of the one surface that has queued resources: what a queued resource holds is counted
    by them."""
    (rules,) = [rules for rules in RULES.values() if rules.queued_resources]
    return rules
