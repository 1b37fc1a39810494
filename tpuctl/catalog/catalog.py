"""The catalog: generations and slice types from accelerators.yaml, prices from prices.yaml."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tpuctl.errors import ConfigError, UnknownAcceleratorError, UsageError

_ZONE_RE = re.compile(r"^(?P<region>[a-z]+-[a-z]+[0-9]+)-(?P<letter>[a-z]|ai[0-9][a-z]?)$")


class CapacityType(StrEnum):
    """How a slice is provisioned and billed. Spot and preemptible share the preemptible price and quota."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    PREEMPTIBLE = "preemptible"
    RESERVED = "reserved"

    @property
    def is_preemptible(self) -> bool:
        return self in (CapacityType.SPOT, CapacityType.PREEMPTIBLE)

    @classmethod
    def parse(cls, value: str, *, field_name: str = "capacity type") -> CapacityType:
        normalized = value.strip().lower().replace("_", "-")
        if normalized == "ondemand":
            normalized = "on-demand"
        try:
            return cls(normalized)
        except ValueError:
            choices = ", ".join(c.value for c in cls)
            raise UsageError(
                f"unknown {field_name} {value!r}",
                field=field_name,
                value=value,
                fix=f"use one of: {choices}",
            ) from None


def region_of_zone(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1``. The zone must be well formed (see ``validate_zone``)."""
    return validate_zone(zone).rsplit("-", 1)[0]


def validate_zone(zone: str, *, field_name: str = "zone") -> str:
    """Return ``zone`` if it is shaped like a GCP zone (``us-central1-a``), else raise a UsageError."""
    if not isinstance(zone, str) or not _ZONE_RE.match(zone):
        raise UsageError(
            f"malformed zone {zone!r}",
            field=field_name,
            value=zone,
            fix="a zone looks like us-central1-a (region, then a dash and the zone letter); "
            "`tpuctl catalog zones` lists them",
        )
    return zone


@dataclass(frozen=True)
class QuotaFamily:
    """One TPU API quota family: on-demand or preemptible, training or serving. ``template`` is the quota
    id with ``{scope}`` for Zone or Region; ``metric`` the Cloud Quotas metric its quotas count."""

    template: str
    metric: str
    preemptible: bool
    serving: bool = False
    scopes: tuple[str, ...] = ("zone", "region")

    def quota_id(self, scope: str) -> str | None:
        return self.template.format(scope=scope.capitalize()) if scope in self.scopes else None


@dataclass(frozen=True)
class ServingQuota:
    """A generation's serving family (v5e): single-host shapes of at most ``max_chips`` draw on it instead
    of the training family."""

    on_demand: str
    preemptible: str
    metric: str
    max_chips: int
    scopes: tuple[str, ...] = ("zone",)


class Surface(StrEnum):
    """Which Google API places a slice: the Cloud TPU API (nodes, queued resources; in maintenance mode)
    or Compute Engine (instances, and MIGs with a workload policy for multi-host slices)."""

    TPU_API = "tpu"
    COMPUTE = "compute"

    @classmethod
    def parse(cls, value: str, *, field_name: str = "api") -> Surface:
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise UsageError(
                f"unknown {field_name} {value!r}",
                field=field_name,
                value=value,
                fix="use one of: " + ", ".join(s.value for s in cls),
            ) from None


_SURFACE_NAMES = {Surface.TPU_API: "Cloud TPU API", Surface.COMPUTE: "Compute Engine"}


@dataclass(frozen=True)
class ComputeQuota:
    """A Compute Engine TPU quota in Cloud Quotas (service ``compute.googleapis.com``)."""

    quota_id: str  # e.g. TPUS-PER-TPU-FAMILY-per-project-region
    scope: str  # "region" or "zone"
    tpu_family: str | None = None  # the ``tpu_family`` dimension, for the per-family quota


@dataclass(frozen=True)
class ComputeShape:
    """How Compute Engine offers a generation: one machine type per host size (the TPU comes with the
    machine type; no guestAccelerators), the image family its hosts boot, and its quotas."""

    machine_types: tuple[tuple[int, str], ...]  # (chips per host, machine type)
    image_family: str
    on_demand_quota: ComputeQuota
    preemptible_quota: ComputeQuota
    image_project: str = "ubuntu-os-accelerator-images"

    def machine_type(self, chips_per_host: int) -> str | None:
        return dict(self.machine_types).get(chips_per_host)

    @property
    def source_image(self) -> str:
        return f"projects/{self.image_project}/global/images/family/{self.image_family}"

    def quota(self, capacity: CapacityType) -> ComputeQuota | None:
        """The quota a slice of this capacity draws on (spot and flex-start: preemptible); None for
        reserved capacity, which draws on its reservation."""
        if capacity is CapacityType.RESERVED:
            return None
        return self.preemptible_quota if capacity.is_preemptible else self.on_demand_quota


@dataclass(frozen=True)
class Generation:
    """One TPU generation, as the TPU API v2 and/or Compute Engine offer it."""

    name: str  # friendly: v5e
    api_prefix: str  # the API's type prefix: v5litepod
    api_enum: str  # AcceleratorConfig.type: V5LITE_POD
    size_counts: str  # "chips" or "cores": what N in `<prefix>-N` counts
    cores_per_chip: int
    chips_per_host: int
    single_host_max_chips: int
    hbm_gib_per_chip: float
    peak_bf16_tflops_per_chip: float
    runtime_version: str
    zones: tuple[str, ...]
    sizes: tuple[tuple[int, str], ...]  # (N, topology)
    quota_unit: str = "chips"  # what this generation's TPU API quotas count: "chips" or "cores"
    quota_on_demand: str = ""  # quota id template, {scope} = Zone | Region
    quota_preemptible: str = ""
    quota_metric: str = ""  # the Cloud Quotas metric name without service and "-preemptible"
    serving: ServingQuota | None = None
    surfaces: tuple[Surface, ...] = (Surface.TPU_API,)  # the first is the default
    compute: ComputeShape | None = None
    #: Whether slices of this generation can be joined over the DCN (Cloud TPU Multislice: v4 and later).
    multislice: bool = False

    @property
    def default_surface(self) -> Surface:
        return self.surfaces[0]

    def check_surface(self, surface: Surface) -> None:
        """Raise a UsageError naming the surfaces that do serve this generation."""
        if surface not in self.surfaces:
            served = " or ".join(s.value for s in self.surfaces)
            raise UsageError(
                f"{self.name} has no {_SURFACE_NAMES[surface]} path: {self.name} slices are placed "
                f"through {' or '.join(_SURFACE_NAMES[s] for s in self.surfaces)}",
                field="api",
                value=surface.value,
                fix=f"use --api {served}, or leave --api out",
            )

    @property
    def valid_sizes(self) -> list[int]:
        return [n for n, _ in self.sizes]

    def chips_for_size(self, size: int) -> int:
        return size if self.size_counts == "chips" else size // self.cores_per_chip

    def quota_id(self, capacity: CapacityType, scope: str) -> str | None:
        """The TPU API quota id for this capacity in ``scope`` ("zone" or "region"); None for reserved
        capacity, which draws on its reservation instead of a quota."""
        if capacity is CapacityType.RESERVED:
            return None
        template = self.quota_preemptible if capacity.is_preemptible else self.quota_on_demand
        return template.format(scope=scope.capitalize())

    def quota_families(self) -> list[QuotaFamily]:
        """Every TPU API quota family of this generation: training on-demand and preemptible, then
        serving; none for a generation the TPU API does not serve."""
        if Surface.TPU_API not in self.surfaces:
            return []
        metric = f"tpu.googleapis.com/{self.quota_metric or self.api_prefix}"
        families = [
            QuotaFamily(self.quota_on_demand, metric, preemptible=False),
            QuotaFamily(self.quota_preemptible, f"{metric}-preemptible", preemptible=True),
        ]
        if self.serving is not None:
            serving_metric = f"tpu.googleapis.com/{self.serving.metric}"
            for template, preemptible in ((self.serving.on_demand, False), (self.serving.preemptible, True)):
                metric_name = f"{serving_metric}-preemptible" if preemptible else serving_metric
                families.append(
                    QuotaFamily(template, metric_name, preemptible, serving=True, scopes=self.serving.scopes)
                )
        return families

    def quota_units(self, chips: int) -> int:
        """How much of this generation's quota ``chips`` chips use."""
        return chips * self.cores_per_chip if self.quota_unit == "cores" else chips


@dataclass(frozen=True)
class AcceleratorType:
    """One slice shape: ``v5litepod-64`` = 64 chips, topology 8x8, 16 hosts of 4 chips."""

    generation: Generation
    size: int

    @property
    def api_name(self) -> str:
        return f"{self.generation.api_prefix}-{self.size}"

    @property
    def friendly_name(self) -> str:
        return f"{self.generation.name}-{self.size}"

    @property
    def topology(self) -> str:
        return dict(self.generation.sizes)[self.size]

    @property
    def chips(self) -> int:
        return self.generation.chips_for_size(self.size)

    @property
    def cores(self) -> int:
        return self.chips * self.generation.cores_per_chip

    @property
    def chips_per_host(self) -> int:
        gen = self.generation
        if self.chips <= gen.single_host_max_chips:
            return self.chips
        return gen.chips_per_host

    @property
    def hosts(self) -> int:
        return math.ceil(self.chips / self.chips_per_host)

    @property
    def quota_units(self) -> int:
        return self.generation.quota_units(self.chips)

    @property
    def draws_on_serving(self) -> bool:
        """Single-host v5e shapes draw on the serving quota family, not the training one."""
        serving = self.generation.serving
        return serving is not None and self.chips <= serving.max_chips

    def quota_family(self, capacity: CapacityType) -> QuotaFamily | None:
        """The quota family a slice of this type draws on; None for reserved capacity (its reservation)."""
        if capacity is CapacityType.RESERVED:
            return None
        serving = self.draws_on_serving
        return next(
            f
            for f in self.generation.quota_families()
            if f.preemptible == capacity.is_preemptible and f.serving == serving
        )

    def quota_ids(self, capacity: CapacityType) -> list[tuple[str, str]]:
        """(scope, quota id) of every quota a slice of this type and capacity draws on."""
        family = self.quota_family(capacity)
        if family is None:
            return []
        return [(scope, qid) for scope in ("zone", "region") if (qid := family.quota_id(scope))]

    @property
    def hbm_gib(self) -> float:
        return self.chips * self.generation.hbm_gib_per_chip

    @property
    def peak_bf16_tflops(self) -> float:
        return self.chips * self.generation.peak_bf16_tflops_per_chip

    @property
    def runtime_version(self) -> str:
        return self.generation.runtime_version

    @property
    def machine_type(self) -> str | None:
        """The Compute Engine machine type of each host; None where Compute Engine does not serve it."""
        compute = self.generation.compute
        return None if compute is None else compute.machine_type(self.chips_per_host)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.api_name,
            "friendly_name": self.friendly_name,
            "generation": self.generation.name,
            "api_type": self.generation.api_enum,
            "size": self.size,
            "size_counts": self.generation.size_counts,
            "chips": self.chips,
            "cores": self.cores,
            "hosts": self.hosts,
            "chips_per_host": self.chips_per_host,
            "topology": self.topology,
            "hbm_gib": self.hbm_gib,
            "peak_bf16_tflops": self.peak_bf16_tflops,
            "runtime_version": self.runtime_version,
            "surfaces": [s.value for s in self.generation.surfaces],
            "machine_type": self.machine_type,
        }


