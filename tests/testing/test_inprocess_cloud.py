"""The in-process cloud: the real TpuApiCloud and quotas client over the simulator's route table, with a
fake clock. Nothing listens on a socket and nothing sleeps: every wait advances simulated time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import NodeRequest, QueuedResourceRequest, TpuCloud
from tpuctl.cloud.tpu_api import TpuApiCloud
from tpuctl.errors import NotFoundError
from tpuctl.sim.world import default_world
from tpuctl.testing.clock import FakeClock
from tpuctl.testing.cloud import InProcessSim

ZONE = "us-central1-a"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[InProcessSim]:
    # speed 1: simulated seconds are the fake clock's seconds.
    world = default_world().model_copy(update={"speed": 1.0})
    with InProcessSim(tmp_path / "state", world, clock=FakeClock()) as sim:
        yield sim


@pytest.fixture
def cloud(sim: InProcessSim) -> Iterator[TpuApiCloud]:
    with sim.cloud() as cloud:
        yield cloud


def node_request(name: str, capacity: CapacityType = CapacityType.ON_DEMAND) -> NodeRequest:
    return NodeRequest(
        name=name,
        zone=ZONE,
        accelerator_type="v5litepod-8",
        runtime_version="v2-alpha-tpuv5-lite",
        capacity=capacity,
        labels={"managed-by": "tpuctl"},
    )


def test_it_is_a_tpu_cloud_on_the_simulator(cloud: TpuApiCloud) -> None:
    conforms: TpuCloud = cloud
    assert conforms.backend == "sim"
    assert ZONE in cloud.list_zones()
    assert "v5litepod-8" in cloud.list_accelerator_types(ZONE)
    assert cloud.quota_limits(), "the quotas client answers through the route table too"


def test_create_list_get_delete_a_node_in_simulated_time(sim: InProcessSim, cloud: TpuApiCloud) -> None:
    started_real, started_sim = time.monotonic(), sim.clock.now()
    node = cloud.create_node(node_request("alpha"))
    assert node.state == "READY" and node.name == "alpha" and node.zone == ZONE
    # The wait for CREATING -> READY polled the operation and slept on the fake clock.
    assert sim.clock.now() - started_sim >= sim.world.durations.node_create_s
    assert [n.name for n in cloud.list_nodes(ZONE)] == ["alpha"]
    assert [n.name for n in cloud.list_nodes()] == ["alpha"]  # every zone
    got = cloud.get_node(ZONE, "alpha")
    assert got.accelerator_type == "v5litepod-8" and got.labels["managed-by"] == "tpuctl"

    cloud.delete_node(ZONE, "alpha")
    assert cloud.list_nodes(ZONE) == []
    with pytest.raises(NotFoundError):
        cloud.get_node(ZONE, "alpha")
    assert time.monotonic() - started_real < 30  # minutes of simulated time, no real waiting


def test_a_node_created_without_waiting_moves_when_the_clock_does(
    sim: InProcessSim, cloud: TpuApiCloud
) -> None:
    assert cloud.create_node(node_request("beta"), wait=False).state == "CREATING"
    sim.clock.advance(sim.world.durations.node_create_s - 1)
    assert cloud.get_node(ZONE, "beta").state == "CREATING"
    sim.clock.advance(1)
    assert cloud.get_node(ZONE, "beta").state == "READY"


def test_a_queued_resource_goes_through_its_states_as_the_clock_advances(
    sim: InProcessSim, cloud: TpuApiCloud
) -> None:
    sim.engine.set_stockout(ZONE)
    request = QueuedResourceRequest(id="qr", zone=ZONE, node=node_request("qr-node", CapacityType.SPOT))
    assert cloud.create_queued_resource(request).state in ("ACCEPTED", "WAITING_FOR_RESOURCES")
    sim.clock.advance(600)
    assert cloud.get_queued_resource(ZONE, "qr").state == "WAITING_FOR_RESOURCES"

    sim.engine.set_stockout(ZONE, clear=True)
    assert cloud.get_queued_resource(ZONE, "qr").state == "PROVISIONING"
    assert cloud.get_node(ZONE, "qr-node").state == "CREATING"
    provisioning_since = sim.clock.now()
    sim.clock.wait_for(lambda: cloud.get_queued_resource(ZONE, "qr").state == "ACTIVE", timeout=3600, step=5)
    assert sim.clock.now() - provisioning_since >= sim.world.durations.queued_provision_s
    assert cloud.get_node(ZONE, "qr-node").state == "READY"

    cloud.delete_queued_resource(ZONE, "qr", force=True)
    assert [q.id for q in cloud.list_queued_resources(ZONE)] == []
    assert cloud.list_nodes(ZONE) == []
