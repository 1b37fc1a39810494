"""Prices: which table is in force, refreshing it from the Cloud Billing Catalog API, and the cache.

Where prices come from, in order:

1. a refreshed cache in the state dir, ``<state_dir>/prices/<backend>.yaml`` (``gcp`` or ``sim``), written
   by ``tpuctl catalog prices --refresh`` with its source and date;
2. else the bundled ``tpuctl/catalog/data/prices.yaml`` (its own source and date).

The cache is per backend because one state dir serves both: prices pulled from Google must not be taken
for the simulator's and the other way round. On the simulator, ``--refresh`` takes the prices of the
world file (the bundled catalog with the world's ``prices:`` overrides) unless a billing endpoint is given
explicitly; the simulator serves no billing surface, and its world file is where its prices are decided.

Mapping SKUs to (generation, region, capacity) follows SkyPilot's catalog fetcher (skypilot-org/skypilot,
``sky/catalog/data_fetchers/fetch_gcp.py``): the
description names the generation (``Tpu-v2``, ``Tpu-v3``, ``Tpu-v4``, ``TpuV5e``, ``TpuV5p``, ``TpuV6e``),
spot/preemptible SKUs say ``Preemptible`` (their usageType is still ``OnDemand``), v2/v3 pod SKUs say
``Pod``. v2, v3 and v4 SKUs are priced per 8 TensorCores (4 chips), v5e, v5p and v6e per chip. A v2/v3
pod SKU prices that generation's slices of several hosts (``pod_on_demand``/``pod_spot``,
``tpuctl.catalog.price_key``), never its single device; every v4 SKU says ``Pod`` and prices every v4
slice. Flex-start (``DWS Defined Duration ...``) SKUs are left out: how they name the generation is not
known well enough to match them.

Changing the table in force does not rewrite history: the ledger keeps the price each slice had. A
refresh records a ``price_change`` event for each live slice whose price moved, so a report bills each
price for its own interval.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tpuctl.catalog import POD_SKU_GENERATIONS, CapacityType, Catalog, PriceTable, price_key
from tpuctl.errors import CloudError, ConfigError, UsageError
from tpuctl.timefmt import iso

if TYPE_CHECKING:
    from tpuctl.backends.base import PriceOverrides
    from tpuctl.cloud.billing import CloudBillingCatalogClient, Sku
    from tpuctl.store.ledger import Ledger

PRICES_DIR = "prices"

#: Description substrings (lowercased, spaces/dashes removed) per catalog generation.
_GENERATION_MARKERS: tuple[tuple[str, str], ...] = (
    ("v5p", "tpuv5p"),
    ("v5e", "tpuv5e"),
    ("v6e", "tpuv6e"),
    ("v4", "tpuv4"),
    ("v3", "tpuv3"),
    ("v2", "tpuv2"),
)
#: Generations whose SKUs are priced per 8 TensorCores rather than per chip.
_PER_8_CORES = frozenset({"v2", "v3", "v4"})
#: SKUs that are not the list price of an ordinary slice.
_EXCLUDED_WORDS = ("commit", "reserv", "calendar", "flex", "dws", "sole tenan", "custom", "premium")
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")


def cache_path(state_dir: Path, backend: str) -> Path:
    return Path(state_dir) / PRICES_DIR / f"{backend}.yaml"


@dataclass(frozen=True)
class PriceSource:
    """Which price table a command used: its source, its date, and whether it is a refreshed cache."""

    source: str
    date: str
    cached: bool
    path: str | None = None
    warnings: tuple[str, ...] = ()
    # generation -> what is uncertain about its prices (TPU7x: per chip or per host), from the table's
    # ``notes:``; shown wherever that generation is priced.
    notes: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "date": self.date,
            "cached": self.cached,
            "path": self.path,
            "notes": dict(self.notes),
        }

    def note_for(self, generation: str) -> str | None:
        return self.notes.get(generation)

    def line(self) -> str:
        kind = "refreshed cache" if self.cached else "bundled catalog"
        return f"prices: {kind}, {self.source} ({self.date})"


def load_catalog(state_dir: Path, backend: str) -> tuple[Catalog, PriceSource]:
    """The catalog with the backend's refreshed prices when cached, else the bundled ones.

    A cache that cannot be read is not fatal (the bundled prices are a correct, older answer): it is
    ignored with a warning that says how to repair it.
    """
    path = cache_path(state_dir, backend)
    if path.exists():
        try:
            catalog = Catalog.load(price_override=path)
        except ConfigError as exc:
            bundled = Catalog.load()
            warning = f"ignoring the price cache {path}: {exc.message}; run `tpuctl catalog prices --refresh`"
            return bundled, PriceSource(
                bundled.prices.source,
                bundled.prices.date,
                cached=False,
                warnings=(warning,),
                notes=bundled.prices.notes,
            )
        return catalog, PriceSource(
            catalog.prices.source,
            catalog.prices.date,
            cached=True,
            path=str(path),
            notes=catalog.prices.notes,
        )
    bundled = Catalog.load()
    return bundled, PriceSource(
        bundled.prices.source, bundled.prices.date, cached=False, notes=bundled.prices.notes
    )


# --------------------------------------------------------------------------------------------------
# SKU mapping


@dataclass(frozen=True)
class MatchedSku:
    generation: str
    region: str
    capacity: str  # a price key: "on_demand" | "spot" | "pod_on_demand" | "pod_spot"
    per_chip_hour: float
    sku_id: str
    description: str
    pod: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "region": self.region,
            "capacity": self.capacity,
            "per_chip_hour": self.per_chip_hour,
            "sku_id": self.sku_id,
            "description": self.description,
            "pod_sku": self.pod,
        }


@dataclass
class SkuMapping:
    """What the SKUs gave: generation -> region -> {"on_demand": x, "spot": y}, and how it was decided."""

    prices: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    matched: list[MatchedSku] = field(default_factory=list)
    skipped: int = 0
    warnings: list[str] = field(default_factory=list)


def generation_of_description(description: str) -> str | None:
    key = re.sub(r"[\s\-_]", "", description.lower())
    for generation, marker in _GENERATION_MARKERS:
        if marker in key:
            return generation
    return None


def map_skus(skus: Iterable[Sku], catalog: Catalog) -> SkuMapping:
    """TPU SKUs -> USD per chip-hour by generation, region and capacity (see the module docstring).

    A v2/v3 pod SKU goes under the pod keys (those generations' pod slices have their own, higher, price);
    for the other generations a single-device SKU wins over a pod one. Two SKUs of the same kind with
    different prices keep the first and say so.
    """
    out = SkuMapping()
    chosen: dict[tuple[str, str, str], MatchedSku] = {}
    for sku in skus:
        generation = generation_of_description(sku.description)
        lowered = sku.description.lower()
        if generation is None or generation not in catalog.generations:
            out.skipped += 1
            continue
        if (
            sku.usage_type not in ("OnDemand", "Preemptible")
            or any(word in lowered for word in _EXCLUDED_WORDS)
            or sku.unit_price is None
            or (sku.usage_unit and sku.usage_unit != "h")
            or (sku.currency and sku.currency != "USD")
        ):
            out.skipped += 1
            continue
        spot = "preemptible" in lowered or sku.usage_type == "Preemptible"
        pod = "pod" in lowered
        capacity = price_key(
            CapacityType.SPOT if spot else CapacityType.ON_DEMAND,
            pod_slice=pod and generation in POD_SKU_GENERATIONS,
        )
        per_chip = sku.unit_price
        if generation in _PER_8_CORES:
            chips_per_sku = 8 // catalog.generations[generation].cores_per_chip
            per_chip = sku.unit_price / chips_per_sku
        for region in sku.regions:
            if not _REGION_RE.match(region):
                continue  # "global", multi-regions: no TPU is billed there
            match = MatchedSku(
                generation, region, capacity, round(per_chip, 9), sku.sku_id, sku.description, pod
            )
            key = (generation, region, capacity)
            previous = chosen.get(key)
            if previous is None or (previous.pod and not pod):
                chosen[key] = match
            elif previous.pod == pod and abs(previous.per_chip_hour - match.per_chip_hour) > 1e-9:
                out.warnings.append(
                    f"{generation} {capacity} in {region}: SKUs {previous.sku_id} ({previous.per_chip_hour}) "
                    f"and {match.sku_id} ({match.per_chip_hour}) disagree; kept the first"
                )
    for (generation, region, capacity), match in sorted(chosen.items()):
        out.prices.setdefault(generation, {}).setdefault(region, {})[capacity] = match.per_chip_hour
        out.matched.append(match)
    return out


# --------------------------------------------------------------------------------------------------
# Refreshing


@dataclass(frozen=True)
class RefreshResult:
    path: Path
    source: str
    date: str
    prices: dict[str, dict[str, dict[str, float]]]
    matched: int
    skipped: int
    filled_from_bundled: tuple[str, ...]
    warnings: tuple[str, ...]
    price_changes: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "source": self.source,
            "date": self.date,
            "matched_skus": self.matched,
            "skipped_skus": self.skipped,
            "filled_from_bundled": list(self.filled_from_bundled),
            "warnings": list(self.warnings),
            "price_changes": list(self.price_changes),
        }


def _today(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).date().isoformat()


def _stamp(now: float) -> str:
    return iso(now)


def fill_gaps(
    fetched: Mapping[str, Mapping[str, Mapping[str, float]]], bundled: PriceTable
) -> tuple[dict[str, dict[str, dict[str, float]]], list[str]]:
    """The fetched prices, completed with the bundled ones where the API listed nothing (e.g. v4 in
    us-central2, which the SKUs have been seen to miss). Returns the merged table and what was filled."""
    merged: dict[str, dict[str, dict[str, float]]] = {
        g: {r: dict(p) for r, p in regions.items()} for g, regions in fetched.items()
    }
    filled: list[str] = []
    for generation, regions in bundled.prices.items():
        for region, pair in regions.items():
            entry = merged.setdefault(generation, {}).setdefault(region, {})
            for capacity, value in pair.items():
                if capacity not in entry:
                    entry[capacity] = float(value)
                    filled.append(f"{generation}/{region}/{capacity}")
    return merged, filled


def write_cache(path: Path, *, source: str, date: str, fetched_at: str, prices: Mapping[str, Any],
                extra: Mapping[str, Any] | None = None) -> None:  # fmt: skip
    """Write the cache in ``prices.yaml``'s shape (so ``Catalog.load(price_override=)`` reads it), atomically:
    a reader sees the old file or the new one, never half of one."""
    from tpuctl.store.paths import atomic_write_text, ensure_private_dir

    ensure_private_dir(path.parent)
    data: dict[str, Any] = {
        "source": source,
        "date": date,
        "fetched_at": fetched_at,
        "currency": "USD",
        "unit": "chip-hour",
        **(extra or {}),
        "prices": {g: {r: dict(p) for r, p in sorted(rs.items())} for g, rs in sorted(prices.items())},
    }
    text = "# Written by `tpuctl catalog prices --refresh`; USD per chip-hour.\n" + yaml.safe_dump(
        data, sort_keys=False
    )
    atomic_write_text(path, text)


def _kept_notes(bundled: PriceTable, generations: set[str]) -> dict[str, str]:
    """The bundled table's notes on the generations whose prices still come from it: a refresh must not
    drop what is uncertain about a price it kept (TPU7x's unit)."""
    return {g: note for g, note in sorted(bundled.notes.items()) if g in generations}


def refresh_from_billing(
    client: CloudBillingCatalogClient,
    *,
    state_dir: Path,
    backend: str,
    now: float,
    service_ids: Sequence[str] | None = None,
    write: bool = True,
) -> RefreshResult:
    """Pull the TPU SKUs of both services, map them, fill gaps from the bundled table, cache the result
    (``write=False``: a dry run, nothing is written)."""
    from tpuctl.cloud.billing import TPU_SERVICE_IDS

    catalog = Catalog.load()
    skus = [sku for service in (service_ids or TPU_SERVICE_IDS) for sku in client.iter_skus(service)]
    mapping = map_skus(skus, catalog)
    if not mapping.matched:
        raise CloudError(
            f"the Cloud Billing Catalog API at {client.base_url} listed {len(skus)} SKUs and none is a TPU "
            "price tpuctl recognizes; the cache was not changed",
            fix="check the endpoint (--billing-url / TPUCTL_BILLING_URL must be the Cloud Billing Catalog "
            "API); the bundled prices stay in force",
        )
    merged, filled = fill_gaps(mapping.prices, catalog.prices)
    source = "Cloud Billing Catalog API (services " + ", ".join(service_ids or TPU_SERVICE_IDS) + ")"
    if filled:
        source += f"; gaps from {catalog.prices.source}"
    path = cache_path(state_dir, backend)
    if write:
        write_cache(
            path,
            source=source,
            date=_today(now),
            fetched_at=_stamp(now),
            prices=merged,
            extra={
                "billing_url": client.base_url,
                "matched_skus": [m.to_dict() for m in mapping.matched],
                "filled_from_bundled": filled,
                "notes": _kept_notes(catalog.prices, {f.split("/", 1)[0] for f in filled}),
            },
        )
    return RefreshResult(
        path=path,
        source=source,
        date=_today(now),
        prices=merged,
        matched=len(mapping.matched),
        skipped=mapping.skipped,
        filled_from_bundled=tuple(filled),
        warnings=tuple(mapping.warnings),
    )


def prices_from_world(
    overrides: PriceOverrides, bundled: PriceTable
) -> dict[str, dict[str, dict[str, float]]]:
    """The bundled table with a backend's own price overrides (a world file's ``prices:``) laid over it."""
    merged = {g: {r: dict(p) for r, p in regions.items()} for g, regions in bundled.prices.items()}
    for generation, regions in overrides.items():
        for region, price in regions.items():
            merged.setdefault(generation, {}).setdefault(region, {}).update(price)
    return merged


def refresh_from_world(
    overrides: PriceOverrides,
    where: str,
    *,
    backend: str,
    state_dir: Path,
    now: float,
    write: bool = True,
) -> RefreshResult:
    """The simulator's prices: the world file's, cached like a refresh so every command uses them."""
    bundled = Catalog.load().prices
    merged = prices_from_world(overrides, bundled)
    overridden = sorted(f"{g}/{r}" for g, regions in overrides.items() for r in regions)
    source = f"simulator world {where}" + (
        f" (overrides {', '.join(overridden)}; the rest from {bundled.source})"
        if overridden
        else f" (no price overrides: {bundled.source})"
    )
    path = cache_path(state_dir, backend)
    if write:
        notes = _kept_notes(bundled, set(bundled.notes) - set(overrides))
        write_cache(path, source=source, date=_today(now), fetched_at=_stamp(now), prices=merged,
                extra={"world": where, "notes": notes})  # fmt: skip
    return RefreshResult(
        path=path,
        source=source,
        date=_today(now),
        prices=merged,
        matched=0,
        skipped=0,
        filled_from_bundled=(),
        warnings=(),
    )


def record_price_changes(
    ledger: Ledger, catalog: Catalog, *, backend: str, project: str, now: float, dry_run: bool = False
) -> list[dict[str, Any]]:
    """A ``price_change`` event for every live slice of this backend whose list price moved, so reports
    bill the old price up to now and the new one after (GCP bills the list price in force)."""
    from tpuctl.store.records import EventKind

    changes: list[dict[str, Any]] = []
    for pod in ledger.list_pods(alive=True):
        if (pod.backend not in (None, backend)) or (pod.project not in (None, project)):
            continue
        if pod.accelerator_type is None or pod.capacity is None:
            continue
        try:
            accel = catalog.resolve(pod.accelerator_type)
            new = catalog.price_per_chip_hour(accel, pod.zone, pod.capacity)
        except UsageError:
            continue
        old = pod.price_per_chip_hour
        if new is None or (old is not None and abs(new - old) < 1e-12):
            continue
        changes.append({"pod": pod.name, "zone": pod.zone, "old": old, "new": new})
        if not dry_run:
            ledger.record_event(
                EventKind.PRICE_CHANGE,
                pod=pod.name,
                zone=pod.zone,
                price_per_chip_hour=new,
                ts=now,
                detail={"reason": "catalog prices --refresh", "old": old, "source": catalog.prices.source},
            )
    return changes
