"""``cost report`` over an open session: the report, reconciled with the live listing first unless told
not to, with the warnings of live slices past their limit. One function for the CLI's local mode and
for `tpuctl server`, so that a report through a server is the report the ledger gives here."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.services.cost.model import CostReport
    from tpuctl.services.cost.reconcile import InBackground
    from tpuctl.services.cost.window import GroupBy
    from tpuctl.services.prices import PriceSource
    from tpuctl.services.session import Session


def session_report(
    sess: Session,
    source: PriceSource,
    group: GroupBy,
    start: float | None,
    end: float | None,
    limit: int | None,
    *,
    reconcile: bool,
    dry_run: bool,
    early: InBackground[CostReport] | None = None,
    workspace: str | None = None,
    principal: str | None = None,
) -> CostReport:
    """The report over ``[start, end)`` (``end`` None: when it is computed), priced with the session's
    catalog (``source`` names it); ``early``: a report already under way, used unless reconciliation
    recorded something. Only the slices of the workspaces the session's actor may see (``Actor.visible``),
    narrowed to ``workspace`` and ``principal`` when given (``--workspace``, ``--user``)."""
    from tpuctl.services.budget import expired_slices
    from tpuctl.services.cost.reconcile import Reconciler, reconciled_report
    from tpuctl.services.cost.scope import CostScope
    from tpuctl.services.cost.service import CostService

    service = CostService(sess.ledger.url, sess.catalog, source, clock=sess.clock)
    scope = CostScope(sess.actor.visible).narrowed(workspace, principal)
    if not scope.everything:
        early = None  # computed before the actor was known: the whole ledger's

    def compute() -> CostReport:
        return service.report(since=start, until=end, group_by=group, limit=limit, scope=scope)

    if reconcile:
        reconciler = Reconciler(sess.ledger, sess.cloud, sess.catalog, clock=sess.clock)
        result = reconciled_report(reconciler, sess.cloud, compute, dry_run=dry_run, first=early)
    else:
        result = compute()
    result.warnings = [*result.warnings, *expired_slices(sess.ledger, now=sess.clock())]
    return result
