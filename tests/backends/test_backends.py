"""The backend seam: chosen once from the settings, and each implementation answers what differs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tpuctl.backends import open_backend
from tpuctl.backends.base import Backend, HostAddress
from tpuctl.backends.gcp import GCP_TUNING, GcpBackend
from tpuctl.backends.sim import SIM_TUNING, SimBackend
from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import NetworkEndpoint, Node
from tpuctl.settings import load_settings
from tpuctl.sim import SimAdminClient


def node(*endpoints: NetworkEndpoint) -> Node:
    return Node(
        name="n",
        zone="us-central1-a",
        accelerator_type="v5litepod-8",
        state="READY",
        capacity=CapacityType.SPOT,
        network_endpoints=endpoints,
    )


def test_the_settings_choose_the_backend_once(state_dir: Path) -> None:
    sim = open_backend(load_settings({"backend": "sim", "state_dir": state_dir}))
    gcp = open_backend(load_settings({"project": "my-proj", "state_dir": state_dir}))
    assert isinstance(sim, SimBackend) and sim.name == "sim" and sim.default_executor == "sim"
    assert isinstance(gcp, GcpBackend) and gcp.name == "gcp" and gcp.project == "my-proj"
    assert gcp.default_executor == "ssh"
    # Both are what services see: the Backend protocol.
    for backend in (sim, gcp):
        check: Backend = backend
        assert check.tuning.step_retry.max_attempts >= 1


def test_google_is_patient_and_the_simulator_is_fast() -> None:
    assert SIM_TUNING.poll_interval_s < GCP_TUNING.poll_interval_s
    assert SIM_TUNING.recovery.confirm_timeout_s < GCP_TUNING.recovery.confirm_timeout_s
    assert SIM_TUNING.step_retry.initial_wait_s < GCP_TUNING.step_retry.initial_wait_s
    # The simulator's single retry policy serves placement and gc alike.
    assert SIM_TUNING.step_retry is SIM_TUNING.gc_retry
    assert GCP_TUNING.delete_margin_s == 120.0 and SIM_TUNING.delete_margin_s == 5.0


def test_google_hosts_are_reached_on_port_22_through_their_external_ip_when_they_have_one() -> None:
    # The endpoints' own port is the TPU runtime's (8470), never SSH's.
    n = node(NetworkEndpoint("10.0.0.2", 8470, "34.1.2.3"), NetworkEndpoint("10.0.0.3", 8470))
    assert GcpBackend(project="p").host_addresses(n) == [
        HostAddress("34.1.2.3", 22),
        HostAddress("10.0.0.3", 22),
    ]


def test_simulated_hosts_are_reached_at_their_endpoint_port() -> None:
    n = node(NetworkEndpoint("127.0.0.1", 2201), NetworkEndpoint("127.0.0.1", 2202))
    assert SimBackend().host_addresses(n) == [HostAddress("127.0.0.1", 2201), HostAddress("127.0.0.1", 2202)]


def test_only_the_simulator_has_local_hosts_and_its_own_prices(state_dir: Path) -> None:
    from tpuctl.cloud.tpu_api import TpuApiCloud

    cloud = TpuApiCloud.for_simulator(project="p", base_url="http://127.0.0.1:9")
    try:
        assert GcpBackend(project="p").local_hosts(cloud, state_dir) is None
        assert GcpBackend(project="p").own_prices() is None
        local = SimBackend().local_hosts(cloud, state_dir)
        assert local is not None
        assert local.checkpoint_dir(state_dir / "runs", "run-1") == str(
            state_dir / "runs" / "run-1" / "checkpoints"
        )
    finally:
        cloud.close()
    own = SimBackend().own_prices()
    assert own.project == "tpuctl-sim" and own.where == "(built-in default world)"
    for regions in own.overrides.values():
        for prices in regions.values():
            assert set(prices) <= {"on_demand", "spot"}
            assert all(value >= 0 for value in prices.values())


def test_local_host_disks_are_wiped_with_their_slice(state_dir: Path) -> None:
    from tpuctl.backends.sim import HOSTS_DIR, LocalSimHosts

    local = LocalSimHosts(state_dir / HOSTS_DIR, admin_url="http://127.0.0.1:9")
    disk = state_dir / HOSTS_DIR / "us-central1-a" / "n" / "worker-0"
    disk.mkdir(parents=True)
    (disk / "ckpt").write_text("x")
    other = state_dir / HOSTS_DIR / "us-central1-a" / "other" / "worker-0"
    other.mkdir(parents=True)
    local.cleanup(node())
    assert not disk.exists() and other.exists()


@pytest.mark.parametrize("speed", [1.0, 100.0])
def test_the_simulator_reports_its_notice_grace_in_real_seconds(
    serve_sim: Callable[..., SimAdminClient], speed: float
) -> None:
    from tpuctl.cloud.tpu_api import TpuApiCloud

    admin = serve_sim({"speed": speed, "durations": {"preemption_grace_s": 30}}, point_cli=False)
    cloud = TpuApiCloud.for_simulator(project="p", base_url=admin.base_url)
    try:
        assert SimBackend().notice_grace_s(cloud) == pytest.approx(30 / speed)
        assert GcpBackend(project="p").notice_grace_s(cloud) is None
    finally:
        cloud.close()
