"""Compute Engine slices on the simulator: TPU7x (and v6e/v5p on request) placed through Compute Engine by
the same commands as every other slice: `pod create` (dry run and real), `pod list`, `pod delete`, the
refusal of a generation Compute Engine does not serve, placement failing over a Compute stockout, and a
Compute quota refusal. Every Compute answer the simulator gives in these tests is checked against
Google's compute v1 discovery document (``schema_problems``). What reaches no host runs on the in-process
simulator (``sim_cli``, a fake clock); a program run on a slice's hosts runs on a served one."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from api_schema import schema_problems
from compute_cli_helpers import OTHER_ZONE, REGION, WORLD, ZONE, compute_get
from recovery_helpers import (
    HOST_XLA_ENV,
    LM_ARGS,
    REPO,
    Chaos,
    Preempt,
    fast_jax_env,
    final_hash,
    run_reference,
)

from tpuctl.sim import SimAdminClient
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import Cli

IMAGE_FAMILY = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"

__all__ = ["schema_problems"]  # a fixture
pytestmark = pytest.mark.usefixtures("schema_problems")


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return WORLD


@pytest.fixture
def admin(serve_sim: Callable[..., SimAdminClient]) -> SimAdminClient:
    """A served simulator, for the programs run on hosts."""
    return serve_sim(WORLD)


def _get(sim_cli: InProcessCli, path: str) -> httpx.Response:
    return compute_get(sim_cli.admin, path, transport=sim_cli.transport)


def test_a_tpu7x_8_dry_run_plans_one_instance_insert_of_the_tpu7x_machine_type(sim_cli: InProcessCli) -> None:
    result = sim_cli("pod", "create", "tpu7x-8", "--zone", ZONE, "--dry-run", "-o", "json")
    assert result.code == 0, result.stderr
    (request,) = result.json["plan"]["requests"]
    url = httpx.URL(request["url"])
    assert request["method"] == "POST" and url.path.endswith(f"/zones/{ZONE}/instances")
    assert len(url.params["requestId"]) == 36  # a UUID, as Compute Engine wants it
    body = request["body"]
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/tpu7x-standard-4t"
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    (disk,) = body["disks"]
    assert disk["initializeParams"]["sourceImage"] == IMAGE_FAMILY
    assert sim_cli.admin.status()["nodes"] == []  # a plan changes nothing


def test_a_run_on_compute_engine_plans_each_host_its_tpu_worker_identity(
    sim_cli: InProcessCli, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")

    def hosts(*flags: str) -> list[dict[str, Any]]:
        result = sim_cli("run", str(script), *flags, "--dry-run", "-o", "json")
        assert result.code == 0, result.stderr
        return list(result.json["plan"]["hosts"])

    # Compute Engine publishes no agent-worker-number for certain (docs/google-facts.md#worker-identity):
    # every host's launch reads TPU_WORKER_ID / TPU_WORKER_HOSTNAMES from its metadata server, where JAX's GKE
    # path finds them.
    compute = hosts("--type", "tpu7x-16", "--zone", ZONE)
    assert len(compute) == 2
    for host in compute:
        assert " launch " in host["command"] and " --tpu-worker-env " in host["command"]
        assert "tpu-env" in host["env"]["TPU_WORKER_ID"]
        assert "worker-network-endpoints" in host["env"]["TPU_WORKER_HOSTNAMES"]
    # A user's own value is the program's, and is not shown as derived.
    (mine, _) = hosts("--type", "tpu7x-16", "--zone", ZONE, "--env", "TPU_WORKER_HOSTNAMES=a,b")
    assert mine["env"]["TPU_WORKER_HOSTNAMES"] == "a,b"
    # The TPU API publishes agent-worker-number: its hosts' programs are left as they are.
    for host in hosts("--type", "v6e-16", "--zone", "us-central1-b", "--api", "tpu"):
        assert "--tpu-worker-env" not in host["command"] and "TPU_WORKER_ID" not in host["env"]


def test_a_tpu7x_32_spot_slice_is_a_workload_policy_a_template_and_a_bulk_mig_of_4_hosts(
    sim_cli: InProcessCli,
) -> None:
    created = sim_cli("pod", "create", "tpu7x-32", "--spot", "--zone", ZONE, "--name", "ir", "-o", "json")
    assert created.code == 0, created.stderr[-3000:]
    policy = _get(sim_cli, f"regions/{REGION}/resourcePolicies/ir").json()
    assert policy["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x4"}
    template = _get(sim_cli, "global/instanceTemplates/ir").json()
    assert template["properties"]["machineType"] == "tpu7x-standard-4t"
    assert template["properties"]["scheduling"]["provisioningModel"] == "SPOT"
    mig = _get(sim_cli, f"zones/{ZONE}/instanceGroupManagers/ir").json()
    assert mig["targetSize"] == 4 and mig["targetSizePolicy"]["mode"] == "BULK"
    assert mig["instanceLifecyclePolicy"]["defaultActionOnFailure"] == "DO_NOTHING"
    assert mig["status"]["isStable"] is True
    assert mig["status"]["appliedAcceleratorTopologies"][0]["state"] == "ACTIVE"

    (listed,) = sim_cli("pod", "list", "-o", "json").json["pods"]
    assert listed["name"] == "ir" and listed["state"] == "READY" and listed["zone"] == ZONE
    assert listed["accelerator_type"] == "tpu7x-32" and listed["capacity"] == "spot"
    assert listed["hosts"] == 4 and listed["chips"] == 16

    assert sim_cli("pod", "delete", "ir", "--zone", ZONE, "-y").code == 0
    for path in (
        f"zones/{ZONE}/instanceGroupManagers/ir",
        "global/instanceTemplates/ir",
        f"regions/{REGION}/resourcePolicies/ir",
    ):
        assert _get(sim_cli, path).status_code == 404, path
    assert sim_cli("pod", "list", "-o", "json").json["pods"] == []


def test_a_preempted_tpu7x_slice_is_described_and_collected_with_its_three_parts(
    sim_cli: InProcessCli,
) -> None:
    assert sim_cli("pod", "create", "tpu7x-16", "--spot", "--zone", ZONE, "--name", "gone").code == 0
    described = sim_cli("pod", "describe", "gone", "--zone", ZONE, "-o", "json").json["pod"]
    assert (described["accelerator_type"], described["hosts"], described["state"]) == ("tpu7x-16", 2, "READY")
    sim_cli.admin.preempt_compute(ZONE, "gone", notice=False)

    def state() -> str:
        return str(sim_cli("pod", "describe", "gone", "--zone", ZONE, "-o", "json").json["pod"]["state"])

    sim_cli.clock.wait_for(lambda: state() == "PREEMPTED", timeout=600, step=1)
    plan = sim_cli("pod", "gc", "--dry-run", "-o", "json").json
    (item,) = plan["gc"]
    assert (item["name"], item["state"]) == ("gone", "PREEMPTED")
    # The MIG (its VMs with it), then the template and the workload policy it used.
    assert [(r["method"], httpx.URL(r["url"]).path.split("/")[-2]) for r in item["requests"]] == [
        ("DELETE", "instanceGroupManagers"),
        ("DELETE", "instanceTemplates"),
        ("DELETE", "resourcePolicies"),
    ]
    assert sim_cli("pod", "gc", "-y").code == 0
    assert sim_cli("pod", "list", "-o", "json").json["pods"] == []
    assert _get(sim_cli, "global/instanceTemplates/gone").status_code == 404


def test_v5e_has_no_compute_engine_path(sim_cli: InProcessCli) -> None:
    result = sim_cli("pod", "create", "v5e-8", "--api", "compute")
    assert result.code == 2
    assert "v5e has no Compute Engine path" in result.stderr and "--api tpu" in result.stderr
    assert sim_cli.admin.status()["nodes"] == []


def test_an_unknown_api_is_refused_naming_the_choices(sim_cli: InProcessCli) -> None:
    result = sim_cli("pod", "create", "v6e-8", "--api", "gke")
    assert result.code == 2 and "'gke'" in result.stderr and "--api compute" in result.stderr


def test_a_compute_stockout_fails_over_to_the_next_zone(sim_cli: InProcessCli) -> None:
    # Both zones price TPU7x alike; placement tries us-central1-ai1a first (zone order), which is out.
    sim_cli.admin.stockout(OTHER_ZONE)
    result = sim_cli("pod", "create", "tpu7x-8", "--zone", ZONE, "--zone", OTHER_ZONE, "-o", "json")
    assert result.code == 0, result.stderr[-3000:]
    assert result.json["pod"]["zone"] == ZONE
    attempts = [(a["zone"], a["outcome"]) for a in result.json["placement"]["attempts"]]
    assert attempts == [(OTHER_ZONE, "stockout"), (ZONE, "created")], attempts
    # The stocked-out instance was not left behind.
    assert [n["zone"] for n in sim_cli.admin.status()["nodes"]] == [ZONE]


@pytest.mark.parametrize(
    "sim_world",
    [{**WORLD, "compute_quotas": [{"quota_id": "TPUS-PER-TPU-FAMILY-per-project-region", "limit": 0}]}],
)
def test_a_compute_quota_refusal_is_exit_4_naming_the_quota(sim_cli: InProcessCli) -> None:
    result = sim_cli("pod", "create", "tpu7x-8", "--zone", ZONE)
    assert result.code == 4, result.stderr[-3000:]
    assert "TPUS-PER-TPU-FAMILY" in result.stderr or "TPUS_PER_TPU_FAMILY" in result.stderr
    assert sim_cli.admin.status()["nodes"] == []


def test_the_profile_api_is_a_preference_the_flag_a_demand(sim_cli: InProcessCli, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("profiles:\n  default:\n    api: compute\n")
    env = {"TPUCTL_CONFIG": str(config)}

    def planned_url(*args: str) -> str:
        result = sim_cli("pod", "create", *args, "--dry-run", "-o", "json", env=env)
        assert result.code == 0, result.stderr
        return str(result.json["plan"]["requests"][0]["url"])

    # v6e is served by both: the profile picks Compute Engine (one ct6e-standard-8t instance) ...
    assert "/compute/v1/" in planned_url("v6e-8", "--zone", "us-central1-b")
    # ... and the flag wins over the profile.
    assert "/compute/v1/" not in planned_url("v6e-8", "--zone", "us-central1-b", "--api", "tpu")
    # v5e has no Compute Engine path: the profile's preference does not apply to it.
    assert "/compute/v1/" not in planned_url("v5e-8", "--zone", "us-central1-a")


# ~40 s on a loaded CI machine: unmodified JAX joining a multi-host Compute Engine slice stays in the default
# suite (tests/sim/test_compute_vpc.py), and so does a one-host tpu7x run through tpuctl (above).
@pytest.mark.slow
def test_an_unmodified_psum_script_runs_on_4_processes_and_16_devices_of_a_tpu7x_32(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    script = tmp_path / "user" / "psum_user.py"
    script.parent.mkdir()
    shutil.copy(REPO / "tests" / "runtime" / "scripts" / "psum_user.py", script)
    result = cli("run", str(script), "--type", "tpu7x-32", "--zone", ZONE)
    assert result.code == 0, result.stderr[-3000:]
    results = sorted(re.findall(r"^w(\d) \| RESULT (.*)$", result.stdout, re.MULTILINE))
    # 16 devices (one per chip), device k contributes k + 1: 16 * 17 / 2 = 136 on every host.
    assert results == [(str(w), f"{w} 4 16 4 136.0") for w in range(4)]
    assert admin.status()["nodes"] == []  # the run's slice is gone with it
    # The Compute Engine slice is billed like any other: per second from READY, at the TPU7x price.
    report = cli("cost", "report", "-o", "json").json
    (group,) = report["groups"]
    assert group["accelerator_type"] == "tpu7x-32" and group["price_per_chip_hour"] == 12.0
    assert group["cost_usd"] > 0
    assert "unconfirmed" in report["prices"]["notes"]["tpu7x"]


def test_a_tpu7x_8_spot_run_reaches_its_host_on_a_project_that_enables_no_guest_attributes(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    """The world's project leaves guest attributes off (Google's default), so the VM publishes its host
    key only because tpuctl's instance metadata enables them; without that the run waits for a key that
    never comes and fails naming enable-guest-attributes. One host, a program that needs one small
    requirement: the Compute Engine image has no pip, so the host sets up with the uv tpuctl brings it."""
    assert "guest_attributes" not in WORLD  # the simulator's default: off
    script = tmp_path / "user" / "hello.py"
    script.parent.mkdir()
    script.write_text(
        "import os, zipp\n"
        "print('hello from', os.environ['TPUCTL_ACCELERATOR_TYPE'], zipp.__name__, flush=True)\n"
    )
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("zipp\n")
    result = cli(
        "run", str(script), "--no-runtime-deps", "--requirements", str(requirements),
        "--type", "tpu7x-8", "--spot", "--zone", ZONE,
    )  # fmt: skip
    assert result.code == 0, result.stderr[-3000:]
    assert "hello from tpu7x-8 zipp" in result.stdout
    assert admin.status()["nodes"] == []


#: The smallest LM run: a few steps, one example per device of a tpu7x-16's 8.
TINY_LM = ["--steps", "3", "--log-every", "1", "--batch", "8", "--seed", "3", "--layers", "1",
           "--d-model", "16", "--heads", "2", "--vocab", "32", "--seq-len", "16"]  # fmt: skip


@pytest.mark.slow
def test_a_tpu7x_16_spot_lm_run_reaches_its_hosts_on_a_project_that_enables_no_guest_attributes(
    admin: SimAdminClient, cli: Cli
) -> None:
    """The same with two hosts made by a MIG from tpuctl's instance template, and the LM example."""
    assert "guest_attributes" not in WORLD
    result = cli("run", "--example", "lm", "--type", "tpu7x-16", "--spot", "--zone", ZONE, "-o", "json",
                 "--", *TINY_LM)  # fmt: skip
    assert result.code == 0, result.stderr[-3000:]
    assert result.json["run"]["hosts"] == 2
    assert admin.status()["nodes"] == []


