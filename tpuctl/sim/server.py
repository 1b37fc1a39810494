"""The simulator's HTTP server: stdlib ``ThreadingHTTPServer`` on 127.0.0.1, started in a few ms.

What it answers is ``tpuctl.sim.routes.dispatch``'s (the surfaces are listed there). This module adds
the transport: the HTTP plumbing, the ticker thread that advances simulated time and reconciles the
simulated VMs (``tpuctl.sim.vms.fleet``), and the faults a network gives, which apply to the TPU API and
Cloud Quotas surfaces only: latency, transient 429/500/503 answers, and dropped connections after a
mutation was performed.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from tpuctl.sim import api_errors, iam
from tpuctl.sim.api_errors import ApiError
from tpuctl.sim.compute import errors as compute_errors
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.exchange import SimRequest, SimResponse, error_response, parse_body
from tpuctl.sim.httpd import LISTEN_BACKLOG
from tpuctl.sim.network import NetworkServices
from tpuctl.sim.routes import dispatch, internal_error
from tpuctl.sim.state import SimDatabase, db_path_for
from tpuctl.sim.vms.layout import chosen_ports
from tpuctl.sim.world import World

if TYPE_CHECKING:
    from tpuctl.sim.vms.fleet import Fleet

Clock = Callable[[], float]

#: How often a simulator whose VMs run in the hypervisor checks that it still runs.
_HYPERVISOR_CHECK_S = 1.0
#: The surfaces a real network sits in front of; faults are injected there only.
_FAULTY_SURFACES = ("/v2/", "/v2alpha1/", "/v1/", "/compute/v1/")
#: Where an ambiguous drop may follow a mutation: the TPU API's and Compute Engine's.
_AMBIGUOUS_SURFACES = ("/v2/", "/compute/v1/")
_MUTATIONS = frozenset({"POST", "PATCH", "DELETE"})
#: Queries Google takes as a POST (Policy Troubleshooter's): they change nothing, so no mutation is noted.
_QUERIES = ("/v1/iam:troubleshoot",)


class _Drop(Exception):
    """Raised after a mutation was performed to drop the connection without answering (ambiguous)."""


class SimServer:
    """The simulated TPU cloud on an ephemeral (or given) loopback port.

    ``state_dir`` holds ``sim/sim.db``. ``world`` replaces the world persisted there (None keeps it;
    the default world on first start). ``clock`` returns real epoch seconds (inject one to drive time
    in tests). The ticker thread advances time every ``ticker_interval_s`` real seconds while the
    server runs and brings the VMs of READY nodes up (0 disables it; requests still advance time lazily,
    and ``fleet.reconcile()`` does the VMs' part). ``network_env`` is the simulated network's services,
    put in every host login's environment (``tpuctl.sim.network.network_env``). ``vm_ports`` overrides
    (ssh_port, metadata_port), else 22/80 where this process may bind them, 2222/8080 otherwise.
    ``vms``: "hypervisor" leaves the VMs and the network to the state's hypervisor process, started if
    none runs (``tpuctl.sim.hypervisor``: what every tpuctl command does, so that a VM never depends on
    the command that served it); "in-process" serves them from this process's ``fleet`` (tests that
    drive the VMs tick by tick).
    """

    def __init__(
        self,
        state_dir: Path,
        world: World | None = None,
        *,
        port: int = 0,
        clock: Clock = time.time,
        ticker_interval_s: float = 0.05,
        network_env: Mapping[str, str] | None = None,
        vm_ports: tuple[int, int] | None = None,
        wheelhouse: Path | None = None,
        vms: Literal["in-process", "hypervisor"] = "in-process",
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
        # None: the simulator serves its own network (a GCS emulator and the package mirror over
        # ``wheelhouse``) and its hosts get their endpoints; a mapping: exactly that (tests).
        self._network_env = None if network_env is None else dict(network_env)
        self._wheelhouse = wheelhouse
        self._network: NetworkServices | None = None
        self._vm_ports = vm_ports
        self._fleet: Fleet | None = None
        self._vms = vms

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> str:
        """Open the state, bind 127.0.0.1 and serve in background threads; returns the base URL."""
        if self._url is not None:
            return self._url
        self._db = SimDatabase(db_path_for(self.state_dir))
        self._engine = SimEngine(self._db, clock=self.clock)
        world = self._engine.install_world(self._requested_world)
        ports = self._vm_ports or chosen_ports()
        self._engine.ctx.vm_ports = ports
        if self._vms == "hypervisor":
            self._ensure_hypervisor()
        else:
            from tpuctl.sim.vms.fleet import Fleet  # asyncssh: only where VMs are served

            network = self._network_env if self._network_env is not None else self._start_network()
            ready = self._network.ready if self._network is not None else None
            self._fleet = Fleet(self._engine, ports=ports, network_env=network, network_ready=ready)
            self._fleet.start()
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

    def _start_network(self) -> dict[str, str]:
        """The simulated network's services (Cloud Storage, its objects kept below the state dir so a
        later simulator process sees the same bucket, and the package mirror hosts install from), served
        at the state's own address by whichever simulator process over it can."""
        from tpuctl.sim.fetch_through import fetch_through_for
        from tpuctl.sim.storage import storage_dir_for
        from tpuctl.sim.vms.layout import services_address

        engine = self._engine
        assert engine is not None
        services = NetworkServices(
            services_address(self.state_dir),
            storage_dir=storage_dir_for(self.state_dir),
            wheelhouse=self._wheelhouse_path(),
            world=lambda: engine.world,
            fetch_through=fetch_through_for(self.state_dir, lambda: engine.world, os.environ, Path.home()),
            engine=engine,  # the APIs the hosts reach (``tpuctl.sim.network``)
        )
        services.start()
        self._network = services
        return services.env

    def _ensure_hypervisor(self) -> None:
        from tpuctl.sim.hypervisor import ensure_hypervisor

        assert self._engine is not None
        ensure_hypervisor(self.state_dir, ports=self._engine.ctx.vm_ports, wheelhouse=self._wheelhouse_path())

    def _wheelhouse_path(self) -> Path:
        from tpuctl.sim.mirror import default_wheelhouse

        return self._wheelhouse or default_wheelhouse(os.environ)

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
        if self._fleet is not None:
            self._fleet.stop()
            self._fleet = None
        if self._network is not None:
            self._network.stop()
            self._network = None
        self._db.close()
        self._url = None
        self._httpd = None
        self._engine = None
        self._db = None

    def _tick_loop(self) -> None:
        assert self._engine is not None
        engine, fleet = self._engine, self._fleet
        checked = time.monotonic()
        while not self._stopping.wait(self.ticker_interval_s):
            try:
                engine.advance()
                if fleet is not None:
                    fleet.reconcile()
                elif time.monotonic() - checked >= _HYPERVISOR_CHECK_S:
                    # A hypervisor that died (killed, crashed) comes back while this simulator runs:
                    # a long `tpuctl run` keeps its VMs served, as Google keeps its VMs up.
                    checked = time.monotonic()
                    self._ensure_hypervisor()
            except Exception as exc:
                # A busy database or a race with stop(): the next tick tries again.
                if fleet is not None:
                    fleet.last_error = exc
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

    @property
    def fleet(self) -> Fleet:
        """The VMs this server serves (tests call ``reconcile()`` when the ticker is off)."""
        if self._vms == "hypervisor":
            raise RuntimeError("this simulator's VMs are served by its hypervisor process, not here")
        if self._fleet is None:
            raise RuntimeError("the simulator is not running; call start() first")
        return self._fleet

    @property
    def ssh_port(self) -> int:
        return self.engine.ctx.vm_ports[0]

    @property
    def metadata_port(self) -> int:
        return self.engine.ctx.vm_ports[1]


