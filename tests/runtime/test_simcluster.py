"""The simulated slice as JAX's GCE TPU cluster sees a real one: from each host's metadata server.

A tiny metadata server per test (tests/runtime/metadata_server.py: loopback, standard paths, 403 without
Metadata-Flavor) stands in for the simulator's; the detector must find the coordinator (host 0's endpoint
address + TPUCTL_COORDINATOR_PORT), the process id (agent-worker-number) and count (the endpoints), and on
a multislice host JAX's BaseTpuCluster arithmetic over the MEGASCALE_* keys (env first, else tpu-env).
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
#: Slice 1 of a 2-slice job: its own 4 workers; process 0 is slice 0's worker 0 (ADDRESSES[0]).
SLICE_1 = ["127.16.0.6", "127.16.0.7", "127.16.0.8", "127.16.0.9"]
TPU_ENV = "ACCELERATOR_TYPE: 'v5litepod-16'\nTOPOLOGY: '4x4'\nWORKER_ID: '{w}'\nNUM_WORKERS: '4'\n"
MULTISLICE_TPU_ENV = TPU_ENV + (
    "MEGASCALE_COORDINATOR_ADDRESS: '{coordinator}'\nMEGASCALE_NUM_SLICES: '2'\n"
    "MEGASCALE_SLICE_ID: '1'\nMEGASCALE_PORT: '8080'\n"
)
TPU_ENV_PATH = "/computeMetadata/v1/instance/attributes/tpu-env"

DETECT = (
    "import os; from jax._src.clusters import ClusterEnv as C; "
    "print(C.auto_detect_unset_distributed_params(None, None, None, None, None, 10)); "
    "print(os.environ.get('JAX_COORDINATOR_BIND_ADDRESS'))"
)


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    # Every TPU VM publishes tpu-env; a single slice's has no MEGASCALE keys.
    s = MetadataServer({**slice_values(2, ADDRESSES), "instance/attributes/tpu-env": TPU_ENV.format(w=2)})
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
        TPU_ENV_PATH,  # JAX's BaseTpuCluster looks for the MEGASCALE keys there
    }
    assert [path for path, _, _ in server.requests].count(TPU_ENV_PATH) == 1


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
    # Compute Engine's format: bare instance names (docs/google-facts.md#metadata-server).
    values = {
        **slice_values(1, []),
        "instance/attributes/worker-network-endpoints": "m-1abc,m-2def",
        "instance/attributes/tpu-env": "TPU_ACCELERATOR_TYPE: 'tpu7x-16'\nTPU_WORKER_ID: '1'\n",
    }
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
    # The stricter reading of docs/google-facts.md#worker-identity: a Compute Engine VM does not publish it.
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


@pytest.fixture
def slice_1_server() -> Iterator[MetadataServer]:
    """Worker 1 of slice 1 of a 2 x v5litepod-16 multislice job, as the simulator publishes it."""
    values = {
        **slice_values(1, SLICE_1),
        "instance/attributes/tpu-env": MULTISLICE_TPU_ENV.format(w=1, coordinator=ADDRESSES[0]),
    }
    s = _VpcServer(values, {"slice-0-w-0": ADDRESSES[0]})
    try:
        yield s
    finally:
        s.close()


def _megascale_env_cleared(monkeypatch: pytest.MonkeyPatch, server: MetadataServer) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", server.host)
    monkeypatch.setenv("TPUCTL_COORDINATOR_PORT", "23456")
    for name in ("TPUCTL_COORDINATOR_ADDRESS", *simcluster._MEGASCALE_KEYS):
        monkeypatch.delenv(name, raising=False)


def test_tpu_env_parses_as_jax_parses_it() -> None:
    text = "A: 'x'\n B : 'y:z' \nno colon here\nA: 'later'\nEMPTY: ''\n"
    assert simcluster.parse_tpu_env(text) == {"A": "later", "B": "y:z", "EMPTY": ""}


def test_a_multislice_host_is_numbered_after_the_slices_before_it(
    run_py: Callable[..., Any], slice_1_server: MetadataServer
) -> None:
    env = sim_host_env(
        "r", 5, 8, 4, 23456, "v5litepod-16", "4x4", "/ck", 0, REPO, metadata_host=slice_1_server.host
    )
    p = run_py(["-c", DETECT], env=env, timeout=60)
    assert p.returncode == 0, p.describe()
    # (coordinator, process count, process id, local id): slice 0's worker 0 at the backend's port,
    # 4 workers x 2 slices, worker 1 + slice 1 x 4.
    assert p.stdout.split("\n")[:2] == ["('127.16.0.2:23456', 8, 5, None)", "127.16.0.2:23456"]
    asked = [path for path, _, _ in slice_1_server.requests]
    assert asked.count(TPU_ENV_PATH) == 1  # once per detection, though JAX reads three keys from it


def test_the_environment_wins_over_tpu_env_key_by_key(
    slice_1_server: MetadataServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _megascale_env_cleared(monkeypatch, slice_1_server)
    workers = (1, SLICE_1)
    found = simcluster.slices()
    assert found == simcluster.Slices(coordinator="127.16.0.2", num_slices=2, slice_id=1)
    assert (found.process_count(workers), found.process_id(workers)) == (8, 5)
    monkeypatch.setenv("MEGASCALE_SLICE_ID", "0")
    found = simcluster.slices()
    assert (found.num_slices, found.slice_id, found.process_id(workers)) == (2, 0, 1)
    # Set but empty is JAX's default (one slice), not a reason to look in tpu-env.
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "")
    assert simcluster.slices().process_count(workers) == 4
    # All three in the environment: tpu-env is not asked at all.
    monkeypatch.setenv("MEGASCALE_COORDINATOR_ADDRESS", "127.16.0.9")
    before = len(slice_1_server.requests)
    assert simcluster.slices() == simcluster.Slices(coordinator="127.16.0.9", num_slices=1, slice_id=0)
    assert len(slice_1_server.requests) == before
    assert simcluster.coordinator_address(workers=workers) == "127.16.0.9:23456"


def test_the_megascale_coordinator_is_a_host_resolved_as_workers_are(
    slice_1_server: MetadataServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _megascale_env_cleared(monkeypatch, slice_1_server)
    workers = (1, SLICE_1)
    # Without a MEGASCALE coordinator it is worker 0 of this host's own slice.
    assert simcluster.coordinator_address(workers=workers, found_slices=simcluster.Slices()) == (
        "127.16.0.6:23456"
    )
    # A port on it is dropped (JAX splits at ':'); the port is the backend's, or JAX's override.
    monkeypatch.setenv("MEGASCALE_COORDINATOR_ADDRESS", "slice-0-w-0:8080")
    assert simcluster.coordinator_address(workers=workers) == "127.16.0.2:23456"
    assert simcluster.coordinator_address("9999", workers) == "127.16.0.2:9999"
    monkeypatch.setenv("MEGASCALE_COORDINATOR_ADDRESS", "gone-0")
    with pytest.raises(RuntimeError, match="worker address 'gone-0' does not resolve"):
        simcluster.coordinator_address(workers=workers)


def test_a_slice_count_that_is_not_a_number_is_named(
    slice_1_server: MetadataServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _megascale_env_cleared(monkeypatch, slice_1_server)
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "two")
    with pytest.raises(RuntimeError, match="MEGASCALE_NUM_SLICES is 'two', not a number"):
        simcluster.slices()
