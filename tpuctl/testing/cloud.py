"""The simulated TPU cloud in this process: the real ``TpuApiCloud`` (google-cloud-tpu's REST client) and
the real Cloud Quotas client, their requests answered by the simulator's route table with no socket.

``InProcessSim`` owns a ``SimEngine`` over a SQLite state dir and a ``FakeClock``; ``cloud()`` gives a
``TpuCloud`` whose every HTTP request goes through ``SimAdapter`` (a ``requests`` transport adapter on the
client's session) or an ``httpx.MockTransport`` (quotas) to ``tpuctl.sim.routes.dispatch``. Nothing is
served, nothing listens, and time moves only when the test advances the clock or the client sleeps (its
``sleep`` is the clock's): an operation polled to its end takes the simulated time it takes, in
milliseconds of real time. Transport faults (latency, injected 5xx, dropped connections) belong to the
HTTP server and do not happen here.
"""

from __future__ import annotations

import http
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict

from tpuctl.testing.clock import FakeClock

if TYPE_CHECKING:
    import httpx

    from tpuctl.cloud.tpu_api import TpuApiCloud
    from tpuctl.sim.engine import SimEngine
    from tpuctl.sim.exchange import SimRequest, SimResponse
    from tpuctl.sim.world import World

#: Where the in-process cloud says it is. ``.invalid`` never resolves, should a request ever escape.
ENDPOINT = "http://tpu.sim.invalid"


def sim_request(method: str, url: str, headers: Mapping[str, str], body: bytes) -> SimRequest:
    """An HTTP request as the route table reads it (path decoded, query parsed, JSON body decoded).

    A body that is not a JSON object raises the simulator's 400 (``ApiError``), as the server answers."""
    from tpuctl.sim.exchange import SimRequest, parse_body

    parts = urlsplit(url)
    return SimRequest(
        method=method.upper(),
        path=unquote(parts.path),
        query=parse_qs(parts.query, keep_blank_values=True),
        body=parse_body(body),
        headers={name.lower(): value for name, value in headers.items()},
    )


def answer(engine: SimEngine, method: str, url: str, headers: Mapping[str, str], body: bytes) -> SimResponse:
    """The simulator's answer to one HTTP request, malformed bodies included."""
    from tpuctl.sim.api_errors import ApiError
    from tpuctl.sim.routes import dispatch, error_response

    try:
        request = sim_request(method, url, headers, body)
    except ApiError as exc:
        return error_response(exc)
    return dispatch(engine, request)


def _bytes(body: str | bytes | None) -> bytes:
    if body is None:
        return b""
    return body.encode() if isinstance(body, str) else body


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _response_headers(response: SimResponse) -> dict[str, str]:
    headers = {"Content-Type": response.content_type, "Content-Length": str(len(response.body))}
    if response.etag is not None:
        headers["ETag"] = response.etag
    return headers


class SimAdapter(BaseAdapter):
    """A ``requests`` transport adapter that hands each request to the simulator's route table."""

    def __init__(self, engine: SimEngine) -> None:
        super().__init__()
        self.engine = engine

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        headers = {name: _text(value) for name, value in request.headers.items()}
        body = request.body
        if body is not None and not isinstance(body, str | bytes):
            raise TypeError("the in-process cloud takes whole request bodies, not streams")
        sim = answer(self.engine, request.method or "GET", request.url or "", headers, _bytes(body))
        response = requests.Response()
        response.status_code = sim.status
        response.reason = http.HTTPStatus(sim.status).phrase
        response.headers = CaseInsensitiveDict(_response_headers(sim))
        response._content = sim.body
        response.encoding = "utf-8"
        response.url = request.url or ""
        response.request = request
        return response

    def close(self) -> None:
        pass


def httpx_transport(engine: SimEngine) -> httpx.MockTransport:
    """An httpx transport over the simulator's route table (the Cloud Quotas client speaks httpx)."""
    import httpx

    def handle(request: httpx.Request) -> httpx.Response:
        sim = answer(engine, request.method, str(request.url), request.headers, request.read())
        return httpx.Response(sim.status, headers=_response_headers(sim), content=sim.body)

    return httpx.MockTransport(handle)


class InProcessSim:
    """A simulator engine over ``state_dir`` (its ``sim/sim.db``) with ``world`` installed (None keeps the
    stored one; the default world on first use), its time the ``clock`` (a frozen ``FakeClock`` unless
    given). Close it (or use it as a context manager) to close the database."""

    def __init__(
        self, state_dir: Path, world: World | None = None, *, clock: FakeClock | None = None
    ) -> None:
        from tpuctl.sim.engine import SimEngine
        from tpuctl.sim.state import SimDatabase, db_path_for

        self.state_dir = state_dir
        self.clock = clock or FakeClock()
        self._db = SimDatabase(db_path_for(state_dir))
        self.engine = SimEngine(self._db, clock=self.clock)
        self.world = self.engine.install_world(world)

    def cloud(self, *, project: str | None = None, **overrides: Any) -> TpuApiCloud:
        """The real ``TpuApiCloud`` against this simulator (the world's project unless given), called as
        the simulator backend calls one; ``overrides``: fields of its ``CloudConfig``. Its waits and
        retries advance the clock unless another ``sleep`` is given."""
        from tpuctl.cloud.quotas import CloudQuotasClient
        from tpuctl.cloud.tpu_api import TpuApiCloud

        overrides.setdefault("sleep", self.clock.sleep)
        quotas = CloudQuotasClient.for_simulator(
            ENDPOINT, transport=httpx_transport(self.engine), **overrides
        )
        return TpuApiCloud.for_simulator(
            project or self.world.project,
            ENDPOINT,
            quotas=quotas,
            http_adapter=SimAdapter(self.engine),
            **overrides,
        )

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> InProcessSim:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
