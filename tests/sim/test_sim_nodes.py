"""Nodes, operations, catalog-like resources and errors, driven through the REAL google-cloud-tpu client
(tpu_v2, REST transport) against the simulator."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import cast

import httpx
import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2
from google.protobuf import field_mask_pb2
from sim_helpers import (
    AUTH,
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

from tpuctl.sim import SimServer
from tpuctl.sim.wire import ACCELERATOR_TYPE_ENUM
from tpuctl.testing.clock import FakeClock, wait_for


def test_accelerator_type_enum_numbers_match_the_client() -> None:
    # The REST transport sends enums as numbers; the simulator's table must be the client's.
    # A proto-plus enum is an IntEnum whose stubs show it to mypy as a constructor only.
    accelerator_types = cast(type[enum.IntEnum], tpu_v2.AcceleratorConfig.Type)
    for number, name in ACCELERATOR_TYPE_ENUM.items():
        assert accelerator_types[name].value == number
    names = {t.name for t in accelerator_types} - {"TYPE_UNSPECIFIED"}
    assert names == set(ACCELERATOR_TYPE_ENUM.values())


def test_create_get_list_delete_node(start_server: Callable[..., SimServer]) -> None:
    # Time moves only when the test says so, to see CREATING and DELETING between requests.
    clock = FakeClock(time.time())
    server = start_server(make_world(), clock=clock, ticker_interval_s=0)
    client = tpu_client(server.url)
    operation = client.create_node(
        parent=PARENT,
        node_id="pod-a",
        node=node("v5litepod-16", labels={"team": "ml", "managed-by": "tpuctl"}, metadata={"k": "v"}),
    )
    # The LRO is pending at first: the node is CREATING.
    assert not operation.done()  # done() asks the server again
    assert operation.metadata.verb == "create"
    assert operation.metadata.target == f"{PARENT}/nodes/pod-a"
    assert operation.metadata.api_version == "v2"
    creating = client.get_node(name=f"{PARENT}/nodes/pod-a")
    assert creating.state == tpu_v2.Node.State.CREATING
    clock.advance(0.12)  # 120 simulated seconds

    ready = operation.result(polling=FAST_POLLING)
    assert ready.name == f"{PARENT}/nodes/pod-a"
    assert ready.state == tpu_v2.Node.State.READY
    assert ready.health == tpu_v2.Node.Health.HEALTHY
    assert ready.accelerator_type == "v5litepod-16"
    assert ready.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V5LITE_POD
    assert ready.accelerator_config.topology == "4x4"
    assert len(ready.network_endpoints) == 4  # 16 chips, 4 per host
    # Each host its own loopback address (127.x.y.z, x >= 16), the TPU runtime's port.
    addresses = [e.ip_address for e in ready.network_endpoints]
    assert len(set(addresses)) == 4 and all(
        a.startswith("127.") and int(a.split(".")[1]) >= 16 for a in addresses
    )
    assert {e.port for e in ready.network_endpoints} == {8470}
    assert dict(ready.labels) == {"team": "ml", "managed-by": "tpuctl"}
    assert dict(ready.metadata) == {"k": "v"}
    assert ready.api_version == tpu_v2.Node.ApiVersion.V2
    assert ready.id > 0
    assert ready.create_time.timestamp() > 0
    assert ready.runtime_version == "v2-alpha-tpuv5-lite"
    assert operation.metadata.end_time.timestamp() >= operation.metadata.create_time.timestamp()

    got = client.get_node(name=f"{PARENT}/nodes/pod-a")
    assert got.state == tpu_v2.Node.State.READY and got.id == ready.id
    assert [n.name for n in client.list_nodes(parent=PARENT)] == [f"{PARENT}/nodes/pod-a"]

    delete = client.delete_node(name=f"{PARENT}/nodes/pod-a")
    assert client.get_node(name=f"{PARENT}/nodes/pod-a").state == tpu_v2.Node.State.DELETING
    clock.advance(0.03)
    delete.result(polling=FAST_POLLING)  # google.protobuf.Empty
    assert delete.metadata.verb == "delete"
    assert list(client.list_nodes(parent=PARENT)) == []
    with pytest.raises(exceptions.NotFound) as info:
        client.get_node(name=f"{PARENT}/nodes/pod-a")
    assert info.value.message.endswith(f"Resource '{PARENT}/nodes/pod-a' was not found")


def test_v5e_64_has_16_endpoints_and_topology_8x8(client: tpu_v2.TpuClient) -> None:
    ready = create_ready(client, "big", node("v5litepod-64"))
    assert ready.accelerator_config.topology == "8x8"
    assert len(ready.network_endpoints) == 16


def test_accelerator_config_instead_of_type(client: tpu_v2.TpuClient) -> None:
    body = tpu_v2.Node(
        accelerator_config=tpu_v2.AcceleratorConfig(
            type_=tpu_v2.AcceleratorConfig.Type.V5P, topology="2x2x2"
        ),
        runtime_version="v2-alpha-tpuv5",
    )
    ready = create_ready(client, "by-config", body)
    assert ready.accelerator_type == "v5p-16"
    assert len(ready.network_endpoints) == 2


def test_list_all_zones_and_pagination(client: tpu_v2.TpuClient) -> None:
    for i in range(3):
        client.create_node(parent=PARENT, node_id=f"n{i}", node=node())
    client.create_node(parent=f"projects/{PROJECT}/locations/us-east5-b", node_id="east", node=node()).result(
        polling=FAST_POLLING
    )
    all_names = [
        n.name.rsplit("/", 1)[-1] for n in client.list_nodes(parent=f"projects/{PROJECT}/locations/-")
    ]
    assert sorted(all_names) == ["east", "n0", "n1", "n2"]
    pager = client.list_nodes(request={"parent": PARENT, "page_size": 2})
    pages = list(pager.pages)
    assert [len(p.nodes) for p in pages] == [2, 1]
    assert pages[0].next_page_token and not pages[1].next_page_token
    assert list(pages[0].unreachable) == []


def test_stop_and_start_single_host_node(client: tpu_v2.TpuClient) -> None:
    create_ready(client, "small", node("v5litepod-8"))
    stopped = client.stop_node(request={"name": f"{PARENT}/nodes/small"}).result(polling=FAST_POLLING)
    assert stopped.state == tpu_v2.Node.State.STOPPED
    started = client.start_node(request={"name": f"{PARENT}/nodes/small"}).result(polling=FAST_POLLING)
    assert started.state == tpu_v2.Node.State.READY
    # Start again while READY: a precondition error (HTTP 400).
    with pytest.raises(exceptions.BadRequest, match="only when it is STOPPED"):
        client.start_node(request={"name": f"{PARENT}/nodes/small"})


def test_stop_multi_host_node_is_refused(client: tpu_v2.TpuClient) -> None:
    create_ready(client, "pod", node("v5litepod-16"))
    with pytest.raises(exceptions.BadRequest, match="multi-host"):
        client.stop_node(request={"name": f"{PARENT}/nodes/pod"})


def test_update_node_labels(client: tpu_v2.TpuClient) -> None:
    create_ready(client, "upd", node(labels={"a": "1"}))
    op = client.update_node(
        node=tpu_v2.Node(name=f"{PARENT}/nodes/upd", labels={"b": "2"}),
        update_mask=field_mask_pb2.FieldMask(paths=["labels"]),
    )
    assert dict(op.result(polling=FAST_POLLING).labels) == {"b": "2"}
    assert dict(client.get_node(name=f"{PARENT}/nodes/upd").labels) == {"b": "2"}


@pytest.mark.parametrize(
    ("node_id", "body", "field"),
    [
        ("Bad_Name", node(), "nodeId"),
        ("x" * 64, node(), "nodeId"),
        ("ends-with-dash-", node(), "nodeId"),
        ("ok", node(labels={"Team": "x"}), "node.labels"),
        ("ok", node(labels={"team": "Has Space"}), "node.labels"),
        ("ok", node("v5litepod-12"), "node.acceleratorType"),
        ("ok", node("v6e-8"), "node.acceleratorType"),  # v6e is not offered in us-central1-a here
        ("ok", tpu_v2.Node(accelerator_type="v5litepod-8"), "node.runtimeVersion"),
    ],
)
def test_invalid_create_is_400_naming_the_field(
    client: tpu_v2.TpuClient, node_id: str, body: tpu_v2.Node, field: str
) -> None:
    with pytest.raises(exceptions.BadRequest) as info:
        client.create_node(parent=PARENT, node_id=node_id, node=body)
    violations = [v for d in info.value.details for v in d.get("fieldViolations", [])]
    assert violations and violations[0]["field"].startswith(field)
    assert list(client.list_nodes(parent=PARENT)) == []


def test_existing_name_is_409(client: tpu_v2.TpuClient) -> None:
    client.create_node(parent=PARENT, node_id="dup", node=node())
    with pytest.raises(exceptions.Conflict) as info:
        client.create_node(parent=PARENT, node_id="dup", node=node())
    assert info.value.message.endswith(f"Resource '{PARENT}/nodes/dup' already exists")


def test_delete_twice_returns_the_same_operation(start_server: Callable[..., SimServer]) -> None:
    clock = FakeClock(time.time())
    client = tpu_client(start_server(make_world(), clock=clock, ticker_interval_s=0).url)
    client.create_node(parent=PARENT, node_id="del", node=node())
    clock.advance(0.12)
    first = client.delete_node(name=f"{PARENT}/nodes/del")
    second = client.delete_node(name=f"{PARENT}/nodes/del")
    assert first.operation.name == second.operation.name
    clock.advance(0.03)
    first.result(polling=FAST_POLLING)
    with pytest.raises(exceptions.NotFound):
        client.delete_node(name=f"{PARENT}/nodes/del")


def test_delete_while_creating_aborts_the_create(start_server: Callable[..., SimServer]) -> None:
    clock = FakeClock(time.time())
    client = tpu_client(start_server(make_world(), clock=clock, ticker_interval_s=0).url)
    create = client.create_node(parent=PARENT, node_id="early", node=node())
    delete = client.delete_node(name=f"{PARENT}/nodes/early")
    clock.advance(0.2)
    delete.result(polling=FAST_POLLING)
    with pytest.raises(exceptions.GoogleAPICallError) as info:
        create.result(polling=FAST_POLLING)
    assert info.value.code == 409  # ABORTED
    assert list(client.list_nodes(parent=PARENT)) == []


def test_operations_get_and_list(client: tpu_v2.TpuClient) -> None:
    op = client.create_node(parent=PARENT, node_id="o1", node=node())
    op.result(polling=FAST_POLLING)
    got = client.get_operation(request={"name": op.operation.name})
    assert got.done and got.name.startswith(f"{PARENT}/operations/operation-")
    assert got.response.type_url == "type.googleapis.com/google.cloud.tpu.v2.Node"
    listed = client.list_operations(request={"name": PARENT})
    assert op.operation.name in [o.name for o in listed.operations]
    everywhere = client.list_operations(request={"name": f"projects/{PROJECT}/locations/-"})
    assert op.operation.name in [o.name for o in everywhere.operations]
    with pytest.raises(exceptions.NotFound):
        client.get_operation(request={"name": f"{PARENT}/operations/operation-0-nope"})


def test_operation_json_shape(server: SimServer, client: tpu_v2.TpuClient) -> None:
    op = client.create_node(parent=PARENT, node_id="shape", node=node())
    op.result(polling=FAST_POLLING)
    raw = httpx.get(f"{server.url}/v2/{op.operation.name}", headers=AUTH).json()
    assert raw["done"] is True
    assert raw["metadata"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
    assert raw["metadata"]["apiVersion"] == "v2" and raw["metadata"]["verb"] == "create"
    assert raw["metadata"]["createTime"].endswith("Z") and raw["metadata"]["endTime"].endswith("Z")
    assert raw["response"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.Node"
    assert raw["response"]["state"] == "READY"  # enum NAMES, as Google's JSON
    delete = client.delete_node(name=f"{PARENT}/nodes/shape")
    delete.result(polling=FAST_POLLING)
    raw = httpx.get(f"{server.url}/v2/{delete.operation.name}", headers=AUTH).json()
    assert raw["response"] == {"@type": "type.googleapis.com/google.protobuf.Empty"}


def test_accelerator_types_runtime_versions_locations(client: tpu_v2.TpuClient) -> None:
    types = list(client.list_accelerator_types(parent=PARENT))
    names = {t.type_ for t in types}
    assert {"v5litepod-64", "v5p-8"} <= names and not any(n.startswith("v6e") for n in names)
    v5e64 = client.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v5litepod-64")
    assert v5e64.accelerator_configs[0].topology == "8x8"
    assert v5e64.accelerator_configs[0].type_ == tpu_v2.AcceleratorConfig.Type.V5LITE_POD
    with pytest.raises(exceptions.NotFound):
        client.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v6e-8")

    versions = [v.version for v in client.list_runtime_versions(parent=PARENT)]
    assert "v2-alpha-tpuv5-lite" in versions and "v2-alpha-tpuv5" in versions
    got = client.get_runtime_version(name=f"{PARENT}/runtimeVersions/v2-alpha-tpuv5-lite")
    assert got.version == "v2-alpha-tpuv5-lite"

    locations = client.list_locations(request={"name": f"projects/{PROJECT}"})
    assert [loc.location_id for loc in locations.locations] == [
        "us-central1-a",
        "us-central1-b",
        "us-east5-b",
    ]
    assert locations.locations[0].name == f"projects/{PROJECT}/locations/us-central1-a"
    one = client.get_location(request={"name": f"projects/{PROJECT}/locations/{ZONE}"})
    assert one.location_id == ZONE


def test_malformed_zone_is_400(client: tpu_v2.TpuClient) -> None:
    with pytest.raises(exceptions.BadRequest, match="Invalid location"):
        client.list_nodes(parent=f"projects/{PROJECT}/locations/uscentral1")


def test_a_project_the_caller_has_no_role_on_is_403(client: tpu_v2.TpuClient) -> None:
    other = f"projects/someone-else/locations/{ZONE}"
    with pytest.raises(exceptions.Forbidden, match=r"Permission 'tpu\.nodes\.list' denied") as denied:
        list(client.list_nodes(parent=other))
    assert denied.value.reason == "IAM_PERMISSION_DENIED"


def test_other_projects_are_separate(start_server: Callable[..., SimServer]) -> None:
    owner = [{"role": "roles/owner", "members": ["user:sim-user@example.com"]}]
    server = start_server(make_world(iam={PROJECT: owner, "someone-else": owner}))
    client = tpu_client(server.url)
    create_ready(client, "mine", node())
    other = f"projects/someone-else/locations/{ZONE}"
    assert list(client.list_nodes(parent=other)) == []
    client.create_node(parent=other, node_id="mine", node=node()).result(polling=FAST_POLLING)
    assert [n.name for n in client.list_nodes(parent=other)] == [f"{other}/nodes/mine"]


def test_spot_node_echoes_scheduling_config(client: tpu_v2.TpuClient) -> None:
    ready = create_ready(client, "spotty", spot_node())
    assert ready.scheduling_config.spot is True


def test_ticker_finishes_creates_without_requests(server: SimServer, client: tpu_v2.TpuClient) -> None:
    client.create_node(parent=PARENT, node_id="tick", node=node())
    wait_for(lambda: server.engine.status()["nodes"][0]["state"] == "READY")


def test_delete_operation_and_service_identity(client: tpu_v2.TpuClient) -> None:
    op = client.create_node(parent=PARENT, node_id="gone-op", node=node())
    op.result(polling=FAST_POLLING)
    client.delete_operation(request={"name": op.operation.name})
    with pytest.raises(exceptions.NotFound):
        client.get_operation(request={"name": op.operation.name})
    identity = client.generate_service_identity(request={"parent": PARENT}).identity
    assert identity.email.endswith("@cloud-tpu.iam.gserviceaccount.com")
