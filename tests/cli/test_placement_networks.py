"""The hosts' network flags (``tpuctl.cli.placement_flags``) against a project with no ``default`` network:
a create naming none is refused as Google refuses it, on both APIs; naming a network and subnetwork (flags,
a Shared VPC's paths, or the profile's keys) it works, and the dry run shows them. In-process simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from compute_cli_helpers import WORLD, compute_get

from tpuctl.sim.iam import ADC_TOKEN
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cloud import ENDPOINT

#: A custom-mode VPC of the project's own and a Shared VPC host project's; no ``default``.
NETWORKS = [
    {"name": "tpu-net", "auto_subnetworks": False, "subnetworks": {"tpu-sub": "us-central1"}},
    {
        "name": "shared",
        "project": "host-proj",
        "auto_subnetworks": False,
        "subnetworks": {"s1": "us-central1"},
    },
]
OWN = ("--network", "tpu-net", "--subnetwork", "tpu-sub")
SHARED = (
    "--network",
    "projects/host-proj/global/networks/shared",
    "--subnetwork",
    "projects/host-proj/regions/us-central1/subnetworks/s1",
)
#: v5e through the Cloud TPU API, tpu7x through Compute Engine.
TYPES = ("v5e-8", "tpu7x-8")


#: The project's policy: the caller owns it, and the hosts' accounts (its default one, and the profile's
#: trainer below) may use it, the checkpoint bucket included.
IAM = {
    "tpuctl-sim": [
        {"role": "roles/owner", "members": ["user:sim-user@example.com"]},
        {
            "role": "roles/editor",
            "members": [
                "serviceAccount:tpuctl-sim-compute@developer.gserviceaccount.com",
                "serviceAccount:trainer@tpuctl-sim.iam.gserviceaccount.com",
            ],
        },
    ]
}


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return {**WORLD, "networks": NETWORKS, "iam": IAM}


@pytest.mark.parametrize("type_name", TYPES)
def test_no_default_network_is_refused_with_googles_error_and_nothing_is_left(
    sim_cli: InProcessCli, type_name: str
) -> None:
    refused = sim_cli("-o", "json", "pod", "create", type_name)
    assert refused.code == 10, refused.stderr
    error = refused.json
    field = "node.networkConfig.network" if type_name == "v5e-8" else "resource.networkInterfaces[0].network"
    assert error["message"].endswith(
        f"Invalid value for field '{field}': 'projects/tpuctl-sim/global/networks/default'. The referenced "
        "network resource cannot be found. [INVALID_ARGUMENT]"
    ), error
    assert "--network" in error["fix"] and "--subnetwork" in error["fix"]
    # The refusal itself, not a failover through every zone: no other zone has the network either.
    assert not error["message"].startswith("every feasible candidate"), error
    assert sim_cli("-o", "json", "pod", "list").json["pods"] == []
    custom = sim_cli("-o", "json", "pod", "create", type_name, "--network", "tpu-net")
    assert custom.code == 10 and "Subnetwork should be specified" in custom.json["message"], custom.stderr


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("network", [OWN, SHARED], ids=["own", "shared-vpc"])
def test_a_named_network_and_subnetwork_are_where_the_hosts_go(
    sim_cli: InProcessCli, type_name: str, network: tuple[str, ...]
) -> None:
    planned = sim_cli("pod", "create", type_name, *network, "--tags", "tpu-ssh", "--dry-run")
    assert planned.code == 0, planned.stderr
    assert f"hosts: network {network[1]}, subnetwork {network[3]}, tags tpu-ssh" in planned.stdout
    created = sim_cli("-o", "json", "pod", "create", type_name, *network, "--name", "p")
    assert created.code == 0, created.stderr
    pod = created.json["pod"]
    nic = _network_of(sim_cli, type_name, pod["zone"])
    host = "host-proj" if network == SHARED else "tpuctl-sim"
    assert nic["network"].endswith(f"projects/{host}/global/networks/{network[1].rsplit('/', 1)[-1]}")
    assert nic["subnetwork"].endswith(
        f"projects/{host}/regions/us-central1/subnetworks/{network[3].rsplit('/', 1)[-1]}"
    )


def test_a_multi_host_compute_slice_takes_the_network_through_its_template(sim_cli: InProcessCli) -> None:
    refused = sim_cli("-o", "json", "pod", "create", "tpu7x-16")
    assert refused.code == 10 and "network resource cannot be found" in refused.json["message"], (
        refused.stderr
    )
    created = sim_cli("-o", "json", "pod", "create", "tpu7x-16", *SHARED)
    assert created.code == 0, created.stderr
    assert created.json["pod"]["hosts"] == 2


def test_a_subnetwork_named_with_its_region_keeps_placement_there(sim_cli: InProcessCli) -> None:
    """The world offers v5e only in us-central1-a; a subnetwork elsewhere is a usage error before any
    request, naming the region."""
    planned = sim_cli("-o", "json", "pod", "create", "v5e-8", "--network", "tpu-net", "--subnetwork",
                      "regions/us-central1/subnetworks/tpu-sub", "--dry-run")  # fmt: skip
    assert planned.code == 0, planned.stderr
    assert planned.json["plan"]["request"]["region"] == "us-central1"
    away = sim_cli("-o", "json", "pod", "create", "v5e-8", "--zone", "us-central1-c", "--subnetwork",
                   "regions/us-east1/subnetworks/s", "--dry-run")  # fmt: skip
    assert away.code == 2 and away.json["field"] == "--zone", away.stderr
    assert "--region us-east1" in away.json["fix"]


def test_the_profiles_network_and_the_run_plan(sim_cli: InProcessCli, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "profiles:\n  default:\n    network: tpu-net\n    subnetwork: tpu-sub\n"
        "    service_account: trainer@tpuctl-sim.iam.gserviceaccount.com\n"
    )
    env = {"TPUCTL_CONFIG": str(config)}
    created = sim_cli("-o", "json", "pod", "create", "v5e-8", env=env)
    assert created.code == 0, created.stderr
    planned = sim_cli("run", "--example", "lm", "--type", "v5e-8", "--dry-run", env=env)
    assert planned.code == 0, planned.stderr
    assert "hosts: network tpu-net, subnetwork tpu-sub, service account trainer@" in planned.stdout
    # A flag wins over the profile's key.
    flagged = sim_cli("-o", "json", "run", "--example", "lm", "--type", "v5e-8", "--network", "other",
                      "--dry-run", env=env)  # fmt: skip
    assert flagged.json["plan"]["target"]["create"]["request"]["network"] == "other"


def _network_of(sim_cli: InProcessCli, type_name: str, zone: str) -> dict[str, Any]:
    """The created slice's network interface, as the API that holds it reads it back."""
    if type_name == "v5e-8":
        auth = {"Authorization": f"Bearer {ADC_TOKEN}"}  # as tpuctl calls it
        with httpx.Client(transport=sim_cli.transport, headers=auth) as http:
            node = http.get(f"{ENDPOINT}/v2/projects/tpuctl-sim/locations/{zone}/nodes/p").json()
        return dict(node["networkConfig"])
    instance = compute_get(sim_cli.admin, f"zones/{zone}/instances/p", transport=sim_cli.transport).json()
    return dict(instance["networkInterfaces"][0])
