"""The read-only, catalog-like surfaces of the TPU API: locations, accelerator types and runtime
versions, as the world offers them."""

from __future__ import annotations

from typing import Any

from tpuctl.catalog import AcceleratorType, Generation, Surface
from tpuctl.sim.api_errors import not_found
from tpuctl.sim.engine.capacity import reservation_in_use
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.plans import accelerator_by_api_name, zone_runtime_versions
from tpuctl.sim.shapes import accelerator_type_json, location_json
from tpuctl.sim.wire import check_zone, paginate


def _page_of(
    key: str, items: list[dict[str, Any]], page_size: int, page_token: str, **extra: Any
) -> dict[str, Any]:
    """One page of a List answer: ``{key: page, **extra}`` and the next page's token when there is one."""
    page, token = paginate(items, page_size, page_token)
    out: dict[str, Any] = {key: page, **extra}
    if token:
        out["nextPageToken"] = token
    return out


class Listings:
    """Locations, accelerator types and runtime versions."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def _zone_generations(self, zone: str) -> list[Generation]:
        check_zone(zone)
        world = self.ctx.world
        # The TPU API's view: a Compute-Engine-only generation (TPU7x) in the zone is not among its types.
        gens = [self.ctx.catalog.generations[g] for g in sorted(world.zones.get(zone, {}))]
        return [g for g in gens if Surface.TPU_API in g.surfaces]

    def list_accelerator_types(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        items = [
            accelerator_type_json(project, zone, AcceleratorType(generation=gen, size=size))
            for gen in self._zone_generations(zone)
            for size in gen.valid_sizes
        ]
        return _page_of("acceleratorTypes", items, page_size, page_token, unreachable=[])

    def get_accelerator_type(self, project: str, zone: str, type_name: str) -> dict[str, Any]:
        accel = accelerator_by_api_name(self.ctx.catalog, type_name)
        if accel is None or accel.generation not in self._zone_generations(zone):
            raise not_found(f"projects/{project}/locations/{zone}/acceleratorTypes/{type_name}")
        return accelerator_type_json(project, zone, accel)

    def _runtime_versions(self, zone: str) -> list[str]:
        check_zone(zone)
        return zone_runtime_versions(self.ctx.catalog, self.ctx.world, zone)

    def list_runtime_versions(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        items = [
            {"name": f"projects/{project}/locations/{zone}/runtimeVersions/{v}", "version": v}
            for v in self._runtime_versions(zone)
        ]
        return _page_of("runtimeVersions", items, page_size, page_token, unreachable=[])

    def get_runtime_version(self, project: str, zone: str, version: str) -> dict[str, Any]:
        if version not in self._runtime_versions(zone):
            raise not_found(f"projects/{project}/locations/{zone}/runtimeVersions/{version}")
        return {"name": f"projects/{project}/locations/{zone}/runtimeVersions/{version}", "version": version}

    def list_locations(self, project: str, page_size: int = 0, page_token: str = "") -> dict[str, Any]:
        items = [location_json(project, zone) for zone in sorted(self.ctx.world.zones)]
        return _page_of("locations", items, page_size, page_token)

    def get_location(self, project: str, zone: str) -> dict[str, Any]:
        if zone not in self.ctx.world.zones:
            raise not_found(f"projects/{project}/locations/{zone}")
        return location_json(project, zone)

    def list_reservations(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        """The world's reservations in ``zone`` as v2alpha1's Reservation (size and use in chips)."""
        check_zone(zone)
        world = self.ctx.world
        with self.ctx.db.read() as conn:
            items = [
                {
                    "name": f"projects/{project}/locations/{zone}/reservations/{r.name}",
                    "standard": {
                        "size": r.chips,
                        "capacityUnits": "CHIPS",
                        "resourceType": self.ctx.catalog.generations[r.generation].api_prefix,
                        "usage": {"total": str(reservation_in_use(conn, r.name))},
                    },
                    "state": "ACTIVE",
                }
                for r in world.reservations
                if r.zone == zone
            ]
        return _page_of("reservations", items, page_size, page_token)
