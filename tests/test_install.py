"""The environment the suite runs in holds exactly the versions in uv.lock (what scripts/setup installs).

Walks the lock from tpuctl with its `test` extra, keeping the dependencies whose markers hold on this
interpreter and platform, and compares that set with every distribution installed here.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.markers import Marker

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "tpuctl"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _applies(dep: dict[str, Any]) -> bool:
    marker = dep.get("marker")
    return marker is None or Marker(str(marker)).evaluate()


def locked_versions(lock: dict[str, Any], extras: set[str]) -> dict[str, str]:
    """Name -> version of every package the lock installs for PROJECT with `extras`, here."""
    packages: dict[str, dict[str, Any]] = {}
    for package in lock["package"]:
        name = _canonical(package["name"])
        # The lock forks a package into several versions only when markers split it; not the case today,
        # and this walk would need the fork's markers to choose.
        assert name not in packages, f"{name} has several versions in uv.lock"
        packages[name] = package
    found: dict[str, str] = {}
    todo: list[tuple[str, set[str]]] = [(PROJECT, extras)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, frozenset(wanted)) in seen:
            continue
        seen.add((name, frozenset(wanted)))
        package = packages[name]
        found[name] = package["version"]
        deps = list(package.get("dependencies", []))
        for extra in wanted:
            deps += package.get("optional-dependencies", {}).get(extra, [])
        todo += [(_canonical(d["name"]), set(d.get("extra", []))) for d in deps if _applies(d)]
    return found


def installed_versions() -> dict[str, str]:
    return {_canonical(dist.metadata["Name"]): dist.version for dist in importlib.metadata.distributions()}


def test_installed_versions_equal_the_lock() -> None:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    want = locked_versions(lock, {"test"})
    have = installed_versions()
    missing = {n: v for n, v in want.items() if n not in have}
    extra = {n: v for n, v in have.items() if n not in want}
    differ = {n: (have[n], v) for n, v in want.items() if n in have and have[n] != v}
    assert not (missing or extra or differ), (
        f"the environment is not uv.lock (run scripts/setup): missing {missing}, not in the lock {extra}, "
        f"(installed, locked) {differ}"
    )
