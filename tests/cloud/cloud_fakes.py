"""A tiny stdlib HTTP server that answers like Google, for error-shape tests of the real tpu_v2 client.

The REST transport talks through ``requests`` (google-auth's AuthorizedSession), so respx cannot intercept
it; this server stands on 127.0.0.1 instead. A test scripts it with ``FakeGoogle.route(method, path_regex,
*responses)``: each matching request consumes the next response (the last one repeats). A response is
``(status, json_body)``, ``DROP`` (close the socket without answering, after reading the request) or
``Hang(seconds)`` (answer nothing for that long, to trip a client read timeout).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

DROP = "drop"


@dataclass(frozen=True)
class Hang:
    seconds: float


Response = tuple[int, Any] | str | Hang | Callable[["Recorded"], Any]


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]


@dataclass
class _Route:
    method: str
    pattern: re.Pattern[str]
    responses: list[Response]
    hits: int = 0


@dataclass
class FakeGoogle:
    routes: list[_Route] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    url: str = ""
    _server: http.server.ThreadingHTTPServer | None = None

    def route(self, method: str, path_regex: str, *responses: Response) -> _Route:
        r = _Route(method.upper(), re.compile(path_regex), list(responses))
        self.routes.insert(0, r)  # later routes win, so a test can override a default
        return r

    def hits(self, method: str, path_regex: str) -> int:
        pat = re.compile(path_regex)
        return sum(1 for r in self.requests if r.method == method.upper() and pat.search(r.path))

    def start(self) -> str:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                rec = Recorded(self.command, parts.path, parse_qs(parts.query), body, dict(self.headers))
                fake.requests.append(rec)
                for r in fake.routes:
                    if r.method == self.command and r.pattern.search(parts.path):
                        resp = r.responses[min(r.hits, len(r.responses) - 1)]
                        r.hits += 1
                        break
                else:
                    resp = (
                        404,
                        {
                            "error": {
                                "code": 404,
                                "message": f"no route for {parts.path}",
                                "status": "NOT_FOUND",
                            }
                        },
                    )
                if callable(resp) and not isinstance(resp, Hang):
                    resp = resp(rec)
                if resp == DROP:
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if isinstance(resp, Hang):
                    time.sleep(resp.seconds)
                    self.close_connection = True
                    return
                assert isinstance(resp, tuple)
                status, payload = resp
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


# ---- Google-shaped payloads ----------------------------------------------------------------------------

P = "projects/p/locations/us-east5-b"


def error(
    http_status: int, status: str, message: str, details: list[dict[str, Any]] | None = None
) -> tuple[int, Any]:
    body: dict[str, Any] = {"code": http_status, "message": message, "status": status}
    if details:
        body["details"] = details
    return http_status, {"error": body}


def node_json(name: str = "n1", zone: str = "us-east5-b", **over: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "name": f"projects/p/locations/{zone}/nodes/{name}",
        "acceleratorType": "v5litepod-8",
        "acceleratorConfig": {"type": "V5LITE_POD", "topology": "2x4"},
        "runtimeVersion": "v2-alpha-tpuv5-lite",
        "state": "READY",
        "health": "HEALTHY",
        "schedulingConfig": {"spot": True},
        "labels": {"managed-by": "tpuctl"},
        "createTime": "2025-04-10T12:00:00.123456Z",
        "networkEndpoints": [
            {"ipAddress": "10.0.0.2", "port": 8470, "accessConfig": {"externalIp": "34.1.2.3"}},
            {"ipAddress": "10.0.0.3", "port": 8470},
        ],
        "apiVersion": "V2",
        "id": "1234567890",
    }
    node.update(over)
    return node


def operation(
    name: str = "op1",
    *,
    done: bool = False,
    zone: str = "us-east5-b",
    verb: str = "create",
    target: str = "",
    response: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    status_detail: str = "",
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "name": f"projects/p/locations/{zone}/operations/{name}",
        "metadata": {
            "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
            "createTime": "2025-04-10T12:00:00Z",
            "target": target,
            "verb": verb,
            "statusDetail": status_detail,
            "apiVersion": "v2",
        },
        "done": done,
    }
    if response is not None:
        op["response"] = response
    if error is not None:
        op["error"] = error
    return op


STOCKOUT_MSG = (
    'There is no more capacity in the zone "us-east5-b"; you can try in another zone where Cloud TPU Nodes '
    "are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x5a0c6fc2d1e4b3a9]"
)
QUOTA_MSG = (
    "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. "
    "Limit: 0 in region us-east5."
)
