"""The simulator's HTTP server: stdlib ``ThreadingHTTPServer`` on 127.0.0.1, started in a few ms.

Surfaces (all JSON unless noted):

- ``/v2/...``: the Cloud TPU API v2 REST surface as google-cloud-tpu's tpu_v2 REST transport sends it
  (it appends ``?$alt=json;enum-encoding=int``; we answer enum NAMES, as Google's JSON does, which the
  client parses too).
- ``/v1/projects/{p}/locations/global/services/tpu.googleapis.com/quotaInfos[/{id}]``: Cloud Quotas.
- ``/sim/metadata/{zone}/{node}/{worker}/computeMetadata/v1/...``: each simulated host's metadata
  server (text; needs ``Metadata-Flavor: Google``).
- ``/sim/v1/...``: the admin API (status, reset, preempt, stockout, hosts, endpoints, faults); see
  ``SimAdminClient``.

Latency and injected faults apply to the TPU API and Cloud Quotas surfaces only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tpuctl.errors import ConfigError
from tpuctl.sim import api_errors
from tpuctl.sim.api_errors import ApiError, invalid_argument
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.state import SimDatabase, db_path_for
from tpuctl.sim.wire import paginate
from tpuctl.sim.world import World, world_from_data

Clock = Callable[[], float]
Query = dict[str, list[str]]

_SEGMENT = r"([^/:]+)"
_LOC = rf"/v2/projects/{_SEGMENT}/locations/{_SEGMENT}"


class _Drop(Exception):
    """Raised after a mutation was performed to drop the connection without answering (ambiguous)."""


class _Text:
    """A plain-text answer (the metadata server's), with its ETag when it is a value."""

    def __init__(self, text: str, status: int = 200, *, etag: str | None = None) -> None:
        self.text = text
        self.status = status
        self.etag = etag


def _etag(value: str) -> str:
    return hashlib.sha1(value.encode(), usedforsecurity=False).hexdigest()[:16]


Answer = dict[str, Any] | _Text


class SimServer:
    """The simulated TPU cloud on an ephemeral (or given) loopback port.

    ``state_dir`` holds ``sim/sim.db``. ``world`` replaces the world persisted there (None keeps it;
    the default world on first start). ``clock`` returns real epoch seconds (inject one to drive time
    in tests). The ticker thread advances time every ``ticker_interval_s`` real seconds while the
    server runs (0 disables it; requests still advance time lazily).
    """

    def __init__(
        self,
        state_dir: Path,
        world: World | None = None,
        *,
        port: int = 0,
        clock: Clock = time.time,
        ticker_interval_s: float = 0.05,
    ) -> None:
        self.state_dir = Path(state_dir)
        self._requested_world = world
        self._port = port
        self.clock = clock
        self.ticker_interval_s = ticker_interval_s
        self._db: SimDatabase | None = None
        self._engine: SimEngine | None = None
        self._httpd: _Httpd | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._url: str | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> str:
        """Open the state, bind 127.0.0.1 and serve in background threads; returns the base URL."""
        if self._url is not None:
            return self._url
        self._db = SimDatabase(db_path_for(self.state_dir))
        self._engine = SimEngine(self._db, clock=self.clock)
        world = self._engine.install_world(self._requested_world)
        self._httpd = _Httpd(("127.0.0.1", self._port), _Handler, self._engine, random.Random(world.seed))
        host, port = self._httpd.server_address[:2]
        self._url = f"http://{host!s}:{port}"
        self._stopping.clear()
        # A short poll interval: stop() waits for the serve loop to notice, and a CLI command pays that.
        serve = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.01},
            name="tpuctl-sim-http",
            daemon=True,
        )
        serve.start()
        self._threads = [serve]
        if self.ticker_interval_s > 0:
            ticker = threading.Thread(target=self._tick_loop, name="tpuctl-sim-ticker", daemon=True)
            ticker.start()
            self._threads.append(ticker)
        return self._url

    def stop(self) -> None:
        """Stop serving, close open connections and the database. Safe to call twice."""
        if self._url is None:
            return
        self._stopping.set()
        assert self._httpd is not None and self._db is not None
        self._httpd.shutdown()
        self._httpd.close_all_connections()
        self._httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._db.close()
        self._url = None
        self._httpd = None
        self._engine = None
        self._db = None

    def _tick_loop(self) -> None:
        assert self._engine is not None
        engine = self._engine
        while not self._stopping.wait(self.ticker_interval_s):
            try:
                engine.advance()
            except Exception:
                # A busy database or a race with stop(): the next tick tries again.
                continue

    def __enter__(self) -> SimServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- accessors -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the simulator is not running; call start() first")
        return self._url

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def engine(self) -> SimEngine:
        """The engine behind the server (tests and `tpuctl sim` may call it directly)."""
        if self._engine is None:
            raise RuntimeError("the simulator is not running; call start() first")
        return self._engine

    @property
    def world(self) -> World:
        return self.engine.world

    def metadata_url(self, zone: str, node: str, worker: int) -> str:
        """What a simulated host uses in place of http://metadata.google.internal."""
        return f"{self.url}/sim/metadata/{zone}/{node}/{worker}"


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    # SO_REUSEADDR (Linux): a restarted `tpuctl sim serve --port P` can rebind while old connections sit
    # in TIME_WAIT; it does not let two live servers share the port (that would be SO_REUSEPORT).
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        engine: SimEngine,
        rng: random.Random,
    ) -> None:
        self.engine = engine
        self.rng = rng
        self.rng_lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_all_connections(self) -> None:
        # Keep-alive connections would otherwise hold their handler threads (and the client's socket)
        # open after stop().
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def roll(self) -> float:
        with self.rng_lock:
            return self.rng.random()


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keep-alive: the client's requests.Session reuses one connection for a whole command.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; without TCP_NODELAY, Nagle plus delayed ACKs add
    # ~40 ms to every keep-alive request.
    disable_nagle_algorithm = True
    server: _Httpd
    server_version = "tpuctl-sim/1"

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet: the CLI runs this in-process and must not print request logs.
        return

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_PUT(self) -> None:
        self._serve("PUT")

    # --- plumbing --------------------------------------------------------------------------------

    def _serve(self, method: str) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        try:
            body = self._read_body()
        except ApiError as exc:
            self._send_json(exc.http_status, exc.body())
            return
        engine = self.server.engine
        try:
            if path.startswith("/v2/") or path.startswith("/v1/"):
                self._inject_latency(engine)
                self._inject_transient(engine, method, path)
                mutation = method in ("POST", "PATCH", "DELETE")
                answer = (
                    _route_tpu(engine, method, path, query, body)
                    if path.startswith("/v2/")
                    else _route_quotas(engine, method, path, query)
                )
                if (
                    mutation
                    and path.startswith("/v2/")
                    and self.server.roll() < engine.faults().ambiguous_error_rate
                ):
                    raise _Drop()
            elif path.startswith("/sim/metadata/"):
                answer = self._metadata(engine, path, query)
            elif path.startswith("/sim/v1/"):
                answer = _route_admin(engine, method, path, query, body)
            else:
                raise ApiError(404, "NOT_FOUND", f"The requested URL {path} was not found on this server.")
        except _Drop:
            self._drop_connection()
            return
        except ApiError as exc:
            self._send_json(exc.http_status, exc.body())
            return
        except Exception as exc:
            # A bug in the simulator: answer as Google's frontend would, never leave the client hanging.
            self._send_json(
                500, ApiError(500, "INTERNAL", f"Internal error in the simulator: {exc!r}").body()
            )
            return
        if isinstance(answer, _Text):
            self._send_text(answer.status, answer.text, answer.etag)
        else:
            self._send_json(200, answer)

    def _read_body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except ValueError:
            raise invalid_argument("Invalid JSON payload received.") from None
        if not isinstance(data, dict):
            raise invalid_argument("Invalid JSON payload received: expected an object.")
        return data

    def _inject_latency(self, engine: SimEngine) -> None:
        latency = engine.world.latency
        delay_ms = latency.base_ms + (self.server.roll() * 2 - 1) * latency.jitter_ms
        if latency.spike_probability and self.server.roll() < latency.spike_probability:
            delay_ms += latency.spike_ms
        if delay_ms > 0:
            time.sleep(delay_ms / 1000.0)

    def _inject_transient(self, engine: SimEngine, method: str, path: str) -> None:
        rate = engine.faults().transient_error_rate
        if rate <= 0 or self.server.roll() >= rate:
            return
        # A mix, as GCP gives: request-rate 429s, 500s and 503s.
        pick = self.server.roll()
        if pick < 1 / 3:
            project_match = re.match(r"^/v[12]/projects/([^/]+)", path)
            project = project_match.group(1) if project_match else engine.world.project
            raise api_errors.rate_limited(project, _rate_limited_method(method, path))
        if pick < 2 / 3:
            raise api_errors.internal_error()
        raise api_errors.unavailable()

    def _drop_connection(self) -> None:
        # The mutation happened; the client gets a closed connection and no status line.
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _metadata(self, engine: SimEngine, path: str, query: Query) -> Answer:
        match = re.match(r"^/sim/metadata/([^/]+)/([^/]+)/([0-9]+)/computeMetadata/v1/(.*)$", path)
        if match is None:
            return _Text("not found\n", 404)
        if self.headers.get("Metadata-Flavor") != "Google":
            # What the real metadata server says without the header.
            return _Text("Missing required header: Metadata-Flavor\n", 403)
        zone, node, worker, key = match.group(1), match.group(2), int(match.group(3)), match.group(4)
        try:
            value = engine.metadata_value(zone, node, worker, key)
        except ApiError:
            return _Text("not found\n", 404)
        if value is None:
            return _Text("not found\n", 404)
        if _first(query, "wait_for_change") == "true":
            # As on GCE: answer when the value's ETag differs from last_etag (default: the ETag at the
            # time of the request), or at timeout_sec with the unchanged value.
            last_etag = _first(query, "last_etag") or _etag(value)
            timeout = min(float(_first(query, "timeout_sec") or 60), 300.0)
            deadline = time.monotonic() + timeout
            while _etag(value) == last_etag and time.monotonic() < deadline:
                time.sleep(0.02)
                try:
                    value = engine.metadata_value(zone, node, worker, key)
                except ApiError:
                    return _Text("not found\n", 404)
                if value is None:
                    return _Text("not found\n", 404)
        return _Text(value, etag=_etag(value))

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self._send(status, data, "application/json; charset=UTF-8")

    def _send_text(self, status: int, text: str, etag: str | None = None) -> None:
        self._send(status, text.encode(), "application/text", etag=etag)

    def _send(self, status: int, data: bytes, content_type: str, *, etag: str | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if self.path.startswith("/sim/metadata/"):
                self.send_header("Metadata-Flavor", "Google")
            if etag is not None:
                self.send_header("ETag", etag)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            # The client went away; nothing to tell it.
            self.close_connection = True


# ================================================================================================
# Routing
# ================================================================================================


def _first(query: Query, key: str, default: str = "") -> str:
    values = query.get(key)
    return values[0] if values else default


def _page(query: Query) -> tuple[int, str]:
    raw = _first(query, "pageSize", "0") or "0"
    try:
        size = int(raw)
    except ValueError:
        raise invalid_argument(f"Invalid value for field 'pageSize': {raw!r}.", "pageSize") from None
    return size, _first(query, "pageToken")


def _bool(query: Query, key: str) -> bool:
    return _first(query, key).lower() in ("true", "1")


def _rate_limited_method(method: str, path: str) -> str:
    if method == "GET":
        return "List" if not re.search(r"/[^/]+/[^/:]+$", path) else "Get"
    if ":" in path.rsplit("/", 1)[-1]:
        return path.rsplit(":", 1)[-1].capitalize()
    return {"POST": "Create", "DELETE": "Delete", "PATCH": "Update"}.get(method, "Request")


def _route_tpu(engine: SimEngine, method: str, path: str, query: Query, body: dict[str, Any]) -> Answer:
    if m := re.fullmatch(rf"/v2/projects/{_SEGMENT}/locations", path):
        if method == "GET":
            return engine.list_locations(m.group(1), *_page(query))
    elif m := re.fullmatch(_LOC, path):
        if method == "GET":
            return engine.get_location(m.group(1), m.group(2))
    elif m := re.fullmatch(_LOC + ":generateServiceIdentity", path):
        if method == "POST":
            return {
                "identity": {
                    "email": f"service-{m.group(1)}@cloud-tpu.iam.gserviceaccount.com",
                    "uid": "100000000000000000001",
                }
            }
    elif m := re.fullmatch(_LOC + r"/nodes", path):
        project, zone = m.group(1), m.group(2)
        if method == "GET":
            return engine.list_nodes(project, zone, *_page(query))
        if method == "POST":
            return engine.create_node(project, zone, _first(query, "nodeId"), body)
    elif m := re.fullmatch(_LOC + rf"/nodes/{_SEGMENT}", path):
        project, zone, node = m.groups()
        if method == "GET":
            return engine.get_node(project, zone, node)
        if method == "DELETE":
            return engine.delete_node(project, zone, node)
        if method == "PATCH":
            return engine.update_node(project, zone, node, body, _first(query, "updateMask"))
    elif m := re.fullmatch(_LOC + rf"/nodes/{_SEGMENT}:(stop|start|getGuestAttributes)", path):
        project, zone, node, verb = m.groups()
        if method == "POST" and verb == "stop":
            return engine.stop_node(project, zone, node)
        if method == "POST" and verb == "start":
            return engine.start_node(project, zone, node)
        if method == "POST":
            raise ApiError(501, "UNIMPLEMENTED", "getGuestAttributes is not simulated.")
    elif m := re.fullmatch(_LOC + r"/queuedResources", path):
        project, zone = m.group(1), m.group(2)
        if method == "GET":
            return engine.list_queued_resources(project, zone, *_page(query))
        if method == "POST":
            return engine.create_queued_resource(
                project, zone, _first(query, "queuedResourceId"), body, _first(query, "requestId")
            )
    elif m := re.fullmatch(_LOC + rf"/queuedResources/{_SEGMENT}", path):
        project, zone, qr = m.groups()
        if method == "GET":
            return engine.get_queued_resource(project, zone, qr)
        if method == "DELETE":
            return engine.delete_queued_resource(
                project, zone, qr, force=_bool(query, "force"), request_id=_first(query, "requestId")
            )
    elif m := re.fullmatch(_LOC + rf"/queuedResources/{_SEGMENT}:reset", path):
        if method == "POST":
            return engine.reset_queued_resource(*m.groups())
    elif m := re.fullmatch(_LOC + r"/operations", path):
        if method == "GET":
            return engine.list_operations(m.group(1), m.group(2), *_page(query))
    elif m := re.fullmatch(_LOC + rf"/operations/{_SEGMENT}", path):
        if method == "GET":
            return engine.get_operation(*m.groups())
        if method == "DELETE":
            return engine.delete_operation(*m.groups())
    elif m := re.fullmatch(_LOC + rf"/operations/{_SEGMENT}:cancel", path):
        if method == "POST":
            raise ApiError(501, "UNIMPLEMENTED", "Cancelling TPU operations is not supported.")
    elif m := re.fullmatch(_LOC + r"/acceleratorTypes", path):
        if method == "GET":
            return engine.list_accelerator_types(m.group(1), m.group(2), *_page(query))
    elif m := re.fullmatch(_LOC + rf"/acceleratorTypes/{_SEGMENT}", path):
        if method == "GET":
            return engine.get_accelerator_type(*m.groups())
    elif m := re.fullmatch(_LOC + r"/runtimeVersions", path):
        if method == "GET":
            return engine.list_runtime_versions(m.group(1), m.group(2), *_page(query))
    elif m := re.fullmatch(_LOC + rf"/runtimeVersions/{_SEGMENT}", path):
        if method == "GET":
            return engine.get_runtime_version(*m.groups())
    else:
        raise ApiError(404, "NOT_FOUND", f"The requested URL {path} was not found on this server.")
    raise ApiError(405, "UNIMPLEMENTED", f"Method {method} is not allowed on {path}.")


def _route_quotas(engine: SimEngine, method: str, path: str, query: Query) -> Answer:
    base = rf"/v1/projects/{_SEGMENT}/locations/global/services/{_SEGMENT}/quotaInfos"
    if method != "GET":
        raise ApiError(405, "UNIMPLEMENTED", f"Method {method} is not allowed on {path}.")
    if m := re.fullmatch(base, path):
        project, service = m.groups()
        infos = engine.quota_infos(project) if service == "tpu.googleapis.com" else []
        page, token = paginate(infos, *_page(query))
        out: dict[str, Any] = {"quotaInfos": page}
        if token:
            out["nextPageToken"] = token
        return out
    if m := re.fullmatch(base + rf"/{_SEGMENT}", path):
        project, service, quota_id = m.groups()
        if service == "tpu.googleapis.com":
            for info in engine.quota_infos(project):
                if info["quotaId"] == quota_id:
                    return info
        raise api_errors.not_found(
            f"projects/{project}/locations/global/services/{service}/quotaInfos/{quota_id}"
        )
    raise ApiError(404, "NOT_FOUND", f"The requested URL {path} was not found on this server.")


def _route_admin(engine: SimEngine, method: str, path: str, query: Query, body: dict[str, Any]) -> Answer:
    route = path.removeprefix("/sim/v1/").rstrip("/")
    if route == "status" and method == "GET":
        return engine.status()
    if route == "world" and method == "GET":
        return engine.world.model_dump(mode="json")
    if route == "reset" and method == "POST":
        new_world = None
        if isinstance(body.get("world"), dict):
            try:
                new_world = world_from_data(body["world"], "POST /sim/v1/reset")
            except ConfigError as exc:
                raise invalid_argument(str(exc), exc.field) from None
        return {"world": engine.reset(new_world).summary()}
    if route == "preempt" and method == "POST":
        zone, node = _required(body, "zone"), _required(body, "node")
        return engine.preempt(zone, node, notice=bool(body.get("notice", True)), project=body.get("project"))
    if route == "stockout" and method == "POST":
        zone = _required(body, "zone")
        return {"zone": zone, "stockout": engine.set_stockout(zone, clear=bool(body.get("clear", False)))}
    if route == "hosts" and method == "POST":
        return engine.register_host(
            _required(body, "zone"),
            _required(body, "node"),
            int(body.get("worker", 0)),
            int(_required(body, "pid")),
            project=body.get("project"),
        )
    if route == "hosts" and method == "DELETE":
        worker = _first(query, "worker")
        removed = engine.unregister_hosts(
            _first(query, "zone"),
            _first(query, "node"),
            int(worker) if worker else None,
            project=_first(query, "project") or None,
        )
        return {"removed": removed}
    if route == "endpoints" and method in ("POST", "PUT"):
        endpoints = body.get("endpoints")
        return engine.set_endpoints(
            _required(body, "zone"), _required(body, "node"), endpoints, project=body.get("project")
        )
    if route == "faults" and method == "GET":
        return engine.faults().model_dump()
    if route == "faults" and method == "POST":
        try:
            faults = engine.set_faults(
                transient_error_rate=body.get("transient_error_rate"),
                ambiguous_error_rate=body.get("ambiguous_error_rate"),
            )
        except ValueError as exc:
            raise invalid_argument(f"Invalid fault rates: {exc}") from None
        return faults.model_dump()
    if route == "advance" and method == "POST":
        engine.advance()
        return {"now": engine.clock()}
    raise ApiError(404, "NOT_FOUND", f"No admin route {method} {path}.")


def _required(body: dict[str, Any], key: str) -> Any:
    value = body.get(key)
    if value is None or value == "":
        raise invalid_argument(f"Field '{key}' is required.", key)
    return value
