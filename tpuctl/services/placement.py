"""Placement, the pure part: a validated request, its candidates (zone x capacity type), their ranking,
and the dry-run plan with its verdict.

Nothing here talks to the cloud or the ledger. ``Allocator`` (``tpuctl.services.allocator``) gathers the
facts (the live listing, the quota limits, what each zone offers) into a ``Survey`` and hands them to
``build_candidates``; the CLI's ``--dry-run`` prints ``Plan.to_dict()``. Keeping this pure is what makes
the decision tables testable exactly.

How a candidate is judged, in this order (the first failing check is its ``reason``, and the stage where
the last candidates fell decides the verdict of an infeasible request):

1. offered: the zone offers the accelerator type (the API's acceleratorTypes list for the zone);
2. price: its USD/hour for the whole request (all slices) is known and within ``--max-price``;
3. quota: both the zone and the region quota of its capacity class (spot and preemptible share one quota,
   separate from on-demand; reserved capacity draws on its reservation instead) have room for all slices.

Feasible candidates are ranked by price for the whole request, then, where the run checkpoints to a
bucket whose location is known, by whether the zone is in the bucket's location (its region, dual-region
or multi-region: saving and restoring a checkpoint there crosses no location, which Cloud Storage bills;
``tpuctl.services.placement_bucket``), then by quota headroom (the smaller of the zone's and the region's
room left after placing; more first, so a concurrent create is less likely to win the race for the last
chips), then by the order the capacity types were allowed in, then by zone name (so the order is
deterministic).

A request may allow several slice types (``other_types``): each type's candidates are built as above, in
its own zones and through its own API, each candidate carrying its type, and all are ranked in one list:
by the user's order of the types first (``ordered``), or by price with the type's order only breaking a
tie (``cheapest``). What is sent for a candidate is the request for its type (``placing``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tpuctl import params
from tpuctl.catalog import AcceleratorType, CapacityType, Catalog, Surface, region_of_zone, validate_zone
from tpuctl.cloud.base import HostNetwork, PlannedRequest
from tpuctl.cloud.buckets import BucketLocation
from tpuctl.errors import (
    EXIT_CAPACITY,
    EXIT_OK,
    EXIT_PRICE_CAP,
    EXIT_QUOTA,
    InfeasibleError,
    NoCapacityError,
    NoQuotaError,
    OverPriceCapError,
    UsageError,
)
from tpuctl.services.placement_bucket import BucketDistance
from tpuctl.services.quota import QuotaBook, QuotaUse, quota_units
from tpuctl.timefmt import iso

QUEUED_CAPACITY = params.QUEUED_CAPACITY
DEFAULT_RACE_K = 3
#: Where quota is requested, per surface: each API's TPU quotas are its own (disjoint pools).
QUOTA_REQUEST_URLS = {
    Surface.TPU_API: "https://console.cloud.google.com/iam-admin/quotas?service=tpu.googleapis.com",
    Surface.COMPUTE: "https://console.cloud.google.com/iam-admin/quotas?service=compute.googleapis.com",
}


class Strategy(StrEnum):
    """How placement proceeds: try candidates one by one, cheapest first; or queue in the top K at once."""

    CHEAPEST = "cheapest"
    RACE = "race"


class TypePreference(StrEnum):
    """How a request naming several slice types ranks them: the user's order first, then price; or price
    alone (the type then only breaks a tie)."""

    ORDERED = "ordered"
    CHEAPEST = "cheapest"


class Rejection(StrEnum):
    """Why a candidate cannot take the request (the first failing check)."""

    NOT_OFFERED = "not_offered"
    NO_PRICE = "no_price"
    OVER_CAP = "over_cap"
    NO_QUOTA = "no_quota"


class Verdict(StrEnum):
    """The plan's answer, with the exit code each maps to (documented in docs/placement.md)."""

    FEASIBLE = "feasible"
    NO_QUOTA = "no_quota"
    NO_CAPACITY = "no_capacity"
    OVER_PRICE_CAP = "over_price_cap"

    @property
    def exit_code(self) -> int:
        return {
            Verdict.FEASIBLE: EXIT_OK,
            Verdict.NO_QUOTA: EXIT_QUOTA,
            Verdict.NO_CAPACITY: EXIT_CAPACITY,
            Verdict.OVER_PRICE_CAP: EXIT_PRICE_CAP,
        }[self]


# --------------------------------------------------------------------------------------------------
# The request


@dataclass(frozen=True)
class SliceType:
    """One slice type a request may be placed on, with what follows from the type: the API that places
    it (a generation may be offered through Compute Engine only) and the runtime its hosts boot."""

    accelerator: AcceleratorType
    surface: Surface
    runtime_version: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "accelerator_type": self.accelerator.api_name,
            "friendly_name": self.accelerator.friendly_name,
            "topology": self.accelerator.topology,
            "chips_per_slice": self.accelerator.chips,
            "hosts_per_slice": self.accelerator.hosts,
            "api": self.surface.value,
            "runtime_version": self.runtime_version,
        }


