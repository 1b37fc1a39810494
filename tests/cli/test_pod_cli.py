"""`tpuctl pod ...` end to end: create, list, describe and delete, dry runs and bad input.

The first test goes the CLI's default path: each command starts its own simulator over the state dir (no
TPUCTL_SIM_URL), so one command sees what the previous one did, exactly as a user runs `tpuctl pod
create`, then `tpuctl pod list`, then `tpuctl pod delete`. The others run on the in-process backend
(``sim_cli``): the same simulator in this process, its waits on a fake clock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tpuctl.sim import World, default_world
from tpuctl.store import Ledger
from tpuctl.store.records import EventKind
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import Cli


@pytest.fixture
def sim_world() -> World:
    """The default world sped up (a create takes 0.05 s of simulated time)."""
    return default_world().model_copy(update={"speed": 1200.0})


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_world: World) -> None:
    """The default path: every command serves the simulator of this world file over the state dir."""
    world_file = tmp_path / "world.yaml"
    world_file.write_text(yaml.safe_dump(sim_world.model_dump(mode="json", exclude_none=True)))
    monkeypatch.setenv("TPUCTL_SIM_WORLD", str(world_file))


def test_create_list_describe_delete_v5e_64(served: None, cli: Cli, state_dir: Path) -> None:
    created = cli("pod", "create", "v5e-64", "--name", "demo", "-o", "json")
    assert created.code == 0, created.stderr

    listed = cli("pod", "list", "-o", "json")
    assert listed.code == 0, listed.stderr
    doc = listed.json
    assert doc["backend"] == "sim"
    [pod] = doc["pods"]
    assert pod["name"] == "demo"
    assert pod["accelerator_type"] == "v5litepod-64"
    assert pod["topology"] == "8x8"
    assert pod["state"] == "READY"
    assert pod["zone"] == "us-central1-a"
    assert pod["capacity"] == "on-demand"
    assert pod["chips"] == 64 and pod["hosts"] == 16
    assert pod["price_per_chip_hour"] == pytest.approx(1.20)
    assert pod["price_per_hour"] == pytest.approx(64 * 1.20)
    assert pod["labels"]["managed-by"] == "tpuctl"

    described = cli("pod", "describe", "demo", "-o", "json")
    assert described.code == 0, described.stderr
    endpoints = described.json["pod"]["network_endpoints"]
    assert len(endpoints) == 16
    assert {e["port"] for e in endpoints} == {8470}

    deleted = cli("pod", "delete", "demo", "-y", "-o", "json")
    assert deleted.code == 0, deleted.stderr
    assert deleted.json["deleted"] == [{"name": "demo", "zone": "us-central1-a"}]
    assert cli("pod", "list", "-o", "json").json["pods"] == []

    with Ledger(state_dir) as ledger:
        kinds = [e.kind for e in ledger.pod_events("demo")]
    for kind in (EventKind.REQUESTED, EventKind.CREATED, EventKind.READY, EventKind.DELETED):
        assert kind in kinds, kinds
    assert kinds.index(EventKind.REQUESTED) < kinds.index(EventKind.READY) < kinds.index(EventKind.DELETED)


def test_table_output_says_it_is_the_simulator(sim_cli: InProcessCli) -> None:
    result = sim_cli("pod", "list")
    assert result.code == 0
    assert " sim " in result.stderr
    assert "simulated TPU cloud" in result.stderr


def test_dry_run_prints_the_exact_request_and_creates_nothing(sim_cli: InProcessCli) -> None:
    result = sim_cli("pod", "create", "v5e-64", "--name", "plan", "--dry-run", "-o", "json")
    assert result.code == 0, result.stderr
    plan = result.json["plan"]
    [request] = [r for r in plan["requests"] if r["method"] == "POST"]
    assert "/v2/projects/tpuctl-sim/locations/us-central1-a/nodes?nodeId=plan" in request["url"]
    assert request["body"]["acceleratorType"] == "v5litepod-64"
    assert request["body"]["runtimeVersion"] == "v2-alpha-tpuv5-lite"
    assert sim_cli("pod", "list", "-o", "json").json["pods"] == []


@pytest.mark.parametrize(
    ("args", "value", "fix_part"),
    [
        (["pod", "create", "v9-8"], "v9-8", "v5e"),
        (["pod", "create", "v5e-48"], "v5e-48", "v5e-64"),
        (["pod", "create", "v5e-8", "--zone", "uscentral1"], "uscentral1", "us-central1-a"),
        (["pod", "create", "v5e-8", "--label", "Team=ML"], "Team=ML", "team"),
        (["pod", "create", "v5e-8", "--label", "novalue"], "novalue", "KEY=VALUE"),
        (["pod", "create", "v5e-8", "--max-price", "-5"], "-5", ""),
        (["pod", "create", "v5e-8", "--name", "Bad_Name"], "Bad_Name", "lowercase"),
        (["--profile", "prod", "pod", "list"], "prod", "profile"),
        (["-o", "xml", "pod", "list"], "xml", "json"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_creates_nothing(
    sim_cli: InProcessCli, args: list[str], value: str, fix_part: str
) -> None:
    result = sim_cli(*args)
    assert result.code == 2, (result.code, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, result.stderr
    assert value in result.stderr
    assert "fix:" in result.stderr
    assert fix_part in result.stderr
    assert sim_cli("pod", "list", "-o", "json").json["pods"] == []


def test_broken_yaml_config_is_exit_2_naming_the_file(
    sim_cli: InProcessCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("profiles:\n  dev:\n    zones: [us-central1-a\n")
    monkeypatch.setenv("TPUCTL_CONFIG", str(config))
    result = sim_cli("pod", "list")
    assert result.code == 2
    assert str(config) in result.stderr
    assert "not valid YAML" in result.stderr


def test_bad_input_as_json_is_a_document_naming_the_field(sim_cli: InProcessCli) -> None:
    result = sim_cli("pod", "create", "v5e-48", "-o", "json")
    assert result.code == 2
    doc = result.json
    assert doc["exit_code"] == 2
    assert doc["value"] == "v5e-48"
    assert "fix" in doc


def test_delete_of_an_unknown_pod_is_not_found(sim_cli: InProcessCli) -> None:
    result = sim_cli("pod", "delete", "ghost", "-y")
    assert result.code == 11
    assert "ghost" in result.stderr


def test_help_loads_no_heavy_library() -> None:
    """`tpuctl --help` must stay fast: the cloud SDK, JAX, pydantic-settings and httpx stay unloaded."""
    heavy = ["google.cloud.tpu_v2", "google.api_core", "jax", "pydantic_settings", "httpx", "rich.table"]
    code = (
        "import sys\n"
        "from tpuctl.cli.main import run\n"
        "try:\n    run(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert "pod" in proc.stdout and "catalog" in proc.stdout
