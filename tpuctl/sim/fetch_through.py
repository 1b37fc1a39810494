"""The package mirror's fetch-through: what the wheelhouse lacks, from the index the user's tools name.

A Google host with an external IP installs a user's own packages from PyPI (or whatever index the
user's setup names); a simulated host reaches only the simulated network's package mirror. When the
world turns ``package_fetch_through`` on, the mirror plays that route: a project its wheelhouse lacks is
looked up on the upstream index (a PEP 503 simple index) and its files are served from the mirror,
each downloaded once into a cache below the state dir and checked against the hash the index gave.
Projects the wheelhouse has are served from it alone: those are the runtime's locked wheels, and
answering them from the wheelhouse keeps a run's setup from asking the upstream index ~60 times.

Beside it, always on: tpuctl's own locked dependencies, which the team server's VM installs, served
from this machine's uv cache (``tpuctl.sim.locked_wheels``), never downloaded.

The upstream index is the one this machine's own pip/uv configuration names (``configured_index_url``),
read from the environment of the process that serves the mirror.
"""

from __future__ import annotations

import configparser
import hashlib
import html.parser
import json
import os
import re
import threading
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.sim.locked_wheels import LockedWheels
    from tpuctl.sim.world import World

#: The index pip and uv use when nothing names another.
PYPI_SIMPLE = "https://pypi.org/simple/"
#: PEP 503 project pages; the mirror serves the upstream's at the same path.
_PROJECT_PAGE = re.compile(r"^/simple/([a-z0-9][a-z0-9-]*)/$")
_DIST_SUFFIXES = (".whl", ".tar.gz", ".zip")
_TIMEOUT_S = 60.0


class UpstreamError(Exception):
    """The upstream index could not be asked (unreachable, or an answer other than a page or a 404)."""


# --- which index the user's tools name ------------------------------------------------------------------


def configured_index_url(environ: Mapping[str, str], home: Path) -> str:
    """The index URL this machine's uv or pip would install from, as their own precedence has it:
    uv's and pip's variables first (``UV_DEFAULT_INDEX``, ``UV_INDEX_URL``, ``PIP_INDEX_URL``), then
    uv's config file (``index-url``, or the ``[[index]]`` marked ``default``), then pip's (``index-url``
    of ``[global]``, ``[install]`` or ``[download]``); PyPI when none names one. ``UV_NO_CONFIG`` and
    ``PIP_CONFIG_FILE=/dev/null`` leave the files unread, as they do for the tools themselves."""
    for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if environ.get(name):
            return _with_slash(environ[name].split()[0])
    found = _uv_config_index(environ, home) or _pip_config_index(environ, home)
    return _with_slash(found or PYPI_SIMPLE)


