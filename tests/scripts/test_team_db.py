"""`scripts/team-db`, the README's team database on this machine: started (made the first time), its URL
printed and taken by tpuctl, started again idempotently, stopped with its data kept."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.testing.cli import Cli
from tpuctl.testing.ports import unused_port

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "team-db"


@pytest.fixture
def team_db_env() -> Iterator[dict[str, str]]:
    # In the system's temp dir, not pytest's: under root the server runs as another user, who must reach it.
    data = Path(tempfile.gettempdir()) / f"tpuctl-team-db-test-{uuid.uuid4().hex[:8]}"
    env = {"TPUCTL_TEAM_DB_DIR": str(data), "TPUCTL_TEAM_DB_PORT": str(unused_port())}
    yield env
    subprocess.run([str(SCRIPT), "stop"], env=_with_path(env), capture_output=True, timeout=60)
    shutil.rmtree(data, ignore_errors=True)


def _with_path(env: dict[str, str]) -> dict[str, str]:
    import os

    return {**os.environ, **env}


def test_the_team_database_starts_serves_tpuctl_and_stops(cli: Cli, team_db_env: dict[str, str]) -> None:
    started = subprocess.run(
        [str(SCRIPT)], env=_with_path(team_db_env), capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert url == f"postgresql://postgres@127.0.0.1:{team_db_env['TPUCTL_TEAM_DB_PORT']}/tpuctl"
    upgraded = cli("--database", url, "db", "upgrade")
    assert upgraded.code == 0 and "ran 0001_ledger_v10" in upgraded.stdout
    again = subprocess.run(
        [str(SCRIPT)], env=_with_path(team_db_env), capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and again.stdout.strip() == url  # already running: the same URL
    stopped = subprocess.run(
        [str(SCRIPT), "stop"], env=_with_path(team_db_env), capture_output=True, timeout=60
    )
    assert stopped.returncode == 0
    down = cli("--database", url + "?connect_timeout=2", "db", "status")
    assert down.code == 1 and "cannot be reached" in down.output
    assert (Path(team_db_env["TPUCTL_TEAM_DB_DIR"]) / "cluster" / "PG_VERSION").exists()  # data kept