@dataclass(frozen=True)
class PlacementRequest:
    """A validated placement request: what to create, where it may go, and how to get it."""

    accelerator: AcceleratorType
    name: str
    request_id: str
    capacity_types: tuple[CapacityType, ...]  # allowed, in the order given
    runtime_version: str
    labels: Mapping[str, str]
    zones: tuple[str, ...] = ()  # explicit zones; empty: the region's, else every zone the catalog lists
    region: str | None = None
    max_price: float | None = None  # USD per hour for the whole request (all slices)
    #: Only candidates with a known price: a run's ``--budget`` counts its spend by the price, and a
    #: slice it could not price would spend unguarded.
    priced_only: bool = False
    slices: int = 1
    queued: bool = False
    valid_for_s: float | None = None
    strategy: Strategy = Strategy.CHEAPEST
    race_k: int = DEFAULT_RACE_K
    reservation: str | None = None
    wait: bool = True
    #: The node's metadata, sent with every create of this request (e.g. ``ssh-keys`` for SSH runs).
    metadata: Mapping[str, str] = field(default_factory=dict)
    #: Ask for external IPs on every host (SSH runs reach their hosts from outside the VPC).
    external_ips: bool = False
    #: Which Google API places the slice (checked against the generation where the request is built).
    surface: Surface = Surface.TPU_API
    #: The hosts' network, subnetwork and network tags.
    network: HostNetwork = field(default_factory=HostNetwork)
    #: The service account the hosts act as (None: the API's default, the Compute Engine default one).
    service_account: str | None = None
    #: The bucket the run checkpoints to (placement prefers zones in its location), if any.
    checkpoint_bucket: str | None = None
    #: When the cloud itself ends the slice (a run's backstop; Compute Engine only, ``NodeRequest``).
    terminate_at: float | None = None
    #: Other slice types the request may be placed on besides ``accelerator`` (whose surface and runtime
    #: are the fields above): every type's candidates are ranked in one plan. Empty: that type only.
    other_types: tuple[SliceType, ...] = ()
    type_preference: TypePreference = TypePreference.ORDERED
    #: The workspace asked for a slice made outside any run (None: the actor's only one); a run's slices
    #: are attributed to the run, whatever this says (``attempts.Recorder``).
    workspace: str | None = None

    @property
    def slice_types(self) -> tuple[SliceType, ...]:
        """Every type the request may be placed on, the first one first."""
        return (SliceType(self.accelerator, self.surface, self.runtime_version), *self.other_types)

    def for_type(self, slice_type: SliceType) -> PlacementRequest:
        """This request for one of its types only: what is created when a candidate of it is chosen."""
        return dataclasses.replace(
            self,
            accelerator=slice_type.accelerator,
            surface=slice_type.surface,
            runtime_version=slice_type.runtime_version,
            other_types=(),
        )

    def placing(self, candidate: Candidate) -> PlacementRequest:
        """The request as it is sent for ``candidate``: of the candidate's own type."""
        if not self.other_types:
            return self
        return self.for_type(self.slice_types[candidate.type_rank])

    @property
    def uses_queued_resource(self) -> bool:
        """A multislice and a race can only be placed through queued resources; so is ``--queued`` on the
        TPU API (on Compute Engine it is ``flex_start``)."""
        return (self.queued and not self.flex_start) or self.slices > 1 or self.strategy is Strategy.RACE

    @property
    def flex_start(self) -> bool:
        """``--queued`` on Compute Engine: a flex-start create that waits for capacity
        (docs/google-facts.md#flex-start)."""
        return self.queued and self.surface is Surface.COMPUTE

    @property
    def chips(self) -> int:
        return self.accelerator.chips * self.slices

    @property
    def quota_needed(self) -> int:
        """Units of quota the request draws (cores for the TPU API's v2-v4 and v5p, chips elsewhere)."""
        return quota_units(self.accelerator, self.surface) * self.slices

    @property
    def node_names(self) -> tuple[str, ...]:
        """The slices this request makes: the name itself, or ``<name>-0 .. <name>-(N-1)`` (the API's
        multisliceParams naming with the request's name as the prefix)."""
        if self.slices == 1:
            return (self.name,)
        return tuple(f"{self.name}-{i}" for i in range(self.slices))

    def to_dict(self) -> dict[str, Any]:
        return {
            "accelerator_type": self.accelerator.api_name,
            "friendly_name": self.accelerator.friendly_name,
            "topology": self.accelerator.topology,
            "chips_per_slice": self.accelerator.chips,
            "hosts_per_slice": self.accelerator.hosts,
            "slices": self.slices,
            "chips": self.chips,
            "name": self.name,
            "node_names": list(self.node_names),
            "request_id": self.request_id,
            "capacity_types": [c.value for c in self.capacity_types],
            "reservation": self.reservation,
            "zones": list(self.zones),
            "region": self.region,
            "max_price_per_hour": self.max_price,
            "priced_only": self.priced_only,
            "queued": self.uses_queued_resource,
            "flex_start": self.flex_start,
            "valid_for_s": self.valid_for_s,
            "strategy": self.strategy.value,
            "race_k": self.race_k if self.strategy is Strategy.RACE else None,
            "runtime_version": self.runtime_version,
            "labels": dict(self.labels),
            **self.network.to_dict(),
            "service_account": self.service_account,
            "checkpoint_bucket": self.checkpoint_bucket,
            **({} if self.terminate_at is None else {"terminate_at": iso(self.terminate_at)}),
            **self._types_dict(),
        }

    def _types_dict(self) -> dict[str, Any]:
        """Where several types are allowed: each of them, in the order given, and how they rank."""
        if not self.other_types:
            return {}
        return {
            "slice_types": [t.to_dict() for t in self.slice_types],
            "type_preference": self.type_preference.value,
        }


