"""Host setup: the pinned runtime sets match uv.lock, the key covers every input, and the generated script,
run for real with bash on the simulator's stock image (no pip, no uv) in a fresh HOME against the
simulator's package mirror, after the uv wheel was brought as tpuctl brings it, installs, skips a second
time and names a failing command."""

from __future__ import annotations

import re
import subprocess
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from setup_helpers import WHEELHOUSE, bring_uv, host_env, run_script, sh

from tpuctl.hosts.setup import (
    REQUIREMENTS_DIR,
    STEP_PREFIX,
    SetupSpec,
    env_python,
    failed_command,
    setup_script,
)
from tpuctl.hosts.uv_tool import PRESENT, host_uv, install_command, local_wheel, probe_command

ROOT = Path(__file__).resolve().parents[2]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(text: str) -> dict[str, str]:
    """name -> version of a requirements file: plain pins, or uv export's (markers, ``--hash`` lines)."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#")[0].split(";")[0].rstrip(" \\").strip()
        if line and not line.startswith("--hash"):
            name, version = line.split("==")
            pins[_canonical(name.split("[")[0])] = version
    return pins


def _hashes(text: str) -> dict[str, set[str]]:
    """name -> the sha256 hashes a uv export pins it to."""
    found: dict[str, set[str]] = {}
    name = ""
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "--hash")):
            name = _canonical(line.split("==")[0])
        if line.startswith("--hash=sha256:"):
            found.setdefault(name, set()).add(line.removeprefix("--hash=").rstrip(" \\"))
    return found


def _group_closure(packages: dict[str, Any], group: str) -> set[str]:
    """Every package the project's dependency group needs in uv.lock's graph (``packages``: its packages
    by name), on any platform (markers ignored, extras followed): what ``uv export --only-group`` lists."""
    project = packages["tpuctl"]
    todo = list(project["dev-dependencies"][group])
    seen: set[str] = set()
    while todo:
        dep = todo.pop()
        name = _canonical(dep["name"])
        package = packages[name]
        for extra in dep.get("extra", []):
            todo += package.get("optional-dependencies", {}).get(extra, [])
        if name not in seen:
            seen.add(name)
            todo += package.get("dependencies", [])
    return seen


@pytest.mark.parametrize("runtime", ["cpu", "tpu"])
def test_runtime_set_is_the_hash_pinned_closure_of_the_locks_runtime_group(runtime: str) -> None:
    """<runtime>.txt is ``uv export --only-group runtime-<runtime>`` of the current uv.lock: every package
    of the closure at uv.lock's version, each pinned to hashes uv.lock has for it (regenerate it with the
    command in its first lines after a change to the group or the lock)."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    locked = {_canonical(p["name"]): p for p in lock["package"]}
    text = (REQUIREMENTS_DIR / f"{runtime}.txt").read_text()
    pins = _pins(text)
    assert {"jax", "jaxlib", "optax", "orbax-checkpoint", "gcsfs"} <= pins.keys()
    assert set(pins) == _group_closure(locked, f"runtime-{runtime}")
    assert {n: v for n, v in pins.items() if locked[n]["version"] != v} == {}
    for name, hashes in _hashes(text).items():
        files = [*locked[name].get("wheels", []), locked[name].get("sdist", {})]
        assert hashes and hashes <= {f.get("hash") for f in files}, name
    assert set(_hashes(text)) == set(pins)


def test_only_the_tpu_set_brings_libtpu() -> None:
    """jax's ``tpu`` extra, followed into the lock: libtpu on Google's hosts, none on the simulator's."""
    assert "libtpu" in _pins((REQUIREMENTS_DIR / "tpu.txt").read_text())
    assert "libtpu" not in _pins((REQUIREMENTS_DIR / "cpu.txt").read_text())


def test_key_changes_with_every_input() -> None:
    base = SetupSpec("cpu", "six\n", ("echo a",))
    variants = [
        replace(base, runtime="tpu"),
        replace(base, runtime=None),
        replace(base, requirements="six==1.16\n"),
        replace(base, commands=("echo b",)),
        replace(base, commands=("echo a", "echo a")),
        replace(base, python="3.12"),
        replace(base, uv_version="0.13.8"),
    ]
    keys = {base.key(), *(v.key() for v in variants)}
    assert len(keys) == len(variants) + 1
    assert base.key() == SetupSpec("cpu", "six\n", ("echo a",)).key()


def test_env_python() -> None:
    assert env_python(SetupSpec(None)) == "python3"
    assert env_python(SetupSpec(None, commands=("echo",))) == "python3"
    spec = SetupSpec("cpu")
    assert env_python(spec) == f".tpuctl/envs/{spec.key()}/bin/python"
    reqs = SetupSpec(None, "six\n")
    assert env_python(reqs, "/r") == f"/r/envs/{reqs.key()}/bin/python"