def _with_slash(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def _uv_config_index(environ: Mapping[str, str], home: Path) -> str | None:
    if environ.get("UV_CONFIG_FILE"):
        files = [Path(environ["UV_CONFIG_FILE"])]
    elif environ.get("UV_NO_CONFIG"):
        return None
    else:
        config_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
        files = [config_home / "uv" / "uv.toml", Path("/etc/uv/uv.toml")]
    for file in files:
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            continue
        for table in (data, data.get("pip") or {}):
            if isinstance(table.get("index-url"), str):
                return str(table["index-url"])
        for index in data.get("index") or []:
            if isinstance(index, dict) and index.get("default") and isinstance(index.get("url"), str):
                return str(index["url"])
    return None


def _pip_config_index(environ: Mapping[str, str], home: Path) -> str | None:
    if environ.get("PIP_CONFIG_FILE") == os.devnull:
        return None
    config_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    # pip reads these in this order, a later file's value overriding an earlier one's.
    files = [Path("/etc/pip.conf"), home / ".pip" / "pip.conf", config_home / "pip" / "pip.conf"]
    if environ.get("PIP_CONFIG_FILE"):
        files.append(Path(environ["PIP_CONFIG_FILE"]))
    found: str | None = None
    for file in files:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(file, encoding="utf-8")
        except (OSError, configparser.Error):
            continue
        for section in ("global", "download", "install"):
            value = parser.get(section, "index-url", fallback=None)
            if value:
                found = value.split()[0]
    return found


# --- the fetching ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpstreamFile:
    """One distribution file an upstream project page links to."""

    name: str
    url: str
    sha256: str | None


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href") if tag == "a" else None
        if href:
            self.hrefs.append(href)


def project_files(page_url: str, page: str) -> list[UpstreamFile]:
    """The distribution files a PEP 503 project page (``page``, found at ``page_url``) links to."""
    parser = _Links()
    parser.feed(page)
    files: list[UpstreamFile] = []
    for href in parser.hrefs:
        url, _, fragment = urllib.parse.urljoin(page_url, href).partition("#")
        name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        if not name.endswith(_DIST_SUFFIXES) or "/" in name or name.startswith("."):
            continue
        digest = fragment.partition("=")[2] if fragment.startswith("sha256=") else None
        files.append(UpstreamFile(name, url, digest))
    return files


class FetchThrough:
    """The upstream index at ``index_url``, asked while ``enabled()`` says so, its files cached in
    ``cache_dir`` (the links each project page gave are kept there too, so a mirror served later by
    another simulator process still knows where a listed file comes from)."""

    def __init__(
        self,
        index_url: str,
        cache_dir: Path,
        enabled: Callable[[], bool],
        locked: LockedWheels | None = None,
    ) -> None:
        """``locked``: tpuctl's own locked dependencies, served whether or not fetch-through is on (they
        stand in for the PyPI a Google VM installs the team server from; never downloaded)."""
        self.index_url = _with_slash(index_url)
        self.cache_dir = cache_dir
        self.enabled = enabled
        self.locked = locked
        self._lock = threading.Lock()

    @property
    def _links_dir(self) -> Path:
        return self.cache_dir / "links"

    def page(self, path: str) -> bytes | None:
        """The mirror's page for ``path`` when it is a project page the upstream index has (links to
        the mirror's own root, with the upstream's hashes), else one of tpuctl's locked dependencies
        from the uv cache (``locked``); None otherwise. The upstream index answers first while
        fetch-through is on: a user's index decides what a user's run installs. Raises UpstreamError
        when the upstream index cannot be asked."""
        match = _PROJECT_PAGE.match(path)
        files = self._ask(match[1]) if match is not None and self.enabled() else []
        if files:
            links = "".join(
                f'<a href="../../{urllib.parse.quote(f.name)}'
                f'{"#sha256=" + f.sha256 if f.sha256 else ""}">{f.name}</a><br>\n'
                for f in files
            )
            return f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode()
        locked = self.locked.page(path) if self.locked is not None else None
        if locked:
            from tpuctl.sim.mirror import index_page  # mirror.py imports this module

            return index_page(locked, prefix="../../")
        return None

    def file(self, name: str) -> Path | None:
        """The cached file ``name``, downloaded now if a project page listed it and it is not cached;
        None when no page listed it or fetch-through is off. Raises UpstreamError when the download fails
        or its hash is not the one the index gave."""
        cached = self.cache_dir / name
        if cached.is_file():
            return cached
        repacked = self.locked.file(name) if self.locked is not None else None
        if repacked is not None:
            return repacked
        if not self.enabled():
            return None
        known = self._known(name)
        if known is None:
            return None
        with self._lock:  # one download per file, however many hosts ask at once
            if not cached.is_file():
                self._download(known, cached)
        return cached

    def _ask(self, project: str) -> list[UpstreamFile]:
        url = f"{self.index_url}{project}/"
        request = urllib.request.Request(url, headers={"Accept": "text/html"})
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as answer:
                page = answer.read().decode("utf-8", errors="replace")
                page_url = answer.geturl()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise UpstreamError(f"{url} answered {exc.code} {exc.reason}") from exc
        except (OSError, ValueError) as exc:
            raise UpstreamError(f"cannot reach {url}: {exc}") from exc
        files = project_files(page_url, page)
        self._links_dir.mkdir(parents=True, exist_ok=True)
        record = {f.name: {"url": f.url, "sha256": f.sha256} for f in files}
        _write_atomically(self._links_dir / f"{project}.json", json.dumps(record).encode())
        return files

    def _known(self, name: str) -> UpstreamFile | None:
        for links in sorted(self._links_dir.glob("*.json")):
            try:
                entry = json.loads(links.read_text(encoding="utf-8")).get(name)
            except (OSError, ValueError):
                continue
            if entry is not None:
                return UpstreamFile(name, str(entry["url"]), entry.get("sha256"))
        return None

    def _download(self, source: UpstreamFile, target: Path) -> None:
        try:
            with urllib.request.urlopen(source.url, timeout=_TIMEOUT_S) as answer:
                data = answer.read()
        except (OSError, ValueError) as exc:
            raise UpstreamError(f"cannot download {source.url}: {exc}") from exc
        if source.sha256 is not None and hashlib.sha256(data).hexdigest() != source.sha256:
            raise UpstreamError(f"{source.url} does not have the sha256 its index page gave")
        _write_atomically(target, data)


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers (this process's other threads, another simulator process) see the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temp.write_bytes(data)
    temp.replace(path)


def package_cache_for(state_dir: Path) -> Path:
    """Where the mirror of a simulator state keeps what it fetched through."""
    return Path(state_dir) / "sim-packages"


def fetch_through_for(
    state_dir: Path, world: Callable[[], World], environ: Mapping[str, str], home: Path
) -> FetchThrough:
    """The fetch-through of the mirror over ``state_dir``: to the index ``environ``'s (and ``home``'s)
    pip/uv configuration names, on while the world in force (``world()``) turns it on."""
    from tpuctl.sim.locked_wheels import locked_wheels_for

    cache = package_cache_for(state_dir)
    return FetchThrough(
        configured_index_url(environ, home),
        cache,
        enabled=lambda: world().package_fetch_through,
        locked=locked_wheels_for(cache, environ, home),
    )


__all__ = [
    "PYPI_SIMPLE",
    "FetchThrough",
    "UpstreamError",
    "UpstreamFile",
    "configured_index_url",
    "fetch_through_for",
    "package_cache_for",
    "project_files",
]