def resolve_capacity_types(
    *,
    capacity_types: Sequence[CapacityType] = (),
    reserved: str | None = None,
    defaults: Sequence[CapacityType] = (),
) -> tuple[tuple[CapacityType, ...], str | None]:
    """The allowed capacity types: the given ones (parsed at the edge: ``--capacity-type`` plus the
    shorthands, in that order) plus reserved with ``reserved``, else ``defaults`` (settings), else
    on-demand; with the reservation name. Reserved capacity without a reservation name is a usage error."""
    types = list(dict.fromkeys(capacity_types))  # without repeats, in the order given
    reservation: str | None = None
    if reserved is not None:
        reservation = reserved.strip()
        if not reservation:
            raise UsageError(
                "--reserved needs a reservation name, got an empty one",
                field="reserved",
                value=reserved,
                fix="pass --reserved RESERVATION_NAME (the name of a TPU reservation in the zone)",
            )
        if CapacityType.RESERVED not in types:
            types.append(CapacityType.RESERVED)
    if not types:
        types = [c for c in defaults if c is not CapacityType.RESERVED or reservation] or [
            CapacityType.ON_DEMAND
        ]
    if CapacityType.RESERVED in types and not reservation:
        raise UsageError(
            "reserved capacity needs a reservation name",
            field="capacity_types",
            value=CapacityType.RESERVED.value,
            fix="pass --reserved RESERVATION_NAME (it implies --capacity-type reserved)",
        )
    return tuple(types), reservation


# --------------------------------------------------------------------------------------------------
# Candidates


@dataclass(frozen=True)
class QuotaCheck:
    """One quota a candidate draws on: zone or region, what it allows, what is used and what is needed."""

    quota_id: str
    scope: str  # "zone" | "region"
    location: str
    limit: int | None  # -1: unlimited; None: unknown (tried, and the create answers)
    in_use: int
    needed: int
    unit: str
    preempted_holding: int = 0
    reclaimable: int = 0  # of in_use, held by dead slices/queued resources that `pod gc` would free
    reclaimable_holders: tuple[str, ...] = ()

    @classmethod
    def from_use(cls, use: QuotaUse, needed: int, holders: Sequence[str] = ()) -> QuotaCheck:
        return cls(
            quota_id=use.quota_id,
            scope=use.scope,
            location=use.location,
            limit=use.limit,
            in_use=use.in_use,
            needed=needed,
            unit=use.unit,
            preempted_holding=use.preempted_holding,
            reclaimable=use.reclaimable,
            reclaimable_holders=tuple(holders),
        )

    @property
    def known(self) -> bool:
        return self.limit is not None

    @property
    def available(self) -> int | None:
        """What is left; None when unlimited or unknown (both let the request through)."""
        if self.limit is None or self.limit < 0:
            return None
        return max(self.limit - self.in_use, 0)

    @property
    def fits(self) -> bool:
        available = self.available
        return available is None or available >= self.needed

    @property
    def fits_after_gc(self) -> bool:
        """Whether deleting the dead slices holding this quota would make room."""
        available = self.available
        return available is None or available + self.reclaimable >= self.needed

    @property
    def headroom(self) -> float:
        available = self.available
        return math.inf if available is None else float(available - self.needed)

    def shortfall(self) -> str:
        """``zone quota Q in us-central1-a: needs 64 chips, 32 available (limit 64, 32 in use)``."""
        where = f"zone {self.location}" if self.scope == "zone" else f"region {self.location}"
        if self.limit is None:
            return f"{self.scope} quota {self.quota_id} in {where}: unknown — try and let the create answer"
        limit = "unlimited" if self.limit < 0 else str(self.limit)
        text = (
            f"{self.scope} quota {self.quota_id} in {where}: needs {self.needed} {self.unit}, "
            f"{self.available} available (limit {limit}, {self.in_use} in use)"
        )
        if self.reclaimable:
            text += f", {self.reclaimable} of them held by preempted/failed slices that `tpuctl pod gc` frees"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "quota_id": self.quota_id,
            "scope": self.scope,
            "location": self.location,
            "limit": self.limit,
            "in_use": self.in_use,
            "needed": self.needed,
            "available": self.available,
            "fits": self.fits,
            "unit": self.unit,
            "preempted_holding": self.preempted_holding,
            "reclaimable": self.reclaimable,
            "reclaimable_holders": list(self.reclaimable_holders),
        }


