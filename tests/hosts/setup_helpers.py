"""Helpers for the host setup tests: a simulated host's login environment, run locally with bash on the
simulator's stock image, and uv brought to it as tpuctl brings it. (A module of its own: several test
directories have a conftest.py.)"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tpuctl.hosts.setup import RUN_SCRIPT_FROM_STDIN
from tpuctl.hosts.uv_tool import install_command, local_wheel
from tpuctl.sim.network import network_env
from tpuctl.sim.vms.disks import host_path

WHEELHOUSE = Path(
    os.environ.get("TPUCTL_SIM_WHEELHOUSE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tpuctl" / "wheels"
)


def host_env(image: Path, home: Path, mirror_url: str) -> dict[str, str]:
    """A login environment from scratch, as a simulated host's (no network beyond loopback services)."""
    return {
        "HOME": str(home),
        "PATH": host_path(image, str(home)),
        "LANG": "C.UTF-8",
        # The storage emulator is not needed here; an unused port.
        **network_env(mirror_url=mirror_url, storage_url="http://127.0.0.1:9"),
    }


def run_script(script: str, env: dict[str, str]) -> tuple[int, list[str], float]:
    return sh(RUN_SCRIPT_FROM_STDIN, script.encode(), env)


def sh(command: str, stdin: bytes, env: dict[str, str]) -> tuple[int, list[str], float]:
    t0 = time.perf_counter()
    # As the executor runs it: the script (or the wheel) on stdin.
    done = subprocess.run(
        ["sh", "-c", command], input=stdin, env=env, cwd=env["HOME"], capture_output=True, timeout=300
    )
    lines = (
        done.stdout.decode(errors="replace").splitlines() + done.stderr.decode(errors="replace").splitlines()
    )
    return done.returncode, lines, time.perf_counter() - t0


def bring_uv(env: dict[str, str]) -> None:
    """What ``tpuctl.hosts.uv_tool.bring_uv`` does on one host."""
    rc, lines, _ = sh(install_command(".tpuctl"), local_wheel([WHEELHOUSE]), env)
    assert rc == 0, "\n".join(lines)
