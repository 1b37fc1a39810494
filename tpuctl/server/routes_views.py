"""The read-only routes of `tpuctl server`: `cost report`, `cost estimate`, `catalog prices`, `quota`,
`pod list` and `pod describe`, each the local command's service run on the server's session, answered as
that service's typed result (``wire_views``).

- ``GET /v1/cost/report?group_by=&since=&until=&limit=&reconcile=&dry_run=``: ``since``/``until`` are
  epoch seconds (the client parses ``7d`` or ``today`` on its own clock, as the local command does);
  no ``until`` ends the window when the report is computed. With ``reconcile`` (the default) the server
  first compares its ledger with the live listing and records what it saw gone or preempted (nothing
  with ``dry_run``), as the local command does: an observation, the same whoever repeats it.
- ``POST /v1/cost/estimate``: ``EstimateIn``; creates nothing (a POST for its list of zones).
- ``GET /v1/catalog/prices``, ``GET /v1/quota``, ``GET /v1/pods?zone=``, ``GET /v1/pods/{name}?zone=``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, Path, Query

from tpuctl.server.gate import scoped
from tpuctl.server.wire_views import (
    CostReportOut,
    EstimateIn,
    EstimateOut,
    PodDescriptionOut,
    PodListOut,
    PricesOut,
    QuotaOut,
    ServedBy,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpuctl.services.prices import PriceSource
    from tpuctl.services.session import Session

#: Epoch seconds a window may name (years 1970 to 2200).
_INSTANT = Query(ge=0, le=7_258_118_400)
ZoneQuery = Annotated[str | None, Query(min_length=1, max_length=100, description="Only this zone.")]


def view_routes(session: Session, json_body: Callable[..., None]) -> APIRouter:
    """The routes over ``session``; ``json_body``: the dependency that refuses a body of another type."""
    router = APIRouter()
    served = ServedBy(backend=session.backend.label, project=session.project)

    @router.get("/v1/cost/report", response_model=CostReportOut)
    def cost_report(
        group_by: Annotated[str | None, Query(max_length=100)] = None,
        since: Annotated[float | None, _INSTANT] = None,
        until: Annotated[float | None, _INSTANT] = None,
        limit: Annotated[int | None, Query(ge=1, le=10_000_000)] = None,
        reconcile: bool = True,
        dry_run: bool = False,
        workspace: Annotated[str | None, Query(max_length=100)] = None,
        user: Annotated[str | None, Query(max_length=320)] = None,
    ) -> CostReportOut:
        from tpuctl.services.cost import parse_group_by
        from tpuctl.services.cost.session_report import session_report

        group = parse_group_by(group_by)
        _check_window(since, until)
        report = session_report(
            scoped(session), _prices(session), group, since, until, limit, reconcile=reconcile,
            dry_run=dry_run, workspace=workspace, principal=user,
        )  # fmt: skip
        return CostReportOut(served_by=served, report=report)

    @router.post("/v1/cost/estimate", response_model=EstimateOut, dependencies=[Depends(json_body)])
    def cost_estimate(body: EstimateIn) -> EstimateOut:
        from tpuctl.services.cost.estimate import build_estimate_request, estimate

        request = build_estimate_request(
            session.catalog, session.settings, body.accelerator_type, hours=body.hours, zones=body.zones,
            region=body.region, slices=body.slices,
        )  # fmt: skip
        result = estimate(scoped(session), request, _prices(session))
        return EstimateOut(served_by=served, rows=result.rows, not_offered=result.not_offered,
                           prices=result.prices, warnings=result.warnings)  # fmt: skip

    @router.get("/v1/catalog/prices", response_model=PricesOut)
    def catalog_prices() -> PricesOut:
        from tpuctl.services.prices import load_catalog

        catalog, source = load_catalog(session.state_dir, session.backend.name)
        return PricesOut(served_by=served, table=catalog.prices, source=source)

    @router.get("/v1/quota", response_model=QuotaOut)
    def quota() -> QuotaOut:
        from tpuctl.services.quota import QuotaBook

        return QuotaOut(
            served_by=served, uses=QuotaBook.from_cloud(session.cloud, session.catalog).all_uses()
        )

    @router.get("/v1/pods", response_model=PodListOut)
    def list_pods(zone: ZoneQuery = None) -> PodListOut:
        from tpuctl.services.pods import PodService

        return PodListOut(served_by=served, pods=PodService(scoped(session)).list(zone))

    @router.get("/v1/pods/{name}", response_model=PodDescriptionOut)
    def describe_pod(
        name: Annotated[str, Path(min_length=1, max_length=100)], zone: ZoneQuery = None
    ) -> PodDescriptionOut:
        from tpuctl.services.pods import PodService

        return PodDescriptionOut(served_by=served, pod=PodService(scoped(session)).describe(name, zone))

    return router


def _prices(session: Session) -> PriceSource:
    """Where the session's catalog prices come from (its refreshed cache, else the bundled table)."""
    from tpuctl.services.prices import load_catalog

    return load_catalog(session.state_dir, session.backend.name)[1]


def _check_window(since: float | None, until: float | None) -> None:
    from tpuctl.server.problems import RequestProblem

    if since is not None and until is not None and since >= until:
        raise RequestProblem(
            f"since {since} is not before until {until}",
            status=400,
            field="since",
            value=since,
            fix="give a since earlier than until (the window is [since, until), epoch seconds)",
        )
