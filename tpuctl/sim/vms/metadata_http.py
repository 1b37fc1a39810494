"""One simulated host's metadata server: ``http://<host address>:<metadata_port>/computeMetadata/v1/...``,
where GCE_METADATA_HOST points on the host. Which host asks is the address the request arrived on (the
path names no host, as on GCE)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tpuctl.sim import metadata
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.exchange import SimRequest, SimResponse, text_response
from tpuctl.sim.httpd import LISTEN_BACKLOG

#: (project, zone, node, worker) of the host serving on an address, or None.
HostOf = Callable[[str], "tuple[str, str, str, int] | None"]


class MetadataServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], engine: SimEngine, host_of: HostOf) -> None:
        self.engine = engine
        self.host_of = host_of
        self.stopping = threading.Event()
        super().__init__(address, _Handler)

    def start(self) -> None:
        threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.1}, name="tpuctl-sim-metadata", daemon=True
        ).start()

    def stop(self) -> None:
        """Stop serving and close the socket (long-polls in flight end at their next poll)."""
        self.stopping.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: MetadataServer
    server_version = "Metadata Server for VM"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        local_address = str(self.connection.getsockname()[0])
        host = self.server.host_of(local_address)
        parts = urlsplit(self.path)
        if host is None:
            response = text_response(metadata.NOT_FOUND, 404)
        else:
            request = SimRequest(
                method="GET",
                path=unquote(parts.path),
                query=parse_qs(parts.query, keep_blank_values=True),
                body={},
                headers={k.lower(): v for k, v in self.headers.items()},
            )
            response = metadata.answer(
                self.server.engine, request, host, stopping=self.server.stopping.is_set
            )
        self._send(response)

    def _send(self, response: SimResponse) -> None:
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            # GCE's metadata server marks every answer so (google-auth's ping checks it).
            self.send_header("Metadata-Flavor", "Google")
            if response.etag is not None:
                self.send_header("ETag", response.etag)
            self.end_headers()
            self.wfile.write(response.body)
        except OSError:
            self.close_connection = True
