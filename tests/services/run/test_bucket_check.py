"""Before a run creates anything: the caller and the hosts' service account must be able to use the
checkpoint bucket, else exit 2 naming the bucket, the account and the role; where Google cannot tell, the
run goes ahead. Through `tpuctl run --dry-run` on the in-process simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpuctl.sim import default_world
from tpuctl.sim.iam import default_service_account
from tpuctl.testing.backend import InProcessCli

USER = "user:sim-user@example.com"
ACCOUNT = default_service_account("tpuctl-sim")
HOSTS = f"serviceAccount:{ACCOUNT}"


def world(*bindings: tuple[str, str]) -> dict[str, Any]:
    data = default_world().model_dump(mode="json")
    data["zones"] = {"us-central1-a": data["zones"]["us-central1-a"]}
    data["reservations"] = []
    policy = [{"role": role, "members": [member]} for role, member in bindings]
    return data | {"iam": {"tpuctl-sim": policy}}


def dry_run(sim_cli: InProcessCli, tmp_path: Path, *extra: str) -> Any:
    script = tmp_path / "proj" / "ok.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("print('ok')\n")
    return sim_cli(
        "run", str(script), "--no-runtime-deps", "--type", "v5e-8", "--dry-run", "-o", "json", *extra
    )


@pytest.mark.parametrize(
    "sim_world",
    [world(("roles/owner", USER), ("roles/storage.objectViewer", HOSTS))],
    ids=["hosts-read-only"],
)
def test_hosts_that_cannot_write_the_bucket_stop_the_run_before_anything_is_made(
    sim_cli: InProcessCli, tmp_path: Path
) -> None:
    refused = dry_run(sim_cli, tmp_path)
    assert refused.code == 2, refused.output
    error = refused.json
    assert error["field"] == "bucket" and error["value"] == "tpuctl-sim"
    assert error["message"] == (
        f"the hosts' service account {ACCOUNT} cannot use the checkpoint bucket gs://tpuctl-sim: it lacks "
        "storage.objects.create, storage.objects.delete, storage.buckets.get"
    )
    assert f"grant {ACCOUNT} roles/storage.legacyBucketReader and roles/storage.objectAdmin" in error["fix"]
    assert f"--member={HOSTS} --role=roles/storage.objectAdmin" in error["fix"]
    assert sim_cli.admin.status()["nodes"] == []


@pytest.mark.parametrize(
    "sim_world", [world(("roles/owner", USER), ("roles/editor", HOSTS))], ids=["default"]
)
def test_the_account_the_hosts_run_as_is_the_one_checked(sim_cli: InProcessCli, tmp_path: Path) -> None:
    runner = "runner@tpuctl-sim.iam.gserviceaccount.com"  # --service-account: no role on the project
    refused = dry_run(sim_cli, tmp_path, "--service-account", runner)
    assert refused.code == 2, refused.output
    assert refused.json["message"].startswith(f"the hosts' service account {runner} cannot use")


@pytest.mark.parametrize(
    "sim_world",
    [world(("roles/tpu.admin", USER), ("roles/compute.admin", USER), ("roles/editor", HOSTS))],
    ids=["caller-without-storage"],
)
def test_a_caller_who_cannot_use_the_bucket_is_told_so(sim_cli: InProcessCli, tmp_path: Path) -> None:
    refused = dry_run(sim_cli, tmp_path)
    assert refused.code == 2, refused.output
    assert refused.json["message"] == (
        "your account cannot use the checkpoint bucket gs://tpuctl-sim: it lacks storage.objects.create, "
        "storage.objects.get, storage.objects.list"
    )
    assert "roles/storage.objectAdmin" in refused.json["fix"]


@pytest.mark.parametrize(
    "sim_world",
    [
        world(("roles/owner", USER), ("roles/editor", HOSTS)),
        # Without Compute Engine, the caller cannot learn the hosts' default account: the run goes ahead.
        world(("roles/tpu.admin", USER), ("roles/storage.objectAdmin", USER), ("roles/viewer", HOSTS)),
    ],
    ids=["both-can", "hosts-unknown"],
)
def test_the_run_goes_ahead_when_they_can_or_google_cannot_tell(
    sim_cli: InProcessCli, tmp_path: Path
) -> None:
    planned = dry_run(sim_cli, tmp_path)
    assert planned.code == 0, planned.output