class ApiListener:
    """The simulated APIs (what a ``SimServer`` answers: the same routes, engine and faults) on a fixed
    address of the simulated network, where the simulated VMs reach them as Google's VMs reach
    googleapis.com (``tpuctl.sim.network``). ``start()`` raises OSError when the address is taken (another
    process of the state serves it); ``stop()`` closes it."""

    def __init__(self, engine: SimEngine, host: str, port: int) -> None:
        self.engine = engine
        self.host = host
        self.port = port
        self._httpd: _Httpd | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        if self._httpd is None:
            rng = random.Random(self.engine.world.seed)
            self._httpd = _Httpd((self.host, self.port), _Handler, self.engine, rng)
            self._thread = threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="tpuctl-sim-network-api",
                daemon=True,
            )
            self._thread.start()
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.close_all_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    # SO_REUSEADDR (Linux): a restarted `tpuctl sim serve --port P` can rebind while old connections sit
    # in TIME_WAIT; it does not let two live servers share the port (that would be SO_REUSEPORT).
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

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
        try:
            raw = self._read_raw_body()
            if (self.headers.get("Content-Type") or "").startswith("application/x-www-form-urlencoded"):
                # OAuth's token endpoint takes a form (RFC 6749), as Google's does.
                body: dict[str, Any] = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
            else:
                body = parse_body(raw)
        except ApiError as exc:
            self._send(error_response(exc))
            return
        parts = urlsplit(self.path)
        request = SimRequest(
            method=method,
            path=unquote(parts.path),
            query=parse_qs(parts.query, keep_blank_values=True),
            body=body,
            headers=self._lowered_headers(),
        )
        try:
            response = self._answer(request)
        except _Drop:
            self._drop_connection()
            return
        except ApiError as exc:
            response = error_response(exc)
        except Exception as exc:
            response = error_response(internal_error(exc))
        self._send(response)

    def _answer(self, request: SimRequest) -> SimResponse:
        """``dispatch``'s answer, with the transport's faults around it on the cloud's API surfaces."""
        engine = self.server.engine
        if not request.path.startswith(_FAULTY_SURFACES):
            return dispatch(engine, request)
        if request.method in _MUTATIONS and not request.path.startswith(_QUERIES):
            # Who asked, as Google's audit log records the principal: the token's account (None: no
            # token, or one the simulator did not issue; the API refuses those).
            caller = iam.account_of(engine.world, iam.bearer_token(request.headers))
            engine.note_mutation(request.method, request.path, caller)
        self._inject_latency(engine)
        self._inject_transient(engine, request.method, request.path)
        response = dispatch(engine, request)
        if (
            response.status == 200
            and request.method in _MUTATIONS
            and request.path.startswith(_AMBIGUOUS_SURFACES)
            and self.server.roll() < engine.faults().ambiguous_error_rate
        ):
            raise _Drop()
        return response

    def _read_raw_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _lowered_headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            # The first of repeated headers counts, as ``self.headers.get`` reads it.
            headers.setdefault(name.lower(), value)
        return headers

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
        # A mix, as GCP gives: request-rate 429s, 500s and 503s; Compute's in its own error shape.
        pick = self.server.roll()
        if path.startswith("/compute/"):
            project_match = re.match(r"^/compute/v1/projects/([^/]+)", path)
            project = project_match.group(1) if project_match else engine.world.project
            if pick < 1 / 3:
                raise compute_errors.rate_limited(project)
            raise compute_errors.backend_error() if pick < 2 / 3 else compute_errors.unavailable()
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

    def _send(self, response: SimResponse) -> None:
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            if response.etag is not None:
                self.send_header("ETag", response.etag)
            self.end_headers()
            self.wfile.write(response.body)
        except OSError:
            # The client went away; nothing to tell it.
            self.close_connection = True


def _rate_limited_method(method: str, path: str) -> str:
    if method == "GET":
        return "List" if not re.search(r"/[^/]+/[^/:]+$", path) else "Get"
    if ":" in path.rsplit("/", 1)[-1]:
        return path.rsplit(":", 1)[-1].capitalize()
    return {"POST": "Create", "DELETE": "Delete", "PATCH": "Update"}.get(method, "Request")