@dataclass(frozen=True)
class Offer:
    """Whether a zone offers the type, as the API says; ``note`` explains a no (e.g. unknown zone)."""

    offered: bool
    note: str | None = None


@dataclass(frozen=True)
class Candidate:
    """One zone x capacity type, annotated. ``reason`` is None exactly when it is feasible."""

    zone: str
    capacity: CapacityType
    offered: bool
    price_per_chip_hour: float | None
    price_per_hour: float | None  # the whole request: chips per slice x slices x price per chip-hour
    max_price: float | None
    quota: tuple[QuotaCheck, ...]
    rejection: Rejection | None
    reason: str | None
    capacity_rank: int = 0  # position of the capacity type in the allowed list (a tie-break)
    #: How far the zone is from the run's checkpoint bucket (None: no bucket, or its location unknown).
    bucket: BucketDistance | None = None
    #: The slice type this candidate creates (None: the request's one type, for one built by hand).
    slice_type: SliceType | None = None
    #: The type's position among the request's types (the user's order).
    type_rank: int = 0
    #: The request names several types: the candidate's key and label name its own.
    several_types: bool = False

    @property
    def far_from_bucket(self) -> bool:
        return self.bucket is not None and not self.bucket.near

    @property
    def region(self) -> str:
        return region_of_zone(self.zone)

    @property
    def feasible(self) -> bool:
        return self.rejection is None

    @property
    def within_cap(self) -> bool | None:
        """None without a cap or without a price; else whether the price is within it."""
        if self.max_price is None or self.price_per_hour is None:
            return None
        return self.price_per_hour <= self.max_price + 1e-9

    @property
    def quota_fits(self) -> bool:
        return all(q.fits for q in self.quota)

    @property
    def headroom(self) -> float:
        return min((q.headroom for q in self.quota), default=math.inf)

    @property
    def key(self) -> str:
        if self.several_types and self.slice_type is not None:
            return f"{self.zone}/{self.capacity.value}/{self.slice_type.accelerator.api_name}"
        return f"{self.zone}/{self.capacity.value}"

    def label(self) -> str:
        price = "price unknown" if self.price_per_hour is None else f"{self.price_per_hour:.2f} USD/h"
        if self.several_types and self.slice_type is not None:
            return f"{self.slice_type.accelerator.api_name} in {self.zone} {self.capacity.value} ({price})"
        return f"{self.zone} {self.capacity.value} ({price})"

    def to_dict(self) -> dict[str, Any]:
        kind = self.slice_type
        return {
            **(
                {}
                if kind is None
                else {"accelerator_type": kind.accelerator.api_name, "api": kind.surface.value}
            ),
            "zone": self.zone,
            "region": self.region,
            "capacity": self.capacity.value,
            "offered": self.offered,
            "price_per_chip_hour": self.price_per_chip_hour,
            "price_per_hour": None if self.price_per_hour is None else round(self.price_per_hour, 6),
            "within_cap": self.within_cap,
            "quota": [q.to_dict() for q in self.quota],
            "quota_fits": self.quota_fits,
            "feasible": self.feasible,
            "rejection": None if self.rejection is None else self.rejection.value,
            "bucket": None if self.bucket is None else self.bucket.to_dict(),
        }


def candidate_zones(
    accel: AcceleratorType,
    *,
    zones: Sequence[str] = (),
    region: str | None = None,
    cloud_zones: Sequence[str] = (),
) -> list[str]:
    """Where to look: the explicit zones; else the region's zones (the catalog's for the generation, plus
    any the API lists in that region); else every zone the catalog lists for the generation."""
    if zones:
        return list(dict.fromkeys(validate_zone(z) for z in zones))
    if region:
        found = [z for z in accel.generation.zones if region_of_zone(z) == region]
        found += [z for z in cloud_zones if _region_or_none(z) == region and z not in found]
        return sorted(found)
    return sorted(accel.generation.zones)


def _region_or_none(zone: str) -> str | None:
    try:
        return region_of_zone(zone)
    except UsageError:
        return None


