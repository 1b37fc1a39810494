"""The backend seam: chosen once from the settings, and each implementation answers what differs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    assert isinstance(sim, SimBackend) and sim.name == "sim" and sim.runtime == "cpu"
    assert isinstance(gcp, GcpBackend) and gcp.name == "gcp" and gcp.project == "my-proj"
    assert gcp.runtime == "tpu"
    # Only the simulator has a bucket of its own; on Google the user names one.
    assert sim.default_bucket == "tpuctl-sim" and gcp.default_bucket is None
    assert gcp.own_prices() is None
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
    cloud: Any = None  # Google's addresses come from the node alone
    assert GcpBackend(project="p").host_addresses(cloud, n) == [
        HostAddress("34.1.2.3", 22),
        HostAddress("10.0.0.3", 22),
    ]


def test_only_simulated_hosts_get_cpu_devices_for_their_chips() -> None:
    addresses = [HostAddress("127.20.0.1", 22), HostAddress("127.20.0.2", 22)]
    assert GcpBackend(project="p").host_env(1, addresses, 4) == {}
    env = SimBackend().host_env(1, addresses, 4)
    assert env["JAX_PLATFORMS"] == "cpu" and env["JAX_NUM_CPU_DEVICES"] == "4"
    # The coordinator listens on host 0's own address, never on every interface.
    assert env["JAX_COORDINATOR_BIND_ADDRESS"] == "127.20.0.1:8482"
    assert env["TPUCTL_COORDINATOR_PORT"] == "8482" and env["TPUCTL_SIM"] == "1"


@pytest.mark.parametrize("speed", [1.0, 100.0])
def test_the_simulator_reports_its_notice_grace_in_real_seconds(
    serve_sim: Callable[..., SimAdminClient], speed: float
) -> None:
    from tpuctl.cloud.tpu_api import TpuApiCloud

    admin = serve_sim({"speed": speed, "durations": {"preemption_grace_s": 30}}, point_cli=False)
    cloud = TpuApiCloud.for_simulator(project="p", base_url=admin.base_url)
    try:
        # The grace is honoured in real seconds, whatever the world's speed.
        assert SimBackend().notice_grace_s(cloud) == pytest.approx(30)
        assert GcpBackend(project="p").notice_grace_s(cloud) is None
    finally:
        cloud.close()


def test_the_simulators_tuning_is_defined_once() -> None:
    from tpuctl.backends.sim import SIM_CLIENTS, SIM_RETRY
    from tpuctl.cloud import tpu_api

    # Its clients' retries and its steps' retries are one policy, and the cloud layer defines none.
    assert SIM_CLIENTS.retry is SIM_RETRY is SIM_TUNING.step_retry is SIM_TUNING.gc_retry
    assert not hasattr(tpu_api, "SIM_RETRY")


def test_each_backend_supplies_how_the_cli_marks_it() -> None:
    sim, gcp = SimBackend().label, GcpBackend(project="p").label
    assert (sim.name, sim.style) == ("sim", "black on yellow")
    assert (gcp.name, gcp.style) == ("gcp", "white on blue")
    assert sim.headline.format(project="p") == "simulated TPU cloud (project p)"
    assert gcp.headline.format(project="p") == "project p"
    # The simulator's state dir is its cloud; a project another tool's variable chose bills on Google.
    assert sim.names_state_dir and not sim.names_ambient_project
    assert gcp.names_ambient_project and not gcp.names_state_dir


def test_google_clients_share_one_adc_lookup_and_googles_endpoints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import google.auth

    from tpuctl.cloud.compute import GOOGLE_COMPUTE_ENDPOINT
    from tpuctl.cloud.quotas import GOOGLE_QUOTAS_URL
    from tpuctl.cloud.tpu_api import GOOGLE_TPU_ENDPOINT

    lookups: list[object] = []
    creds = object()

    def adc(**_: Any) -> Any:
        lookups.append(creds)
        return creds, "p"

    monkeypatch.setattr(google.auth, "default", adc)
    cloud: Any = GcpBackend(project="my-proj").open_cloud(tmp_path, [])
    tpu, compute = cloud._tpu, cloud._compute
    assert len(lookups) == 1  # looked up once, when the session opens, and shared
    assert (tpu.endpoint, compute.endpoint) == (GOOGLE_TPU_ENDPOINT, GOOGLE_COMPUTE_ENDPOINT)
    assert tpu._quotas.base_url == compute._quotas.base_url == GOOGLE_QUOTAS_URL
    assert (tpu._quotas.service, compute._quotas.service) == ("tpu.googleapis.com", "compute.googleapis.com")
    for client in (tpu, compute):
        assert client._config.credentials() is creds and client._config.trust_env is True
        assert client.backend == "gcp" and client.project == "my-proj"
    assert tpu._quotas._credentials is creds and tpu._quotas._trust_env is True


def test_simulator_clients_send_the_simulated_adc_and_are_never_proxied(
    serve_sim: Callable[..., SimAdminClient], tmp_path: Path
) -> None:
    from tpuctl.backends.sim import SIM_CLIENTS
    from tpuctl.sim.iam import ADC_TOKEN

    admin = serve_sim({}, point_cli=False)
    closers: list[Callable[[], None]] = []
    cloud: Any = SimBackend(url=admin.base_url).open_cloud(tmp_path, closers)
    try:
        tpu, compute = cloud._tpu, cloud._compute
        assert tpu.endpoint == compute.endpoint == admin.base_url.rstrip("/")
        assert tpu._config is SIM_CLIENTS and compute._config is SIM_CLIENTS
        assert not SIM_CLIENTS.trust_env
        for quotas in (tpu._quotas, compute._quotas):
            assert quotas.base_url == admin.base_url.rstrip("/") and quotas._trust_env is False
            assert quotas._auth_headers() == {"authorization": f"Bearer {ADC_TOKEN}"}
        assert cloud.backend == "sim"
    finally:
        cloud.close()


def test_google_without_adc_fails_when_the_session_opens_with_the_login_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    from tpuctl.errors import UnauthenticatedError

    def no_adc(**_: Any) -> Any:
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_adc)
    with pytest.raises(UnauthenticatedError) as err:
        GcpBackend(project="p").open_cloud(tmp_path, [])
    assert err.value.fix == "gcloud auth application-default login"


def test_google_images_have_their_ubuntus_python_and_simulated_ones_this_interpreters() -> None:
    import sys

    from tpuctl.hosts.pythons import ImagePython

    google = GcpBackend(project="p")
    assert google.image_python("v2-alpha-tpuv5-lite") == ImagePython("3.10", downloads=True)
    assert google.image_python("ubuntu-accel-2404-amd64-tpu-tpu7x") == ImagePython("3.12", downloads=True)
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    # Every simulated image is a venv of the simulator's interpreter, whatever its name; its hosts never
    # download a Python. A simulator serving at a URL may run another interpreter: not known.
    assert SimBackend().image_python("v2-alpha-tpuv5-lite") == ImagePython(this, downloads=False)
    assert SimBackend(url="http://127.0.0.1:1").image_python("x") == ImagePython(None, downloads=False)


def test_a_client_with_a_state_dir_of_its_own_reaches_a_served_simulators_storage(
    serve_sim: Callable[..., SimAdminClient], tmp_path: Path
) -> None:
    from tpuctl.backends.sim import SIM_BUCKET
    from tpuctl.sim.network import STORAGE_PORT
    from tpuctl.sim.vms.layout import services_address

    admin = serve_sim({}, point_cli=False)
    served = admin.status()["storage_url"]
    elsewhere = tmp_path / "team-server"  # not the simulator's state dir: its address is another
    assert served != f"http://{services_address(elsewhere)}:{STORAGE_PORT}"
    closers: list[Callable[[], None]] = []
    try:
        buckets = SimBackend(url=admin.base_url).open_buckets(elsewhere, closers)
        assert buckets.base_url == served
        assert buckets.location(SIM_BUCKET).location  # answered by the simulator's storage
    finally:
        for close in reversed(closers):
            close()
