"""tpuctl builds with pip's own front end, offline, as `pip install .` builds it: with build isolation, the
build backend taken from the wheelhouse scripts/setup keeps (.tools/wheels), and never an index. The wheel
holds the whole package, the files the code opens at run time, the `tpuctl` command and the dependencies
pyproject.toml names."""

from __future__ import annotations

import configparser
import importlib
import os
import subprocess
import tomllib
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
BACKEND_WHEELHOUSE = ROOT / ".tools" / "wheels"
PACKAGE = "tpuctl"

# Files the code opens by path or through importlib.resources rather than importing them: a build that
# dropped one would install a tpuctl that fails only when it reaches that file.
RUN_TIME_FILES = (
    "tpuctl/catalog/data/accelerators.yaml",
    "tpuctl/catalog/data/prices.yaml",
    "tpuctl/catalog/data/server_vm_prices.yaml",
    "tpuctl/sim/data/world.yaml",
    "tpuctl/sim/data/discovery/tpu.v2.json",
    "tpuctl/sim/data/discovery/tpu.v2alpha1.json",
    "tpuctl/runtime/requirements/cpu.txt",
    "tpuctl/runtime/requirements/tpu.txt",
    # Not in a package (no __init__.py): the hosts' start-up hook, shipped by path.
    "tpuctl/runtime/_sitecustomize/sitecustomize.py",
    "tpuctl/hosts/programs/bench_step.py",
)


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _pip_env() -> dict[str, str]:
    """This environment without the machine's pip settings: no configured index, find-links or constraints
    can stand in for the wheelhouse (PIP_CONFIG_FILE=os.devnull makes pip read no config file at all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def _pip_wheel(out: Path) -> Path:
    """Build tpuctl's wheel into `out` as `pip install .` builds it (build isolation on), offline."""
    if not any(BACKEND_WHEELHOUSE.glob("*.whl")):
        pytest.fail(f"no build backend wheel in {BACKEND_WHEELHOUSE}: run scripts/setup")
    # .venv, made by uv, has no pip. scripts/setup's tools venv, made by `python -m venv`, has the pip a
    # new user's venv has (the one Python bundles), and reusing it saves making a venv (seconds of CPU).
    frontends = sorted(ROOT.glob(".tools/uv-*/bin/python"))
    if not frontends:
        pytest.fail(f"no tools venv with pip in {ROOT / '.tools'}: run scripts/setup")
    build = subprocess.run(
        [str(frontends[-1]), "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-cache-dir",
         "--find-links", str(BACKEND_WHEELHOUSE), "--wheel-dir", str(out), str(ROOT)],
        env=_pip_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert build.returncode == 0, f"pip wheel failed:\n{build.stdout}\n{build.stderr}"
    built = sorted(p.name for p in out.iterdir())
    assert built == [f"{PACKAGE}-{_version()}-py3-none-any.whl"]
    return out / built[0]


def _version() -> str:
    return str(_pyproject()["project"]["version"])


def _dist_info() -> str:
    return f"{PACKAGE}-{_version()}.dist-info"


def _package_files_on_disk() -> set[str]:
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(ROOT / PACKAGE):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if not name.endswith((".pyc", ".pyo")):
                found.add((Path(dirpath) / name).relative_to(ROOT).as_posix())
    return found


def _assert_holds_the_package_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    names = {n for n in wheel.namelist() if not n.endswith("/")}  # files, not the zip's directory entries
    in_package = {n for n in names if n.startswith(f"{PACKAGE}/")}
    on_disk = _package_files_on_disk()
    assert in_package == on_disk, (
        f"only on disk: {sorted(on_disk - in_package)}, only in the wheel: {sorted(in_package - on_disk)}"
    )
    assert names - in_package == {n for n in names if n.startswith(f"{_dist_info()}/")}
    assert "tpuctl/__init__.py" in names


def _assert_holds_the_files_the_code_opens_at_run_time(wheel: zipfile.ZipFile) -> None:
    missing = [f for f in RUN_TIME_FILES if f not in wheel.namelist()]
    assert not missing, f"not in the wheel: {missing}"
    # The same bytes as the source: the build copies them, it does not regenerate them.
    for name in RUN_TIME_FILES:
        assert wheel.read(name) == (ROOT / name).read_bytes(), name


def _assert_installs_the_tpuctl_command(wheel: zipfile.ZipFile) -> None:
    entry_points = configparser.ConfigParser()
    entry_points.read_string(wheel.read(f"{_dist_info()}/entry_points.txt").decode())
    scripts = dict(entry_points["console_scripts"])
    assert scripts == {"tpuctl": "tpuctl.cli.main:console_main"}
    assert scripts == _pyproject()["project"]["scripts"]
    module, _, function = scripts["tpuctl"].partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def _assert_requires_the_projects_dependencies(wheel: zipfile.ZipFile) -> None:
    metadata = HeaderParser().parsestr(wheel.read(f"{_dist_info()}/METADATA").decode())
    assert (metadata["Name"], metadata["Version"]) == (PACKAGE, _version())
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    unconditional = {str(r) for r in requires if r.marker is None}
    assert unconditional == {str(Requirement(d)) for d in _pyproject()["project"]["dependencies"]}


# One test, one build: split into several, xdist could hand them to two workers that would each build.
def test_pip_builds_the_wheel_offline_with_the_package_its_data_and_command(tmp_path: Path) -> None:
    with zipfile.ZipFile(_pip_wheel(tmp_path)) as wheel:
        _assert_holds_the_package_and_nothing_else(wheel)
        _assert_holds_the_files_the_code_opens_at_run_time(wheel)
        _assert_installs_the_tpuctl_command(wheel)
        _assert_requires_the_projects_dependencies(wheel)