def build_candidates(
    request: PlacementRequest,
    *,
    catalog: Catalog,
    book: QuotaBook,
    zones: Sequence[str],
    offers: Mapping[str, Offer],
    bucket: BucketLocation | None = None,
    type_rank: int = 0,
    several_types: bool = False,
) -> list[Candidate]:
    """Every zone x allowed capacity type of the request's (one) type, annotated and judged (see the module
    docstring for the order of the checks); ``bucket``: where the run's checkpoint bucket is, when known;
    ``type_rank``: the type's position among several the request allows (``several_types``)."""
    accel = request.accelerator
    slice_type = request.slice_types[0]
    out: list[Candidate] = []
    for zone in zones:
        offer = offers.get(zone, Offer(False, "the API did not say what this zone offers"))
        distance = None if bucket is None else BucketDistance.of(bucket, zone)
        for rank, capacity in enumerate(request.capacity_types):
            # Flex-start is billed by its own SKU: its price where the catalog has one, else unknown
            # (docs/google-facts.md#prices-for-budgets), never the spot price.
            per_chip = catalog.price_per_chip_hour(accel, zone, capacity, flex_start=request.flex_start)
            per_hour = None if per_chip is None else per_chip * request.chips
            uses = book.uses_for(accel, zone, capacity, request.surface)
            checks = tuple(
                QuotaCheck.from_use(
                    use, request.quota_needed, book.holders(use.quota_id, use.location, use.tpu_family)
                )
                for use in uses
            )
            rejection, reason = _judge(request, zone, capacity, offer, per_hour, checks)
            out.append(
                Candidate(
                    zone=zone,
                    capacity=capacity,
                    offered=offer.offered,
                    price_per_chip_hour=per_chip,
                    price_per_hour=per_hour,
                    max_price=request.max_price,
                    quota=checks,
                    rejection=rejection,
                    reason=reason,
                    capacity_rank=rank,
                    bucket=distance,
                    slice_type=slice_type,
                    type_rank=type_rank,
                    several_types=several_types,
                )
            )
    return out


def _judge(
    request: PlacementRequest,
    zone: str,
    capacity: CapacityType,
    offer: Offer,
    per_hour: float | None,
    checks: Sequence[QuotaCheck],
) -> tuple[Rejection | None, str | None]:
    accel = request.accelerator
    if not offer.offered:
        note = f" ({offer.note})" if offer.note else ""
        return Rejection.NOT_OFFERED, f"{accel.api_name} is not offered in zone {zone}{note}"
    if per_hour is None and request.priced_only:
        return (
            Rejection.NO_PRICE,
            f"no price for {accel.generation.name} {capacity.value} in region {region_of_zone(zone)}, and "
            "--budget counts the run's spend by its price",
        )
    if request.max_price is not None:
        if per_hour is None:
            return (
                Rejection.NO_PRICE,
                f"no price for {accel.generation.name} {capacity.value} in region {region_of_zone(zone)}, "
                f"so the cap of {request.max_price:.2f} USD/h cannot be checked",
            )
        if per_hour > request.max_price + 1e-9:
            return (
                Rejection.OVER_CAP,
                f"over the price cap: {per_hour:.2f} USD/h > {request.max_price:.2f} USD/h",
            )
    short = [q for q in checks if not q.fits]
    if short:
        return Rejection.NO_QUOTA, "; ".join(q.shortfall() for q in short)
    return None, None


def rank(
    candidates: Iterable[Candidate], preference: TypePreference = TypePreference.ORDERED
) -> list[Candidate]:
    """The feasible candidates in the order they are tried (see the module docstring). Of several slice
    types, ``ordered`` tries the user's first type's candidates before the next type's; ``cheapest``
    ranks them all by price, the type's order only breaking a tie (one type: the same either way)."""
    ordered = preference is TypePreference.ORDERED

    def key(c: Candidate) -> tuple[int, bool, float, bool, float, int, int, str]:
        price = c.price_per_hour
        return (
            c.type_rank if ordered else 0,
            price is None,
            price if price is not None else 0.0,
            c.far_from_bucket,
            -c.headroom,
            c.type_rank,
            c.capacity_rank,
            c.zone,
        )

    return sorted((c for c in candidates if c.feasible), key=key)


def _display_order(candidates: Iterable[Candidate], order: Sequence[Candidate]) -> list[Candidate]:
    """Feasible ones in rank order, then the rejected ones by price (unknown last), then zone."""
    ranked_keys = {c.key for c in order}
    rejected = sorted(
        (c for c in candidates if c.key not in ranked_keys),
        key=lambda c: (
            c.price_per_hour is None,
            c.price_per_hour if c.price_per_hour is not None else 0.0,
            c.zone,
            c.type_rank,
            c.capacity_rank,
        ),
    )
    return [*order, *rejected]


# --------------------------------------------------------------------------------------------------
# The plan


