"""Queued resources through the real client: waiting for capacity, becoming ACTIVE, failing at
valid-until, multislice, delete (with and without force), reset, requestId idempotency, quota."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2
from google.protobuf import duration_pb2
from sim_helpers import (
    FAST_POLLING,
    PARENT,
    PROJECT,
    ZONE,
    create_ready,
    make_world,
    node,
    spot_node,
    tpu_client,
)

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.testing.clock import FakeClock, wait_for

QR = tpu_v2.QueuedResource
QRState = tpu_v2.QueuedResourceState.State


def queued(
    node_id: str | None = "q-node",
    *,
    accelerator_type: str = "v5litepod-16",
    spot: bool = True,
    node_count: int = 0,
    prefix: str = "",
    valid_for_s: int = 0,
) -> tpu_v2.QueuedResource:
    spec: dict[str, Any] = {"parent": PARENT, "node": node(accelerator_type)}
    if node_count:
        spec["multislice_params"] = QR.Tpu.NodeSpec.MultisliceParams(
            node_count=node_count, node_id_prefix=prefix
        )
    else:
        spec["node_id"] = node_id
    fields: dict[str, Any] = {"tpu": QR.Tpu(node_spec=[QR.Tpu.NodeSpec(**spec)])}
    if spot:
        fields["spot"] = QR.Spot()
    else:
        fields["guaranteed"] = QR.Guaranteed()
    if valid_for_s:
        fields["queueing_policy"] = QR.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=valid_for_s)
        )
    return tpu_v2.QueuedResource(**fields)


def state_of(client: tpu_v2.TpuClient, qr_id: str) -> Any:
    return client.get_queued_resource(name=f"{PARENT}/queuedResources/{qr_id}").state.state


def test_waits_for_resources_then_becomes_active(client: tpu_v2.TpuClient) -> None:
    create_ready(client, "hog", spot_node("v5litepod-64"))  # the whole spot pool (64 chips)
    operation = client.create_queued_resource(
        parent=PARENT, queued_resource_id="qr1", queued_resource=queued()
    )
    created = operation.result(polling=FAST_POLLING)
    assert created.name == f"{PARENT}/queuedResources/qr1"
    assert operation.metadata.verb == "create"
    wait_for(lambda: state_of(client, "qr1") == QRState.WAITING_FOR_RESOURCES)
    qr = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr1")
    assert qr.state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE
    assert qr.spot is not None and "spot" in QR.pb(qr).WhichOneof("tier")

    client.delete_node(name=f"{PARENT}/nodes/hog").result(polling=FAST_POLLING)
    wait_for(lambda: state_of(client, "qr1") == QRState.ACTIVE)
    made = client.get_node(name=f"{PARENT}/nodes/q-node")
    assert made.state == tpu_v2.Node.State.READY
    assert made.queued_resource == f"{PARENT}/queuedResources/qr1"
    assert made.scheduling_config.spot
    assert not made.multislice_node
    listed = [q.name for q in client.list_queued_resources(parent=f"projects/{PROJECT}/locations/-")]
    assert listed == [f"{PARENT}/queuedResources/qr1"]


def test_fails_when_valid_until_passes(start_server: Callable[..., SimServer]) -> None:
    clock = FakeClock(time.time())
    server = start_server(make_world(), clock=clock, ticker_interval_s=0)
    client = tpu_client(server.url)
    with SimAdminClient(server.url) as admin:
        admin.stockout(ZONE)
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="qr2", queued_resource=queued(valid_for_s=600)
    )
    assert state_of(client, "qr2") == QRState.WAITING_FOR_RESOURCES
    clock.advance(599 / 1000)  # 599 simulated seconds at speed 1000
    assert state_of(client, "qr2") == QRState.WAITING_FOR_RESOURCES
    clock.advance(2 / 1000)
    qr = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr2")
    assert qr.state.state == QRState.FAILED
    assert qr.state.failed_data.error.code == 8
    assert "validUntil" in qr.state.failed_data.error.message
    assert list(client.list_nodes(parent=PARENT)) == []
    # A FAILED queued resource can be deleted without force.
    client.delete_queued_resource(name=f"{PARENT}/queuedResources/qr2").result(polling=FAST_POLLING)
    assert list(client.list_queued_resources(parent=PARENT)) == []


def test_a_queued_resource_is_looked_at_when_it_is_queued(start_server: Callable[..., SimServer]) -> None:
    """Where there is capacity when it is created (or reset), a queued resource starts provisioning then,
    not at the next request: that may come only after its validUntil, and it must not fail for that."""
    clock = FakeClock(time.time())
    server = start_server(make_world(), clock=clock, ticker_interval_s=0)
    client = tpu_client(server.url)
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="qr10", queued_resource=queued(valid_for_s=30)
    )
    clock.advance(31 / 1000)  # the next request comes after validUntil
    assert state_of(client, "qr10") == QRState.PROVISIONING  # its node is due 60 s after the create
    clock.advance(30 / 1000)
    assert state_of(client, "qr10") == QRState.ACTIVE

    # Reset starts a new validity window, and looks at once too.
    with SimAdminClient(server.url) as admin:
        admin.stockout(ZONE)
        client.create_queued_resource(
            parent=PARENT, queued_resource_id="qr11", queued_resource=queued("q-node-2", valid_for_s=30)
        )
        clock.advance(31 / 1000)
        assert state_of(client, "qr11") == QRState.FAILED
        admin.stockout(ZONE, clear=True)
    client.reset_queued_resource(name=f"{PARENT}/queuedResources/qr11")
    clock.advance(31 / 1000)
    assert state_of(client, "qr11") == QRState.PROVISIONING


def test_multislice_makes_n_nodes(client: tpu_v2.TpuClient) -> None:
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="ms", queued_resource=queued(node_count=2, prefix="slice")
    ).result(polling=FAST_POLLING)
    wait_for(lambda: state_of(client, "ms") == QRState.ACTIVE)
    nodes = {n.name.rsplit("/", 1)[-1]: n for n in client.list_nodes(parent=PARENT)}
    assert sorted(nodes) == ["slice-0", "slice-1"]
    for made in nodes.values():
        assert made.multislice_node
        assert made.queued_resource == f"{PARENT}/queuedResources/ms"
        assert made.state == tpu_v2.Node.State.READY
        assert len(made.network_endpoints) == 4


def test_multislice_prefix_defaults_to_the_queued_resource_id(client: tpu_v2.TpuClient) -> None:
    client.create_queued_resource(
        parent=PARENT,
        queued_resource_id="ms2",
        queued_resource=queued(node_count=2, accelerator_type="v5litepod-4"),
    )
    wait_for(lambda: state_of(client, "ms2") == QRState.ACTIVE)
    assert sorted(n.name.rsplit("/", 1)[-1] for n in client.list_nodes(parent=PARENT)) == ["ms2-0", "ms2-1"]


def test_multislice_needs_room_for_all_nodes(client: tpu_v2.TpuClient) -> None:
    create_ready(client, "half", spot_node("v5litepod-32"))
    client.create_queued_resource(
        parent=PARENT,
        queued_resource_id="big",
        queued_resource=queued(node_count=2, accelerator_type="v5litepod-32"),
    )
    wait_for(lambda: state_of(client, "big") == QRState.WAITING_FOR_RESOURCES)
    assert [n.name.rsplit("/", 1)[-1] for n in client.list_nodes(parent=PARENT)] == ["half"]


def test_delete_needs_force_while_nodes_exist(client: tpu_v2.TpuClient) -> None:
    client.create_queued_resource(parent=PARENT, queued_resource_id="qr3", queued_resource=queued(spot=False))
    wait_for(lambda: state_of(client, "qr3") == QRState.ACTIVE)
    with pytest.raises(exceptions.BadRequest) as info:
        client.delete_queued_resource(name=f"{PARENT}/queuedResources/qr3")
    assert "force" in info.value.message
    operation = client.delete_queued_resource(
        request={"name": f"{PARENT}/queuedResources/qr3", "force": True}
    )
    assert state_of(client, "qr3") == QRState.DELETING
    operation.result(polling=FAST_POLLING)
    assert list(client.list_queued_resources(parent=PARENT)) == []
    assert list(client.list_nodes(parent=PARENT)) == []


def test_delete_without_force_once_nodes_are_gone(client: tpu_v2.TpuClient) -> None:
    client.create_queued_resource(parent=PARENT, queued_resource_id="qr4", queued_resource=queued())
    wait_for(lambda: state_of(client, "qr4") == QRState.ACTIVE)
    client.delete_node(name=f"{PARENT}/nodes/q-node").result(polling=FAST_POLLING)
    client.delete_queued_resource(name=f"{PARENT}/queuedResources/qr4").result(polling=FAST_POLLING)
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=f"{PARENT}/queuedResources/qr4")


def test_request_id_makes_create_idempotent(client: tpu_v2.TpuClient) -> None:
    request = {
        "parent": PARENT,
        "queued_resource_id": "qr5",
        "queued_resource": queued(),
        "request_id": "5f0c1b2a-1111-4c3d-9e8f-000000000001",
    }
    first = client.create_queued_resource(request=request)
    second = client.create_queued_resource(request=request)
    assert first.operation.name == second.operation.name
    assert len(list(client.list_queued_resources(parent=PARENT))) == 1
    # Without the request id, the same name is a conflict.
    with pytest.raises(exceptions.Conflict):
        client.create_queued_resource(parent=PARENT, queued_resource_id="qr5", queued_resource=queued())


def test_reset_puts_a_suspended_queued_resource_back_in_the_queue(
    client: tpu_v2.TpuClient, admin: SimAdminClient
) -> None:
    client.create_queued_resource(parent=PARENT, queued_resource_id="qr6", queued_resource=queued())
    wait_for(lambda: state_of(client, "qr6") == QRState.ACTIVE)
    admin.preempt(ZONE, "q-node", notice=False)
    qr = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr6")
    assert qr.state.state == QRState.SUSPENDED
    assert qr.state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE
    assert client.get_node(name=f"{PARENT}/nodes/q-node").state == tpu_v2.Node.State.PREEMPTED
    # Reset is only for SUSPENDED or FAILED ones.
    reset = client.reset_queued_resource(name=f"{PARENT}/queuedResources/qr6").result(polling=FAST_POLLING)
    assert reset.name == f"{PARENT}/queuedResources/qr6"
    wait_for(lambda: state_of(client, "qr6") == QRState.ACTIVE)
    assert client.get_node(name=f"{PARENT}/nodes/q-node").state == tpu_v2.Node.State.READY
    with pytest.raises(exceptions.BadRequest):
        client.reset_queued_resource(name=f"{PARENT}/queuedResources/qr6")


def test_quota_is_checked_at_provisioning_and_held_while_failed(
    start_server: Callable[..., SimServer],
) -> None:
    server = start_server(
        make_world(quotas={"generations": {"v5e": {"preemptible": {"zone": 24, "region": 24}}}})
    )
    client = tpu_client(server.url)
    # Accepted although 2 x 16 chips exceed the 24-chip quota: quota is checked when provisioning.
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="qr7", queued_resource=queued(node_count=2, prefix="qq")
    ).result(polling=FAST_POLLING)
    wait_for(lambda: state_of(client, "qr7") == QRState.FAILED)
    qr = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr7")
    assert qr.state.failed_data.error.code == 8
    assert "TPUV5sPreemptibleLitepodPer" in qr.state.failed_data.error.message
    # With its QuotaFailure, as the synchronous 429 carries it (a client reads the quota from it).
    [detail] = qr.state.failed_data.error.details
    assert detail.type_url == "type.googleapis.com/google.rpc.QuotaFailure"
    # A FAILED queued resource keeps its quota until deleted (GCP behaviour). A multi-host shape: a
    # single-host v5e draws on the serving family instead.
    with pytest.raises(exceptions.TooManyRequests):
        client.create_node(parent=PARENT, node_id="n", node=spot_node("v5litepod-16"))
    client.delete_queued_resource(name=f"{PARENT}/queuedResources/qr7").result(polling=FAST_POLLING)
    create_ready(client, "n", spot_node("v5litepod-16"))


def test_invalid_queued_resources(client: tpu_v2.TpuClient) -> None:
    with pytest.raises(exceptions.BadRequest, match="queuedResourceId"):
        client.create_queued_resource(parent=PARENT, queued_resource_id="Bad", queued_resource=queued())
    with pytest.raises(exceptions.BadRequest, match="nodeCount"):
        bad = queued(node_count=1, prefix="x")
        client.create_queued_resource(parent=PARENT, queued_resource_id="one", queued_resource=bad)
    with pytest.raises(exceptions.BadRequest, match="nodeSpec"):
        client.create_queued_resource(
            parent=PARENT, queued_resource_id="empty", queued_resource=tpu_v2.QueuedResource(spot=QR.Spot())
        )
    assert list(client.list_queued_resources(parent=PARENT)) == []


def test_deleting_a_node_while_provisioning_fails_the_queued_resource(
    start_server: Callable[..., SimServer],
) -> None:
    server = start_server(make_world(durations={"queued_provision_s": 5000}))
    client = tpu_client(server.url)
    client.create_queued_resource(parent=PARENT, queued_resource_id="qr8", queued_resource=queued())
    wait_for(lambda: state_of(client, "qr8") == QRState.PROVISIONING)
    assert client.get_node(name=f"{PARENT}/nodes/q-node").state == tpu_v2.Node.State.CREATING
    client.delete_node(name=f"{PARENT}/nodes/q-node").result(polling=FAST_POLLING)
    qr = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr8")
    assert qr.state.state == QRState.FAILED
    assert qr.state.failed_data.error.code == 10  # ABORTED


def test_preempted_spot_queued_resource_goes_suspending_then_suspended(
    start_server: Callable[..., SimServer],
) -> None:
    server = start_server(make_world(durations={"preemption_grace_s": 1}))  # 1 real second of grace
    client = tpu_client(server.url)
    client.create_queued_resource(parent=PARENT, queued_resource_id="qr9", queued_resource=queued())
    wait_for(lambda: state_of(client, "qr9") == QRState.ACTIVE)
    with SimAdminClient(server.url) as admin:
        admin.preempt(ZONE, "q-node", notice=True)
        qr = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr9")
        assert qr.state.state == QRState.SUSPENDING
        assert qr.state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE
        assert admin.metadata(ZONE, "q-node", 0) == "TRUE"
    wait_for(lambda: state_of(client, "qr9") == QRState.SUSPENDED)
    assert client.get_node(name=f"{PARENT}/nodes/q-node").state == tpu_v2.Node.State.PREEMPTED
