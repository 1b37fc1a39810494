"""Spend this calendar month (UTC) per workspace and per principal: what the server's queue orders by.

To be folded onto the cost service's own month spend per workspace and principal once that exists (the
attribution of cost to workspaces and principals): this one is the cost report grouped by run, joined to
each run's workspace and principal, so it counts what runs spent and not slices made outside a run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from tpuctl.store.records import LOCAL_WORKSPACE

if TYPE_CHECKING:
    from tpuctl.services.session import Session


@dataclass(frozen=True)
class MonthSpend:
    """USD spent this calendar month (UTC) ``month`` (``2026-11``): per workspace and per (workspace,
    principal). A workspace or principal not named spent nothing."""

    month: str
    by_workspace: Mapping[str, float] = field(default_factory=dict)
    by_principal: Mapping[tuple[str, str], float] = field(default_factory=dict)


def month_spend(session: Session, *, now: float) -> MonthSpend:
    """USD spent by runs from the start of ``now``'s calendar month (UTC) to ``now``, per workspace and per
    (workspace, principal)."""
    from tpuctl.services.budget import month_start
    from tpuctl.services.cost import CostService, GroupBy
    from tpuctl.services.prices import load_catalog

    start = month_start(now)
    prices = load_catalog(session.state_dir, session.backend.name)[1]
    report = CostService(session.ledger.url, session.catalog, prices, clock=lambda: now).report(
        since=start, until=now, group_by=GroupBy("run"), with_days=False
    )
    spent = {str(g["key"]): float(g["cost_usd"] or 0.0) for g in report.groups}
    by_workspace: dict[str, float] = defaultdict(float)
    by_principal: dict[tuple[str, str], float] = defaultdict(float)
    for run in session.ledger.list_runs():
        usd = spent.get(run.run_id)
        if not usd:
            continue
        workspace = run.workspace or LOCAL_WORKSPACE
        by_workspace[workspace] += usd
        by_principal[(workspace, run.principal or "")] += usd
    month = datetime.fromtimestamp(start, UTC).strftime("%Y-%m")
    return MonthSpend(month, dict(by_workspace), dict(by_principal))
