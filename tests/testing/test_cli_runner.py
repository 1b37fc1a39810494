"""The shared in-process CLI runner: exit code, both streams, the JSON document, env for one call."""

from __future__ import annotations

import os

import pytest

from tpuctl.testing.cli import Cli, invoke


def test_a_json_command_gives_its_document(cli: Cli) -> None:
    result = cli("-o", "json", "catalog", "types")
    assert result.code == 0, result.output
    assert result.document is not None and result.document == result.json
    assert result.seconds > 0


def test_a_usage_error_is_exit_2_with_its_error_document() -> None:
    result = invoke(["-o", "json", "pod", "create", "v5e-8", "--max-price", "-1", "--dry-run"])
    assert result.code == 2, result.output
    assert result.document is not None and result.document["error"] == "usage"


def test_env_applies_to_one_call_only() -> None:
    os.environ.pop("TPUCTL_PROFILE", None)
    result = invoke(["-o", "json", "pod", "list"], env={"TPUCTL_PROFILE": "nope"})
    assert result.code != 0, result.output
    assert "TPUCTL_PROFILE" not in os.environ


def test_table_output_has_no_document() -> None:
    result = invoke(["--help"])
    assert result.code == 0 and "Usage" in result.stdout
    assert result.document is None


def test_stdin_answers_a_confirmation(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tpuctl.cli.context.stdin_is_tty", lambda: True)  # as if a terminal asked
    declined = cli("sim", "reset", stdin="n\n")
    assert declined.code == 1 and "reset the simulator" in declined.stdout
    assert "aborted" in declined.stderr
    assert "simulator reset" not in declined.stderr
    accepted = cli("sim", "reset", stdin="y\n")
    assert accepted.code == 0 and "simulator reset" in accepted.stderr
