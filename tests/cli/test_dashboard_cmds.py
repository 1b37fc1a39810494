"""`tpuctl dashboard` at the command line: a bad port is refused before anything opens; a real process
serves the pages on loopback, without a browser when told, and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tpuctl.testing.cli import Cli
from tpuctl.testing.clock import wait_for
from tpuctl.testing.ports import unused_port


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_a_port_that_is_not_one_is_exit_2(cli: Cli, port: str) -> None:
    result = cli("dashboard", "--no-browser", "--port", port)
    assert result.code == 2, result.stderr
    assert "port" in result.stderr.lower() or "listen" in result.stderr.lower()


# A process of its own with its own simulator: tens of seconds on a loaded machine. The pages themselves
# are the default suite's (tests/dashboard).
@pytest.mark.slow
def test_the_dashboard_serves_its_pages_on_loopback_until_sigterm(state_dir: Path) -> None:
    port = unused_port()
    env = {**os.environ, "TPUCTL_STATE_DIR": str(state_dir), "BROWSER": "false"}
    argv = [sys.executable, "-m", "tpuctl", "dashboard", "--no-browser", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:

        def runs_page() -> httpx.Response | None:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[1]
                return None

        page = wait_for(runs_page, timeout=60, interval=0.2, what="the dashboard's runs page")
        assert (
            page is not None
            and page.status_code == 200
            and "<h1>Runs</h1>" in page.text
            and "no runs yet" in page.text
        )
        assert httpx.get(f"http://127.0.0.1:{port}/money", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"http://127.0.0.1:{port}/" in err
