"""`tpuctl dashboard --server URL`: a team server's pages through the loopback proxy, each request sent by
the CLI's own client of the server (what the client adds to every request reaches the server), nothing
of the browser's own passed on, and nothing but the pages reachable through it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from fastapi.testclient import TestClient
from loopback import serving
from recorded_runs import LIVE, RUN

if TYPE_CHECKING:
    from fastapi import FastAPI, Request, Response
    from starlette.middleware.base import RequestResponseEndpoint

    from tpuctl.services.session import Session

TOKEN = "Bearer the-clis-own-token"


class _Stamping(httpx.HTTPTransport):
    """Stands in for what the CLI's client adds to each of its requests (its credentials)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Authorization"] = TOKEN
        return super().handle_request(request)


@pytest.fixture
def heard() -> list[dict[str, str]]:
    return []


@pytest.fixture
def team_server(recorded: Session, tmp_path: Path, heard: list[dict[str, str]]) -> Iterator[str]:
    """`tpuctl server`'s app over the recorded runs, on loopback; ``heard``: each request's headers."""
    from tpuctl.server.app import build_app
    from tpuctl.server.bundles import BundleStore

    app: FastAPI = build_app(recorded, BundleStore(tmp_path / "bundles"), None)

    @app.middleware("http")
    async def listen(request: Request, call_next: RequestResponseEndpoint) -> Response:
        heard.append({k.lower(): v for k, v in request.headers.items()})
        return await call_next(request)

    with serving(app) as url:
        yield url


@pytest.fixture
def proxy(team_server: str) -> Iterator[TestClient]:
    from tpuctl.client.api import ServerClient
    from tpuctl.dashboard.proxy import proxy_app

    with ServerClient(team_server, transport=_Stamping()) as client, TestClient(proxy_app(client)) as c:
        yield c


def test_the_proxy_shows_the_servers_pages_with_the_clients_credentials(
    proxy: TestClient, heard: list[dict[str, str]]
) -> None:
    runs = proxy.get("/", headers={"Cookie": "session=the-browsers", "Authorization": "Basic browser"})
    assert runs.status_code == 200 and f'data-run="{RUN}"' in runs.text
    assert heard[-1]["authorization"] == TOKEN and "cookie" not in heard[-1]
    run = proxy.get(f"/runs/{RUN}")
    assert run.status_code == 200 and run.text.count('data-mark="preemption"') == 2
    assert "<svg" in run.text
    live = proxy.get(f"/runs/{LIVE}/live")
    assert live.headers["x-tpuctl-live"] == "yes" and live.headers["cache-control"] == "no-store"
    money = proxy.get("/money", params={"group_by": "capacity"})
    assert 'data-group="spot"' in money.text
    assert proxy.get("/slices?gone=1d").text.count("data-end-reason=") == 3
    assert all(h["authorization"] == TOKEN for h in heard)


def test_the_proxy_passes_on_nothing_but_the_pages(proxy: TestClient, heard: list[dict[str, str]]) -> None:
    for path in ("/v1/runs", "/healthz", "/openapi.json", f"/runs/{RUN}/cancel"):
        assert proxy.get(path).status_code == 404, path
    assert proxy.post(f"/runs/{RUN}").status_code == 405
    assert heard == []  # none of them reached the server


def test_a_server_that_does_not_answer_is_a_bad_gateway_saying_so() -> None:
    from tpuctl.client.api import ServerClient
    from tpuctl.dashboard.proxy import proxy_app
    from tpuctl.testing.ports import unused_port

    url = f"http://127.0.0.1:{unused_port()}"
    with ServerClient(url) as client, TestClient(proxy_app(client)) as c:
        answer = c.get("/")
    assert answer.status_code == 502 and f"cannot reach tpuctl server at {url}" in answer.text
