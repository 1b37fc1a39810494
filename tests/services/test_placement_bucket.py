"""Placement near the checkpoint bucket: which zones are in a bucket's location (a region, a dual-region,
a multi-region), what a far zone costs per GB of checkpoint, and a run's dry-run plan on the in-process
simulator, its bucket's location read from the simulated Cloud Storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tpuctl.cloud.buckets import BucketLocation
from tpuctl.services.placement_bucket import BucketDistance, egress_usd_per_gb, in_bucket_location
from tpuctl.sim.iam import ADC_TOKEN
from tpuctl.testing.backend import InProcessCli


def bucket(location: str, location_type: str = "region", *data: str) -> BucketLocation:
    return BucketLocation("b", location, location_type, tuple(data))


@pytest.mark.parametrize(
    ("where", "region", "near"),
    [
        (bucket("US-CENTRAL1"), "us-central1", True),
        (bucket("US-CENTRAL1"), "us-east1", False),
        (bucket("US", "multi-region"), "us-east5", True),
        (bucket("US", "multi-region"), "northamerica-northeast1", False),  # Canada is not in US
        (bucket("EU", "multi-region"), "europe-west4", True),
        (bucket("EU", "multi-region"), "europe-west2", False),  # London is not in the EU
        (bucket("NAM4", "dual-region"), "us-east1", True),
        (bucket("NAM4", "dual-region"), "us-east5", False),
        (bucket("US", "dual-region", "us-east5", "us-central1"), "us-east5", True),  # configurable
        (bucket("US", "dual-region", "us-east5", "us-central1"), "us-west4", False),
    ],
)
def test_a_zone_is_near_where_the_bucket_keeps_its_data(
    where: BucketLocation, region: str, near: bool
) -> None:
    assert in_bucket_location(where, region) is near


def test_what_a_gb_of_checkpoint_costs_between_locations() -> None:
    assert egress_usd_per_gb(bucket("US-CENTRAL1"), "us-central1") == 0.0
    assert egress_usd_per_gb(bucket("NAM4", "dual-region"), "us-east1") == 0.0
    assert egress_usd_per_gb(bucket("US", "multi-region"), "us-east5") is None  # charged, rate unknown
    assert egress_usd_per_gb(bucket("US-CENTRAL1"), "us-east1") == 0.02  # same continent
    assert egress_usd_per_gb(bucket("EU", "multi-region"), "europe-west2") == 0.02
    assert egress_usd_per_gb(bucket("US-CENTRAL1"), "asia-southeast1") == 0.08  # between continents
    assert egress_usd_per_gb(bucket("ASIA", "multi-region"), "us-east5") == 0.08
    assert egress_usd_per_gb(bucket("AUSTRALIA-SOUTHEAST1"), "us-east5") is None  # not known here: said
    assert egress_usd_per_gb(bucket("ASIA-EAST1"), "asia-southeast1") is None
    far = BucketDistance.of(bucket("US-CENTRAL1"), "asia-southeast1-b")
    note = far.cost_note(bucket("US-CENTRAL1"), "asia-southeast1-b")
    assert note is not None and "about 0.08 USD per GB" in note and "gs://b in US-CENTRAL1" in note
    assert BucketDistance.of(bucket("US-CENTRAL1"), "us-central1-a").cost_note(bucket("US"), "z") is None


# --- a run's plan, on the in-process simulator -------------------------------------------------------


#: Three zones offering v5e: us-central1-a and us-east1-c at one price (the catalog's), so that only the
#: bucket tells them apart (by name, us-central1-a is first); asia-southeast1-b dearer.
POOLS = {"v5e": {"on_demand": 64, "preemptible": 64}}
WORLD: dict[str, Any] = {
    "project": "bucket-proj",
    "speed": 1000,
    "zones": {"us-central1-a": POOLS, "us-east1-c": POOLS, "asia-southeast1-b": POOLS},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
}


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return WORLD


def _bucket_in(sim_cli: InProcessCli, name: str, location: str) -> None:
    """A bucket in the simulated Cloud Storage, in ``location`` (the emulator takes it as an update)."""
    url = sim_cli.backend.storage_url
    auth = {"Authorization": f"Bearer {ADC_TOKEN}"}  # the world's principal, who owns the project
    httpx.post(
        f"{url}/storage/v1/b", params={"project": "bucket-proj"}, json={"name": name}, headers=auth
    ).raise_for_status()
    httpx.patch(f"{url}/storage/v1/b/{name}", json={"location": location}, headers=auth).raise_for_status()


def _plan(sim_cli: InProcessCli, tmp_path: Path, *args: str) -> dict[str, Any]:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    result = sim_cli("run", str(script), "--type", "v5e-4", "--dry-run", *args, "-o", "json")
    assert result.code == 0, result.stderr
    created: dict[str, Any] = result.json["plan"]["target"]["create"]
    return created


def test_a_run_is_placed_in_its_buckets_region_among_equal_prices_and_says_what_far_costs(
    sim_cli: InProcessCli, tmp_path: Path
) -> None:
    _bucket_in(sim_cli, "ckpt-east", "US-EAST1")
    _bucket_in(sim_cli, "ckpt-asia", "ASIA-SOUTHEAST1")
    east = _plan(sim_cli, tmp_path, "--checkpoint-dir", "gs://ckpt-east/run")
    assert east["request"]["checkpoint_bucket"] == "ckpt-east"
    assert [key.split("/")[0] for key in east["order"]] == [
        "us-east1-c",
        "us-central1-a",
        "asia-southeast1-b",
    ]
    assert east["chosen"]["bucket"] == {"near": True, "egress_usd_per_gb": 0.0}
    assert east["checkpoint_bucket"]["location"] == "US-EAST1" and east["warnings"] == []
    assert "in the checkpoint bucket's location" in east["chosen"]["reason"]
    # The price still comes first: a dearer zone near the bucket does not win; the plan says what the
    # cheaper, far one costs per checkpoint.
    asia = _plan(sim_cli, tmp_path, "--checkpoint-dir", "gs://ckpt-asia/run")
    assert [key.split("/")[0] for key in asia["order"]] == [
        "us-central1-a",
        "us-east1-c",
        "asia-southeast1-b",
    ]
    assert asia["checkpoint_bucket"]["chosen_zone_near"] is False
    assert asia["checkpoint_bucket"]["egress_usd_per_gb"] == 0.08
    (note,) = asia["warnings"]
    assert "us-central1-a is outside gs://ckpt-asia in ASIA-SOUTHEAST1" in note and "0.08 USD per GB" in note
    # Without a --checkpoint-dir the run's is in the simulator's own bucket (its emulator's US multi-region).
    default = _plan(sim_cli, tmp_path)
    assert default["checkpoint_bucket"]["bucket"] == "tpuctl-sim" and default["chosen"]["bucket"]["near"]


def _objects_only(world: dict[str, Any]) -> dict[str, Any]:
    """``world`` with a caller who may use the bucket's objects but not read the bucket itself
    (roles/storage.objectAdmin holds no storage.buckets.get)."""
    user = ["user:sim-user@example.com"]
    roles = ("roles/tpu.admin", "roles/cloudquotas.viewer", "roles/storage.objectAdmin")
    return {**world, "iam": {"bucket-proj": [{"role": role, "members": user} for role in roles]}}


@pytest.mark.parametrize("sim_world", [_objects_only(WORLD)], ids=["objects-only"])
def test_a_bucket_whose_location_cannot_be_read_is_a_warning_not_a_failure(
    sim_cli: InProcessCli, tmp_path: Path
) -> None:
    plan = _plan(sim_cli, tmp_path, "--checkpoint-dir", "gs://tpuctl-sim/run")
    assert plan["feasible"] and plan["checkpoint_bucket"]["location"] is None
    assert any("location of bucket gs://tpuctl-sim could not be read" in w for w in plan["warnings"])