@dataclass
class Plan:
    """What placement would do: the verdict, every candidate with why, and the requests it would send."""

    request: PlacementRequest
    candidates: list[Candidate]  # every candidate, feasible ones first in rank order
    order: list[Candidate]  # the feasible ones, in the order they are tried
    verdict: Verdict
    message: str | None = None
    fix: str | None = None
    requests: list[PlannedRequest] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    zones: list[str] = field(default_factory=list)
    #: Where the run's checkpoint bucket is (None: no bucket, or its location could not be read).
    bucket: BucketLocation | None = None

    @property
    def feasible(self) -> bool:
        return self.verdict is Verdict.FEASIBLE

    @property
    def chosen(self) -> Candidate | None:
        return self.order[0] if self.order else None

    @property
    def racing(self) -> list[Candidate]:
        if self.request.strategy is not Strategy.RACE:
            return []
        return self.order[: self.request.race_k]

    def status_of(self, candidate: Candidate) -> tuple[str, str]:
        """(status, why) of a candidate: chosen | racing | fallback | rejected."""
        if not candidate.feasible:
            return "rejected", candidate.reason or ""
        position = next(i for i, c in enumerate(self.order) if c.key == candidate.key)
        best = self.order[0]
        if self.request.strategy is Strategy.RACE and position < self.request.race_k:
            return "racing", (
                f"queued at once with the other top {min(self.request.race_k, len(self.order))} "
                f"feasible candidates (rank {position + 1}); the first to become ACTIVE is kept"
            )
        if position == 0:
            return "chosen", _chosen_why(candidate, len(self.order), self.request.type_preference)
        extra = ""
        if candidate.price_per_hour is not None and best.price_per_hour is not None:
            extra = f", {candidate.price_per_hour - best.price_per_hour:+.2f} USD/h vs the chosen"
        return "fallback", f"feasible, tried in rank {position + 1} if the ones before fail{extra}"

    def error(self, attempts: Sequence[Mapping[str, Any]] = ()) -> InfeasibleError | None:
        """The error an infeasible plan raises outside a dry run (None when feasible)."""
        if self.feasible:
            return None
        cls = {
            Verdict.NO_QUOTA: NoQuotaForRequest,
            Verdict.NO_CAPACITY: NoCapacityForRequest,
            Verdict.OVER_PRICE_CAP: OverPriceCapForRequest,
        }[self.verdict]
        return cls(
            self.message or "no candidate can take the request",
            fix=self.fix,
            attempts=attempts,
            candidates=[self.candidate_dict(c) for c in self.candidates],
        )

    def candidate_dict(self, candidate: Candidate) -> dict[str, Any]:
        status, why = self.status_of(candidate)
        rank_ = next((i + 1 for i, c in enumerate(self.order) if c.key == candidate.key), None)
        return {**candidate.to_dict(), "rank": rank_, "status": status, "reason": why}

    def estimated_price_per_hour(self) -> float | None:
        chosen = self.chosen
        return None if chosen is None or chosen.price_per_hour is None else round(chosen.price_per_hour, 6)

    def to_dict(self) -> dict[str, Any]:
        chosen = self.chosen
        return {
            "feasible": self.feasible,
            "verdict": self.verdict.value,
            "exit_code": self.verdict.exit_code,
            "message": self.message,
            "fix": self.fix,
            "request": self.request.to_dict(),
            "chosen": None if chosen is None else self.candidate_dict(chosen),
            "estimated_price_per_hour": self.estimated_price_per_hour(),
            "order": [c.key for c in self.order],
            "zones_considered": list(self.zones),
            "candidates": [self.candidate_dict(c) for c in self.candidates],
            "requests": [r.to_dict() for r in self.requests],
            "warnings": list(self.warnings),
            "checkpoint_bucket": self._bucket_dict(),
        }

    def _bucket_dict(self) -> dict[str, Any] | None:
        """The run's checkpoint bucket: where it is, and what a checkpoint costs from the chosen zone."""
        name = self.request.checkpoint_bucket
        if name is None:
            return None
        chosen = self.chosen
        out: dict[str, Any] = {"bucket": name, "location": None, "location_type": None, "data_locations": []}
        if self.bucket is not None:
            out.update(self.bucket.to_dict())
        distance = chosen.bucket if chosen is not None else None
        out["chosen_zone_near"] = None if distance is None else distance.near
        # The checkpoint's size is the program's; the cost is per GB of it.
        out["egress_usd_per_gb"] = None if distance is None else distance.egress_usd_per_gb
        return out


def _chosen_why(
    candidate: Candidate, feasible: int, preference: TypePreference = TypePreference.ORDERED
) -> str:
    price = "price unknown" if candidate.price_per_hour is None else f"{candidate.price_per_hour:.2f} USD/h"
    near = (
        " in the checkpoint bucket's location"
        if candidate.bucket is not None and candidate.bucket.near
        else ""
    )
    if feasible == 1:
        return f"the only feasible candidate ({price}){near}"
    # Of several types in the user's order, the first is the first type's cheapest, not the cheapest.
    what = (
        "cheapest feasible candidate of the first type that has one"
        if candidate.several_types and preference is TypePreference.ORDERED
        else "cheapest feasible candidate"
    )
    return f"{what} ({price}){near}; {feasible - 1} fallback(s) if it is stocked out"


def decide(
    request: PlacementRequest,
    candidates: Sequence[Candidate],
    *,
    zones: Sequence[str],
    warnings: Sequence[str] = (),
    bucket: BucketLocation | None = None,
) -> Plan:
    """Rank the candidates and reach a verdict. The requests are added by the allocator (they need the
    cloud's request builder)."""
    order = rank(candidates, request.type_preference)
    plan = Plan(
        request=request,
        candidates=_display_order(candidates, order),
        order=order,
        verdict=Verdict.FEASIBLE,
        warnings=list(warnings),
        zones=list(zones),
        bucket=bucket,
    )
    if order:
        chosen = order[0]
        if bucket is not None and chosen.bucket is not None:
            note = chosen.bucket.cost_note(bucket, chosen.zone)
            if note is not None:
                plan.warnings.append(note)
        return plan
    if request.other_types:
        plan.verdict, plan.message, plan.fix = _infeasible_types(request, candidates)
    else:
        plan.verdict, plan.message, plan.fix = _infeasible(request, candidates, zones)
    return plan


