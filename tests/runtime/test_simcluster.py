"""The simulated slice as JAX's GCE TPU cluster sees a real one: from each host's metadata server.

A tiny metadata server per test (tests/runtime/metadata_server.py: loopback, standard paths, 403 without
Metadata-Flavor) stands in for the simulator's; the detector must find the coordinator (host 0's endpoint
address + TPUCTL_COORDINATOR_PORT), the process id (agent-worker-number) and count (the endpoints).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.runtime import simcluster
from tpuctl.runtime.hostenv import sim_host_env
from tpuctl.testing.metadata_server import MetadataServer, slice_values

REPO = Path(__file__).resolve().parents[2]
ADDRESSES = ["127.16.0.2", "127.16.0.3", "127.16.0.4", "127.16.0.5"]

DETECT = (
    "import os; from jax._src.clusters import ClusterEnv as C; "
    "print(C.auto_detect_unset_distributed_params(None, None, None, None, None, 10)); "
    "print(os.environ.get('JAX_COORDINATOR_BIND_ADDRESS'))"
)


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    s = MetadataServer(slice_values(2, ADDRESSES))
    try:
        yield s
    finally:
        s.close()


def _env(server: MetadataServer, **extra: str) -> dict[str, str]:
    env = sim_host_env("r", 2, 4, 2, 23456, "v5litepod-16", "4x4", "/ck", 0, REPO, metadata_host=server.host)
    env.update(extra)
    return env


def test_endpoints_parse_as_jax_parses_them() -> None:
    assert simcluster.worker_addresses("unknown:unknown:127.16.0.2,unknown:unknown:127.16.0.3") == [
        "127.16.0.2",
        "127.16.0.3",
    ]
    assert simcluster.worker_addresses("t1v-n-0,t1v-n-1") == ["t1v-n-0", "t1v-n-1"]  # the new format
    with pytest.raises(RuntimeError, match="a:b"):
        simcluster.worker_addresses("a:b")


def test_coordinator_is_host_0_at_the_backends_port(
    server: MetadataServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", server.host)
    monkeypatch.setenv("TPUCTL_COORDINATOR_PORT", "23456")
    monkeypatch.delenv("TPUCTL_COORDINATOR_ADDRESS", raising=False)
    assert simcluster.coordinator_address() == "127.16.0.2:23456"
    assert simcluster.coordinator_address("9999") == "127.16.0.2:9999"  # JAX_COORDINATOR_PORT wins
    assert simcluster.attribute("agent-worker-number") == "2"
    assert all(flavor == "Google" for _, _, flavor in server.requests)
    monkeypatch.delenv("TPUCTL_COORDINATOR_PORT")
    assert simcluster.coordinator_address() == "127.16.0.2:8482"  # JAX's own TPU port
    monkeypatch.setenv("TPUCTL_COORDINATOR_ADDRESS", "127.16.0.9:7777")
    assert simcluster.coordinator_address() == "127.16.0.9:7777"


def test_a_missing_server_is_named_after_jaxs_tries(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = MetadataServer()
    host = gone.host
    gone.close()
    monkeypatch.setenv("GCE_METADATA_HOST", host)
    sleeps: list[float] = []
    with pytest.raises(RuntimeError, match=f"{host}.*agent-worker-number in 6 tries"):
        simcluster.attribute("agent-worker-number", sleep=sleeps.append)
    assert sleeps == [0.5] * 5


def test_detector_reads_the_metadata_server(run_py: Callable[..., Any], server: MetadataServer) -> None:
    p = run_py(["-c", DETECT], env=_env(server), timeout=60)
    assert p.returncode == 0, p.describe()
    assert p.stdout.split("\n")[:2] == ["('127.16.0.2:23456', 4, 2, None)", "127.16.0.2:23456"]
    paths = {path for path, _, _ in server.requests}
    assert paths == {
        "/computeMetadata/v1/instance/attributes/agent-worker-number",
        "/computeMetadata/v1/instance/attributes/worker-network-endpoints",
    }


def test_coordinator_address_env_still_overrides(run_py: Callable[..., Any], server: MetadataServer) -> None:
    env = _env(server, TPUCTL_COORDINATOR_ADDRESS="127.0.0.1:4444", JAX_COORDINATOR_BIND_ADDRESS="[::]:4444")
    p = run_py(["-c", DETECT], env=env, timeout=60)
    assert p.returncode == 0, p.describe()
    assert p.stdout.split("\n")[:2] == ["('127.0.0.1:4444', 4, 2, None)", "[::]:4444"]


class _VpcServer(MetadataServer):
    """A metadata server that is also the simulated VPC's name service (as the simulator's is), knowing
    ``names``; any other name is NXDOMAIN."""

    def __init__(self, values: dict[str, str], names: dict[str, str]) -> None:
        super().__init__(values)
        self.names = names

    def answer(self, raw_path: str, flavor: str | None) -> tuple[int, str, str | None]:
        if not raw_path.startswith(simcluster.RESOLVE_PATH):
            return super().answer(raw_path, flavor)
        self.requests.append((raw_path, {}, flavor))
        name = raw_path[len(simcluster.RESOLVE_PATH) :]
        if flavor != "Google":
            return 403, "Missing required header: Metadata-Flavor", None
        if name in self.names:
            return 200, self.names[name] + "\n", None
        return 404, f"NXDOMAIN: {name!r} does not resolve from project 'p', zone 'z'", None


CE_NAMES = {"m-1abc": "127.16.0.2", "m-2def": "127.16.0.3"}


@pytest.fixture
def ce_server() -> Iterator[_VpcServer]:
    # Compute Engine's format: bare instance names (ce-tpu-facts §2.6).
    values = {**slice_values(1, []), "instance/attributes/worker-network-endpoints": "m-1abc,m-2def"}
    s = _VpcServer(values, CE_NAMES)
    try:
        yield s
    finally:
        s.close()


def test_instance_names_resolve_through_the_vpc_name_service(
    ce_server: _VpcServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", ce_server.host)
    monkeypatch.setenv("TPUCTL_COORDINATOR_PORT", "23456")
    monkeypatch.delenv("TPUCTL_COORDINATOR_ADDRESS", raising=False)
    assert simcluster.coordinator_address() == "127.16.0.2:23456"
    assert (simcluster.RESOLVE_PATH + "m-1abc", {}, "Google") in ce_server.requests
    # An IP literal is never looked up.
    before = len(ce_server.requests)
    assert simcluster.resolve("127.16.0.9") == "127.16.0.9" and simcluster.resolve("::1") == "::1"
    assert len(ce_server.requests) == before


def test_a_name_that_does_not_resolve_is_named(
    ce_server: _VpcServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", ce_server.host)
    ce_server.set("instance/attributes/worker-network-endpoints", "gone-0,m-2def")
    with pytest.raises(RuntimeError, match=r"worker address 'gone-0' does not resolve.*NXDOMAIN"):
        simcluster.coordinator_address()


def test_an_unreachable_name_service_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = MetadataServer()
    host = gone.host
    gone.close()
    monkeypatch.setenv("GCE_METADATA_HOST", host)
    sleeps: list[float] = []
    with pytest.raises(RuntimeError, match=f"name service of the metadata server at {host}.*'m-1abc' in 6"):
        simcluster.resolve("m-1abc", sleep=sleeps.append)
    assert sleeps == [0.5] * 5


def test_detector_hands_jax_an_address_on_a_compute_engine_slice(
    run_py: Callable[..., Any], ce_server: _VpcServer
) -> None:
    env = sim_host_env("r", 1, 2, 2, 23456, "tpu7x-16", "2x2x2", "/ck", 0, REPO, metadata_host=ce_server.host)
    p = run_py(["-c", DETECT], env=env, timeout=60)
    assert p.returncode == 0, p.describe()
    # JAX gets (and binds, on host 0) an address: gRPC would not resolve the instance name.
    assert p.stdout.split("\n")[:2] == ["('127.16.0.2:23456', 2, 1, None)", "127.16.0.2:23456"]


@pytest.fixture
def ce_server_without_worker_number(ce_server: _VpcServer) -> _VpcServer:
    # The stricter reading of ce-tpu-facts §8.1: a Compute Engine VM does not publish it.
    del ce_server.values["instance/attributes/agent-worker-number"]
    return ce_server


def test_without_agent_worker_number_jaxs_gke_variables_describe_the_slice(
    run_py: Callable[..., Any], ce_server_without_worker_number: _VpcServer
) -> None:
    server = ce_server_without_worker_number
    env = sim_host_env("r", 1, 2, 2, 23456, "tpu7x-16", "2x2x2", "/ck", 0, REPO, metadata_host=server.host)
    env.update(TPU_WORKER_ID="1", TPU_WORKER_HOSTNAMES="m-1abc,m-2def")
    p = run_py(["-c", DETECT], env=env, timeout=60)
    assert p.returncode == 0, p.describe()
    assert p.stdout.split("\n")[:2] == ["('127.16.0.2:23456', 2, 1, None)", "127.16.0.2:23456"]
    # JAX's GCE way was tried first, as long as JAX tries it (6 times), before the GKE way answered.
    asked = [path for path, _, _ in server.requests if path.endswith("/agent-worker-number")]
    assert len(asked) == 6


def test_without_either_the_slice_is_not_detected(
    ce_server_without_worker_number: _VpcServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", ce_server_without_worker_number.host)
    for name in (
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "TPU_PROCESS_ADDRESSES",
        "TPUCTL_COORDINATOR_ADDRESS",
    ):
        monkeypatch.delenv(name, raising=False)
    sleeps: list[float] = []
    assert simcluster.slice_workers(sleep=sleeps.append) is None
    assert sleeps == [0.5] * 5
    with pytest.raises(
        RuntimeError, match="publishes no agent-worker-number and neither TPU_PROCESS_ADDRESSES"
    ):
        simcluster.coordinator_address()
    # TPU_PROCESS_ADDRESSES wins over TPU_WORKER_HOSTNAMES, as in JAX; a port on an entry is not the host's.
    monkeypatch.setenv("TPU_WORKER_ID", "0")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "m-2def,m-1abc")
    monkeypatch.setenv("TPU_PROCESS_ADDRESSES", "m-1abc:8476,m-2def:8476")
    assert simcluster.slice_workers(sleep=sleeps.append) == (0, ["m-1abc", "m-2def"])
    monkeypatch.setenv("TPU_WORKER_ID", "")
    with pytest.raises(RuntimeError, match="TPU_WORKER_ID is '', not a number"):
        simcluster.slice_workers(sleep=sleeps.append)
