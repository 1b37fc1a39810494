"""The simulator backend on a simulated VM (the team server's): its clients call as the VM's service
account, with the token google-auth's Compute Engine credentials take from the VM's metadata server, as a
tpuctl on a Google VM does; never as the laptop's simulated ADC. The simulator's IAM then decides."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tpuctl.backends import open_backend
from tpuctl.backends.sim import SIM_CLIENTS, SIM_VM_CLIENTS, SimBackend
from tpuctl.errors import PermissionDeniedError
from tpuctl.hosts.ssh import ensure_key_pair
from tpuctl.settings import load_settings
from tpuctl.sim import SimServer
from tpuctl.sim.iam import ADC_TOKEN, default_service_account
from tpuctl.sim.vms.metadata_http import MetadataServer
from tpuctl.sim.world import World, world_from_data

PROJECT = "tpuctl-sim"
ZONE = "us-central1-a"
VM_ACCOUNT = default_service_account(PROJECT)
NODES = f"/v2/projects/{PROJECT}/locations/{ZONE}/nodes"


def _world(iam: dict[str, Any] | None = None) -> World:
    data = {
        "zones": {ZONE: {"v5e": {"on_demand": 8}}},
        "quotas": {"default": {"on_demand": {"zone": -1, "region": -1}}},
        "latency": {"base_ms": 0, "jitter_ms": 0},
        "iam": iam,
    }
    return world_from_data(data, "test world")


@contextmanager
def _on_a_vm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: World) -> Iterator[SimServer]:
    """A simulator with one node whose host's metadata server google-auth is pointed at, as the
    simulated VM's GCE_METADATA_HOST points it (read by google-auth when it is imported, so set on the
    module here); no VM is served (the host's processes are not needed)."""
    from google.auth.compute_engine import _metadata

    server = SimServer(tmp_path / "sim", world, network_env={}, ticker_interval_s=0)
    url = server.start()
    metadata: MetadataServer | None = None
    try:
        made = httpx.post(
            f"{url}{NODES}?nodeId=vm",
            json={"acceleratorType": "v5litepod-8", "runtimeVersion": "v2-alpha-tpuv5-lite"},
            headers={"Authorization": f"Bearer {ADC_TOKEN}"},  # created by the laptop's user
        )
        assert made.status_code == 200, made.text
        metadata = MetadataServer(("127.0.0.1", 0), server.engine, lambda _address: (PROJECT, ZONE, "vm", 0))
        metadata.start()
        monkeypatch.setattr(_metadata, "_GCE_METADATA_HOST", f"127.0.0.1:{metadata.server_address[1]}")
        yield server
    finally:
        if metadata is not None:
            metadata.stop()
        server.stop()


def test_the_settings_say_a_tpuctl_is_on_a_simulated_vm_from_its_login_environment(
    monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    laptop = open_backend(load_settings({"backend": "sim", "state_dir": state_dir}))
    monkeypatch.setenv("TPUCTL_SIM_VM", "1234/0")  # what every login on a simulated VM has
    on_vm = open_backend(load_settings({"backend": "sim", "state_dir": state_dir}))
    assert isinstance(laptop, SimBackend) and isinstance(on_vm, SimBackend)
    assert (laptop.on_vm, on_vm.on_vm) == (False, True)
    assert (laptop.clients, on_vm.clients) == (SIM_CLIENTS, SIM_VM_CLIENTS)


def test_on_a_vm_the_backend_calls_as_the_vms_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closers: list[Callable[[], None]] = []
    with _on_a_vm(tmp_path, monkeypatch, _world()) as server:
        backend = SimBackend(url=server.url, on_vm=True)
        cloud = backend.open_cloud(tmp_path / "server-state", closers)
        try:
            assert [n.name for n in cloud.list_nodes(ZONE)] == ["vm"]
            # OS Login: the VM's account, named by its own credentials, imports the key into its own
            # profile (what the server does before it logs in to a run's hosts).
            os_login = backend.open_os_login(cloud, closers)
            assert os_login.caller() == VM_ACCOUNT
            key = ensure_key_pair(tmp_path / "keys")
            os_login.authorize_key(PROJECT, key.public_openssh, expires_at=time.time() + 600)
        finally:
            for close in reversed(closers):
                close()
        imports = [m for m in server.engine.mutations if m["path"].endswith(":importSshPublicKey")]
        assert [m["caller"] for m in imports] == [VM_ACCOUNT]  # as the simulator's IAM saw it


def test_a_vm_account_the_project_grants_nothing_is_refused_naming_the_permission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The laptop's user is the project's owner; the VM's account has no role: what the VM's tpuctl may
    do is its account's, not the user's who created the VM."""
    owner_only = {PROJECT: [{"role": "roles/owner", "members": ["user:sim-user@example.com"]}]}
    closers: list[Callable[[], None]] = []
    with _on_a_vm(tmp_path, monkeypatch, _world(owner_only)) as server:
        cloud = SimBackend(url=server.url, on_vm=True).open_cloud(tmp_path / "server-state", closers)
        try:
            with pytest.raises(PermissionDeniedError) as denied:
                cloud.list_nodes(ZONE)
            assert "tpu.nodes.list" in str(denied.value)
        finally:
            for close in reversed(closers):
                close()
