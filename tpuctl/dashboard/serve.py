"""`tpuctl dashboard`'s process: the pages alone (no API, no supervisors) over the local ledger, served by
uvicorn on a loopback address (``tpuctl.server.listen``: the pages have no authentication), until
SIGTERM or Ctrl-C."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from fastapi import FastAPI
    from starlette.applications import Starlette

    from tpuctl.server.listen import Listen
    from tpuctl.services.session import Session


def dashboard_app(session: Session, *, live_every_s: float = 2.0) -> FastAPI:
    """The pages over ``session``, with the CLI's error documents for what the pages refuse; a live
    run's page refreshes every ``live_every_s``."""
    from fastapi import FastAPI

    from tpuctl import __version__
    from tpuctl.dashboard.routes import dashboard_router
    from tpuctl.server import problems

    app = FastAPI(
        title="tpuctl dashboard", version=__version__, docs_url=None, redoc_url=None, openapi_url=None
    )
    problems.install(app)
    app.include_router(dashboard_router(session, live_every_s=live_every_s))
    return app


def serve_dashboard(session: Session, listen: Listen, *, open_browser: bool) -> None:
    """Serve the pages over ``session`` until SIGTERM or SIGINT (``serve_app``)."""
    serve_app(lambda: dashboard_app(session), listen, open_browser=open_browser)


def serve_app(make_app: Callable[[], Starlette], listen: Listen, *, open_browser: bool) -> None:
    """Serve the app ``make_app`` builds until SIGTERM or SIGINT; with ``open_browser``, open the runs page
    once the socket listens (the socket is bound first, so the browser never finds nothing there)."""
    import uvicorn

    from tpuctl.server.serve import _bind, _signals_end_quietly

    sock = _bind(listen)
    try:
        app = make_app()
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        print(f"tpuctl dashboard: {listen.url}/ (Ctrl-C stops it)", file=sys.stderr, flush=True)
        if open_browser:
            threading.Thread(target=_open, args=(f"{listen.url}/",), daemon=True).start()
        with _signals_end_quietly():
            server.run(sockets=[sock])
    finally:
        sock.close()


def _open(url: str) -> None:
    import webbrowser

    webbrowser.open(url)