#: Generations whose slices of several hosts bill a "Pod" SKU of their own, dearer than the single
#: device's (docs/google-facts.md#prices-for-budgets); later generations price every slice alike.
POD_SKU_GENERATIONS = frozenset({"v2", "v3"})


def price_key(capacity: CapacityType, *, flex_start: bool = False, pod_slice: bool = False) -> str:
    """The key of a price in the table: ``on_demand`` or ``spot`` (spot and preemptible share the
    Preemptible SKU), ``pod_on_demand``/``pod_spot`` for a v2/v3 pod slice, ``flex_start`` for
    flex-start (its own SKU: never the spot price)."""
    if flex_start:
        return "flex_start"
    base = "spot" if capacity.is_preemptible else "on_demand"
    return f"pod_{base}" if pod_slice else base


@dataclass(frozen=True)
class PriceTable:
    """USD per chip-hour by generation, region and capacity type, with where the figures came from."""

    source: str
    date: str
    # generation -> region -> {price_key: USD per chip-hour}, e.g. {"on_demand": x, "spot": y}
    prices: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # generation -> what is uncertain about its prices (TPU7x: the unit), shown wherever they are
    notes: dict[str, str] = field(default_factory=dict)

    def per_chip_hour(
        self,
        generation: str,
        region: str,
        capacity: CapacityType,
        *,
        flex_start: bool = False,
        pod_slice: bool = False,
    ) -> float | None:
        """The price, or None when the table has none for that generation, region and kind of capacity
        (``price_key``): unknown, never another kind's price."""
        by_region = self.prices.get(generation, {}).get(region)
        if by_region is None:
            return None
        value = by_region.get(price_key(capacity, flex_start=flex_start, pod_slice=pod_slice))
        return float(value) if value is not None else None

    def regions(self, generation: str) -> list[str]:
        return sorted(self.prices.get(generation, {}))


