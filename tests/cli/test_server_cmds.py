"""`tpuctl server` and `--server` at the command line: what is refused before anything starts (a
non-loopback address, a second server on an embedded ledger, a server with a ledger named beside it,
what a server does not carry yet), and a client whose server does not answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LeaseOwner
from tpuctl.testing.cli import Cli
from tpuctl.testing.ports import unused_port


def test_a_non_loopback_address_is_refused(cli: Cli) -> None:
    result = cli("server", "--listen", "0.0.0.0:8471")
    assert result.code == 2
    assert "not a loopback address" in result.stderr and "without a workspace file" in result.stderr


def test_a_bad_workspace_file_is_exit_2_naming_its_line(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "workspaces.yaml"
    path.write_text("workspaces:\n  team-a:\n    members:\n      a1@example.com: owner\n")
    result = cli("server", "--listen", "0.0.0.0:8471", "--workspaces", str(path))
    assert result.code == 2
    assert f"{path}:4: workspaces.team-a.members.a1@example.com" in result.stderr
    alone = cli("server", "--audience", "https://x")
    assert alone.code == 2 and "need --workspaces" in alone.stderr
    path.write_text("workspaces:\n  team-a:\n    members:\n      a1@example.com: member\n")
    anywhere = cli("server", "--listen", "0.0.0.0:8471", "--workspaces", str(path))
    assert anywhere.code == 2 and "--audience http://HOST:8471" in anywhere.stderr


def test_a_second_server_on_the_same_ledger_exits_2_naming_the_first(state_dir: Path) -> None:
    with Ledger(state_dir / "ledger.db") as ledger:  # the first: this live process, by its identity
        ledger.claim_replica(LeaseOwner.of_this_process(), "127.0.0.1:8471", 60)
    env = {**os.environ, "TPUCTL_STATE_DIR": str(state_dir)}
    argv = [sys.executable, "-m", "tpuctl", "server", "--listen", f"127.0.0.1:{unused_port()}"]
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stderr
    assert f"pid {os.getpid()} on host {os.uname().nodename}" in second.stderr
    assert "stop the other server first" in second.stderr


def test_server_and_database_together_are_exit_2(cli: Cli, tmp_path: Path) -> None:
    result = cli(
        "--server", "http://127.0.0.1:8471", "--database", f"sqlite:///{tmp_path}/l.db", "runs", "list"
    )
    assert result.code == 2 and "both a server" in result.stderr


def test_a_server_that_is_not_an_http_url_is_exit_2(cli: Cli) -> None:
    result = cli("--server", "ftp://example.com", "runs", "list")
    assert result.code == 2 and "not an http(s) URL" in result.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("run", "--example", "lm", "--type", "v5e-8", "--no-import-check"), "--no-import-check"),
    ],
)
def test_what_a_server_does_not_carry_yet_is_exit_2(cli: Cli, args: tuple[str, ...], said: str) -> None:
    result = cli("--server", f"http://127.0.0.1:{unused_port()}", *args)
    assert result.code == 2, result.stderr
    assert f"{said} is not carried through a tpuctl server yet" in result.stderr


def test_a_server_that_does_not_answer_is_exit_15(cli: Cli) -> None:
    result = cli("runs", "list", env={"TPUCTL_SERVER": f"http://127.0.0.1:{unused_port()}"})
    assert result.code == 15 and "cannot reach tpuctl server" in result.stderr


def test_the_profile_key_server_makes_the_cli_a_client(cli: Cli, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    config = tmp_path / "config.yaml"
    config.write_text(f"profiles:\n  default:\n    server: {url}\n")
    result = cli("runs", "list", env={"TPUCTL_CONFIG": str(config)})
    assert result.code == 15 and f"cannot reach tpuctl server at {url}" in result.stderr
