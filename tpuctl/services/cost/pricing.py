"""Pricing a report's rows: the ledger's recorded prices (already in the rows), the catalog's list price for
time the ledger left unpriced, and the on-demand list price that spot savings are measured against."""

from __future__ import annotations

from tpuctl.catalog import CapacityType, Catalog, region_of_zone
from tpuctl.errors import UsageError
from tpuctl.services.cost.model import CostLine
from tpuctl.services.cost.subs import Sub, unnull
from tpuctl.store.billing import is_preemptible


class Pricer:
    """Prices ``Sub`` rows into ``CostLine`` figures, with the catalog's prices looked up once per
    (type, zone, capacity). Warnings about missing prices go to the list each call is given."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._cache: dict[tuple[str | None, str, str | None], tuple[float | None, float | None]] = {}

    def combo_prices(self, zone: str, atype: str, capacity: str) -> tuple[float | None, float | None]:
        """(own, on-demand) catalog prices per chip-hour of a temp-table combination (NULLs as NULL_KEY)."""
        return self.catalog_prices(unnull(atype), zone, unnull(capacity))

    def add_held(self, line: CostLine, sub: Sub, warnings: list[str]) -> None:
        line.quota_held_chip_hours += sub.chip_seconds / 3600.0
        if sub.chip_seconds:
            line.quota_held_usd += self.usd(sub, warnings)

    def catalog_prices(
        self, accel_type: str | None, zone: str, capacity: str | None
    ) -> tuple[float | None, float | None]:
        """(this capacity's list price, the on-demand list price) per chip-hour, from the catalog."""
        key = (accel_type, zone, capacity)
        if key not in self._cache:
            own: float | None = None
            od: float | None = None
            try:
                if accel_type is not None:
                    accel = self._catalog.resolve(accel_type)
                    od = self._catalog.price_per_chip_hour(accel, zone, CapacityType.ON_DEMAND)
                    if capacity is not None:
                        own = self._catalog.price_per_chip_hour(accel, zone, CapacityType(capacity))
            except (UsageError, ValueError):
                pass
            self._cache[key] = (own, od)
        return self._cache[key]

    def usd(self, sub: Sub, warnings: list[str]) -> float:
        usd = sub.priced_usd_seconds / 3600.0
        if sub.unpriced_chip_seconds > 0:
            own, _od = self.catalog_prices(sub.accelerator_type, sub.zone, sub.capacity)
            if own is None:
                warnings.append(
                    f"no price for {sub.accelerator_type} {sub.capacity} in {sub.zone}, in the ledger or the "
                    "catalog: that time is counted at 0 USD"
                )
            else:
                warnings.append(
                    "some slices had no price in the ledger; they are priced at the catalog's current "
                    "list price"
                )
                usd += sub.unpriced_chip_seconds / 3600.0 * own
        return usd

    def add_billed(self, line: CostLine, sub: Sub, warnings: list[str], *, sign: float) -> None:
        usd = self.usd(sub, warnings)
        chip_hours = sub.chip_seconds / 3600.0
        line.billed_hours += sign * sub.seconds / 3600.0
        line.chip_hours += sign * chip_hours
        line.cost_usd += sign * usd
        preemptible = is_preemptible(sub.capacity)
        if not preemptible:
            line.on_demand_usd += sign * usd
            return
        _own, od = self.catalog_prices(sub.accelerator_type, sub.zone, sub.capacity)
        if od is None:
            warnings.append(
                f"no on-demand price for {sub.accelerator_type} in {region_or(sub.zone)}: its spot time is "
                "compared at its own price (no savings counted)"
            )
            line.on_demand_usd += sign * usd
            return
        od_usd = chip_hours * od
        line.on_demand_usd += sign * od_usd
        line.spot_savings_usd += sign * (od_usd - usd)


def region_or(zone: str) -> str:
    """The zone's region, or the zone itself when it has no region (not a GCP zone name)."""
    try:
        return region_of_zone(zone)
    except UsageError:
        return zone
