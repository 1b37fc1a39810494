"""The rows the report's queries give back: one group's share in one (zone, type, capacity) (``Sub``) and
what one scan of the pods table contributed (``Partial``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuctl.services.cost.sql_intervals import aggregate_sql
from tpuctl.services.cost.window import GroupBy
from tpuctl.store.cost_reader import LedgerReader
from tpuctl.store.cost_sql import NULL_KEYS


@dataclass(frozen=True)
class Sub:
    """One aggregate row: a group's share in one (zone, type, capacity)."""

    key: Any
    zone: str
    accelerator_type: str | None
    capacity: str | None
    slices: int
    seconds: float
    chip_seconds: float
    priced_usd_seconds: float  # sum of chips x seconds x price: USD x 3600
    unpriced_chip_seconds: float


@dataclass
class Partial:
    """What one id range of the pods table contributed."""

    rows: list[tuple[Any, ...]]  # per group key x zone x type x capacity (cost_agg summed over days)
    first_days: list[tuple[Any, ...]]  # per first billed day x zone x type x capacity
    preemptions: int
    free: int
    changed_subs: list[Sub] = field(default_factory=list)  # their pieces, each at its price
    changed_whole: list[Sub] = field(default_factory=list)  # what the scan counted for them
    changed_days: list[Sub] = field(default_factory=list)
    changed_days_whole: list[Sub] = field(default_factory=list)
    later: list[Sub] = field(default_factory=list)
    #: The fast path's per-day spend, summed in SQL (sql_scan.DAY_USD_SQL): (day, None, None, None,
    #: priced, 0) per day and (day, zone, type, capacity, 0, unpriced) where the catalog prices some time.
    day_rows: list[tuple[Any, ...]] = field(default_factory=list)
    #: The same split by a grouping's column (``scan_all``'s ``split``): the type, the capacity or the zone
    #: in its place, the other two NULL.
    split_rows: list[tuple[Any, ...]] = field(default_factory=list)


def sub_rows(reader: LedgerReader, sql: str, params: Mapping[str, Any]) -> list[Sub]:
    """The rows of ``sql``, in ``aggregate_sql``'s columns."""
    return [
        Sub(
            r[0],
            r[1],
            r[2],
            r[3],
            int(r[4]),
            float(r[5] or 0),
            float(r[6] or 0),
            float(r[7] or 0),
            float(r[8] or 0),
        )
        for r in reader.query(sql, params)
    ]


def subs(
    reader: LedgerReader, source: str, group: GroupBy, params: Mapping[str, Any], *, count: bool = False
) -> list[Sub]:
    """An interval relation (``sql_intervals``) summed per group."""
    return sub_rows(reader, aggregate_sql(source, group, reader.dialect, count=count), params)


def negate(sub: Sub) -> Sub:
    """The same amounts taken away (slices are not counted twice, so theirs stay 0)."""
    return Sub(sub.key, sub.zone, sub.accelerator_type, sub.capacity, 0, -sub.seconds, -sub.chip_seconds,
               -sub.priced_usd_seconds, -sub.unpriced_chip_seconds)  # fmt: skip


#: What stands for NULL in the working tables' keys, on either engine (``billing.null_key``).
def unnull(value: Any) -> Any:
    return None if value in NULL_KEYS else value


def floats(values: Sequence[Any]) -> list[float]:
    return [float(v or 0.0) for v in values]
