"""A tiny GCE metadata server for runtime tests: loopback only, standard paths, Google's rules.

Serves ``/computeMetadata/v1/<path>`` from a dict of values; answers 403 without
``Metadata-Flavor: Google`` and 404 for an unknown path; every value has an ETag (a hash of the value),
and ``?wait_for_change=true&last_etag=E&timeout_sec=T`` holds the request until the ETag differs from E
or T seconds pass, as https://cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange
describes. ``set(path, value)`` changes a value and wakes the waiting requests (unless ``wake=False``).
"""

from __future__ import annotations

import hashlib
import http.server
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

from tpuctl.sim.httpd import LISTEN_BACKLOG

ROOT = "/computeMetadata/v1/"


def etag_of(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG  # as the simulator's servers, for the same reason


class MetadataServer:
    """One host's metadata server on 127.0.0.1 (an ephemeral port); ``host`` is its "ip:port"."""

    def __init__(self, values: Mapping[str, str] | None = None, *, etags: bool = True) -> None:
        """``etags=False``: a server that sends no ETag (and so cannot be long-polled)."""
        self.values: dict[str, str] = dict(values or {})
        self.etags = etags
        self.requests: list[tuple[str, dict[str, str], str | None]] = []  # (path, query, flavor header)
        self._changed = threading.Condition()
        self._closing = False
        self.httpd = _Server(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def set(self, path: str, value: str, *, wake: bool = True) -> None:
        """``wake=False``: the long polls in flight are not answered (until their timeout or the next
        waking change), as a change whose answer is still on its way to the host; a new GET sees it."""
        with self._changed:
            self.values[path] = value
            if wake:
                self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def answer(self, raw_path: str, flavor: str | None) -> tuple[int, str, str | None]:
        """(status, body, etag) for one GET; blocks for a long poll."""
        parsed = urllib.parse.urlsplit(raw_path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        with self._changed:
            self.requests.append((parsed.path, query, flavor))
        if flavor != "Google":
            return 403, "Missing Metadata-Flavor:Google header.", None
        if not parsed.path.startswith(ROOT):
            return 404, "not found", None
        key = parsed.path[len(ROOT) :]
        with self._changed:
            if query.get("wait_for_change") == "true":
                last = query.get("last_etag", "")
                current = self.values.get(key)
                self._changed.wait_for(
                    lambda: (
                        self._closing or etag_of(self.values.get(key, "")) != (last or etag_of(current or ""))
                    ),
                    timeout=float(query.get("timeout_sec", "60")),
                )
            value = self.values.get(key)
        if value is None:
            return 404, "not found", None
        return 200, value, etag_of(value) if self.etags else None

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                status, body, etag = server.answer(self.path, self.headers.get("Metadata-Flavor"))
                data = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/text")
                    self.send_header("Metadata-Flavor", "Google")
                    if etag is not None:
                        self.send_header("ETag", etag)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client hung up during a long poll
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def slice_values(worker: int, addresses: list[str], accelerator_type: str = "v5litepod-16") -> dict[str, str]:
    """The attributes a TPU VM of a slice sees (the subset the runtime reads), plus the notice keys."""
    return {
        "instance/attributes/agent-worker-number": str(worker),
        "instance/attributes/worker-network-endpoints": ",".join(f"unknown:unknown:{a}" for a in addresses),
        "instance/attributes/accelerator-type": accelerator_type,
        # Every TPU VM publishes tpu-env; JAX's multislice detection reads it (without it, 6 tries 0.5 s
        # apart, as a real VM never makes it wait).
        "instance/attributes/tpu-env": f"ACCELERATOR_TYPE: '{accelerator_type}'\nWORKER_ID: '{worker}'\n",
        "instance/preempted": "FALSE",
        "instance/maintenance-event": "NONE",
    }
