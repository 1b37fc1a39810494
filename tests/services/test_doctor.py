"""`tpuctl doctor` (tpuctl/services/doctor.py): every check runs and is shown, a failure does not hide
the others, and the exit code is the first failure's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import Cli

CHECKS = ["config file", "profile", "backend", "credentials", "project", "api reachable", "quotas readable",
          "os login", "backstop", "state dir", "ledger"]  # fmt: skip


def test_doctor_on_the_simulator_passes_every_check(sim_cli: InProcessCli, tmp_path: Path) -> None:
    config = tmp_path / "tpuctl.yaml"
    config.write_text("profiles:\n  lab:\n    zones: [us-central1-a]\n")
    result = sim_cli("--config", str(config), "--profile", "lab", "doctor", "-o", "json")
    assert result.code == 0, result.stderr
    doc = result.json
    assert [c["check"] for c in doc["checks"]] == CHECKS
    assert all(c["status"] == "ok" for c in doc["checks"]) and doc["ok"] is True
    detail = {c["check"]: c["detail"] for c in doc["checks"]}
    assert detail["config file"] == str(config)  # which file, and which profile, are in use
    assert detail["profile"] == "lab"
    assert detail["backend"] == "sim" and detail["project"] == "tpuctl-sim"
    assert detail["os login"].startswith("off (enable-oslogin is set neither on the slice nor on project")
    assert "ssh-keys" in detail["os login"]
    # What a run's hosts need to delete its slices themselves, named with the account they act as.
    assert (
        "the project's Compute Engine default service account, which needs tpu.nodes.delete"
        in detail["backstop"]
    )
    assert "(roles/tpu.admin)" in detail["backstop"] and "after 600 s, backstop_grace" in detail["backstop"]
    table = sim_cli("doctor")
    assert table.code == 0 and "quotas readable" in table.stdout


def test_doctor_without_credentials_on_gcp_shows_the_whole_table_and_exits_13(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUCTL_PROJECT", "my-project")
    result = cli("doctor", "-o", "json")
    assert result.code == 13, result.stderr
    doc = result.json
    status = {c["check"]: c["status"] for c in doc["checks"]}
    assert [c["check"] for c in doc["checks"]] == CHECKS
    assert status == {
        "config file": "ok", "profile": "ok", "backend": "ok", "credentials": "FAIL", "project": "ok",
        "api reachable": "skipped", "quotas readable": "skipped", "os login": "skipped", "backstop": "ok",
        "state dir": "ok", "ledger": "ok",
    }  # fmt: skip
    failed = next(c for c in doc["checks"] if c["status"] == "FAIL")
    assert "credentials" in failed["detail"] and "gcloud auth application-default login" in failed["fix"]
    assert doc["ok"] is False
    table = cli("doctor")
    assert table.code == 13
    assert "FAIL" in table.stdout and "skipped" in table.stdout and "state dir" in table.stdout


def test_an_unreachable_simulator_url_is_its_own_error_not_an_internal_one(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUCTL_SIM_URL", "http://127.0.0.1:9")
    listed = cli("pod", "list", "-o", "json")
    assert listed.code == 15, listed.stderr
    assert listed.json["error"] == "unreachable"
    assert "http://127.0.0.1:9" in listed.json["message"] and "internal error" not in listed.stderr
    assert "tpuctl sim serve" in listed.json["fix"]
    doctor = cli("doctor", "-o", "json")
    assert doctor.code == 15
    [failed] = [c for c in doctor.json["checks"] if c["status"] == "FAIL"]
    assert failed["check"] == "credentials" and "no simulator answers" in failed["detail"]


@pytest.mark.parametrize("sim_world", [{"os_login": True}])
def test_doctor_reports_os_login_on_and_the_account_runs_log_in_as(sim_cli: InProcessCli) -> None:
    result = sim_cli("doctor", "-o", "json")
    assert result.code == 0, result.stderr
    (check,) = [c for c in result.json["checks"] if c["check"] == "os login"]
    assert check["status"] == "ok"
    assert check["detail"].startswith("on (enable-oslogin in the metadata of project tpuctl-sim)")
    assert "sim-user@example.com" in check["detail"] and "sim_user_example_com" in check["detail"]
    assert "roles/compute.osAdminLogin" in check["detail"]


@pytest.mark.parametrize("sim_world", [{"os_login": True}])
def test_doctor_fails_os_login_when_its_api_refuses_the_callers_profile(
    sim_cli: InProcessCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuctl.cloud.oslogin import OsLoginAccess

    # Credentials of another account than the one the simulator acts for: its OS Login refuses them.
    monkeypatch.setattr(OsLoginAccess, "caller", lambda self: "stranger@example.org")
    result = sim_cli("doctor", "-o", "json")
    assert result.code == 13, result.stderr
    (check,) = [c for c in result.json["checks"] if c["check"] == "os login"]
    assert check["status"] == "FAIL" and "OS Login is on for project tpuctl-sim" in check["detail"]
    assert "roles/compute.osLogin" in check["fix"] and "stranger@example.org" in check["fix"]
