"""The simulated network's Cloud Storage: gcp-storage-emulator, in-process, on loopback.

gcp-storage-emulator (PyPI ``gcp-storage-emulator``) serves GCS's JSON API (``/storage/v1/...``,
``/upload/storage/v1/...``, ``/download/storage/v1/...``), which is what tensorstore's gs:// driver (orbax's
array writes and reads; pointed here with ``TENSORSTORE_GCS_HTTP_URL``) and gcsfs (etils.epath's gs://
directories; pointed here with ``STORAGE_EMULATOR_HOST``) speak. Its server handles one request at a time
on a thread of its own, so its storage needs no locking.
"""

from __future__ import annotations

import logging
import sys
from http import server as http_server
from pathlib import Path
from typing import Any

DEFAULT_BUCKET = "tpuctl-sim"


class _QuietHTTPServer(http_server.HTTPServer):
    """The emulator's HTTPServer, silent about clients that hang up mid-answer (tensorstore and gcsfs close
    pooled connections freely); any other error is still printed, as the base class does."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _api_thread(host: str, port: int, storage: Any) -> Any:
    """The emulator's API thread on ``port`` (0: an ephemeral one), serving with ``_QuietHTTPServer``; a
    daemon, so one left running does not keep the interpreter from exiting. The socket is bound here, in
    the caller's thread, so a port in use raises OSError to the caller (in the emulator's own thread it
    would leave ``start()`` waiting forever)."""
    from functools import partial

    from gcp_storage_emulator.server import APIThread, RequestHandler

    httpd = _QuietHTTPServer((host, port), partial(RequestHandler, storage))

    class _Thread(APIThread):  # type: ignore[misc]  # the package is untyped
        def run(self) -> None:
            self._httpd = httpd
            self.is_running.set()
            self._httpd.serve_forever()

    return _Thread(host, port, storage, name="tpuctl-storage", daemon=True)


class StorageEmulator:
    """A GCS emulator on ``http://<host>:<port>`` (an ephemeral port by default) with ``default_bucket``
    created.

    ``data_dir`` keeps the objects on disk there (surviving a restart of the emulator); None keeps them in
    memory. ``start()`` returns the URL (no trailing slash, as STORAGE_EMULATOR_HOST takes it) and is
    idempotent; ``stop()`` closes the socket.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        default_bucket: str = DEFAULT_BUCKET,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
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

            if self.data_dir is not None:
                self.data_dir.mkdir(parents=True, exist_ok=True)
            server = create_server(
                self.host,
                self.port,
                in_memory=self.data_dir is None,
                default_bucket=self.default_bucket,
                data_dir=str(self.data_dir.absolute()) if self.data_dir is not None else None,
            )
            # Every 404 (orbax asks for files before creating them) is logged at ERROR by the emulator.
            logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
            server._api = _api_thread(self.host, self.port, server._storage)
            server.start()
            self._server = server
        return self.url

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()


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


__all__ = ["DEFAULT_BUCKET", "StorageEmulator", "stored_objects"]