def _safe_loader() -> type[yaml.SafeLoader]:
    # libyaml's loader is ~10x faster than the pure-Python one, and the catalog loads on every command.
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(name: str) -> dict[str, Any]:
    text = resources.files("tpuctl.catalog").joinpath("data", name).read_text(encoding="utf-8")
    data = yaml.load(text, Loader=_safe_loader())
    if not isinstance(data, dict):
        raise ConfigError(f"catalog file {name} is not a mapping", path=name)
    return data


def _parse_generation(name: str, raw: dict[str, Any]) -> Generation:
    sizes = tuple(sorted((int(n), str(t)) for n, t in raw["sizes"].items()))
    return Generation(
        name=name,
        api_prefix=str(raw["api_prefix"]),
        api_enum=str(raw["api_enum"]),
        size_counts=str(raw["size_counts"]),
        cores_per_chip=int(raw["cores_per_chip"]),
        chips_per_host=int(raw["chips_per_host"]),
        single_host_max_chips=int(raw.get("single_host_max_chips", raw["chips_per_host"])),
        hbm_gib_per_chip=float(raw["hbm_gib_per_chip"]),
        peak_bf16_tflops_per_chip=float(raw["peak_bf16_tflops_per_chip"]),
        runtime_version=str(raw["runtime_version"]),
        zones=tuple(str(z) for z in raw["zones"]),
        sizes=sizes,
        quota_unit=str(raw["quota"]["unit"]),
        quota_on_demand=str(raw["quota"]["on_demand"]),
        quota_preemptible=str(raw["quota"]["preemptible"]),
        quota_metric=str(raw["quota"].get("metric", "")),
        serving=_parse_serving(raw.get("serving")),
        surfaces=tuple(Surface(str(v)) for v in raw.get("surfaces", ["tpu"])),
        compute=_parse_compute(raw.get("compute")),
        multislice=bool(raw.get("multislice", False)),
    )


