"""The dashboard's pages as a FastAPI router: ``/`` (runs), ``/runs/{run}`` (with ``/runs/{run}/live``,
the part of it a live page fetches again, and ``/runs/{run}/logs/{worker}``, a host's log as text),
``/money`` and ``/slices``. Rendered on the server with Jinja2 (autoescaped); the pages' one script
(``templates/live.js``) and style sheet are inlined, so a page is one request and needs nothing from
another host."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, PlainTextResponse

from tpuctl.dashboard import svg
from tpuctl.dashboard.pages import MONEY_GROUPINGS, Dashboard

if TYPE_CHECKING:
    from collections.abc import Callable

    import jinja2

    from tpuctl.services.prices import PriceSource
    from tpuctl.services.session import Session
    from tpuctl.teams.workspaces import Workspaces

TEMPLATES = Path(__file__).parent / "templates"
RunRef = Annotated[str, PathParam(min_length=1, max_length=200)]


def dashboard_router(
    session: Session,
    prices: PriceSource | None = None,
    *,
    live_every_s: float = 2.0,
    workspaces: Workspaces | None = None,
    acting: Callable[[], Session] | None = None,
) -> APIRouter:
    """The pages over ``session``; ``prices``: the catalog's price source (None: loaded as `cost report`
    loads it, from the backend's refreshed cache if any). A live run's page refreshes every
    ``live_every_s``. ``workspaces``: the server's (their monthly budgets burn down on the money page;
    None: the implicit local one, which has no budget). ``acting``: the session a request acts through
    (a team server's: the caller as actor, so a page shows only what the caller may see, as the API's
    JSON does); None: ``session`` itself (`tpuctl dashboard` over the local ledger)."""
    if prices is None:
        from tpuctl.services.prices import load_catalog

        prices = load_catalog(session.state_dir, session.backend.name)[1]
    priced = prices

    def pages_data() -> Dashboard:
        return Dashboard(session if acting is None else acting(), priced, workspaces)

    env = _environment()
    router = APIRouter(include_in_schema=False)

    def page(name: str, title: str, **values: Any) -> HTMLResponse:
        html = env.get_template(name).render(title=title, root="", live_every_ms=int(live_every_s * 1000),
                                             **values)  # fmt: skip
        return HTMLResponse(html)

    @router.get("/", response_class=HTMLResponse)
    def runs(limit: Annotated[int, Query(ge=1, le=10_000)] = 50) -> HTMLResponse:
        return page("runs.html", "Runs", page="runs", rows=pages_data().runs(limit=limit), limit=limit)

    @router.get("/runs/{run}", response_class=HTMLResponse)
    def run(run: RunRef) -> HTMLResponse:
        got = pages_data().run(run)
        return page("run.html", f"Run {got.described.run.run_id}", page="run", page_data=got)

    @router.get("/runs/{run}/live", response_class=HTMLResponse)
    def run_live(run: RunRef) -> HTMLResponse:
        got = pages_data().run(run)
        response = page("run_body.html", "", page_data=got)
        response.headers["X-Tpuctl-Live"] = "yes" if got.live else "no"
        response.headers["Cache-Control"] = "no-store"
        return response

    @router.get("/runs/{run}/logs/{worker}", response_class=PlainTextResponse)
    def host_log(run: RunRef, worker: Annotated[int, PathParam(ge=0)]) -> PlainTextResponse:
        return PlainTextResponse(pages_data().host_log(run, worker), headers={"Cache-Control": "no-store"})

    @router.get("/money", response_class=HTMLResponse)
    def money(
        group_by: Annotated[str, Query(max_length=100)] = "type",
        since: Annotated[str | None, Query(max_length=100)] = None,
    ) -> HTMLResponse:
        got = pages_data().money(group_by=group_by, since=since)
        return page(
            "money.html", "Money", page="money", page_data=got, since=since, groupings=MONEY_GROUPINGS
        )

    @router.get("/queue", response_class=HTMLResponse)
    def queue() -> HTMLResponse:
        return page("queue.html", "Queue", page="queue", rows=pages_data().queue())

    @router.get("/slices", response_class=HTMLResponse)
    def slices(gone: Annotated[str | None, Query(max_length=100)] = None) -> HTMLResponse:
        """``gone``: also the slices that ended since then (``cost report --since``'s forms: 1d, 7d, a
        date); absent, the live ones only."""
        from tpuctl.services.cost import parse_instant

        since = None if not gone else parse_instant(gone, field_name="gone", now=session.clock())
        rows = pages_data().slices(gone_since=since)
        return page("slices.html", "Slices", page="slices", rows=rows, gone=gone or "")

    return router


def _environment() -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.globals.update(
        money=_money, percent=_percent, age=_age, colours=svg.SEGMENT_COLOURS, group_colours=svg.GROUP_COLOURS
    )
    return env


def _money(value: float | None) -> str:
    """USD to the cent, or to two significant digits below a cent (as `cost report`'s table)."""
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 0.01:
        return f"{value:,.2f}"
    return f"{value:.2g}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if days else f"{hours}h {minutes}m" if hours else f"{minutes}m"
