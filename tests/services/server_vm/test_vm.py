"""server up's bookkeeping around the VM, with a recording Compute Engine: a VM that exists is never
taken over; a VM created by an up that then fails is deleted, and the error is the failure's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from tpuctl.backends.base import HostAddress, Timekeeping
from tpuctl.backends.sim import SIM_TUNING
from tpuctl.cloud.instances import VmInstance, vm_of
from tpuctl.errors import RunFailedError, UsageError
from tpuctl.services.server_vm.plan import ServerVmSpec, instance_body
from tpuctl.services.server_vm.vm import server_up
from tpuctl.services.server_vm.wheel import ServerWheel
from tpuctl.testing.clock import FakeClock

if TYPE_CHECKING:
    from tpuctl.services.session import Session

ZONE = "us-central1-a"


class RecordingInstances:
    """Compute Engine's instances, in memory; its VMs publish no host keys (a guest agent that never
    started)."""

    def __init__(self) -> None:
        self.vms: dict[str, VmInstance] = {}
        self.calls: list[str] = []

    def find(self, zone: str, name: str) -> VmInstance | None:
        return self.vms.get(name)

    def get(self, zone: str, name: str) -> VmInstance:
        return self.vms[name]

    def create(self, zone: str, body: Mapping[str, Any], *, request_id: str | None = None) -> VmInstance:
        self.calls.append(f"create {body['name']}")
        nic = {"networkIP": "10.0.0.2"}
        vm = vm_of({**body, "status": "RUNNING", "networkInterfaces": [nic]}, zone)
        self.vms[vm.name] = vm
        return vm

    def delete(self, zone: str, name: str) -> None:
        self.calls.append(f"delete {name}")
        del self.vms[name]

    def host_keys(self, zone: str, name: str) -> tuple[str, ...]:
        return ()


def _session(tmp_path: Path, instances: RecordingInstances) -> Session:
    clock = FakeClock()
    account = SimpleNamespace(username="me_example_com")
    access = SimpleNamespace(authorize_key=lambda *a, **k: account, caller=lambda: "me@example.com")
    backend = SimpleNamespace(
        open_instances=lambda cloud, closers: instances,
        instance_address=lambda cloud, vm: HostAddress(vm.address or "", 22),
        timekeeping=Timekeeping(clock=clock.now, monotonic=clock.now, sleep=clock.sleep),
        tuning=SIM_TUNING,
    )
    session = SimpleNamespace(
        backend=backend,
        cloud=None,
        state_dir=tmp_path,
        project="p",
        clock=clock.now,
        settings=SimpleNamespace(os_login_key_ttl=3600.0),
        os_login=lambda: access,
    )
    return cast("Session", session)


def _wheel(tmp_path: Path) -> ServerWheel:
    return ServerWheel(tmp_path / "tpuctl.whl", "")


def test_a_vm_created_by_a_failed_up_is_deleted(tmp_path: Path) -> None:
    instances = RecordingInstances()
    said: list[str] = []
    spec = ServerVmSpec(project="p", zone=ZONE, name="srv", bucket="b")
    with pytest.raises(RunFailedError, match="published no SSH host keys"):
        server_up(_session(tmp_path, instances), spec, _wheel(tmp_path), say=said.append)
    assert instances.calls == ["create srv", "delete srv"] and instances.vms == {}
    assert any("deleting VM srv, which it created" in line for line in said), said


def test_an_existing_vm_is_never_taken_over(tmp_path: Path) -> None:
    instances = RecordingInstances()
    spec = ServerVmSpec(project="p", zone=ZONE, name="srv", bucket="b")
    instances.vms["srv"] = vm_of(instance_body(spec), ZONE)
    with pytest.raises(UsageError, match="already exists") as raised:
        server_up(_session(tmp_path, instances), spec, _wheel(tmp_path), say=lambda line: None)
    assert raised.value.fix is not None and "server status" in raised.value.fix
    assert instances.calls == [] and "srv" in instances.vms
