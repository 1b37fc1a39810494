"""One creation path: `pod create`, `run --type` (whatever the executor) and a run's recovery all place
their slice through the allocator, with the same capacity types, price cap, zones and failover. On the
in-process simulator (``sim_cli``): placing a slice reaches no host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import Cli, CliResult

ZONES = ("us-central1-a", "us-east1-c")


def profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **keys: Any) -> None:
    config = tmp_path / "config.yaml"
    lines = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in keys.items())
    config.write_text(f"profiles:\n  default:\n{lines}")
    monkeypatch.setenv("TPUCTL_CONFIG", str(config))


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return path


#: A ProxyCommand reaching hosts by their internal address (as an IAP tunnel would).
PROXY = ["--ssh-proxy-command", "nc %h %p"]


def plan_both(cli: Cli, script: Path, *run_flags: str) -> tuple[CliResult, CliResult]:
    """`pod create v5e-64` and `run --type v5e-64 RUN_FLAGS`, both dry runs under the profile."""
    pod = cli("pod", "create", "v5e-64", "--dry-run", "-o", "json")
    run = cli("run", str(script), "--type", "v5e-64", *run_flags, "--dry-run", "-o", "json")
    return pod, run


@pytest.mark.parametrize("proxy", [[], PROXY])
def test_run_and_pod_create_give_the_same_verdict_over_the_price_cap(
    sim_cli: InProcessCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: Path, proxy: list[str]
) -> None:
    profile(tmp_path, monkeypatch, capacity_types=["spot"], max_price=5)
    pod, run = plan_both(sim_cli, script, *proxy)
    assert pod.code == run.code == 6, (pod.stderr, run.stderr)
    assert pod.json["plan"]["verdict"] == run.json["error"] == "over_price_cap"


@pytest.mark.parametrize("proxy", [[], PROXY])
def test_run_and_pod_create_plan_the_same_spot_placement_under_the_cap(
    sim_cli: InProcessCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: Path, proxy: list[str]
) -> None:
    profile(tmp_path, monkeypatch, capacity_types=["spot"], max_price=100)
    pod, run = plan_both(sim_cli, script, *proxy)
    assert pod.code == run.code == 0, (pod.stderr, run.stderr)
    chosen = pod.json["plan"]["chosen"]
    target = run.json["plan"]["target"]
    assert chosen["capacity"] == target["capacity"] == "spot"
    assert target["zone"] == chosen["zone"] == target["create"]["chosen"]["zone"]
    assert target["create"]["request"]["max_price_per_hour"] == 100.0
    bodies = json.dumps(target["create"]["requests"])
    # Every host is reached over SSH: tpuctl's key goes in at creation (the placement's node metadata),
    # and an external IP is asked for (the API gives none unless asked) unless a ProxyCommand reaches
    # the internal addresses.
    assert "ssh-keys" in bodies
    assert ("enableExternalIps" in bodies or "enable_external_ips" in bodies) is (not proxy)


TWO_ZONES: dict[str, Any] = {
    "speed": 1000,
    "zones": {z: {"v4": {"on_demand": 64, "preemptible": 64}} for z in ZONES},
    "quotas": {"default": {"on_demand": {"zone": -1, "region": -1}}},
    "latency": {"base_ms": 0, "jitter_ms": 0},
}


@pytest.mark.parametrize("sim_world", [TWO_ZONES])
def test_a_recovery_re_creation_fails_over_to_another_zone_on_the_ssh_path(
    sim_cli: InProcessCli, state_dir: Path, script: Path
) -> None:
    # The recovery's re-creation is `provision(prefer_zone=the zone it ran in)`: with that zone stocked
    # out, the allocator places the slice in another allowed zone, hosts reached over SSH as on Google.
    from tpuctl.services.run.launcher import Launcher
    from tpuctl.services.run.model import RunRequest
    from tpuctl.services.run.provision import renamed
    from tpuctl.services.session import open_session
    from tpuctl.settings import load_settings

    settings = load_settings({"backend": "sim", "state_dir": state_dir, "zones": list(ZONES)})
    with open_session(settings, backend=sim_cli.backend) as session:
        launcher = Launcher(session)
        prepared = launcher.prepare(RunRequest(script=str(script), accelerator_type="v4-8", executor="ssh"))
        session.ledger.create_run(prepared.run_id, script="train.py")
        first = launcher.provision(prepared)
        assert first.zone == ZONES[0]  # the cheapest first (same price: the allocator's order)
        assert sim_cli.admin.stockout(first.zone)
        again = launcher.provision(renamed(prepared, 1, 1), prefer_zone=first.zone)
        assert again.zone == ZONES[1] and again.state == "READY"
        ssh_keys = sim_cli.admin.metadata(again.zone, again.name, 0, "instance/attributes/ssh-keys")
        assert ssh_keys.startswith("tpuctl:ssh-ed25519 ")
        assert all(e.external_ip for e in again.nodes[0].network_endpoints)