def test_failed_command_is_the_last_step_line() -> None:
    lines = [f"{STEP_PREFIX}uv venv x\n", "ok", f"{STEP_PREFIX}make it\n", "make: *** Error 2"]
    assert failed_command(lines) == "make it"
    assert failed_command(["nothing here"]) is None


# The real script -----------------------------------------------------------------------------------------


def test_the_stock_image_has_no_pip_and_no_uv(image: Path, tmp_path: Path) -> None:
    env = host_env(image, tmp_path, "http://127.0.0.1:9")
    for probe in ("command -v pip", "command -v pip3", "command -v uv", "python3 -m pip --version"):
        assert sh(probe, b"", env)[0] != 0, probe
    assert sh("command -v python3", b"", env)[1] == [f"{image}/bin/python3"]


def test_uv_is_brought_verified_and_kept(image: Path, tmp_path: Path) -> None:
    """The wheel is refused unless its sha256 is the pin; the binary it holds runs from the tpuctl root,
    and the probe then says it is there (so a second run sends nothing)."""
    env = host_env(image, tmp_path, "http://127.0.0.1:9")
    assert sh(probe_command(".tpuctl"), b"", env)[1] == []
    wheel = local_wheel([WHEELHOUSE])
    rc, _, _ = sh(install_command(".tpuctl"), wheel[:-1] + b"x", env)
    assert rc != 0
    assert list((tmp_path / ".tpuctl" / "tools").iterdir()) == []  # nothing kept of a wheel refused
    bring_uv(env)
    version = subprocess.run([tmp_path / host_uv(".tpuctl"), "--version"], capture_output=True, text=True)
    assert version.stdout.split()[:2] == ["uv", SetupSpec(None).uv_version]
    assert sh(probe_command(".tpuctl"), b"", env)[1] == [PRESENT]


def test_setup_without_uv_fails_at_a_named_step(image: Path, mirror_url: str, tmp_path: Path) -> None:
    rc, lines, _ = run_script(setup_script(SetupSpec(None, "zipp\n")), host_env(image, tmp_path, mirror_url))
    assert rc != 0
    assert failed_command(lines) == f"test -x {tmp_path}/{host_uv('.tpuctl')}"


def test_setup_installs_then_skips(image: Path, mirror_url: str, tmp_path: Path) -> None:
    env = host_env(image, tmp_path, mirror_url)
    bring_uv(env)
    # The runtime's lock installs as it is, then the user's requirements are resolved against it.
    spec = SetupSpec(
        "cpu",
        "zipp\n",
        commands=("python -c 'import jax, optax, orbax.checkpoint, gcsfs, zipp' && echo imported",),
    )
    script = setup_script(spec)
    rc, lines, first = run_script(script, env)
    assert rc == 0, "\n".join(lines)
    assert "imported" in lines
    python = tmp_path / env_python(spec)
    assert (python.parent.parent / ".complete").is_file()
    version = subprocess.run(
        [python, "-c", "import jax; print(jax.__version__)"], capture_output=True, text=True
    )
    assert version.stdout.strip() == _pins((REQUIREMENTS_DIR / "cpu.txt").read_text())["jax"]
    rc, lines, second = run_script(script, env)
    assert rc == 0
    assert [line for line in lines if line.startswith(STEP_PREFIX)] == []
    assert any("up to date" in line for line in lines)
    print(f"setup cpu on a fresh HOME: {first:.2f} s; again: {second:.3f} s")


def test_failing_command_fails_and_is_named(image: Path, mirror_url: str, tmp_path: Path) -> None:
    env = host_env(image, tmp_path, mirror_url)
    spec = SetupSpec(None, commands=("echo first", "echo broken >&2; exit 7", "echo never"))
    rc, lines, _ = run_script(setup_script(spec), env)
    assert rc == 7
    assert failed_command(lines) == "echo broken >&2; exit 7"
    assert "broken" in lines and "never" not in lines
    assert not (tmp_path / ".tpuctl" / "envs" / spec.key() / ".complete").exists()


def test_user_requirements_from_the_mirror(image: Path, mirror_url: str, tmp_path: Path) -> None:
    """User requirements install into the environment too (here a small wheel the mirror has), and a
    setup command can run ``uv pip install`` as tpuctl's fix for a missing module says."""
    env = host_env(image, tmp_path, mirror_url)
    bring_uv(env)
    check = "python -c 'import zipp, typing_extensions; print(zipp.__name__)'"
    spec = SetupSpec(None, "zipp\n", ("uv pip install --quiet typing_extensions", check))
    rc, lines, _ = run_script(setup_script(spec), env)
    assert rc == 0, "\n".join(lines)
    assert "zipp" in lines
    assert failed_command(lines) == check
