"""The world file: the bundled default, its configs/ symlink, and validation errors that name the file,
the field, the bad value and the fix."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tpuctl.catalog import Catalog
from tpuctl.errors import ConfigError
from tpuctl.sim import default_world, load_world
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.state import SimDatabase
from tpuctl.sim.world import World
from tpuctl.testing.clock import FakeClock

REPO = Path(__file__).resolve().parents[2]


def test_configs_world_yaml_is_a_symlink_to_the_package_default() -> None:
    link = REPO / "configs" / "world.yaml"
    assert link.is_symlink()
    assert link.resolve() == (REPO / "tpuctl" / "sim" / "data" / "world.yaml").resolve()
    assert load_world(link) == default_world()


def test_default_world_offers_each_generation_in_the_catalog_zones() -> None:
    world = default_world()
    catalog = Catalog.load()
    assert world.project == "tpuctl-sim"
    assert world.faults.transient_error_rate == 0 and world.faults.ambiguous_error_rate == 0
    assert world.preemption.rate_per_hour == 0
    assert world.real_seconds(world.durations.node_create_s) == pytest.approx(2.0)
    for name in ("v5e", "v6e", "v5p", "v4", "v3", "v2"):
        offered = {z for z in world.zones if world.offers(z, name)}
        assert offered == set(catalog.generations[name].zones), name


@pytest.mark.parametrize("capacity", ["on_demand", "spot"])
def test_default_world_creates_v5e_64_in_us_central1_a(tmp_path: Path, capacity: str) -> None:
    clock = FakeClock(time.time())
    db = SimDatabase(tmp_path / "sim.db")
    engine = SimEngine(db, clock=clock)
    world = engine.install_world(None)
    body = {
        "acceleratorType": "v5litepod-64",
        "runtimeVersion": "v2-alpha-tpuv5-lite",
        "schedulingConfig": {"spot": capacity == "spot"},
    }
    operation = engine.create_node(world.project, "us-central1-a", "pod", body)
    assert operation["done"] is False
    clock.advance(world.real_seconds(world.durations.node_create_s))
    made = engine.get_node(world.project, "us-central1-a", "pod")
    assert made["state"] == "READY"
    assert made["acceleratorConfig"] == {"type": "V5LITE_POD", "topology": "8x8"}
    assert len(made["networkEndpoints"]) == 16
    db.close()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "world.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("zones:\n  us-central1-a:\n    v5e: {on_demand: -8}\n", "zones.us-central1-a.v5e.on_demand", -8),
        (
            "zones:\n  us-central1-a:\n    v5e: {on_demnd: 8}\n",
            "zones.us-central1-a.v5e.on_demnd",
            "on_demnd",
        ),
        ("zones:\n  us-central1-a:\n    v7x: {on_demand: 8}\n", "zones.us-central1-a.v7x", "v7x"),
        ("zones:\n  uscentral1:\n    v5e: {on_demand: 8}\n", "zones.uscentral1", "uscentral1"),
        ("speed: 0\n", "speed", 0),
        ("speed: fast\n", "speed", "fast"),
        ("faults: {transient_error_rate: 1.5}\n", "faults.transient_error_rate", 1.5),
        ("project: Bad_Project\n", "project", "Bad_Project"),
        ("durations: {node_create_s: -1}\n", "durations.node_create_s", -1),
        (
            "zones: {us-central1-a: {v5e: {on_demand: 8}}}\n"
            "reservations: [{name: r, zone: us-east5-b, generation: v5e, chips: 8}]\n",
            "reservations.0.zone",
            "us-east5-b",
        ),
        (
            "quotas: {overrides: [{generation: v5e, capacity: on_demand, location: moon, limit: 8}]}\n",
            "quotas.overrides.0.location",
            "moon",
        ),
        (
            "quotas: {overrides: [{generation: v5e, capacity: spot, location: us-central1, limit: 8}]}\n",
            "quotas.overrides.0.capacity",
            "spot",
        ),
        ("preemption: {schedule: [{node: x}]}\n", "preemption.schedule.0.after_s", None),
        ("prices: {v5e: {uscentral1: {on_demand: 1}}}\n", "prices.v5e.uscentral1", "uscentral1"),
    ],
)
def test_bad_world_names_file_field_value_and_fix(
    tmp_path: Path, text: str, field: str, value: object
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_world(path)
    error = info.value
    assert error.path == str(path)
    assert error.field == field
    if value is not None:
        assert error.value == value
    assert error.fix
    assert str(path) in error.message and field in error.message
    assert error.exit_code == 2


def test_broken_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "zones:\n  us-central1-a: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_world(path)
    assert info.value.path == str(path)
    assert "not valid YAML" in info.value.message and "line" in info.value.message


def test_not_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_world(write(tmp_path, "- a\n- b\n"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_world(tmp_path / "nope.yaml")
    assert info.value.path == str(tmp_path / "nope.yaml")
    assert info.value.fix


def test_empty_file_is_an_empty_world(tmp_path: Path) -> None:
    world = load_world(write(tmp_path, "# nothing\n"))
    assert world.zones == {} and world.project == "tpuctl-sim"


def test_quota_limits_defaults_generations_and_overrides() -> None:
    world = World.model_validate(
        {
            "quotas": {
                "default": {"on_demand": {"zone": 1, "region": 2}, "preemptible": {"zone": 3, "region": 4}},
                "generations": {"v5p": {"on_demand": {"zone": 10, "region": 20}}},
                "overrides": [
                    {"generation": "v5e", "capacity": "on_demand", "location": "us-central1-a", "limit": 99},
                    {"generation": "v5e", "capacity": "preemptible", "location": "us-central1", "limit": -1},
                ],
            }
        }
    )
    assert world.quota_limit("v5e", "on_demand", "us-central1-a") == 99
    assert world.quota_limit("v5e", "on_demand", "us-central1-b") == 1
    assert world.quota_limit("v5e", "on_demand", "us-central1") == 2
    assert world.quota_limit("v5e", "preemptible", "us-central1") == -1
    assert world.quota_limit("v5p", "on_demand", "us-east5-a") == 10
    assert world.quota_limit("v5p", "preemptible", "us-east5") == 0  # listed generation: its own defaults


def test_world_import_is_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, tpuctl.sim; "
        "assert 'google.cloud.tpu_v2' not in sys.modules and 'google.protobuf' not in sys.modules; "
        "import tpuctl.sim.server; "
        "assert 'google.cloud.tpu_v2' not in sys.modules and 'google.protobuf' not in sys.modules, "
        "[m for m in sys.modules if m.startswith('google')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
