"""InstanceClient against the real simulator through the real google-cloud-compute client: the team
server's VM created from the plan's exact body, read, its host keys published, deleted; Google's refusals
translated at the boundary."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.backends.sim import SIM_CLIENTS
from tpuctl.cloud.instances import InstanceClient
from tpuctl.errors import CloudError, NotFoundError
from tpuctl.services.server_vm.plan import ServerVmSpec, instance_body
from tpuctl.sim.server import SimServer
from tpuctl.sim.world import default_world, world_from_data

ZONE = "us-east5-b"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimServer]:
    data = default_world().model_dump(mode="json")
    data["latency"] = {"base_ms": 0, "jitter_ms": 0, "spike_probability": 0, "spike_ms": 0}
    durations = {"compute_op_s": 1, "node_create_s": 6, "node_delete_s": 3}  # 0.1 s at speed 60
    data["durations"] = {**data.get("durations", {}), **durations}
    server = SimServer(tmp_path / "state", world_from_data(data, "test world"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def instances(sim: SimServer) -> Iterator[InstanceClient]:
    client = InstanceClient(project=sim.world.project, endpoint=sim.url, config=SIM_CLIENTS)
    yield client
    client.close()


def test_the_server_vm_is_created_read_and_deleted(instances: InstanceClient) -> None:
    spec = ServerVmSpec(project=instances.project, zone=ZONE, name="srv")
    vm = instances.create(ZONE, instance_body(spec), request_id="r-1")
    assert (vm.name, vm.zone, vm.status, vm.machine_type) == ("srv", ZONE, "RUNNING", "e2-small")
    assert vm.metadata["enable-oslogin"] == "TRUE" and vm.labels == {"tpuctl-server": "srv"}
    assert vm.address and vm.address in (vm.external_ip, vm.internal_ip)
    assert instances.get(ZONE, "srv") == vm
    instances.delete(ZONE, "srv")
    assert instances.find(ZONE, "srv") is None
    with pytest.raises(NotFoundError):
        instances.delete(ZONE, "srv")


def test_a_refused_body_is_an_error_naming_googles_reason(instances: InstanceClient) -> None:
    body = instance_body(ServerVmSpec(project=instances.project, zone=ZONE, name="srv"))
    body["scheduling"].update(provisioningModel="SPOT", automaticRestart=False)
    with pytest.raises(CloudError, match="preemptible be false when OnHostMaintenance"):
        instances.create(ZONE, body)
    assert instances.find(ZONE, "srv") is None
