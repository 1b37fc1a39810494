"""The simulated network's Cloud Storage: gcp-storage-emulator, in-process, on loopback.

gcp-storage-emulator (PyPI ``gcp-storage-emulator``) serves GCS's JSON API (``/storage/v1/...``,
``/upload/storage/v1/...``, ``/download/storage/v1/...``), which is what tensorstore's gs:// driver (orbax's
array writes and reads; pointed here with ``TENSORSTORE_GCS_HTTP_URL``) and gcsfs (etils.epath's gs://
directories; pointed here with ``FSSPEC_GCS_ENDPOINT_URL``) speak. Its server handles one request at a time
on a thread of its own, so its storage needs no locking.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from http import server as http_server
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.sim import storage_access
from tpuctl.sim.httpd import LISTEN_BACKLOG

if TYPE_CHECKING:
    from tpuctl.sim.world import World

DEFAULT_BUCKET = "tpuctl-sim"


class _QuietHTTPServer(http_server.HTTPServer):
    """The emulator's HTTPServer, silent about clients that hang up mid-answer (tensorstore and gcsfs close
    pooled connections freely); any other error is still printed, as the base class does.

    It serves one connection at a time (the emulator's storage is not thread-safe), so the connections a
    restore opens at once wait in its listen backlog (``tpuctl.sim.httpd``).
    """

    request_queue_size = LISTEN_BACKLOG

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


_UPLOAD_PATH = re.compile(r"^/upload/storage/v1/b/(?P<bucket>[^/]+)/o$")
_MEDIA_PATH = re.compile(r"^(?:/download)?/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<object>[^?]+)")


def _request_handler(world: Callable[[], World]) -> Any:
    """The emulator's request handler, with what Cloud Storage does that the emulator does not:

    - it checks who calls (``tpuctl.sim.storage_access``: a bearer token and the caller's roles on the
      world's project, ``world()`` being the world in force) and answers testIamPermissions;
    - it sends the object's ``x-goog-generation`` and ``x-goog-metageneration`` on a media download
      (https://cloud.google.com/storage/docs/xml-api/reference-headers#xgooggeneration): tensorstore reads
      the generation it makes its next conditional write against from them, and without them overwriting
      an object (OCDBT's manifest) fails with "Malformed StorageGeneration", where Google's answers work;
    - it honours ``ifGenerationMatch`` on uploads (``_precondition_failed``);
    - it streams a whole object's media from its first byte (``_streamed``), where the emulator reads
      the object into memory before sending any."""
    from urllib.parse import parse_qs, unquote, urlsplit

    from gcp_storage_emulator.server import RequestHandler

    class _Handler(RequestHandler):  # type: ignore[misc]  # the package is untyped
        _status = 0

        def send_response(self, code: int, message: str | None = None) -> None:
            self._status = int(code)
            super().send_response(code, message)

        def end_headers(self) -> None:
            if self.command in ("GET", "HEAD") and self._status in (200, 206):
                for name, value in self._generation_headers().items():
                    self.send_header(name, value)
            super().end_headers()

        def do_GET(self) -> None:
            if not self._answered_here("GET") and not self._streamed():
                super().do_GET()

        def do_PUT(self) -> None:
            if not self._answered_here("PUT"):
                super().do_PUT()

        def do_PATCH(self) -> None:
            if not self._answered_here("PATCH"):
                super().do_PATCH()

        def do_DELETE(self) -> None:
            if not self._answered_here("DELETE"):
                super().do_DELETE()

        def do_POST(self) -> None:
            if not self._answered_here("POST") and not self._precondition_failed():
                super().do_POST()

        def _answered_here(self, method: str) -> bool:
            """Refuse a caller without the permission, or answer testIamPermissions; True when answered."""
            url = urlsplit(self.path)
            path, query = unquote(url.path), parse_qs(url.query)
            headers = {k.lower(): v for k, v in self.headers.items()}
            current = world()
            bucket = storage_access.bucket_of(path)
            if storage_access.is_test_permissions(path):
                asked = query.get("permissions", [])
                exists = bucket is not None and self.storage.get_bucket(bucket) is not None
                self._send_json(*storage_access.tested_permissions(current, headers, asked, exists=exists))
                return True
            names = query.get("name")
            name = names[0] if names else None
            need = storage_access.need_of(method, path, name, lambda obj: self._exists(bucket, obj))
            refused = storage_access.refusal(current, headers, need) if need is not None else None
            if refused is None:
                return False
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self._send_json(*refused)
            return True

        def _exists(self, bucket: str | None, name: str) -> bool:
            if bucket is None:
                return False
            try:
                self.storage.get_file_obj(bucket, unquote(name))
            except Exception:  # the emulator's NotFound: no such object
                return False
            return True

        def _send_json(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json; charset=UTF-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _precondition_failed(self) -> bool:
            """Answer 412 to an upload whose ``ifGenerationMatch`` is not the object's generation (0: it
            must not exist), as Cloud Storage does; the emulator ignores the condition, which would let
            a stale writer win. Only uploads that name the object in the query are checked (tensorstore's
            media uploads; a multipart upload names it in its body)."""
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            match = _UPLOAD_PATH.match(url.path)
            wanted, name = query.get("ifGenerationMatch"), query.get("name")
            if match is None or not wanted or not name:
                return False
            try:
                current = str(self.storage.get_file_obj(match["bucket"], name[0])["generation"])
            except Exception:  # no such object: generation 0
                current = "0"
            if wanted[0] == current:
                return False
            message = "At least one of the pre-conditions you specified did not hold."
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self._send_json(
                412,
                {
                    "error": {
                        "code": 412,
                        "message": message,
                        "errors": [{"reason": "conditionNotMet", "domain": "global"}],
                    }
                },
            )
            return True

        def _streamed(self) -> bool:
            """Send a whole object's media straight from its file, as Cloud Storage streams a download;
            True when sent. The emulator reads the object whole into memory first, so a host restoring
            its environment (``tpuctl.hosts.envstore``) got no byte of a 700 MB archive, and its ``tar``
            wrote nothing, until the emulator had read all of it. Only a plain ``alt=media`` GET of an
            object kept on disk, with no range and no other parameter: anything else (a range, another
            generation, an in-memory bucket, no such object) the emulator answers as it does."""
            url = urlsplit(self.path)
            match = _MEDIA_PATH.match(url.path)
            query = parse_qs(url.query)
            plain = query == {"alt": ["media"]} or (url.path.startswith("/download/") and not query)
            if match is None or not plain or "range" in {k.lower() for k in self.headers}:
                return False
            if self.storage._use_memory_fs:  # the emulator's own flag: no file to stream from
                return False
            bucket, name = match["bucket"], unquote(match["object"])
            try:
                obj = self.storage.get_file_obj(bucket, name)
                path = self.storage._store._disk_path(self.storage._object_path(bucket, name))
                media = open(path, "rb")  # noqa: SIM115  # closed below, once sent
            except Exception:  # the emulator's NotFound, a missing file: it answers (404) as it does
                return False
            with media:
                self.send_response(200)
                if obj.get("contentType") is not None:
                    self.send_header("Content-type", obj["contentType"])
                self.send_header("X-Goog-Hash", f"crc32c={obj['crc32c']},md5={obj['md5Hash']}")
                for key, value in (obj.get("metadata") or {}).items():
                    if value is not None:
                        self.send_header(f"x-goog-meta-{key}", str(value))
                self.send_header("Content-Length", str(os.fstat(media.fileno()).st_size))
                self.end_headers()
                self.connection.sendfile(media)  # from the page cache to the socket, off the GIL
            return True

        def _generation_headers(self) -> dict[str, str]:
            url = urlsplit(self.path)
            match = _MEDIA_PATH.match(url.path)
            media = url.path.startswith("/download/") or parse_qs(url.query).get("alt") == ["media"]
            if match is None or not media:
                return {}
            try:
                obj = self.storage.get_file_obj(match["bucket"], unquote(match["object"]))
            except Exception:  # the emulator's NotFound and the like: no object, no headers
                return {}
            return {
                "x-goog-generation": str(obj["generation"]),
                "x-goog-metageneration": str(obj["metageneration"]),
            }

    return _Handler


def _api_thread(host: str, port: int, storage: Any, world: Callable[[], World]) -> Any:
    """The emulator's API thread on ``port`` (0: an ephemeral one), serving with ``_QuietHTTPServer``; a
    daemon, so one left running does not keep the interpreter from exiting. The socket is bound here, in
    the caller's thread, so a port in use raises OSError to the caller (in the emulator's own thread it
    would leave ``start()`` waiting forever)."""
    from functools import partial

    from gcp_storage_emulator.server import APIThread

    httpd = _QuietHTTPServer((host, port), partial(_request_handler(world), storage))

    class _Thread(APIThread):  # type: ignore[misc]  # the package is untyped
        def run(self) -> None:
            self._httpd = httpd
            self.is_running.set()
            self._httpd.serve_forever()

    return _Thread(host, port, storage, name="tpuctl-storage", daemon=True)


class StorageEmulator:
    """A GCS emulator on ``http://<host>:<port>`` (an ephemeral port by default) with ``default_bucket``
    created, checking its callers against ``world()``, the world in force (its project owns the bucket).

    ``data_dir`` keeps the objects on disk there (surviving a restart of the emulator); None keeps them in
    memory. ``start()`` returns the URL (no trailing slash, as the endpoint variables take it) and is
    idempotent; ``stop()`` closes the socket.
    """

    def __init__(
        self,
        world: Callable[[], World],
        data_dir: Path | None = None,
        default_bucket: str = DEFAULT_BUCKET,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.world = world
        self.data_dir = data_dir
        self.default_bucket = default_bucket
        self.host = host
        self.port = port
        self._server: Any = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the storage emulator is not started")
        # The emulator creates its HTTPServer in its API thread, so the bound port is read from there
        # once start() has waited for it (the package has no public accessor for an ephemeral port).
        port = self._server._api._httpd.server_address[1]
        return f"http://{self.host}:{port}"

    def start(self) -> str:
        if self._server is None:
            # Imported here: the emulator pulls in google-cloud-storage, which only the simulator needs.
            from gcp_storage_emulator.server import create_server

            if self.data_dir is not None:  # the bucket's objects are the user's: private, as the state dir
                self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            server = create_server(
                self.host,
                self.port,
                in_memory=self.data_dir is None,
                default_bucket=self.default_bucket,
                data_dir=str(self.data_dir.absolute()) if self.data_dir is not None else None,
            )
            # Every 404 (orbax asks for files before creating them) is logged at ERROR by the emulator.
            logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
            server._api = _api_thread(self.host, self.port, server._storage, self.world)
            server.start()
            self._server = server
        return self.url

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()


def storage_dir_for(state_dir: Path) -> Path:
    """Where the emulator of a simulator state keeps its buckets."""
    return Path(state_dir) / "sim-gcs"


def stored_objects(data_dir: Path, bucket: str = DEFAULT_BUCKET, prefix: str = "") -> list[str]:
    """The names of the objects in ``bucket`` under ``prefix`` that the emulator keeps in ``data_dir``,
    read from its index file (no emulator need be running: the simulator's CLI and tests look)."""
    import json

    from gcp_storage_emulator.storage import STORAGE_DIR

    try:
        meta = json.loads((data_dir / STORAGE_DIR / ".meta").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    objects = (meta.get("objects") or {}).get(bucket) or {}
    return sorted(name for name in objects if name.startswith(prefix))


__all__ = ["DEFAULT_BUCKET", "StorageEmulator", "storage_dir_for", "stored_objects"]