def _infeasible_types(request: PlacementRequest, candidates: Sequence[Candidate]) -> tuple[Verdict, str, str]:
    """The verdict of a request of several types none can take: each type's own reason, in the user's
    order; the first type's verdict is the exit code (it is the one the user named first)."""
    verdicts = []
    for type_rank, slice_type in enumerate(request.slice_types):
        own = [c for c in candidates if c.type_rank == type_rank]
        zones = list(dict.fromkeys(c.zone for c in own))
        verdicts.append((slice_type, _infeasible(request.for_type(slice_type), own, zones)))
    message = "no slice type can take the request: " + "; ".join(
        f"{t.accelerator.friendly_name}: {why}" for t, (_, why, _) in verdicts
    )
    fix = "; or ".join(dict.fromkeys(f for _, (_, _, f) in verdicts))
    return verdicts[0][1][0], message, fix


def _infeasible(
    request: PlacementRequest, candidates: Sequence[Candidate], zones: Sequence[str]
) -> tuple[Verdict, str, str]:
    """The verdict of a request no candidate can take: the stage where the last candidates fell."""
    accel = request.accelerator
    what = f"{request.slices} x {accel.api_name}" if request.slices > 1 else accel.api_name
    offered = [c for c in candidates if c.offered]
    if not offered:
        where = ", ".join(zones) if zones else "no zone (none matched the zones/region given)"
        return (
            Verdict.NO_CAPACITY,
            f"{what} is not offered in any zone considered: {where}",
            f"choose another type or zone (`tpuctl catalog zones` lists where {accel.generation.name} is "
            "offered), or drop --zone/--region to consider every zone",
        )
    priced = [c for c in offered if c.rejection not in (Rejection.OVER_CAP, Rejection.NO_PRICE)]
    if not priced and request.max_price is None:  # only ``priced_only`` rejects an unpriced candidate
        return (
            Verdict.OVER_PRICE_CAP,
            f"no candidate for {what} has a price, and --budget counts the run's spend by its price: "
            + ", ".join(f"{c.zone} {c.capacity.value}" for c in offered),
            "give the price --budget assumes with --assume-price-per-hour USD, or choose a zone and "
            "capacity tpuctl has a price for (`tpuctl cost estimate` lists them)",
        )
    if not priced:
        return _over_cap(request, what, offered)
    return _no_quota(request, what, priced)


#: How many over-cap candidates the refusal names (cheapest first); `-o json` has every one.
OVER_CAP_LISTED = 4


def _over_cap(request: PlacementRequest, what: str, offered: Sequence[Candidate]) -> tuple[Verdict, str, str]:
    """The over-cap verdict: the priced candidates, cheapest first, and the smallest cap that would place
    the request. Unpriced candidates are named apart: the cap cannot be checked for them, so raising it
    would not let them through."""
    cap = request.max_price
    assert cap is not None
    over = sorted(
        (c for c in offered if c.price_per_hour is not None),
        key=lambda c: (c.price_per_hour or 0.0, c.zone, c.capacity_rank),
    )
    unpriced = [c for c in offered if c.price_per_hour is None]
    cheaper = [] if CapacityType.SPOT in request.capacity_types else ["allow spot capacity (--spot)"]
    others = " or ".join([*cheaper, "choose a smaller type or fewer slices"])
    unpriced_note = ""
    if unpriced:
        names = ", ".join(f"{c.zone} {c.capacity.value}" for c in unpriced)
        unpriced_note = f"; no known price (so the cap cannot be checked) for {names}"
    if not over:
        return (
            Verdict.OVER_PRICE_CAP,
            f"no candidate for {what} has a known price, so the price cap of {cap:.2f} USD/h cannot be "
            f"checked anywhere: {', '.join(f'{c.zone} {c.capacity.value}' for c in unpriced)}",
            "drop --max-price, or choose a zone with a known price (`tpuctl catalog prices` lists them)",
        )
    listed = "; ".join(
        f"{c.zone} {c.capacity.value} {c.price_per_hour:.2f} USD/h" for c in over[:OVER_CAP_LISTED]
    )
    if len(over) > OVER_CAP_LISTED:
        listed += f"; +{len(over) - OVER_CAP_LISTED} more (-o json lists every candidate)"
    message = (
        f"every priced candidate for {what} is over the price cap of {cap:.2f} USD/h: {listed}{unpriced_note}"
    )
    # The cheapest one whose quota also has room is what a higher cap would place; if none has room,
    # a higher cap alone would only trade this refusal for a quota one.
    placeable = next((c for c in over if c.quota_fits), None)
    if placeable is None:
        fix = (
            f"raise --max-price to at least {smallest_cap(over[0].price_per_hour or 0.0):.2f} and get quota "
            f"(every priced candidate is also short of it: `tpuctl quota`), or {others}"
        )
    else:
        fix = (
            f"raise --max-price to {smallest_cap(placeable.price_per_hour or 0.0):.2f}, the smallest cap "
            f"that would place it ({placeable.zone} {placeable.capacity.value}), or {others}"
        )
    return Verdict.OVER_PRICE_CAP, message, fix


