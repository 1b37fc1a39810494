"""Quota: limits from Cloud Quotas, usage from the slices that exist, per quota id and location.

Usage is counted from the live listing (every node in any state holds quota until deleted, a PREEMPTED one
included) and from queued resources that hold quota while SUSPENDED or FAILED (when their nodes are not in
the listing already). Quota held by such dead things is "reclaimable": `tpuctl pod gc` frees it, and the
allocator names the holders when a request is short of that quota.

A limit is *unknown* when Cloud Quotas does not list the quota id, or could not be read at all (a 403:
the API not enabled, or a caller with roles/tpu.admin only): placement then tries and lets the create
answer, as it would have worked without the check; it never counts an unknown limit as 0.

The two surfaces draw on disjoint pools (docs/google-facts.md#compute-engine-quotas), each with its own
rules (``quota_rules``: which quotas, what they count, queued resources or none); this module asks the
rules, never which surface it is. A key is (quota id, location, TPU family), the family None for every
quota without that dimension. Flex-start (not a capacity tpuctl places yet) spends the preemptible quota
first and falls back to the per-family one (docs/google-facts.md#provisioning-models): charge it to the
preemptible quota only when it comes, the stricter reading, as the simulator does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tpuctl.catalog import AcceleratorType, CapacityType, Catalog, Generation, Surface
from tpuctl.cloud.base import DEAD_QUEUED_STATES, Node, QueuedResource, QuotaLimit, TpuCloud
from tpuctl.errors import UsageError
from tpuctl.services.quota_rules import RULES, QuotaKey, queued_resource_rules, quota_rules

#: The surface of a quota id that neither the catalog nor a listed row places: the TPU API's, the pool
#: every quota of a generation without a Compute Engine path is in.
_UNPLACED = Surface.TPU_API


@dataclass(frozen=True)
class QuotaUse:
    """One quota at one location: its limit, what the existing slices use, and what is left."""

    quota_id: str
    scope: str  # "zone" | "region"
    location: str
    limit: int | None  # -1: unlimited; None: unknown (not listed, or Cloud Quotas unreadable)
    in_use: int
    unit: str  # "chips" | "cores"
    preempted_holding: int = 0  # of in_use, units held by PREEMPTED slices (freed by deleting them)
    # of in_use, units held by anything dead that `pod gc` deletes: PREEMPTED or TERMINATED slices and
    # FAILED or SUSPENDED queued resources
    reclaimable: int = 0
    # Compute Engine's per-family quota: the family this row counts; None for every other quota (and for
    # a per-family quota's limit that holds for the families without a row of their own).
    tpu_family: str | None = None
    surface: Surface = Surface.TPU_API  # whose pool: the TPU API's or Compute Engine's

    @property
    def known(self) -> bool:
        return self.limit is not None

    @property
    def available(self) -> int | None:
        """What is left; None when unlimited or unknown."""
        if self.limit is None or self.limit < 0:
            return None
        return max(self.limit - self.in_use, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "quota_id": self.quota_id,
            "scope": self.scope,
            "location": self.location,
            "limit": self.limit,
            "in_use": self.in_use,
            "available": self.available,
            "unit": self.unit,
            "preempted_holding": self.preempted_holding,
            "reclaimable": self.reclaimable,
            "tpu_family": self.tpu_family,
            "surface": self.surface.value,
        }


class QuotaBook:
    """Limits and usage, looked up by (quota id, location, TPU family). Built from one listing: a
    snapshot."""

    def __init__(
        self,
        catalog: Catalog,
        limits: Iterable[QuotaLimit] | None,
        nodes: Iterable[Node],
        queued_resources: Iterable[QueuedResource] = (),
    ) -> None:
        """``limits`` None: Cloud Quotas could not be read, so every limit is unknown."""
        self._catalog = catalog
        self._limits: dict[QuotaKey, QuotaLimit] = {}
        # A default entry that named no locations, by (quota id, TPU family).
        self._defaults: dict[tuple[str, str | None], QuotaLimit] = {}
        # Each quota id's surface and unit: the catalog's, then the listed rows' owners for the rest.
        self._surfaces: dict[str, Surface] = {}
        self._units: dict[str, str] = {}
        for rules in RULES.values():
            for quota_id, unit in rules.catalog_quotas(catalog).items():
                self._surfaces[quota_id] = rules.surface
                self._units[quota_id] = unit
        for limit in limits or ():
            location = limit.zone or limit.region
            if location:
                self._limits[QuotaKey(limit.quota_id, location, limit.tpu_family)] = limit
            else:
                self._defaults[(limit.quota_id, limit.tpu_family)] = limit
            for rules in RULES.values():
                if rules.owns(limit):
                    self._surfaces.setdefault(limit.quota_id, rules.surface)
        self._use: dict[QuotaKey, int] = defaultdict(int)
        self._preempted: dict[QuotaKey, int] = defaultdict(int)
        self._reclaimable: dict[QuotaKey, int] = defaultdict(int)
        self._holders: dict[QuotaKey, list[str]] = defaultdict(list)
        listed = self._count_nodes(nodes)
        self._count_queued(queued_resources, listed)

    def _count_nodes(self, nodes: Iterable[Node]) -> set[tuple[str, str]]:
        """Count every node in the listing; the (zone, name) of each, for the queued resources."""
        listed: set[tuple[str, str]] = set()
        for node in nodes:
            listed.add((node.zone, node.name))
            accel = self._resolve(node.accelerator_type)
            if accel is None:
                continue
            rules = quota_rules(node.surface)
            units = rules.units(accel)
            for key in rules.keys(accel, node.zone, node.capacity):
                self._use[key] += units
                if node.state == "PREEMPTED":
                    self._preempted[key] += units
                if node.is_dead:  # gives nothing, holds quota until deleted
                    self._reclaimable[key] += units
                    self._holders[key].append(f"slice {node.name} ({node.state}, {node.zone})")
        return listed

    def _count_queued(self, queued_resources: Iterable[QueuedResource], listed: set[tuple[str, str]]) -> None:
        """Queued resources that hold quota while dead, for their nodes not listed (counted by the rules of
        the surface that has queued resources)."""
        rules = queued_resource_rules()
        for qr in queued_resources:
            if qr.state not in DEAD_QUEUED_STATES:
                continue
            accel = self._resolve(qr.accelerator_type)
            # Nodes of the queued resource that still exist were counted above; count only the rest.
            missing = [n for n in qr.node_ids if (qr.zone, n) not in listed]
            count = len(missing) if qr.node_ids else qr.node_count
            if accel is None or count == 0:
                continue
            capacity = CapacityType.SPOT if qr.tier == "spot" else CapacityType.ON_DEMAND
            held = rules.units(accel) * count
            for key in rules.keys(accel, qr.zone, capacity):
                self._use[key] += held
                self._reclaimable[key] += held
                self._holders[key].append(f"queued resource {qr.id} ({qr.state}, {qr.zone})")

    @classmethod
    def from_cloud(cls, cloud: TpuCloud, catalog: Catalog) -> QuotaBook:
        return cls(catalog, cloud.quota_limits(), cloud.list_nodes(None), cloud.list_queued_resources(None))

    def holders(self, quota_id: str, location: str, tpu_family: str | None = None) -> list[str]:
        """What dead slices and queued resources hold of this quota (``pod gc`` frees them)."""
        return list(self._holders.get(QuotaKey(quota_id, location, tpu_family), ()))

    def _resolve(self, api_name: str) -> AcceleratorType | None:
        try:
            return self._catalog.resolve(api_name)
        except UsageError:
            return None

    @staticmethod
    def keys_for(
        accel: AcceleratorType, zone: str, capacity: CapacityType, surface: Surface | None = None
    ) -> list[QuotaKey]:
        """The quotas a slice of this type and capacity in ``zone`` draws on through ``surface`` (None:
        the generation's default, the TPU API wherever it serves one): the TPU API's per zone and per
        region, or Compute Engine's one (none for reserved capacity, which draws on its reservation)."""
        return quota_rules(surface or accel.generation.default_surface).keys(accel, zone, capacity)

    def use(
        self, quota_id: str, location: str, unit: str = "chips", tpu_family: str | None = None
    ) -> QuotaUse:
        key = QuotaKey(quota_id, location, tpu_family)
        limit = self._limit(key)
        scope = "zone" if location.count("-") >= 2 else "region"
        return QuotaUse(
            quota_id=quota_id,
            scope=scope,
            location=location,
            # An id Cloud Quotas does not list is unknown, not zero: the create answers for it.
            limit=limit.limit if limit is not None else None,
            in_use=self._use.get(key, 0),
            unit=unit,
            preempted_holding=self._preempted.get(key, 0),
            reclaimable=self._reclaimable.get(key, 0),
            tpu_family=tpu_family,
            surface=self._surfaces.get(quota_id, _UNPLACED),
        )

    def _limit(self, key: QuotaKey) -> QuotaLimit | None:
        """The most specific row: the location's for the family, the location's for every family, then
        the same without a location (the order ``parse_quota_infos`` ranks Cloud Quotas' entries in)."""
        families = dict.fromkeys((key.tpu_family, None))
        for family in families:
            if (hit := self._limits.get(key._replace(tpu_family=family))) is not None:
                return hit
        for family in families:
            if (hit := self._defaults.get((key.quota_id, family))) is not None:
                return hit
        return None

    def uses_for(
        self,
        accel: AcceleratorType,
        zone: str,
        capacity: CapacityType,
        surface: Surface | None = None,
    ) -> list[QuotaUse]:
        """What each quota the slice draws on allows (``surface`` as in ``keys_for``)."""
        rules = quota_rules(surface or accel.generation.default_surface)
        unit = rules.unit(accel)
        return [
            self.use(key.quota_id, key.location, unit, key.tpu_family)
            for key in rules.keys(accel, zone, capacity)
        ]

    def all_uses(self) -> list[QuotaUse]:
        keys = set(self._limits) | set(self._use)
        return [
            self.use(key.quota_id, key.location, self._units.get(key.quota_id, "chips"), key.tpu_family)
            for key in sorted(keys, key=lambda k: k.order)
        ]


def generation_uses(uses: Iterable[QuotaUse], generation: Generation) -> list[QuotaUse]:
    """The rows of ``uses`` that count ``generation``'s slices: its TPU API quotas (training and serving)
    and its Compute Engine ones. A per-family quota's row for no family (the limit of every family
    without a row of its own) stays where the generation has no row of its own at that location."""
    tpu_api = {
        quota_id
        for family in generation.quota_families()
        for scope in family.scopes
        if (quota_id := family.quota_id(scope))
    }
    compute = generation.compute
    own_compute = (
        set()
        if compute is None
        else {(q.quota_id, q.tpu_family) for q in (compute.on_demand_quota, compute.preemptible_quota)}
    )
    uses = list(uses)
    own = [u for u in uses if u.quota_id in tpu_api or (u.quota_id, u.tpu_family) in own_compute]
    placed = {(u.quota_id, u.location) for u in own}
    per_family = {quota_id for quota_id, family in own_compute if family is not None}
    others = [
        u
        for u in uses
        if u.tpu_family is None and u.quota_id in per_family and (u.quota_id, u.location) not in placed
    ]
    return [u for u in uses if u in own or u in others]


def quota_units(accel: AcceleratorType, surface: Surface) -> int:
    """How much of its quotas one slice of ``accel`` uses through ``surface``."""
    return quota_rules(surface).units(accel)