def _parse_compute(raw: dict[str, Any] | None) -> ComputeShape | None:
    if raw is None:
        return None
    quota = raw["quota"]
    scope = str(quota["scope"])
    family = quota.get("tpu_family")
    return ComputeShape(
        machine_types=tuple(sorted((int(k), str(v)) for k, v in raw["machine_types"].items())),
        image_family=str(raw["image_family"]),
        on_demand_quota=ComputeQuota(str(quota["on_demand"]), scope, str(family) if family else None),
        preemptible_quota=ComputeQuota(str(quota["preemptible"]), scope),
    )


def _parse_serving(raw: dict[str, Any] | None) -> ServingQuota | None:
    if raw is None:
        return None
    return ServingQuota(
        on_demand=str(raw["on_demand"]),
        preemptible=str(raw["preemptible"]),
        metric=str(raw["metric"]),
        max_chips=int(raw["max_chips"]),
        scopes=tuple(str(s) for s in raw.get("scopes", ("zone",))),
    )


@dataclass(frozen=True)
class Catalog:
    """Generations, types, zones and prices. Build with ``Catalog.load()``; it is immutable."""

    generations: dict[str, Generation]
    prices: PriceTable
    source: str
    date: str

    @classmethod
    def load(cls, price_override: Path | None = None) -> Catalog:
        """The bundled catalog; ``price_override`` is a refreshed prices file of the same shape."""
        if price_override is None:
            return _bundled_catalog()
        base = _bundled_catalog()
        return cls(
            generations=base.generations,
            prices=load_price_table(price_override),
            source=base.source,
            date=base.date,
        )

    # --- types -----------------------------------------------------------------------------------

    def resolve(self, name: str) -> AcceleratorType:
        """``v5e-64``, ``v5litepod-64``, ``V5LITE_POD-64`` -> the type; anything else -> a UsageError
        that lists what is valid."""
        raw = name.strip()
        match = re.fullmatch(r"(?P<prefix>[A-Za-z0-9_]+?)-(?P<size>[0-9]+)", raw)
        if not match:
            raise UnknownAcceleratorError(
                f"unknown accelerator type {name!r}",
                field="TYPE",
                value=name,
                fix="give a generation and a size, e.g. v5e-64, v6e-8, v5p-128, v4-32 "
                "(`tpuctl catalog types` lists them)",
            )
        prefix = match["prefix"].lower()
        generation = self._generation_for_prefix(prefix)
        if generation is None:
            known = ", ".join(f"{g.name} ({g.api_prefix})" for g in self.generations.values())
            names = [n for g in self.generations.values() for n in (g.name, g.api_prefix)]
            near = difflib.get_close_matches(prefix, names, n=1, cutoff=0.6)
            raise UnknownAcceleratorError(
                f"unknown accelerator generation {match['prefix']!r} in {name!r}"
                + (f"; did you mean {near[0]}-{match['size']}?" if near else ""),
                field="TYPE",
                value=name,
                fix=f"use one of: {known}",
            )
        size = int(match["size"])
        if size not in dict(generation.sizes):
            valid = ", ".join(f"{generation.name}-{n}" for n in generation.valid_sizes)
            counts = "chips" if generation.size_counts == "chips" else "TensorCores (2 per chip)"
            raise UnknownAcceleratorError(
                f"invalid size {size} for {generation.name} in {name!r} (N counts {counts})",
                field="TYPE",
                value=name,
                fix=f"valid sizes: {valid}",
            )
        return AcceleratorType(generation=generation, size=size)

    def _generation_for_prefix(self, prefix: str) -> Generation | None:
        for gen in self.generations.values():
            if prefix in (gen.name, gen.api_prefix) or (gen.api_enum and prefix == gen.api_enum.lower()):
                return gen
        return None

    def quota_family_of(self, quota_id: str) -> tuple[Generation, QuotaFamily] | None:
        """The generation and family a TPU API quota id belongs to (None: not one the catalog knows)."""
        for gen in self.generations.values():
            for family in gen.quota_families():
                if quota_id in (family.quota_id("zone"), family.quota_id("region")):
                    return gen, family
        return None

    def generation_for_api_enum(self, api_enum: str) -> Generation | None:
        for gen in self.generations.values():
            if gen.api_enum and gen.api_enum == api_enum:
                return gen
        return None

    def types(self, generation: str | None = None) -> list[AcceleratorType]:
        gens = [self.generation(generation)] if generation else list(self.generations.values())
        return [AcceleratorType(generation=g, size=n) for g in gens for n in g.valid_sizes]

    def generation(self, name: str) -> Generation:
        gen = self._generation_for_prefix(name.lower())
        if gen is None:
            raise UnknownAcceleratorError(
                f"unknown accelerator generation {name!r}",
                field="generation",
                value=name,
                fix="use one of: " + ", ".join(self.generations),
            )
        return gen

    # --- zones and prices --------------------------------------------------------------------------

    def zones(self, generation: str | None = None) -> list[str]:
        gens = [self.generation(generation)] if generation else list(self.generations.values())
        return sorted({z for g in gens for z in g.zones})

    def price_per_chip_hour(
        self, accel: AcceleratorType, zone: str, capacity: CapacityType, *, flex_start: bool = False
    ) -> float | None:
        """A slice's price per chip-hour: its own SKU's (a v2/v3 pod slice's pod SKU, flex-start's),
        None when the table has no figure for it."""
        pod_slice = accel.generation.name in POD_SKU_GENERATIONS and accel.hosts > 1
        return self.prices.per_chip_hour(
            accel.generation.name, region_of_zone(zone), capacity, flex_start=flex_start, pod_slice=pod_slice
        )

    def price_per_hour(
        self,
        accel: AcceleratorType,
        zone: str,
        capacity: CapacityType,
        slices: int = 1,
        *,
        flex_start: bool = False,
    ) -> float | None:
        per_chip = self.price_per_chip_hour(accel, zone, capacity, flex_start=flex_start)
        return None if per_chip is None else per_chip * accel.chips * slices


