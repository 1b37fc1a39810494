"""Quota: limits from Cloud Quotas, usage from the slices that exist, per quota id and location.

Usage is counted from the live listing (every node in any state holds quota until deleted, a PREEMPTED one
included) and from queued resources that hold quota while SUSPENDED or FAILED (when their nodes are not in
the listing already). Quota held by such dead things is "reclaimable": `tpuctl pod gc` frees it, and the
allocator names the holders when a request is short of that quota.

A limit is *unknown* when Cloud Quotas does not list the quota id, or could not be read at all (a 403:
the API not enabled, or a caller with roles/tpu.admin only): placement then tries and lets the create
answer, as it would have worked without the check; it never counts an unknown limit as 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tpuctl.catalog import AcceleratorType, CapacityType, Catalog, region_of_zone
from tpuctl.cloud.base import DEAD_QUEUED_STATES, Node, QueuedResource, QuotaLimit, TpuCloud
from tpuctl.errors import UsageError


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
        }


class QuotaBook:
    """Limits and usage, looked up by (quota id, location). Built from one listing: a snapshot."""

    def __init__(
        self,
        catalog: Catalog,
        limits: Iterable[QuotaLimit] | None,
        nodes: Iterable[Node],
        queued_resources: Iterable[QueuedResource] = (),
    ) -> None:
        """``limits`` None: Cloud Quotas could not be read, so every limit is unknown."""
        self._catalog = catalog
        self._limits: dict[tuple[str, str], QuotaLimit] = {}
        self._defaults: dict[str, QuotaLimit] = {}  # a default entry that named no locations
        for limit in limits or ():
            location = limit.zone or limit.region
            if location:
                self._limits[(limit.quota_id, location)] = limit
            else:
                self._defaults[limit.quota_id] = limit
        self._use: dict[tuple[str, str], int] = defaultdict(int)
        self._preempted: dict[tuple[str, str], int] = defaultdict(int)
        self._reclaimable: dict[tuple[str, str], int] = defaultdict(int)
        self._holders: dict[tuple[str, str], list[str]] = defaultdict(list)
        listed: set[tuple[str, str]] = set()
        for node in nodes:
            listed.add((node.zone, node.name))
            accel = self._resolve(node.accelerator_type)
            if accel is None:
                continue
            for key in self.keys_for(accel, node.zone, node.capacity):
                self._use[key] += accel.quota_units
                if node.state == "PREEMPTED":
                    self._preempted[key] += accel.quota_units
                if node.is_dead:  # gives nothing, holds quota until deleted
                    self._reclaimable[key] += accel.quota_units
                    self._holders[key].append(f"slice {node.name} ({node.state}, {node.zone})")
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
            for key in self.keys_for(accel, qr.zone, capacity):
                self._use[key] += accel.quota_units * count
                self._reclaimable[key] += accel.quota_units * count
                self._holders[key].append(f"queued resource {qr.id} ({qr.state}, {qr.zone})")

    @classmethod
    def from_cloud(cls, cloud: TpuCloud, catalog: Catalog) -> QuotaBook:
        return cls(catalog, cloud.quota_limits(), cloud.list_nodes(None), cloud.list_queued_resources(None))

    def holders(self, quota_id: str, location: str) -> list[str]:
        """What dead slices and queued resources hold of this quota (``pod gc`` frees them)."""
        return list(self._holders.get((quota_id, location), ()))

    def _resolve(self, api_name: str) -> AcceleratorType | None:
        try:
            return self._catalog.resolve(api_name)
        except UsageError:
            return None

    @staticmethod
    def keys_for(accel: AcceleratorType, zone: str, capacity: CapacityType) -> list[tuple[str, str]]:
        """The (quota id, location) pairs a slice of this type and capacity in ``zone`` draws on."""
        places = {"zone": zone, "region": region_of_zone(zone)}
        return [(quota_id, places[scope]) for scope, quota_id in accel.quota_ids(capacity)]

    def use(self, quota_id: str, location: str, unit: str = "chips") -> QuotaUse:
        limit = self._limits.get((quota_id, location)) or self._defaults.get(quota_id)
        scope = "zone" if location.count("-") >= 2 else "region"
        return QuotaUse(
            quota_id=quota_id,
            scope=scope,
            location=location,
            # An id Cloud Quotas does not list is unknown, not zero: the create answers for it.
            limit=limit.limit if limit is not None else None,
            in_use=self._use.get((quota_id, location), 0),
            unit=unit,
            preempted_holding=self._preempted.get((quota_id, location), 0),
            reclaimable=self._reclaimable.get((quota_id, location), 0),
        )

    def uses_for(self, accel: AcceleratorType, zone: str, capacity: CapacityType) -> list[QuotaUse]:
        unit = accel.generation.quota_unit
        return [self.use(qid, loc, unit) for qid, loc in self.keys_for(accel, zone, capacity)]

    def all_uses(self) -> list[QuotaUse]:
        keys = set(self._limits) | set(self._use)
        units = {}
        for gen in self._catalog.generations.values():
            for family in gen.quota_families():
                for scope in ("zone", "region"):
                    qid = family.quota_id(scope)
                    if qid:
                        units[qid] = gen.quota_unit
        return [self.use(qid, loc, units.get(qid, "chips")) for qid, loc in sorted(keys)]
