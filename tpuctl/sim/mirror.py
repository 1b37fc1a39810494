"""The simulated network's package mirror: a wheelhouse served over HTTP on loopback.

Simulated hosts install offline: their pip and uv are pointed at this mirror (``PIP_NO_INDEX=1`` +
``PIP_FIND_LINKS``, ``UV_NO_INDEX=1`` + ``UV_FIND_LINKS``; see ``tpuctl.sim.network``). The root page is a
flat HTML page of links, one per distribution file, which is what both installers accept for
``--find-links`` (pip: "If a URL or path to an html file, then parse for links to archives"; uv: a
"flat index", an HTML page of links to distributions). Files are served with byte ranges, which uv uses
to read a wheel's METADATA from the end of the zip instead of downloading the whole wheel.

The same files are also served as a PEP 503 "simple" index under ``/simple/``: uv 0.13 has no environment
variable for ``--no-index`` (``uv pip install --help`` lists none), so the simulated network makes the
mirror uv's default index (``UV_DEFAULT_INDEX``) and nothing is ever asked of PyPI.
"""

from __future__ import annotations

import html
import re
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from functools import partial
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.sim.fetch_through import UpstreamError
from tpuctl.sim.httpd import LISTEN_BACKLOG

if TYPE_CHECKING:
    from tpuctl.sim.fetch_through import FetchThrough

#: What counts as a distribution file (anything else in the wheelhouse, e.g. stamps, is not listed).
DIST_SUFFIXES = (".whl", ".tar.gz", ".zip")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
#: Asked before each request is answered, with its method, path and Range header (None: whole): False
#: closes the connection unanswered (``tpuctl.sim.network``: hosts with no route to the mirror).
Admit = Callable[[str, str, str | None], bool]


def distributions(wheelhouse: Path) -> list[str]:
    """Names of the distribution files directly in ``wheelhouse``, sorted."""
    if not wheelhouse.is_dir():
        return []
    return sorted(p.name for p in wheelhouse.iterdir() if p.is_file() and p.name.endswith(DIST_SUFFIXES))


