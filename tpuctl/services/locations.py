"""Which zones and regions exist: the catalog's, and the backend's own locations (a simulated world or a
project may offer zones the catalog does not list). Checked before anything is planned or created, so a
typo'd zone is a usage error with "did you mean", not "not offered" (a capacity problem)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tpuctl import params
from tpuctl.catalog import AcceleratorType, Catalog, region_of_zone

if TYPE_CHECKING:
    from tpuctl.cloud.base import TpuCloud


def check_zones(
    catalog: Catalog,
    cloud: TpuCloud | None,
    zones: Iterable[str],
    param: str = "zone",
    *,
    accelerator: AcceleratorType | None = None,
) -> list[str]:
    """``zones``, each known to the catalog or the backend; the backend is asked only when the catalog
    does not know one (listing locations is an API call on Google). With ``accelerator``, an unknown
    zone's "did you mean" is a zone the catalog says offers its generation: the nearest zone by spelling
    may not offer it, and following that suggestion would only trade exit 2 for "not offered"."""
    given = [params.zone(z, param) for z in zones]
    known = set(catalog.zones())
    if cloud is not None and any(z not in known for z in given):
        known.update(cloud.list_zones())
    offering = None if accelerator is None else accelerator.generation.zones
    return [params.zone(z, param, known=known, suggest_from=offering) for z in given]


def check_region(catalog: Catalog, cloud: TpuCloud | None, region: str, param: str = "region") -> str:
    """``region``, one that holds a zone the catalog or the backend knows."""
    params.region(region, param)
    known = {region_of_zone(z) for z in catalog.zones()}
    if cloud is not None and region not in known:
        known.update(region_of_zone(z) for z in cloud.list_zones())
    return params.region(region, param, known=known)
