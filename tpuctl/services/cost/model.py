"""A report's records: one group's figures (``CostLine``) and the report (``CostReport``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from tpuctl.services.cost.window import GroupBy, iso
from tpuctl.store.billing import round_usd as _r

if TYPE_CHECKING:
    from tpuctl.services.prices import PriceSource

#: The figures of a group record, in the documented order (after the key and the per-kind facts).
FIGURES: Final = (
    "slices",
    "billed_hours",
    "chip_hours",
    "cost_usd",
    "on_demand_usd",
    "spot_savings_usd",
    "recomputed_usd",
    "quota_held_chip_hours",
    "quota_held_usd",
    "waste_usd",
)
#: CostLine's figures, as constructor arguments (waste_usd, the last, is derived).
FIGURE_FIELDS: Final = FIGURES[:-1]


@dataclass
class CostLine:
    """One group of a report (a slice, a run, a zone, a day, ...): what it was billed and what it wasted.

    USD figures are exact sums of chips x price x seconds / 3600; rounding happens only in ``to_dict``.
    """

    key: str
    slices: int = 0
    billed_hours: float = 0.0  # slice-hours billed (summed over slices)
    chip_hours: float = 0.0
    cost_usd: float = 0.0
    on_demand_usd: float = 0.0  # the same chip-hours at the on-demand list price of type and region
    spot_savings_usd: float = 0.0  # on_demand_usd - cost_usd, for spot/preemptible time only
    recomputed_usd: float = 0.0  # cost of slice time whose work was recomputed after a preemption
    quota_held_chip_hours: float = 0.0  # chip-hours a preempted slice held quota until deleted
    quota_held_usd: float = 0.0  # the same at the slice's price (not billed: what the quota was worth)
    info: dict[str, Any] = field(default_factory=dict)  # per-kind facts (a slice's zone, a run's status)

    def add(self, other: CostLine) -> None:
        self.slices += other.slices
        self.billed_hours += other.billed_hours
        self.chip_hours += other.chip_hours
        self.cost_usd += other.cost_usd
        self.on_demand_usd += other.on_demand_usd
        self.spot_savings_usd += other.spot_savings_usd
        self.recomputed_usd += other.recomputed_usd
        self.quota_held_chip_hours += other.quota_held_chip_hours
        self.quota_held_usd += other.quota_held_usd

    @property
    def waste_usd(self) -> float:
        return self.recomputed_usd + self.quota_held_usd

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            **self.info,
            "slices": self.slices,
            "billed_hours": _r(self.billed_hours),
            "chip_hours": _r(self.chip_hours),
            "cost_usd": _r(self.cost_usd),
            "on_demand_usd": _r(self.on_demand_usd),
            "spot_savings_usd": _r(self.spot_savings_usd),
            "recomputed_usd": _r(self.recomputed_usd),
            "quota_held_chip_hours": _r(self.quota_held_chip_hours),
            "quota_held_usd": _r(self.quota_held_usd),
            "waste_usd": _r(self.waste_usd),
        }


#: CSV columns of ``cost report -o csv`` (one row per group; documented in docs/cost.md).
CSV_COLUMNS: Final = ("group_by", "key", *FIGURES)

#: What ``--group-by slice`` adds after the key, one fact per column, so a spreadsheet can filter and
#: sum by zone, type or capacity without taking the key (``zone/name#incarnation``) apart.
SLICE_CSV_FACTS: Final = (
    "zone", "name", "incarnation", "accelerator_type", "chips", "capacity", "state", "run_id",
    "ready_at", "ended_at", "end_reason",
)  # fmt: skip


@dataclass
class CostReport:
    """A report. ``groups`` are the group records (``CostLine.to_dict`` shape, figures rounded), in report
    order: most expensive first (then by key; slices by READY time, then id), days in date order. With a
    ``limit`` they are the ``limit`` costliest of ``groups_total``; totals and per-day figures always
    cover every group."""

    group_by: GroupBy
    since: float | None
    until: float
    now: float
    groups: list[dict[str, Any]]
    totals: CostLine
    by_day: list[dict[str, Any]]
    preemptions: int
    free_preemptions: int
    prices: PriceSource
    #: The preemptions by kind (``PreemptionKind`` values, or ``unclassified``), adding up to ``preemptions``.
    preemption_kinds: dict[str, int] = field(default_factory=dict)
    groups_total: int = 0
    limit: int | None = None
    warnings: list[str] = field(default_factory=list)
    untracked: list[dict[str, Any]] = field(default_factory=list)
    reconciled: list[dict[str, Any]] = field(default_factory=list)
    # generation -> the price table's note on it, for the generations billed in the window (TPU7x's unit)
    price_notes: dict[str, str] = field(default_factory=dict)

    @property
    def lines(self) -> list[CostLine]:
        """The groups as ``CostLine`` objects (with their rounded figures)."""
        figures = set(FIGURE_FIELDS) | {"key", "waste_usd"}
        return [
            CostLine(
                str(g["key"]),
                **{name: _unknown_as_zero(g[name]) for name in FIGURE_FIELDS},
                info={k: v for k, v in g.items() if k not in figures},
            )
            for g in self.groups
        ]

    @property
    def omitted(self) -> CostLine | None:
        """What the groups a --limit left out add up to (totals less the groups shown), or None."""
        if self.groups_total <= len(self.groups):
            return None
        rest = CostLine(f"{self.groups_total - len(self.groups)} more")
        rest.add(self.totals)
        for g in self.groups:
            for name in FIGURE_FIELDS[1:]:  # not slices: a slice may count in several groups
                setattr(rest, name, getattr(rest, name) - _unknown_as_zero(g[name]))
        rest.slices = 0
        return rest

    def to_dict(self) -> dict[str, Any]:
        """The ``cost report -o json`` document body (schema in docs/cost.md)."""
        totals = self.totals.to_dict()
        totals.pop("key")
        totals.update(
            {
                "preemptions": self.preemptions,
                "free_preemptions": self.free_preemptions,
                "preemption_kinds": dict(self.preemption_kinds),
                "untracked_usd_per_hour": _r(sum(u["usd_per_hour"] or 0.0 for u in self.untracked)),
            }
        )
        return {
            "window": {"since": iso(self.since), "until": iso(self.until), "now": iso(self.now)},
            "group_by": self.group_by.name,
            "currency": "USD",
            "prices": {
                "ledger": "each slice is billed at the price per chip-hour the ledger recorded for it, "
                "in force at each moment (price_change events split its time)",
                "catalog": self.prices.to_dict(),
                "notes": dict(self.price_notes),
            },
            "totals": totals,
            "groups_total": self.groups_total,
            "limit": self.limit,
            "groups": self.groups,
            "by_day": self.by_day,
            "untracked": self.untracked,
            "reconciled": self.reconciled,
            "warnings": list(self.warnings),
        }

    def csv_columns(self) -> tuple[str, ...]:
        """``CSV_COLUMNS``, with the slice's facts after the key when grouped by slice."""
        if self.group_by.kind == "slice":
            return (*CSV_COLUMNS[:2], *SLICE_CSV_FACTS, *CSV_COLUMNS[2:])
        return CSV_COLUMNS

    def csv_rows(self) -> list[list[Any]]:
        name = self.group_by.name
        columns = self.csv_columns()[1:]
        return [[name, *(g.get(c) for c in columns)] for g in self.groups]


def _unknown_as_zero(value: Any) -> Any:
    """A group's figure for arithmetic: None (unknown: a run whose program reports no steps; the group's
    ``steps_reported`` says so) counts as nothing, as it does in the totals."""
    return 0.0 if value is None else value
