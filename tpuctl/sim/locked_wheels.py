"""tpuctl's own locked dependencies, served by the package mirror from this machine's uv cache.

A Google VM that runs the team server installs tpuctl's wheel with its locked dependencies (FastAPI,
uvicorn, SQLAlchemy, ...) from PyPI; a simulated VM reaches only the simulated network's mirror, whose
wheelhouse holds the runtime's wheels, not the server's. This source lets the mirror serve the server's
too, offline: a project of ``uv.lock`` (at its locked version only, nothing else of the project) that
the wheelhouse lacks is found in uv's cache, where ``scripts/setup``'s sync left it unpacked
(``archive-v0/<id>/``: the wheel's files as they were, its ``.dist-info`` with ``WHEEL`` and ``RECORD``),
and zipped back into the wheel it was, once, below the simulator's state. Nothing is downloaded: a
project the cache lacks is not served.
"""

from __future__ import annotations

import os
import re
import threading
import tomllib
import zipfile
from collections.abc import Mapping
from pathlib import Path

#: PEP 503 project pages, the only pages this source answers.
_PROJECT_PAGE = re.compile(r"^/simple/([a-z0-9][a-z0-9-]*)/$")


def normalized(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_pins(lock_file: Path) -> dict[str, str]:
    """{normalized project: version} of every registry package of a ``uv.lock`` (none when absent: an
    installed tpuctl has no lock, and then nothing is served from the cache)."""
    try:
        lock = tomllib.loads(lock_file.read_text(encoding="utf-8"))
    except OSError:
        return {}
    return {
        normalized(str(p["name"])): str(p["version"])
        for p in lock.get("package", [])
        if "registry" in p.get("source", {}) and "version" in p
    }


def uv_cache_dir(environ: Mapping[str, str], home: Path) -> Path:
    """uv's cache as uv finds it: ``$UV_CACHE_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/uv``."""
    if environ.get("UV_CACHE_DIR"):
        return Path(environ["UV_CACHE_DIR"]).expanduser()
    return Path(environ.get("XDG_CACHE_HOME") or home / ".cache") / "uv"


def wheel_name(dist_info: Path) -> str:
    """The file name of the wheel a ``<name>-<version>.dist-info`` came from: its tags read from
    ``WHEEL`` and compressed as the wheel spec's file names compress a tag set (``py2.py3-none-any``)."""
    tags = [
        line.split(":", 1)[1].strip()
        for line in (dist_info / "WHEEL").read_text(encoding="utf-8").splitlines()
        if line.startswith("Tag:")
    ]
    if not tags:
        raise ValueError(f"{dist_info / 'WHEEL'} names no Tag")
    parts = [t.split("-") for t in tags]
    compressed = "-".join(".".join(dict.fromkeys(p[i] for p in parts)) for i in range(3))
    return f"{dist_info.name.removesuffix('.dist-info')}-{compressed}.whl"


def repack(unpacked: Path, target: Path) -> None:
    """Zip an unpacked wheel's files into ``target`` (atomically: readers see a whole wheel or none)."""
    temp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(temp, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path in sorted(p for p in unpacked.rglob("*") if p.is_file()):
            wheel.write(path, path.relative_to(unpacked).as_posix())
    temp.replace(target)


class LockedWheels:
    """The mirror's source for ``pins`` (project -> version), from the uv cache ``cache``; the repacked
    wheels are kept in ``out``."""

    def __init__(self, pins: Mapping[str, str], cache: Path, out: Path) -> None:
        self.pins = dict(pins)
        self.cache = cache
        self.out = out
        self._lock = threading.Lock()

    def page(self, path: str) -> list[str] | None:
        """The file names of the project page at ``path`` (``/simple/<project>/``), repacking the
        locked version's wheel on first ask; None when the project is not locked or not in the cache."""
        match = _PROJECT_PAGE.match(path)
        if match is None or match.group(1) not in self.pins:
            return None
        project = match.group(1)
        with self._lock:
            found = self._wheel(project, self.pins[project])
        return [found] if found else None

    def file(self, name: str) -> Path | None:
        """A wheel ``page`` repacked (None for any other name)."""
        path = self.out / name
        return path if "/" not in name and path.is_file() else None

    def _wheel(self, project: str, version: str) -> str | None:
        stem = f"{project.replace('-', '_')}-{version}.dist-info"
        kept = [p.name for p in self.out.glob("*.whl")] if self.out.is_dir() else []
        for name in kept:
            if normalized(name.split("-")[0]) == project and name.split("-")[1] == version:
                return name
        archives = self.cache / "archive-v0"
        for entry in archives.iterdir() if archives.is_dir() else ():
            dist_info = next((d for d in entry.glob("*.dist-info") if d.name.lower() == stem.lower()), None)
            if dist_info is not None and (dist_info / "WHEEL").is_file():
                name = wheel_name(dist_info)
                repack(entry, self.out / name)
                return name
        return None


def locked_wheels_for(package_cache: Path, environ: Mapping[str, str], home: Path) -> LockedWheels:
    """tpuctl's lock (beside its package, in a source checkout) served from this machine's uv cache."""
    lock_file = Path(__file__).resolve().parents[2] / "uv.lock"
    return LockedWheels(locked_pins(lock_file), uv_cache_dir(environ, home), package_cache / "locked")
