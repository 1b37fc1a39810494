"""Cost per UTC day split by a slice's own facts (zone, region, type, capacity), in one scan: the
dashboard's stacked bars. ``cost report`` gives each day's total (``by_day``) and each group's total
(``groups``); this gives the cells between them, from the same per-day rows the day grouping prices, so a
day's cells add up to its ``by_day`` figure and a group's cells to its group's ``cost_usd``.

Groupings whose key is not a fact of the slice's (zone, type, capacity) row (run, slice, label, ...) are
not split here: ``DAY_SPLIT_GROUPINGS`` names those that are.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from tpuctl.services.cost.details import NONE_KEY
from tpuctl.services.cost.pricing import region_or
from tpuctl.services.cost.window import GroupBy
from tpuctl.store.billing import DAY_S
from tpuctl.store.billing import round_usd as _r

if TYPE_CHECKING:
    from tpuctl.services.cost.aggregate import Query
    from tpuctl.services.cost.subs import Sub

#: The groupings a day's cost splits by in one scan: the key is a fact of every per-day row.
DAY_SPLIT_GROUPINGS: Final = ("zone", "region", "type", "capacity")


@dataclass(frozen=True)
class DayCosts:
    """One UTC day (``YYYY-MM-DD``) and each group's USD that day, costliest first (rounded as the
    report's JSON rounds)."""

    day: str
    groups: tuple[tuple[str, float], ...]


def splittable(group: GroupBy) -> GroupBy:
    """``group``, if a day's cost splits by it (``DAY_SPLIT_GROUPINGS``); else ValueError."""
    if group.kind not in DAY_SPLIT_GROUPINGS:
        raise ValueError(f"a day's cost does not split by {group.name} in one scan")
    return group


def day_cells(q: Query, group: GroupBy, day_rows: Iterable[Sub]) -> list[DayCosts]:
    """Each day's billed USD split by ``group`` (one of ``DAY_SPLIT_GROUPINGS``), from the report's
    per-day rows (keyed by day; the fast path's carry only the column ``group`` reads)."""
    splittable(group)
    return day_costs((_day(sub), _key(group, sub), q.pricer.usd(sub, q.warnings)) for sub in day_rows)


def day_costs(cells: Iterable[tuple[str, str, float]]) -> list[DayCosts]:
    """(day, group, USD) cells, added up per day and group, as ``DayCosts`` by date (a day's groups
    costliest first; a cell that rounds to nothing is left out, and a day with nothing left)."""
    by_day: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for day, key, usd in cells:
        by_day[day][key] += usd
    days = [
        DayCosts(
            day, tuple(sorted(((k, _r(v)) for k, v in by.items() if _r(v)), key=lambda kv: (-kv[1], kv[0])))
        )
        for day, by in sorted(by_day.items())
    ]
    return [day for day in days if day.groups]


def _day(sub: Sub) -> str:
    return datetime.fromtimestamp(int(sub.key) * DAY_S, UTC).date().isoformat()


def _key(group: GroupBy, sub: Sub) -> str:
    """The group a per-day row belongs to, as ``cost report --group-by`` names it."""
    if group.kind == "zone":
        return sub.zone
    if group.kind == "region":
        return region_or(sub.zone)
    value = sub.accelerator_type if group.kind == "type" else sub.capacity
    return NONE_KEY if value is None else str(value)