def project_name(filename: str) -> str:
    """The PEP 503 normalized project name of a distribution file (a wheel's or sdist's first field)."""
    stem = filename[: -len(".tar.gz")] if filename.endswith(".tar.gz") else filename.rsplit(".", 1)[0]
    name = stem.split("-")[0] if filename.endswith(".whl") else stem.rsplit("-", 1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def index_page(names: list[str], prefix: str = "", suffix: str = "") -> bytes:
    """An HTML page of links: one per name, to ``prefix + name + suffix``."""
    links = "".join(
        f'<a href="{html.escape(prefix + urllib.parse.quote(n) + suffix)}">{html.escape(n)}</a><br>\n'
        for n in names
    )
    return f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode()


def _page(wheelhouse: Path, path: str) -> bytes | None:
    """The HTML page at ``path``: the find-links page (``/``), the simple index's project list
    (``/simple/``) or a project's files (``/simple/<project>/``); None if there is none."""
    names = distributions(wheelhouse)
    if path in ("/", "/index.html"):
        return index_page(names)
    if path == "/simple/":
        return index_page(sorted({project_name(n) for n in names}), suffix="/")
    parts = path.split("/")
    if len(parts) == 4 and parts[1] == "simple" and parts[3] == "":
        files = [n for n in names if project_name(n) == parts[2]]
        return index_page(files, prefix="../../") if files else None
    return None


class _Handler(BaseHTTPRequestHandler):
    """GET/HEAD of ``/`` (the page) and of ``/<file>`` (with a single ``Range: bytes=a-b`` honoured)."""

    protocol_version = "HTTP/1.1"

    def __init__(
        self, wheelhouse: Path, fetch_through: FetchThrough | None, admit: Admit | None, *args: Any
    ) -> None:
        self.wheelhouse = wheelhouse
        self.fetch_through = fetch_through
        self.admit = admit
        super().__init__(*args)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: every request would otherwise be printed on stderr."""

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if self.admit is not None and not self.admit(self.command, path, self.headers.get("Range")):
            self.close_connection = True  # no answer at all, as from an address with no route to it
            return
        if path == "/simple" or (path.startswith("/simple/") and path.count("/") == 2 and path[-1] != "/"):
            # PEP 503: project URLs end with a slash; send clients there.
            self.send_response(HTTPStatus.MOVED_PERMANENTLY)
            self.send_header("Location", path + "/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        try:
            page = _page(self.wheelhouse, path) or self._fetched_page(path)
            file = self._fetched_file(path.lstrip("/")) if page is None else None
        except UpstreamError as exc:
            self._upstream_failed(exc)
            return
        if page is not None:
            self._head(HTTPStatus.OK, len(page), "text/html; charset=utf-8")
            if body:
                self.wfile.write(page)
            return
        name = path.lstrip("/")
        file = file or self.wheelhouse / name
        # Only plain names of listed files: no "..", no subfolders.
        if "/" in name or not name.endswith(DIST_SUFFIXES) or not file.is_file():
            self._head(HTTPStatus.NOT_FOUND, 0, "text/plain")
            return
        self._send_file(file, body=body)

    def _fetched_page(self, path: str) -> bytes | None:
        """A project page the wheelhouse lacks, from the upstream index when fetch-through is on."""
        return None if self.fetch_through is None else self.fetch_through.page(path)

    def _fetched_file(self, name: str) -> Path | None:
        """A file the wheelhouse lacks that a fetched page listed (cached, or downloaded now)."""
        if self.fetch_through is None or "/" in name or (self.wheelhouse / name).is_file():
            return None
        return self.fetch_through.file(name)

    def _upstream_failed(self, exc: UpstreamError) -> None:
        # 502, as a proxy says its upstream failed: uv and pip then name the URL and the status.
        message = f"the package mirror's upstream index failed: {exc}\n".encode()
        self._head(HTTPStatus.BAD_GATEWAY, len(message), "text/plain; charset=utf-8")
        self.wfile.write(message)

    def _send_file(self, file: Path, *, body: bool) -> None:
        size = file.stat().st_size
        start, end = 0, size - 1
        status = HTTPStatus.OK
        match = _RANGE.match(self.headers.get("Range", ""))
        if match and (match[1] or match[2]):
            if match[1]:
                start, end = int(match[1]), min(int(match[2]) if match[2] else size - 1, size - 1)
            else:  # a suffix range: the last N bytes
                start = max(size - int(match[2]), 0)
            if start > end:
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = HTTPStatus.PARTIAL_CONTENT
        length = end - start + 1
        self._head(status, length, "application/octet-stream", content_range=(start, end, size))
        if not body:
            return
        self.wfile.flush()  # the headers go first, then the body straight from the file
        with file.open("rb") as f:
            # sendfile(2): the kernel copies file to socket, without the GIL or a Python loop per chunk
            # (a fresh host's setup pulls ~200 MB of wheels from here; the loop cost it ~1.5 s).
            self.connection.sendfile(f, offset=start, count=length)

    def _head(
        self, status: HTTPStatus, length: int, ctype: str, content_range: tuple[int, int, int] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        if status is HTTPStatus.PARTIAL_CONTENT and content_range is not None:
            self.send_header("Content-Range", "bytes {}-{}/{}".format(*content_range))
        self.end_headers()


def default_wheelhouse(environ: Mapping[str, str]) -> Path:
    """Where scripts/setup primes the wheels: ``$TPUCTL_SIM_WHEELHOUSE``, else
    ``${XDG_CACHE_HOME:-~/.cache}/tpuctl/wheels``."""
    if environ.get("TPUCTL_SIM_WHEELHOUSE"):
        return Path(environ["TPUCTL_SIM_WHEELHOUSE"]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpuctl" / "wheels"


class _MirrorServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG


class PackageMirror:
    """Serves ``wheelhouse`` at ``http://<host>:<port>/`` (an ephemeral port by default) from a daemon
    thread.

    ``start()`` returns the URL of the find-links page (idempotent); ``stop()`` closes the socket. The
    directory is read on every request, so wheels added later are served too. ``admit``, when given, is
    asked before each request is answered (``Admit``).
    """

    def __init__(
        self,
        wheelhouse: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        fetch_through: FetchThrough | None = None,
        admit: Admit | None = None,
    ) -> None:
        self.wheelhouse = wheelhouse
        self.fetch_through = fetch_through
        self.admit = admit
        self.host = host
        self.port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the package mirror is not started")
        return f"http://{self.host}:{self._server.server_address[1]}/"

    def start(self) -> str:
        if self._server is None:
            server = _MirrorServer(
                (self.host, self.port), partial(_Handler, self.wheelhouse, self.fetch_through, self.admit)
            )
            self._thread = threading.Thread(target=server.serve_forever, name="tpuctl-mirror", daemon=True)
            self._server = server
            self._thread.start()
        return self.url

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)


__all__ = ["DIST_SUFFIXES", "PackageMirror", "distributions", "index_page"]
