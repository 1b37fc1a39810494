"""The simulated project's VPC networks (``tpuctl.sim.vpc``): what a create's network interface must name,
and the words each refusal gives. Pure: a world and the function."""

from __future__ import annotations

import pytest

from tpuctl.errors import ConfigError
from tpuctl.sim import default_world
from tpuctl.sim.vpc import (
    NETWORK_NOT_FOUND,
    SUBNETWORK_NEEDED,
    SUBNETWORK_NOT_FOUND,
    Attachment,
    VpcRefusal,
    attach,
    full_paths,
)
from tpuctl.sim.world import Network, World, world_from_data

PROJECT = "tpuctl-sim"
REGION = "us-central1"

#: No ``default`` network: a custom-mode VPC of the project's own, and a Shared VPC host project's.
CUSTOM = default_world().model_copy(
    update={
        "networks": [
            Network(name="tpu-net", auto_subnetworks=False, subnetworks={"tpu-sub": REGION}),
            Network(name="shared", project="host-proj", auto_subnetworks=False, subnetworks={"s1": REGION}),
        ]
    }
)


def _refusal(
    world: World, network: str | None, subnetwork: str | None, *, compute: bool = False
) -> VpcRefusal:
    with pytest.raises(VpcRefusal) as info:
        attach(world, PROJECT, REGION, network, subnetwork, network_from_subnetwork=compute)
    return info.value


def test_the_default_world_has_the_default_network_and_its_subnetwork_in_every_region() -> None:
    world = default_world()
    found = attach(world, PROJECT, "asia-east1", None, None, network_from_subnetwork=False)
    assert found == Attachment(
        f"projects/{PROJECT}/global/networks/default",
        f"projects/{PROJECT}/regions/asia-east1/subnetworks/default",
    )


def test_without_a_default_network_a_create_naming_none_is_refused() -> None:
    refused = _refusal(CUSTOM, None, None)
    assert (refused.part, refused.why) == ("network", NETWORK_NOT_FOUND)
    assert refused.value == f"projects/{PROJECT}/global/networks/default"
    assert _refusal(CUSTOM, "nope", "tpu-sub").why == NETWORK_NOT_FOUND


def test_a_custom_mode_network_needs_its_subnetwork_in_the_zones_region() -> None:
    assert (_refusal(CUSTOM, "tpu-net", None).part, _refusal(CUSTOM, "tpu-net", None).why) == (
        "",
        SUBNETWORK_NEEDED,
    )
    assert _refusal(CUSTOM, "tpu-net", "other").why == SUBNETWORK_NOT_FOUND
    elsewhere = _refusal(CUSTOM, "tpu-net", "regions/europe-west4/subnetworks/tpu-sub")
    assert elsewhere.part == "subnetwork" and "region of the zone (us-central1)" in elsewhere.why
    found = attach(CUSTOM, PROJECT, REGION, "tpu-net", "tpu-sub", network_from_subnetwork=False)
    assert (
        found is not None and found.subnetwork == f"projects/{PROJECT}/regions/{REGION}/subnetworks/tpu-sub"
    )
    # Named alone in another region, the same subnetwork is not there.
    with pytest.raises(VpcRefusal, match="cannot be found"):
        attach(CUSTOM, PROJECT, "us-west4", "tpu-net", "tpu-sub", network_from_subnetwork=False)


def test_a_shared_vpc_is_named_by_its_host_projects_paths() -> None:
    network = "projects/host-proj/global/networks/shared"
    subnetwork = f"https://www.googleapis.com/compute/v1/projects/host-proj/regions/{REGION}/subnetworks/s1"
    found = attach(CUSTOM, PROJECT, REGION, network, subnetwork, network_from_subnetwork=False)
    assert found == Attachment(network, f"projects/host-proj/regions/{REGION}/subnetworks/s1")
    # The host's network is not the service project's own.
    assert _refusal(CUSTOM, "shared", "s1").why == NETWORK_NOT_FOUND
    mixed = _refusal(CUSTOM, network, f"projects/{PROJECT}/regions/{REGION}/subnetworks/s1")
    assert "is not valid for Network" in mixed.why


def test_compute_engine_takes_the_network_a_subnetwork_is_in() -> None:
    found = attach(CUSTOM, PROJECT, REGION, None, "tpu-sub", network_from_subnetwork=True)
    assert found is not None and found.network == f"projects/{PROJECT}/global/networks/tpu-net"
    assert _refusal(CUSTOM, None, "none-such", compute=True).why == SUBNETWORK_NOT_FOUND


def test_a_global_template_names_its_subnetwork_by_its_full_path() -> None:
    with pytest.raises(VpcRefusal, match="full path"):
        attach(CUSTOM, PROJECT, None, "tpu-net", "tpu-sub", network_from_subnetwork=True, template=True)
    path = f"projects/{PROJECT}/regions/{REGION}/subnetworks/tpu-sub"
    assert attach(CUSTOM, PROJECT, None, "tpu-net", path, network_from_subnetwork=True, template=True) is None


def test_reads_answer_full_paths() -> None:
    assert full_paths(PROJECT, "us-east5-b", "global/networks/vpc", None) == {
        "network": f"projects/{PROJECT}/global/networks/vpc",
        "subnetwork": f"projects/{PROJECT}/regions/us-east5/subnetworks/vpc",
    }


def test_a_world_lists_each_network_once_with_well_formed_names() -> None:
    with pytest.raises(ConfigError, match="listed twice"):
        world_from_data({"networks": [{"name": "a"}, {"name": "a"}]}, "w")
    with pytest.raises(ConfigError, match="subnetwork and its region"):
        world_from_data({"networks": [{"name": "a", "subnetworks": {"s": "us-central1-a"}}]}, "w")