#: The recovery test's world: two TPU7x zones, Compute quotas, a grace long enough to checkpoint.
RECOVERY_WORLD: dict[str, Any] = {
    **WORLD,
    "seed": 5,
    "durations": {"node_create_s": 60, "node_delete_s": 10, "stockout_s": 5, "preemption_grace_s": 20},
}
#: The tiny LM with one example per device of a tpu7x-16's 8.
TPU7X_16_ARGS = [*LM_ARGS[: LM_ARGS.index("--batch") + 1], "8", *LM_ARGS[LM_ARGS.index("--batch") + 2 :]]


def _preempt_compute(admin: SimAdminClient, zone: str, name: str, notice: bool) -> None:
    # The simulator's status names a Compute slice by its resource path (instanceGroupManagers/NAME).
    admin.preempt_compute(zone, name.rsplit("/", 1)[-1], notice=notice)


@pytest.mark.slow
def test_a_tpu7x_spot_run_preempted_recovers_in_another_zone_bit_identical(
    serve_sim: Callable[..., SimAdminClient],
    schema_problems: list[str],
    cli: Cli,
    state_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "world.yaml").write_text(yaml.safe_dump(RECOVERY_WORLD))
    for key, value in fast_jax_env(tmp_path / "jax-cache").items():
        monkeypatch.setenv(key, value)
    admin = serve_sim(RECOVERY_WORLD)
    reference = run_reference(
        tmp_path / "reference",
        TPU7X_16_ARGS,
        hosts=2,
        accelerator_type="tpu7x-16",
        topology="2x2x2",
        extra_env=fast_jax_env(tmp_path / "jax-cache"),
    )
    # Placement tries us-central1-ai1a first (same price, zone order): preempted there as it stocks out.
    plan = [Preempt(1, 6, notice=True, stockout=OTHER_ZONE)]
    chaos = Chaos(
        admin,
        state_dir,
        plan,
        preempt=lambda zone, name, notice: _preempt_compute(admin, zone, name, notice),
    ).start()
    try:
        result = cli(
            "run", "--example", "lm", "--type", "tpu7x-16", "--spot",
            "--checkpoint-every", "4", *HOST_XLA_ENV, "-o", "json", "--", *TPU7X_16_ARGS,
        )  # fmt: skip
    finally:
        chaos.join(check=False)
    assert result.code == 0, result.stderr[-4000:]
    chaos.check()
    run = cli("runs", "describe", result.json["run"]["run_id"], "-o", "json").json["run"]
    assert final_hash(state_dir / "runs" / run["run_id"] / "worker-0.log") == reference
    (preemption,) = run["recovery"]["preemptions"]
    assert preemption["zone"] == OTHER_ZONE and preemption["new_zone"] == ZONE
    assert preemption["restored_step"] == preemption["checkpoint_step"] is not None
    assert admin.status()["nodes"] == []
