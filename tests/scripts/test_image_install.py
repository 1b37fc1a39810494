"""The container image's install steps (scripts/image-install, which the Dockerfile runs) on a scratch
copy of what the Dockerfile copies, offline from uv's cache: the locked versions install, tpuctl is not
editable, and the installed `tpuctl` runs its server command. No Docker engine here: the image itself is
never built."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = ROOT / ".tools" / "uv-0.13.9" / "bin" / "uv"


def _dockerfile_copies() -> list[str]:
    """The repository paths the Dockerfile copies into the image (COPY SRC... DEST)."""
    out: list[str] = []
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if line.startswith("COPY "):
            out.extend(line.split()[1:-1])
    return out


def test_the_dockerfile_runs_the_script_the_test_runs() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "COPY scripts/image-install /usr/local/bin/tpuctl-image-install" in text
    assert re.search(r"RUN UV_NO_CACHE=1 tpuctl-image-install /opt/tpuctl", text)


@pytest.mark.slow
def test_image_install_steps_give_a_working_tpuctl(tmp_path: Path) -> None:
    app = tmp_path / "opt-tpuctl"
    app.mkdir()
    for source in _dockerfile_copies():
        if source.startswith("scripts/"):
            continue  # the script itself, run from the repository
        path = ROOT / source
        if path.is_dir():
            shutil.copytree(path, app / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, app / source)
    env = {**os.environ, "UV": str(UV), "UV_OFFLINE": "1"}  # never the network: uv's cache only
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        [str(ROOT / "scripts" / "image-install"), str(app)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert f"tpuctl 0.1.0 in {app}/.venv" in done.stdout
    installed = subprocess.run(
        [str(app / ".venv" / "bin" / "python"), "-c", "import tpuctl; print(tpuctl.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert installed.startswith(str(app / ".venv")), installed  # not editable: the image holds the code
    pytest_there = subprocess.run(
        [str(app / ".venv" / "bin" / "python"), "-c", "import pytest"], capture_output=True
    )
    assert pytest_there.returncode != 0  # no test tools in the image