def load_price_table(path: Path) -> PriceTable:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_safe_loader())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"cannot read price file {path}: {exc}",
            path=str(path),
            fix="run `tpuctl catalog prices --refresh` again",
        ) from exc
    return _parse_price_table(data, str(path))


def _parse_price_table(data: Any, where: str) -> PriceTable:
    if not isinstance(data, dict) or not isinstance(data.get("prices"), dict):
        raise ConfigError(f"price file {where} has no 'prices' mapping", path=where, field="prices")
    prices: dict[str, dict[str, dict[str, float]]] = {}
    for gen, regions in data["prices"].items():
        prices[str(gen)] = {
            str(region): {k: float(v) for k, v in pair.items()} for region, pair in regions.items()
        }
    notes = {str(k): str(v) for k, v in (data.get("notes") or {}).items()}
    return PriceTable(
        source=str(data.get("source", where)), date=str(data.get("date", "")), prices=prices, notes=notes
    )


@cache
def _bundled_catalog() -> Catalog:
    # Cached: the files are package data and never change within a process.
    accel = _load_yaml("accelerators.yaml")
    generations = {name: _parse_generation(name, raw) for name, raw in accel["generations"].items()}
    prices = _parse_price_table(_load_yaml("prices.yaml"), "prices.yaml")
    return Catalog(
        generations=generations, prices=prices, source=str(accel["source"]), date=str(accel["date"])
    )