def smallest_cap(per_hour: float) -> float:
    """The smallest cap, in whole cents, that a price is within (rounded up, so passing it works; the
    rounding to 6 places first keeps 76.8 from becoming 76.81 through float noise)."""
    return math.ceil(round(per_hour * 100, 6)) / 100


def _no_quota(request: PlacementRequest, what: str, priced: list[Candidate]) -> tuple[Verdict, str, str]:
    """The no-quota verdict in a few lines: whether the request is over the quota LIMIT everywhere (then
    only a higher limit, or a smaller request, helps) or over what is left, and the closest candidate;
    `-o json` (the error's candidates) has every one."""
    unit = request.accelerator.generation.quota_unit
    needed = request.quota_needed
    short = [(c, q) for c in priced for q in c.quota if not q.fits]

    def under(q: QuotaCheck) -> bool:  # the limit itself is below the request (an unknown one is not)
        return q.limit is not None and 0 <= q.limit < needed

    def limit_of(q: QuotaCheck) -> float:
        return math.inf if q.limit is None else q.limit

    over_limit = all(any(under(q) for q in c.quota) for c in priced)
    closest = max(priced, key=lambda c: min((q.headroom for q in c.quota), default=math.inf))
    head = f"not enough quota for {what} ({needed} {unit}) in any of {len(priced)} candidates"
    fixes = []
    quota_url = QUOTA_REQUEST_URLS[request.surface]
    if over_limit:
        # Each candidate's binding limit (its lowest short one); the most generous of those.
        binding = [min((q for q in c.quota if not q.fits), key=limit_of) for c in priced]
        highest = max(binding, key=limit_of)
        ids = sorted({q.quota_id for _, q in short if under(q)})
        message = (
            f"{head}: {needed} {unit} is more than the quota limit itself in every one (the highest is "
            f"{highest.limit} {unit}, {highest.quota_id} in {highest.location})"
        )
        fixes.append(
            f"request a limit of at least {needed} {unit} for {', '.join(ids[:3])}"
            + (f" (+{len(ids) - 3} more)" if len(ids) > 3 else "")
            + f" ({quota_url})"
        )
        fixes.append("or ask for fewer chips (a smaller type, fewer slices)")
    else:
        nearest = "; ".join(q.shortfall() for q in closest.quota if not q.fits)
        message = f"{head}; the closest is {closest.zone} {closest.capacity.value}: {nearest}"
        fixes.append("choose another type or zone")
        if any(q.reclaimable for _, q in short):
            fixes.append("free quota held by preempted or failed slices with `tpuctl pod gc`")
        fixes.append(f"request more quota ({quota_url})")
    if not any(c.is_preemptible for c in request.capacity_types):
        fixes.append("allow spot capacity (--spot), whose quota is separate from on-demand")
    return Verdict.NO_QUOTA, message + " (-o json lists every candidate)", "; ".join(fixes)


# --------------------------------------------------------------------------------------------------
# Errors that carry the candidates (so `-o json` shows every candidate and why it was rejected)


class NoQuotaForRequest(NoQuotaError):
    def __init__(
        self,
        message: str,
        *,
        fix: str | None = None,
        attempts: Sequence[Mapping[str, Any]] = (),
        candidates: Sequence[dict[str, Any]] = (),
    ) -> None:
        super().__init__(message, fix=fix, attempts=[dict(a) for a in attempts])
        self.candidates = list(candidates)

    def details(self) -> dict[str, Any]:
        return {**super().details(), "candidates": self.candidates}


class NoCapacityForRequest(NoCapacityError):
    def __init__(
        self,
        message: str,
        *,
        fix: str | None = None,
        attempts: Sequence[Mapping[str, Any]] = (),
        candidates: Sequence[dict[str, Any]] = (),
    ) -> None:
        super().__init__(message, fix=fix, attempts=[dict(a) for a in attempts])
        self.candidates = list(candidates)

    def details(self) -> dict[str, Any]:
        return {**super().details(), "candidates": self.candidates}


class OverPriceCapForRequest(OverPriceCapError):
    def __init__(
        self,
        message: str,
        *,
        fix: str | None = None,
        attempts: Sequence[Mapping[str, Any]] = (),
        candidates: Sequence[dict[str, Any]] = (),
    ) -> None:
        super().__init__(message, fix=fix, attempts=[dict(a) for a in attempts])
        self.candidates = list(candidates)

    def details(self) -> dict[str, Any]:
        return {**super().details(), "candidates": self.candidates}
