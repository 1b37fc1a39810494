"""`tpuctl doctor` (tpuctl/services/doctor.py): every check runs and is shown, a failure does not hide
the others, and the exit code is the first failure's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import Cli

CHECKS = ["config file", "profile", "backend", "credentials", "project", "api reachable", "quotas readable",
          "os login", "compute permission", "guest attributes", "bucket", "backstop", "state dir",
          "ledger"]  # fmt: skip


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
    assert (
        detail["compute permission"] == "Compute Engine answers for project tpuctl-sim (compute.projects.get)"
    )
    # Off on a new project; tpuctl's own slices enable it themselves.
    assert detail["guest attributes"].startswith(
        "enable-guest-attributes is not set in the metadata of project"
    )
    assert "tpuctl sets it on every Compute Engine slice it makes" in detail["guest attributes"]
    # The simulator's own bucket, in its emulator's multi-region.
    assert detail["bucket"].startswith(
        "gs://tpuctl-sim in US: the caller can write it (storage.objects.create"
    )
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
        "api reachable": "skipped", "quotas readable": "skipped", "os login": "skipped",
        "compute permission": "skipped", "guest attributes": "skipped", "bucket": "skipped", "backstop": "ok",
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


@pytest.mark.parametrize("sim_world", [{"guest_attributes": True}])
def test_guest_attributes_on_for_the_project_say_so(sim_cli: InProcessCli) -> None:
    (check,) = [c for c in sim_cli("doctor", "-o", "json").json["checks"] if c["check"] == "guest attributes"]
    assert check["status"] == "ok" and check["detail"].startswith("on for project tpuctl-sim")


def test_no_compute_permission_warns_naming_the_roles_and_skips_what_needs_it(
    sim_cli: InProcessCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuctl.cloud.oslogin import OsLoginAccess
    from tpuctl.errors import PermissionDeniedError

    def refused(self: OsLoginAccess, project: str) -> dict[str, str]:
        raise PermissionDeniedError(f"Required 'compute.projects.get' permission for 'projects/{project}'")

    monkeypatch.setattr(OsLoginAccess, "project_metadata", refused)  # a caller with TPU roles only
    result = sim_cli("doctor", "-o", "json")
    assert result.code == 0, result.stderr  # a warning: TPU API slices still work
    checks = {c["check"]: c for c in result.json["checks"]}
    compute = checks["compute permission"]
    assert compute["status"] == "warn" and "compute.projects.get" in compute["detail"]
    assert "TPU API slices still work" in compute["detail"]
    assert "roles/compute.admin" in compute["fix"] and "roles/compute.viewer" in compute["fix"]
    assert checks["guest attributes"]["status"] == "skipped" and checks["bucket"]["status"] == "ok"
    assert result.json["ok"] is True
    assert "warn" in sim_cli("doctor").stdout


def test_a_bucket_that_does_not_exist_fails_with_how_to_make_it(sim_cli: InProcessCli) -> None:
    result = sim_cli("doctor", "-o", "json", env={"TPUCTL_BUCKET": "no-such-bucket"})
    assert result.code == 11, result.stderr
    (check,) = [c for c in result.json["checks"] if c["check"] == "bucket"]
    assert check["status"] == "FAIL" and check["detail"] == "bucket gs://no-such-bucket does not exist"
    assert "gcloud storage buckets create gs://no-such-bucket" in check["fix"]


def test_a_bucket_the_caller_cannot_write_fails_naming_the_permission_and_the_role(
    sim_cli: InProcessCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuctl.cloud.buckets import BucketClient

    # What testIamPermissions answers a caller with roles/storage.objectViewer alone.
    viewer = frozenset({"storage.objects.get", "storage.objects.list"})
    monkeypatch.setattr(BucketClient, "held_permissions", lambda self, bucket, asked: viewer)
    result = sim_cli("doctor", "-o", "json")
    assert result.code == 13, result.stderr
    (check,) = [c for c in result.json["checks"] if c["check"] == "bucket"]
    assert check["status"] == "FAIL"
    lacks = "it lacks storage.objects.create, storage.objects.delete"
    assert check["detail"] == f"the caller cannot write bucket gs://tpuctl-sim: {lacks}"
    assert "roles/storage.objectAdmin" in check["fix"]
