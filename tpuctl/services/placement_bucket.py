"""Placement near the run's checkpoint bucket: which zones are in the bucket's location, and what a
checkpoint costs to move to a zone that is not (docs/google-facts.md#cloud-storage-buckets).

Every checkpoint a run saves goes from its hosts to the bucket, and every restore comes back: in the
bucket's region or dual-region that is free; read from a multi-region, or anywhere outside the bucket's
location, Cloud Storage bills it as data transfer. A zone in the bucket's location (its multi-region
included) is "near" and ranks first among equally priced ones. Pure: the bucket's location is read by the
allocator's survey.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuctl.catalog import region_of_zone
from tpuctl.cloud.buckets import BucketLocation

#: Multi-regions and the regions in them (docs/google-facts.md#cloud-storage-buckets): US holds the
#: us-* regions; EU the regions in member states of the European Union (not London, not Zurich); ASIA
#: the asia-* regions.
_MULTI_REGIONS: dict[str, tuple[str, frozenset[str]]] = {
    "US": ("us-", frozenset()),
    "EU": ("europe-", frozenset({"europe-west2", "europe-west6"})),
    "ASIA": ("asia-", frozenset()),
}
#: The predefined dual-regions and their two regions.
_DUAL_REGIONS: dict[str, frozenset[str]] = {
    "ASIA1": frozenset({"asia-northeast1", "asia-northeast2"}),
    "EUR4": frozenset({"europe-north1", "europe-west4"}),
    "EUR5": frozenset({"europe-west1", "europe-west2"}),
    "EUR7": frozenset({"europe-west2", "europe-west3"}),
    "EUR8": frozenset({"europe-west3", "europe-west6"}),
    "NAM4": frozenset({"us-central1", "us-east1"}),
}
#: Continents as Cloud Storage's data transfer prices group locations, by region prefix.
_CONTINENTS = {
    "us": "north-america",
    "northamerica": "north-america",
    "southamerica": "south-america",
    "europe": "europe",
    "asia": "asia",
    "me": "middle-east",
    "africa": "africa",
    "australia": "oceania",
}
#: USD per GB moved between a bucket and a VM in another location, between two locations on the same
#: continent, for the continents whose rate is known here (docs/google-facts.md#cloud-storage-buckets).
_SAME_CONTINENT_USD_PER_GB = {"north-america": 0.02, "europe": 0.02}
#: Between continents, neither of them Oceania.
_INTERCONTINENTAL_USD_PER_GB = 0.08


def bucket_regions(bucket: BucketLocation) -> frozenset[str] | None:
    """The regions a bucket keeps its data in, when they are a fixed set (a region, a dual-region);
    None for a multi-region (``in_bucket_location`` reads those by prefix)."""
    if bucket.data_locations:
        return frozenset(bucket.data_locations)
    if bucket.location in _DUAL_REGIONS:
        return _DUAL_REGIONS[bucket.location]
    if bucket.location in _MULTI_REGIONS:
        return None
    return frozenset({bucket.location.lower()})


def in_bucket_location(bucket: BucketLocation, region: str) -> bool:
    """Whether a VM in ``region`` reads and writes ``bucket`` without crossing locations."""
    regions = bucket_regions(bucket)
    if regions is not None:
        return region in regions
    prefix, outside = _MULTI_REGIONS[bucket.location]
    return region.startswith(prefix) and region not in outside


def continent_of(region: str) -> str | None:
    return _CONTINENTS.get(region.split("-", 1)[0])


def egress_usd_per_gb(bucket: BucketLocation, region: str) -> float | None:
    """What one GB costs between ``bucket`` and a VM in ``region``: 0 in its region or dual-region; the
    rate between two locations otherwise, where known here (None: unknown, say so). Reads from a
    multi-region are charged even in a region inside it, at a rate not known here."""
    if in_bucket_location(bucket, region):
        return 0.0 if bucket_regions(bucket) is not None else None
    theirs = {continent_of(r) for r in bucket_regions(bucket) or ()} or {_multi_region_continent(bucket)}
    ours = continent_of(region)
    if ours is None or None in theirs:
        return None
    if ours in theirs:
        return _SAME_CONTINENT_USD_PER_GB.get(ours)
    if "oceania" in theirs | {ours}:
        return None
    return _INTERCONTINENTAL_USD_PER_GB


def _multi_region_continent(bucket: BucketLocation) -> str | None:
    prefix = _MULTI_REGIONS.get(bucket.location, ("", frozenset()))[0].rstrip("-")
    return _CONTINENTS.get(prefix)


@dataclass(frozen=True)
class BucketDistance:
    """How far a candidate zone is from the run's checkpoint bucket."""

    near: bool  # in the bucket's location: no transfer charge
    egress_usd_per_gb: float | None  # None: the rate is not known here

    @classmethod
    def of(cls, bucket: BucketLocation, zone: str) -> BucketDistance:
        region = region_of_zone(zone)
        return cls(in_bucket_location(bucket, region), egress_usd_per_gb(bucket, region))

    def to_dict(self) -> dict[str, Any]:
        return {"near": self.near, "egress_usd_per_gb": self.egress_usd_per_gb}

    def cost_note(self, bucket: BucketLocation, zone: str) -> str | None:
        """What a checkpoint costs from ``zone``, in words; None where it costs nothing."""
        if self.near:
            return None
        rate = (
            "at a rate tpuctl does not know (Cloud Storage's pricing page has it)"
            if self.egress_usd_per_gb is None
            else f"about {self.egress_usd_per_gb:.2f} USD per GB"
        )
        return (
            f"{zone} is outside {bucket.describe()}: every checkpoint saved or restored there crosses "
            f"locations, {rate} of checkpoint (its size is the program's: tpuctl cannot tell it)"
        )
