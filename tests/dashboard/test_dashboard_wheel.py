"""A wheel built from the repository, installed in a fresh venv from uv's cache with the network off
(a missing package fails the install: nothing is downloaded), serves the pages with their charts: the
templates, the style sheet and the script travel in the wheel, and nothing is read from the checkout."""

from __future__ import annotations

import os
import re
import subprocess
import time
import zipfile
from pathlib import Path

import httpx
import pytest
from recorded_runs import RUN, record_both

from tpuctl.store.ledger import Ledger
from tpuctl.testing.clock import wait_for
from tpuctl.testing.ports import unused_port

ROOT = Path(__file__).resolve().parents[2]
UV = sorted(ROOT.glob(".tools/uv-*/bin/uv"))


def _uv(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> None:
    assert UV, f"no uv in {ROOT / '.tools'}: run scripts/setup"
    done = subprocess.run([str(UV[-1]), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"uv {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def _offline() -> dict[str, str]:
    # UV_OFFLINE as well as --offline: nothing uv runs for these may reach an index.
    return {**os.environ, "UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}


def _wheel(out: Path) -> Path:
    _uv("build", "--wheel", "--offline", "--out-dir", str(out), env=_offline())
    (wheel,) = out.glob("tpuctl-*.whl")
    return wheel


def test_the_wheel_holds_the_pages_templates_style_and_script(tmp_path: Path) -> None:
    """The cheap check (a build takes a tenth of a second): what the pages are made of is in the wheel,
    byte for byte. Serving from an installed wheel is the --slow test below."""
    pages = ROOT / "tpuctl" / "dashboard" / "templates"
    with zipfile.ZipFile(_wheel(tmp_path)) as wheel:
        for source in sorted(pages.iterdir()):
            name = source.relative_to(ROOT).as_posix()
            assert wheel.read(name) == source.read_bytes(), name
    assert {p.suffix for p in pages.iterdir()} >= {".html", ".css", ".js"}


@pytest.mark.slow
def test_a_wheel_installed_offline_in_a_fresh_venv_serves_the_pages_with_their_charts(tmp_path: Path) -> None:
    env = _offline()
    wheel = _wheel(tmp_path / "dist")
    venv = tmp_path / "venv"
    # The locked runtime dependencies (as the lock pins them, from the cache), then the wheel alone.
    _uv("sync", "--locked", "--offline", "--no-dev", "--no-install-project", "--python",
        str(ROOT / ".venv" / "bin" / "python"), env={**env, "UV_PROJECT_ENVIRONMENT": str(venv)})  # fmt: skip
    _uv(
        "pip",
        "install",
        "--offline",
        "--no-deps",
        "--python",
        str(venv / "bin" / "python"),
        str(wheel),
        env=env,
    )
    state = tmp_path / "state"
    with Ledger(state / "ledger.db") as ledger:
        record_both(ledger, time.time())
    port = unused_port()
    server = subprocess.Popen(
        [str(venv / "bin" / "tpuctl"), "--state-dir", str(state), "dashboard", "--no-browser",
         "--port", str(port)],
        cwd=tmp_path, env={k: v for k, v in env.items() if k != "PYTHONPATH"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url), timeout=60, what="the installed tpuctl dashboard to answer")
        page = httpx.get(f"{url}/runs/{RUN}", timeout=30).text
        money = httpx.get(f"{url}/money", timeout=30).text
    finally:
        server.terminate()
        said = server.communicate(timeout=30)[0]
    assert len(re.findall(r'data-mark="preemption"', page)) == 2, said
    assert 'data-mark="segment"' in page and "<style>" in page and "<script>" in page
    assert 'data-mark="bar"' in money and 'data-mark="waste-bar"' in money
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import tpuctl; print(tpuctl.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert where.startswith(str(venv)), where  # the wheel's copy served, not the checkout's


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False
