"""What each workspace, and each user in it, spent in one calendar month (UTC): the figure the server's
queue orders by (fair share) and its metrics export, from the very report `cost report` gives.

One report over the month, one row per slice (``--group-by slice``: each slice's own workspace and
principal, ``tpuctl.store.view``), summed here both ways: per workspace, and per (workspace, principal).
``spent_usd`` is what Google bills (``cost_usd``); ``wasted_usd`` is the part of it that paid for work
recomputed after a preemption (``recomputed_usd``); ``productive_usd`` the rest. Quota held by a preempted
slice is not in either: Google does not bill it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from tpuctl.services.cost.window import GroupBy
from tpuctl.store.billing import round_usd

if TYPE_CHECKING:
    from tpuctl.services.cost.scope import CostScope
    from tpuctl.services.cost.service import CostService
    from tpuctl.services.session import Session


@dataclass(frozen=True)
class Spend:
    """USD billed in the month, and the part of it spent on recomputed work."""

    spent_usd: float = 0.0
    wasted_usd: float = 0.0

    @property
    def productive_usd(self) -> float:
        return round_usd(self.spent_usd - self.wasted_usd)

    def plus(self, spent_usd: float, wasted_usd: float) -> Spend:
        return Spend(round_usd(self.spent_usd + spent_usd), round_usd(self.wasted_usd + wasted_usd))


@dataclass(frozen=True)
class MonthSpend:
    """A month's spend (``month``: ``YYYY-MM``, UTC) per workspace and per (workspace, principal); a
    workspace or user that spent nothing is absent (read it as ``Spend()``)."""

    month: str
    by_workspace: Mapping[str, Spend] = field(default_factory=dict)
    by_principal: Mapping[tuple[str, str], Spend] = field(default_factory=dict)


def month_bounds(year: int, month: int) -> tuple[float, float]:
    """The month's first instant and the next month's (UTC epoch seconds)."""
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return start.timestamp(), end.timestamp()


def month_of(instant: float) -> tuple[int, int]:
    """The (year, month) of ``instant`` in UTC: ``month_spend(service, *month_of(now))`` is this month."""
    at = datetime.fromtimestamp(instant, UTC)
    return at.year, at.month


def month_spend(service: CostService, year: int, month: int, *, scope: CostScope | None = None) -> MonthSpend:
    """What was spent in ``year``-``month`` (UTC), up to now for the current month, per workspace and per
    (workspace, principal); ``scope``: only those slices (None: all, as the server's queue needs)."""
    since, until = month_bounds(year, month)
    report = service.report(since=since, until=until, group_by=GroupBy("slice"), with_days=False, scope=scope)
    by_workspace: dict[str, Spend] = {}
    by_principal: dict[tuple[str, str], Spend] = {}
    for row in report.groups:
        workspace, principal = str(row["workspace"]), str(row["principal"])
        spent, wasted = float(row["cost_usd"]), float(row["recomputed_usd"])
        by_workspace[workspace] = by_workspace.get(workspace, Spend()).plus(spent, wasted)
        key = (workspace, principal)
        by_principal[key] = by_principal.get(key, Spend()).plus(spent, wasted)
    return MonthSpend(f"{year:04d}-{month:02d}", by_workspace, by_principal)


def this_month_spend(session: Session, *, now: float) -> MonthSpend:
    """``now``'s calendar month (UTC) up to ``now``, every slice (the queue orders every workspace's runs),
    priced as `cost report` prices it (the session's catalog and the backend's price source)."""
    from tpuctl.services.cost.service import CostService
    from tpuctl.services.prices import load_catalog

    prices = load_catalog(session.state_dir, session.backend.name)[1]
    service = CostService(session.ledger.url, session.catalog, prices, clock=lambda: now)
    return month_spend(service, *month_of(now))
