"""tpuctl itself for the server's VM: its wheel, built here from the source checkout with uv (offline: uv
bundles the build backend pyproject.toml names), and its locked dependencies (``uv export`` of uv.lock:
the versions tested together), which the VM's host setup installs from the host's package index (PyPI on
Google; the simulator's mirror, which serves them from the local uv cache, on a simulated VM).

The same on both backends: the wheel goes to the VM over SSH, never through a package index, so the VM
runs exactly the tpuctl that created it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tpuctl.errors import UsageError

#: The uv scripts/setup pins and installs into the checkout's tools folder.
_TOOLS_UV: Final = ".tools/uv-*/bin/uv"
_UV_TIMEOUT_S: Final = 300.0


@dataclass(frozen=True)
class ServerWheel:
    """tpuctl's wheel (a local file) and the pins of its dependencies (requirements lines, no hashes:
    the host setup resolves the wheel's own requirements against them)."""

    path: Path
    locked: str


def source_root() -> Path:
    """The checkout this tpuctl runs from (its pyproject.toml and uv.lock beside the package);
    ``UsageError`` for an installed tpuctl, which has neither."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file() or not (root / "uv.lock").is_file():
        raise UsageError(
            "server up builds tpuctl's wheel from its source checkout, and this tpuctl has none",
            fix="run server up from a tpuctl checkout (git clone; scripts/setup)",
        )
    return root


def find_uv(root: Path) -> str:
    """uv: the checkout's pinned one (scripts/setup installs it), else the one on PATH."""
    pinned = sorted(root.glob(_TOOLS_UV))
    found = str(pinned[-1]) if pinned else shutil.which("uv")
    if not found:
        raise UsageError("server up needs uv to build tpuctl's wheel", fix="run scripts/setup")
    return found


def build_server_wheel(out_dir: Path, root: Path | None = None) -> ServerWheel:
    """Build the wheel into ``out_dir`` and export the lock's pins of tpuctl's own dependencies (no
    dev or test extras), both offline."""
    root = root or source_root()
    uv = find_uv(root)
    env = {**os.environ, "UV_OFFLINE": "1", "UV_NO_PROGRESS": "1"}
    out, err = _uv(uv, ["build", "--wheel", "--no-build-logs", "-o", str(out_dir), str(root)], root, env)
    said = [line.split("Successfully built ", 1)[1].strip() for line in (out + err).splitlines()
            if "Successfully built " in line]  # fmt: skip
    if not said or not Path(said[-1]).is_file():
        raise UsageError(f"uv build made no wheel: {(out + err)[-500:]}")
    export = ["export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes", "--no-header"]
    locked, _ = _uv(uv, [*export, "--no-annotate"], root, env)
    return ServerWheel(Path(said[-1]), locked)


def _uv(uv: str, args: list[str], root: Path, env: dict[str, str]) -> tuple[str, str]:
    done = subprocess.run(
        [uv, *args], cwd=root, env=env, capture_output=True, text=True, timeout=_UV_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise UsageError(f"uv {args[0]} failed: {(done.stderr or done.stdout)[-800:]}")
    return done.stdout, done.stderr
