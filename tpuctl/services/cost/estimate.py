"""``cost estimate``: every zone x capacity type where a type is offered, priced, with its saving against
on-demand and whether quota fits now.

It reuses the allocator's look at the project (``Allocator.survey``: the live listing, queued resources,
quota limits and what each zone offers) and its candidate builder, so an estimate and a ``pod create
--dry-run`` can never disagree on price, offer or quota. Reserved capacity is left out: its price is a
contract's, not a list price.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpuctl.catalog import CapacityType, Catalog

if TYPE_CHECKING:
    from tpuctl.services.placement import Candidate, PlacementRequest
    from tpuctl.services.prices import PriceSource
    from tpuctl.services.session import Session
    from tpuctl.settings import Settings

ESTIMATE_CAPACITIES: tuple[CapacityType, ...] = (
    CapacityType.ON_DEMAND,
    CapacityType.SPOT,
    CapacityType.PREEMPTIBLE,
)
DEFAULT_HOURS = 1.0


@dataclass(frozen=True)
class EstimateRequest:
    placement: PlacementRequest
    hours: float


def build_estimate_request(
    catalog: Catalog,
    settings: Settings,
    type_name: str,
    *,
    hours: float | None = None,
    zones: Sequence[str] = (),
    region: str | None = None,
    slices: int = 1,
) -> EstimateRequest:
    """Check the parsed values (exit 2 on a bad one) before any backend is contacted; ``hours`` None is
    the default."""
    from tpuctl.services.allocator import build_request

    placement = build_request(
        catalog,
        settings,
        type_name,
        zones=zones,
        region=region,
        capacity_types=ESTIMATE_CAPACITIES,
        slices=slices,
    )
    return EstimateRequest(placement=placement, hours=DEFAULT_HOURS if hours is None else hours)


@dataclass(frozen=True)
class EstimateRow:
    zone: str
    region: str
    capacity: str
    usd_per_chip_hour: float | None
    usd_per_hour: float | None  # the whole request: chips per slice x slices
    usd_total: float | None  # for the requested hours
    on_demand_usd_per_hour: float | None
    saving_usd: float | None  # against on-demand in the same zone, for the requested hours
    saving_pct: float | None
    quota_fits: bool
    quota: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "zone": self.zone,
            "region": self.region,
            "capacity": self.capacity,
            "usd_per_chip_hour": self.usd_per_chip_hour,
            "usd_per_hour": _r(self.usd_per_hour),
            "usd_total": _r(self.usd_total),
            "on_demand_usd_per_hour": _r(self.on_demand_usd_per_hour),
            "saving_usd": _r(self.saving_usd),
            "saving_pct": None if self.saving_pct is None else round(self.saving_pct, 2),
            "quota_fits": self.quota_fits,
            "quota": list(self.quota),
        }


@dataclass
class Estimate:
    request: EstimateRequest
    rows: list[EstimateRow]
    not_offered: list[str]
    prices: PriceSource
    warnings: list[str] = field(default_factory=list)

    @property
    def price_note(self) -> str | None:
        """What is uncertain about this generation's prices (TPU7x: per chip or per host), or None."""
        return self.prices.note_for(self.request.placement.accelerator.generation.name)

    def to_dict(self) -> dict[str, Any]:
        req = self.request.placement
        return {
            "accelerator_type": req.accelerator.api_name,
            "friendly_name": req.accelerator.friendly_name,
            "chips_per_slice": req.accelerator.chips,
            "slices": req.slices,
            "chips": req.chips,
            "hours": self.request.hours,
            "currency": "USD",
            "prices": self.prices.to_dict(),
            "price_note": self.price_note,
            "options": [row.to_dict() for row in self.rows],
            "not_offered_in": self.not_offered,
            "warnings": self.warnings,
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def estimate(session: Session, request: EstimateRequest, prices: PriceSource) -> Estimate:
    """Price every offered (zone, capacity type); cheapest first (unknown prices last)."""
    from tpuctl.services.allocator import Allocator
    from tpuctl.services.placement import build_candidates

    placement = request.placement
    survey = Allocator(session).survey(placement)
    candidates = build_candidates(
        placement, catalog=session.catalog, book=survey.book, zones=survey.zones, offers=survey.offers
    )
    offered = [c for c in candidates if c.offered]
    on_demand = {c.zone: c.price_per_hour for c in offered if c.capacity is CapacityType.ON_DEMAND}
    rows = [_row(c, on_demand.get(c.zone), request.hours) for c in offered]
    rows.sort(
        key=lambda r: (
            r.usd_per_hour is None,
            r.usd_per_hour or 0.0,
            r.zone,
            ESTIMATE_CAPACITIES.index(CapacityType(r.capacity)),
        )
    )
    not_offered = sorted({c.zone for c in candidates if not c.offered})
    warnings = list(prices.warnings)
    if not rows:
        warnings.append(
            f"{placement.accelerator.api_name} is not offered in any zone considered "
            f"({', '.join(not_offered) or 'none'})"
        )
    return Estimate(request=request, rows=rows, not_offered=not_offered, prices=prices, warnings=warnings)


def _row(candidate: Candidate, on_demand_per_hour: float | None, hours: float) -> EstimateRow:
    per_hour = candidate.price_per_hour
    saving: float | None = None
    pct: float | None = None
    if per_hour is not None and on_demand_per_hour:
        saving = (on_demand_per_hour - per_hour) * hours
        pct = (on_demand_per_hour - per_hour) / on_demand_per_hour * 100.0
    return EstimateRow(
        zone=candidate.zone,
        region=candidate.region,
        capacity=candidate.capacity.value,
        usd_per_chip_hour=candidate.price_per_chip_hour,
        usd_per_hour=per_hour,
        usd_total=None if per_hour is None else per_hour * hours,
        on_demand_usd_per_hour=on_demand_per_hour,
        saving_usd=saving,
        saving_pct=pct,
        quota_fits=candidate.quota_fits,
        quota=tuple(q.to_dict() for q in candidate.quota),
    )
