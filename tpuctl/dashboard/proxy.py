"""`tpuctl dashboard --server URL`: a team server's pages on a loopback address, each request passed on
through the CLI's own client of that server (``ServerClient.forward``), so the pages reach the server as
the person's own commands do, with the same credentials, and the browser needs no login of its own.

Only the pages are passed on (GET and HEAD of the dashboard's paths): the proxy holds the person's
credentials, so it must not open the server's API to whatever else can reach this loopback port. Nothing
the browser sends but the path and query goes on (no cookie, no header of its own).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request

    from tpuctl.client.api import ServerClient

#: The dashboard's pages (``tpuctl.dashboard.routes``): the only paths passed on.
PAGE_PATHS: Final = re.compile(r"^/(money|slices|runs/[^/]+(/live|/logs/\d+)?)?$")
#: What of the server's answer goes back to the browser: its type, caching and a live page's state.
ANSWER_HEADERS: Final = ("content-type", "cache-control", "x-tpuctl-live")


def proxy_app(client: ServerClient) -> Starlette:
    """The pages of the server ``client`` reaches, passed on; any other path is not found here."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    from tpuctl.errors import UnreachableError

    def page(request: Request) -> Response:
        target = request.url.path
        if not PAGE_PATHS.match(target):
            return PlainTextResponse(f"not a dashboard page: {target}", status_code=404)
        try:
            answer = client.forward(request.method, target, params=list(request.query_params.multi_items()))
        except UnreachableError as exc:
            return PlainTextResponse(f"{exc}\n", status_code=502)  # its message names the fix
        headers = {name: answer.headers[name] for name in ANSWER_HEADERS if name in answer.headers}
        return Response(answer.content, status_code=answer.status_code, headers=headers)

    # A plain function endpoint: Starlette runs it in its thread pool (the client's call blocks).
    return Starlette(routes=[Route("/{path:path}", page, methods=["GET", "HEAD"])])
