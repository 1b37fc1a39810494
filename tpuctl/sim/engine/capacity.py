"""Capacity and quota: what a zone's pools and reservations have free, whether a request fits
(all or nothing), the quota a project uses, and the Cloud Quotas view of the limits."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from tpuctl.catalog import AcceleratorType, QuotaFamily
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.plans import NodePlan, plan_from_json
from tpuctl.sim.engine.records import QR_QUOTA_HOLDING_STATES, placeholders
from tpuctl.sim.shapes import quota_error, quota_info_json
from tpuctl.sim.world import CapacityClass, PoolClass, World, region_of

#: A quota over its limit: quota id, limit, scope, location, usage.
Violation = tuple[str, int, str, str, int]


@dataclass
class _Demand:
    """Quota units one request needs, per (generation, capacity class, serving family)."""

    units: dict[tuple[str, CapacityClass, bool], int] = field(default_factory=dict)

    def add(self, accel: AcceleratorType, capacity_class: CapacityClass) -> None:
        key = (accel.generation.name, capacity_class, accel.draws_on_serving)
        self.units[key] = self.units.get(key, 0) + accel.quota_units


def pool_in_use(conn: sqlite3.Connection, zone: str, generation: str, capacity_class: str) -> int:
    row = conn.execute(
        "SELECT COALESCE(SUM(chips), 0) FROM nodes WHERE zone = ? AND generation = ? "
        "AND capacity_class = ? AND state != 'PREEMPTED'",
        (zone, generation, capacity_class),
    ).fetchone()
    return int(row[0])


def reservation_in_use(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute(
        "SELECT COALESCE(SUM(chips), 0) FROM nodes WHERE reservation = ? AND state != 'PREEMPTED'",
        (name,),
    ).fetchone()
    return int(row[0])


def is_stocked_out(conn: sqlite3.Connection, zone: str) -> bool:
    return conn.execute("SELECT 1 FROM stockouts WHERE zone = ?", (zone,)).fetchone() is not None


class Capacity:
    """Quota checks, placement and the quota surface, over the shared context."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def quota_usage(
        self,
        conn: sqlite3.Connection,
        project: str,
        generation: str,
        capacity_class: str,
        location: str,
        serving: bool = False,
    ) -> int:
        """Quota units ``project`` uses of one (generation, class, family) quota in a zone or region."""
        gen = self.ctx.catalog.generations[generation]
        # Single-host shapes of a generation with a serving family count there, the rest in training.
        max_serving = gen.serving.max_chips if gen.serving is not None else 0
        family = "n.chips <= ?" if serving else "n.chips > ?"
        is_zone = location.count("-") >= 2
        where = "n.zone = ?" if is_zone else "n.zone LIKE ?"
        pattern = location if is_zone else f"{location}-%"
        holding = placeholders(QR_QUOTA_HOLDING_STATES)
        # Nodes in any state count; nodes of a SUSPENDED/FAILED queued resource are counted through
        # their queued resource (its whole request) instead, so nothing counts twice.
        row = conn.execute(
            f"""
            SELECT COALESCE(SUM(n.quota_units), 0) FROM nodes n
            WHERE n.project = ? AND n.generation = ? AND n.capacity_class = ? AND {where} AND {family}
              AND n.surface = 'tpu'  -- Compute Engine quota pools are disjoint (docs/google-facts.md)
              AND NOT EXISTS (SELECT 1 FROM queued_resources q
                              WHERE q.project = n.project AND q.zone = n.zone AND q.qr_id = n.queued_resource
                                AND q.state IN ({holding}))
            """,
            (project, generation, capacity_class, pattern, max_serving, *QR_QUOTA_HOLDING_STATES),
        ).fetchone()
        used = int(row[0])
        qr_where = "zone = ?" if is_zone else "zone LIKE ?"
        for qr in conn.execute(
            f"SELECT plan FROM queued_resources WHERE project = ? AND {qr_where} AND state IN ({holding})",
            (project, pattern, *QR_QUOTA_HOLDING_STATES),
        ).fetchall():
            for item in json.loads(qr["plan"]):
                plan = plan_from_json(self.ctx.catalog, item)
                if (
                    plan.accel.generation.name == generation
                    and plan.capacity_class == capacity_class
                    and plan.accel.draws_on_serving == serving
                ):
                    used += plan.accel.quota_units
        return used

    def check_quota(
        self, conn: sqlite3.Connection, world: World, project: str, zone: str, plans: list[NodePlan]
    ) -> None:
        """Raise the 429 RESOURCE_EXHAUSTED GCP answers when ``plans`` would exceed a zone or region quota."""
        demand = _Demand()
        for plan in plans:
            demand.add(plan.accel, plan.capacity_class)
        violations: list[Violation] = []
        for (gen_name, capacity_class, serving), units in sorted(demand.units.items()):
            if capacity_class == "reserved":
                continue  # reserved capacity draws on its reservation, not on a quota
            family = self._family(gen_name, capacity_class, serving)
            for scope, location in (("region", region_of(zone)), ("zone", zone)):
                quota_id = family.quota_id(scope)
                if quota_id is None:
                    continue  # a family without this scope (serving quotas are per zone)
                limit = world.quota_limit(gen_name, capacity_class, location, serving)  # type: ignore[arg-type]
                if limit < 0:
                    continue
                used = self.quota_usage(conn, project, gen_name, capacity_class, location, serving)
                if used + units > limit:
                    violations.append((quota_id, limit, scope, location, used))
        if violations:
            raise quota_error(project, violations)

    def place(
        self, conn: sqlite3.Connection, world: World, zone: str, plans: list[NodePlan]
    ) -> list[str | None] | None:
        """Room for all of ``plans`` at once? Returns each plan's reservation (None for pool capacity), or
        None when they do not all fit (all or nothing, as a multislice request)."""
        pool_need: dict[tuple[str, PoolClass], int] = {}
        reserved_need: dict[tuple[str | None, str], int] = {}  # (named reservation or None, generation)
        for plan in plans:
            gen = plan.accel.generation.name
            if plan.capacity_class == "reserved":
                rkey = (plan.reservation, gen)
                reserved_need[rkey] = reserved_need.get(rkey, 0) + plan.accel.chips
            else:
                pkey: tuple[str, PoolClass] = (gen, plan.capacity_class)
                pool_need[pkey] = pool_need.get(pkey, 0) + plan.accel.chips
        stocked_out = is_stocked_out(conn, zone)
        for (gen, pool), chips in pool_need.items():
            free = (
                0 if stocked_out else world.pool_chips(zone, gen, pool) - pool_in_use(conn, zone, gen, pool)
            )
            if chips > free:
                return None
        chosen: dict[tuple[str | None, str], str] = {}
        for (named, gen), chips in reserved_need.items():
            candidates = (
                [r for r in world.reservations if r.name == named]
                if named is not None
                else [r for r in world.reservations if r.zone == zone and r.generation == gen]
            )
            fit = next((r for r in candidates if r.chips - reservation_in_use(conn, r.name) >= chips), None)
            if fit is None:
                return None
            chosen[(named, gen)] = fit.name
        return [
            chosen[(p.reservation, p.accel.generation.name)] if p.capacity_class == "reserved" else None
            for p in plans
        ]

    def _family(self, generation: str, capacity_class: str, serving: bool) -> QuotaFamily:
        gen = self.ctx.catalog.generations[generation]
        preemptible = capacity_class != "on_demand"
        return next(f for f in gen.quota_families() if f.preemptible == preemptible and f.serving == serving)

    def quota_infos(self, project: str) -> list[dict[str, Any]]:
        """Every TPU API quota of the generations this world offers, as Cloud Quotas serves a QuotaInfo: one
        default entry (no dimensions) for every location of its scope, plus one entry per override."""
        world = self.ctx.world
        infos: list[dict[str, Any]] = []
        for gen_name in world.generations_offered():
            gen = self.ctx.catalog.generations[gen_name]
            zones = sorted(z for z in world.zones if world.offers(z, gen_name))
            regions = sorted({region_of(z) for z in zones})
            for family in gen.quota_families():
                capacity_class = "preemptible" if family.preemptible else "on_demand"
                for scope, locations in (("zone", zones), ("region", regions)):
                    quota_id = family.quota_id(scope)
                    if quota_id is None:
                        continue
                    default = world.quota_default(gen_name, capacity_class, locations[0], family.serving)  # type: ignore[arg-type]
                    overrides = [
                        (loc, limit)
                        for loc in locations
                        if (limit := world.quota_override(gen_name, capacity_class, loc, family.serving))  # type: ignore[arg-type]
                        is not None
                    ]
                    infos.append(
                        quota_info_json(project, gen, family, quota_id, scope, default, locations, overrides)
                    )
        return sorted(infos, key=lambda i: str(i["quotaId"]))
