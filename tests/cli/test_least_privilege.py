"""A caller with TPU roles only (roles/tpu.admin: no Compute Engine permission) uses tpuctl for what the
TPU API serves: `pod create v5e-8`, `pod list`, `quota` and a `run` work, each asking Compute Engine
nothing it does not need and saying what it could not list; `pod create tpu7x-8` (Compute Engine only)
exits 13 naming the missing permission and the role that holds it. In process on the fake clock, but for
the one tiny run, which needs hosts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.sim import SimAdminClient, default_world
from tpuctl.sim.iam import default_service_account
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import Cli

USER = "user:sim-user@example.com"
HOSTS = f"serviceAccount:{default_service_account('tpuctl-sim')}"
#: roles/tpu.admin and what else such a caller usually has (quotas, the bucket), no Compute Engine role.
TPU_ONLY: dict[str, Any] = {
    "tpuctl-sim": [
        {"role": "roles/tpu.admin", "members": [USER]},
        {"role": "roles/cloudquotas.viewer", "members": [USER]},
        {"role": "roles/storage.objectAdmin", "members": [USER]},
        {"role": "roles/editor", "members": [HOSTS]},
    ]
}
NOTE = (
    "note: Compute Engine slices not listed: no permission (compute.instances.list, which "
    "roles/compute.admin holds)"
)


@pytest.fixture
def sim_world() -> dict[str, Any]:
    """The default world cut to one zone for v5e and one for TPU7x (fewer zones to survey), TPU_ONLY."""
    data = default_world().model_dump(mode="json")
    data["zones"] = {zone: data["zones"][zone] for zone in ("us-central1-a", "us-central1-c")}
    data["reservations"] = []
    return data | {"iam": TPU_ONLY}


def test_a_tpu_only_caller_uses_the_tpu_api_and_is_told_what_it_cannot_see(sim_cli: InProcessCli) -> None:
    created = sim_cli("pod", "create", "v5e-8", "--name", "mine")
    assert created.code == 0, created.output
    assert "Compute Engine" not in created.output  # a v5e request never asks Compute Engine
    listed = sim_cli("pod", "list", "-o", "json")
    assert listed.code == 0 and [p["name"] for p in listed.json["pods"]] == ["mine"]
    human = sim_cli("pod", "list")
    assert human.code == 0 and NOTE in human.stderr
    quota = sim_cli("quota", "-o", "json")
    assert quota.code == 0, quota.output


def test_a_compute_engine_slice_names_the_missing_permission_and_role(sim_cli: InProcessCli) -> None:
    refused = sim_cli("pod", "create", "tpu7x-8", "--name", "ce", "-o", "json")
    assert refused.code == 13, refused.output
    error = refused.json
    assert error["error"] == "permission_denied"
    assert (error["permission"], error["role"]) == ("compute.instances.list", "roles/compute.admin")
    assert "roles/compute.admin" in error["fix"] and "compute.instances.list" in error["message"]


def test_a_run_works_without_compute_engine(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, tmp_path: Path
) -> None:
    world = {
        "speed": 1000,
        "zones": {"us-central1-a": {"v5e": {"on_demand": 8}}},
        "quotas": {"default": {"on_demand": {"zone": -1, "region": -1}}},
        "latency": {"base_ms": 0, "jitter_ms": 0},
        "iam": TPU_ONLY,
    }
    serve_sim(world)
    script = tmp_path / "proj" / "hello.py"
    script.parent.mkdir()
    script.write_text("print('hello from', __import__('socket').gethostname())\n")
    result = cli("run", str(script), "--no-runtime-deps", "--type", "v5e-8")
    assert result.code == 0, result.output
    assert "hello from" in result.stdout
