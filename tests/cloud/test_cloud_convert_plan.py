"""proto <-> dataclass conversion, request building, and the exact dry-run plans."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from google.cloud.tpu_v2.types import cloud_tpu
from google.protobuf import json_format

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import (
    HostNetwork,
    NetworkEndpoint,
    NodeRequest,
    PlannedRequest,
    QueuedResourceRequest,
    VpcNetwork,
    VpcSubnetwork,
)
from tpuctl.cloud.config import CloudConfig
from tpuctl.cloud.tpu_api import TpuApiCloud, node_from_proto, queued_resource_from_proto
from tpuctl.errors import UsageError

GOOGLE = "https://tpu.googleapis.com"
ALT = "%24alt=json%3Benum-encoding%3Dint"


def parse(cls: Any, data: dict[str, Any]) -> Any:
    """JSON -> raw proto, the way the REST transport parses a response."""
    msg = cls.pb()()
    json_format.Parse(json.dumps(data), msg, ignore_unknown_fields=True)
    return msg


def cloud() -> TpuApiCloud:
    # backend gcp with no credentials: planning must need neither credentials nor a connection.
    return TpuApiCloud(project="proj", endpoint=GOOGLE)


NODE_JSON: dict[str, Any] = {
    "name": "projects/proj/locations/us-east5-b/nodes/pod-a",
    "description": "created by tpuctl",
    "acceleratorType": "v5litepod-16",
    "acceleratorConfig": {"type": "V5LITE_POD", "topology": "4x4"},
    "runtimeVersion": "v2-alpha-tpuv5-lite",
    "schedulingConfig": {"preemptible": True},
    "labels": {"managed-by": "tpuctl", "tpuctl-request": "r1"},
    "metadata": {"startup-script": "echo hi"},
    "state": "PREEMPTED",
    "health": "HEALTHY",
    "id": "7781234",
    "createTime": "2025-04-10T12:00:01.250Z",
    "networkEndpoints": [
        {"ipAddress": "10.0.0.2", "port": 8470, "accessConfig": {"externalIp": "34.1.2.3"}},
        {"ipAddress": "10.0.0.3", "port": 8470},
    ],
    "queuedResource": "projects/proj/locations/us-east5-b/queuedResources/q1",
    "multisliceNode": True,
}


def test_node_from_proto_every_field() -> None:
    node = node_from_proto(parse(cloud_tpu.Node, NODE_JSON))
    assert node.name == "pod-a" and node.zone == "us-east5-b"
    assert node.accelerator_type == "v5litepod-16" and node.topology == "4x4"
    assert node.state == "PREEMPTED" and node.health == "HEALTHY"
    assert node.capacity is CapacityType.PREEMPTIBLE
    assert node.labels == {"managed-by": "tpuctl", "tpuctl-request": "r1"} and node.is_tpuctl_managed
    assert node.metadata == {"startup-script": "echo hi"}
    assert node.network_endpoints == (
        NetworkEndpoint("10.0.0.2", 8470, "34.1.2.3"),
        NetworkEndpoint("10.0.0.3", 8470),
    )
    assert node.create_time == datetime(2025, 4, 10, 12, 0, 1, 250000, tzinfo=UTC)
    assert node.queued_resource == "projects/proj/locations/us-east5-b/queuedResources/q1"
    assert node.multislice_node is True and node.id == "7781234" and node.description == "created by tpuctl"


def test_node_from_proto_numeric_enums_and_defaults() -> None:
    # The client asks for enum-encoding=int, so a server may answer with numbers; both must read the same.
    data = {
        "name": "projects/proj/locations/us-west4-a/nodes/n",
        "state": 2,
        "health": 0,
        "acceleratorConfig": {"type": 11},
        "schedulingConfig": {},
    }
    node = node_from_proto(parse(cloud_tpu.Node, data))
    assert (node.state, node.health, node.capacity, node.topology, node.create_time) == (
        "READY",
        None,
        CapacityType.ON_DEMAND,
        None,
        None,
    )
    assert node_from_proto(parse(cloud_tpu.Node, {**data, "state": 99})).state == "99"
    assert (
        node_from_proto(parse(cloud_tpu.Node, {**data, "schedulingConfig": {"spot": True}})).capacity
        is CapacityType.SPOT
    )
    assert node_from_proto(
        parse(cloud_tpu.Node, {**data, "schedulingConfig": {"reserved": True}})
    ).capacity is (CapacityType.RESERVED)
    # proto-plus wrappers are accepted as well as raw messages.
    assert node_from_proto(cloud_tpu.Node.wrap(parse(cloud_tpu.Node, data))).zone == "us-west4-a"


def test_queued_resource_from_proto() -> None:
    multislice = {
        "name": "projects/proj/locations/us-east5-b/queuedResources/q1",
        "createTime": "2025-04-10T12:00:00Z",
        "tpu": {
            "nodeSpec": [
                {
                    "parent": "projects/proj/locations/us-east5-b",
                    "multisliceParams": {"nodeCount": 3},
                    "node": {"acceleratorType": "v6e-8", "labels": {"tpuctl-request": "r9"}},
                }
            ]
        },
        "guaranteed": {},
        "state": {"state": "ACTIVE", "stateInitiator": "USER", "activeData": {}},
    }
    qr = queued_resource_from_proto(parse(cloud_tpu.QueuedResource, multislice))
    assert (qr.id, qr.zone, qr.state, qr.state_initiator, qr.tier) == (
        "q1",
        "us-east5-b",
        "ACTIVE",
        "USER",
        "guaranteed",
    )
    assert qr.node_ids == ("q1-0", "q1-1", "q1-2") and qr.node_count == 3  # prefix defaults to the QR id
    assert qr.accelerator_type == "v6e-8" and qr.labels == {"tpuctl-request": "r9"}
    assert qr.create_time == datetime(2025, 4, 10, 12, 0, tzinfo=UTC)

    failed = {
        "name": "projects/proj/locations/us-east5-b/queuedResources/q2",
        "spot": {},
        "tpu": {"nodeSpec": [{"parent": "projects/proj/locations/us-east5-b", "nodeId": "solo", "node": {}}]},
        "state": {
            "state": 4,
            "stateInitiator": 2,
            "failedData": {"error": {"code": 8, "message": "valid-until passed"}},
        },
    }
    qr = queued_resource_from_proto(parse(cloud_tpu.QueuedResource, failed))
    assert (qr.state, qr.state_initiator, qr.tier, qr.node_ids) == ("FAILED", "SERVICE", "spot", ("solo",))
    assert (qr.error_code, qr.error_message) == (8, "valid-until passed")


# ---- plans: exact method, URL and body ------------------------------------------------------------------

NODE_REQ = NodeRequest(
    name="pod-a",
    zone="us-east5-b",
    accelerator_type="v5litepod-64",
    runtime_version="v2-alpha-tpuv5-lite",
    capacity=CapacityType.SPOT,
    labels={"managed-by": "tpuctl", "tpuctl-owner": "alice"},
    metadata={"startup-script": "true"},
    description="created by tpuctl",
)


def test_plan_create_node_exact() -> None:
    c = cloud()
    (plan,) = c.plan_create_node(NODE_REQ, request_id="r-1")
    assert plan == PlannedRequest(
        method="POST",
        url=f"{GOOGLE}/v2/projects/proj/locations/us-east5-b/nodes?nodeId=pod-a&{ALT}",
        body={
            "description": "created by tpuctl",
            "acceleratorType": "v5litepod-64",
            "runtimeVersion": "v2-alpha-tpuv5-lite",
            "schedulingConfig": {"spot": True},
            "labels": {"managed-by": "tpuctl", "tpuctl-owner": "alice", "tpuctl-request": "r-1"},
            "metadata": {"startup-script": "true"},
        },
    )
    assert plan.to_dict()["method"] == "POST"
    assert c._client_obj is None  # nothing was built, nothing was sent


@pytest.mark.parametrize(
    ("capacity", "reservation", "sched"),
    [
        (CapacityType.ON_DEMAND, None, None),
        (CapacityType.PREEMPTIBLE, None, {"preemptible": True}),
        (CapacityType.RESERVED, None, {"reserved": True}),
        (CapacityType.ON_DEMAND, "res-1", {"reserved": True}),
    ],
)
def test_plan_create_node_scheduling(capacity: CapacityType, reservation: str | None, sched: Any) -> None:
    req = NodeRequest(
        name="n",
        zone="us-central1-a",
        accelerator_type="v4-8",
        runtime_version="tpu-ubuntu2204-base",
        capacity=capacity,
        reservation=reservation,
    )
    body = cloud().plan_create_node(req)[0].body
    assert body is not None and body.get("schedulingConfig") == sched


def test_plan_create_queued_resource_multislice_exact() -> None:
    req = QueuedResourceRequest(
        id="qr-1",
        zone="us-east5-b",
        node=NODE_REQ,
        node_count=4,
        node_id_prefix="ms",
        tier="spot",
        valid_for_seconds=7200,
    )
    plan = cloud().plan_create_queued_resource(req, request_id="0b7f6a1e-5c2d-4f3e-9a8b-1c2d3e4f5a6b")
    assert plan.method == "POST"
    assert plan.url == (
        f"{GOOGLE}/v2/projects/proj/locations/us-east5-b/queuedResources?queuedResourceId=qr-1"
        f"&requestId=0b7f6a1e-5c2d-4f3e-9a8b-1c2d3e4f5a6b&{ALT}"
    )
    assert plan.body == {
        "tpu": {
            "nodeSpec": [
                {
                    "parent": "projects/proj/locations/us-east5-b",
                    "multisliceParams": {"nodeCount": 4, "nodeIdPrefix": "ms"},
                    "node": {
                        "description": "created by tpuctl",
                        "acceleratorType": "v5litepod-64",
                        "runtimeVersion": "v2-alpha-tpuv5-lite",
                        "labels": {
                            "managed-by": "tpuctl",
                            "tpuctl-owner": "alice",
                            "tpuctl-request": "0b7f6a1e-5c2d-4f3e-9a8b-1c2d3e4f5a6b",
                        },
                        "metadata": {"startup-script": "true"},
                    },
                }
            ]
        },
        "spot": {},
        "queueingPolicy": {"validUntilDuration": "7200s"},
    }


def test_plan_create_queued_resource_single_guaranteed_reserved() -> None:
    node = NodeRequest(
        name="solo",
        zone="us-central2-b",
        accelerator_type="v4-32",
        runtime_version="rt",
        capacity=CapacityType.RESERVED,
    )
    req = QueuedResourceRequest(
        id="qr-2",
        zone="us-central2-b",
        node=node,
        tier="guaranteed",
        reservation="my-res",
        valid_for_seconds=90.5,
    )
    plan = cloud().plan_create_queued_resource(req)
    assert (
        plan.url
        == f"{GOOGLE}/v2/projects/proj/locations/us-central2-b/queuedResources?queuedResourceId=qr-2&{ALT}"
    )
    assert plan.body == {
        "tpu": {
            "nodeSpec": [
                {
                    "parent": "projects/proj/locations/us-central2-b",
                    "nodeId": "solo",
                    "node": {
                        "acceleratorType": "v4-32",
                        "runtimeVersion": "rt",
                        "schedulingConfig": {"reserved": True},
                    },
                }
            ]
        },
        "guaranteed": {},
        "queueingPolicy": {"validUntilDuration": "90.500s"},
        "reservationName": "projects/proj/locations/us-central2-b/reservations/my-res",
    }


def test_plan_deletes_exact() -> None:
    c = cloud()
    assert c.plan_delete_node("us-east5-b", "pod-a") == [
        PlannedRequest("DELETE", f"{GOOGLE}/v2/projects/proj/locations/us-east5-b/nodes/pod-a?{ALT}", None)
    ]
    assert c.plan_delete_queued_resource(
        "us-east5-b", "qr-1", force=True, request_id="rid"
    ) == PlannedRequest(
        "DELETE",
        f"{GOOGLE}/v2/projects/proj/locations/us-east5-b/queuedResources/qr-1?requestId=rid&force=true&{ALT}",
        None,
    )


def test_simulator_plan_keeps_http() -> None:
    c = TpuApiCloud(project="p", endpoint="http://127.0.0.1:8471/", config=CloudConfig(backend="sim"))
    assert c.plan_delete_node("us-east5-b", "n")[0].url.startswith("http://127.0.0.1:8471/v2/projects/p/")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"node_count": 0}, "slices"),
        ({"tier": "best-effort"}, "tier"),
        ({"valid_for_seconds": -5}, "valid-for"),
    ],
)
def test_bad_queued_resource_requests_are_refused(kwargs: dict[str, Any], field: str) -> None:
    req = QueuedResourceRequest(id="q", zone="us-east5-b", node=NODE_REQ, **kwargs)
    with pytest.raises(UsageError) as err:
        cloud().plan_create_queued_resource(req)
    assert err.value.field == field


def test_request_id_must_be_a_label_value_and_match_an_existing_label() -> None:
    with pytest.raises(UsageError, match="not a valid label value"):
        cloud().plan_create_node(NODE_REQ, request_id="Has Spaces")
    labelled = NodeRequest(
        name="n",
        zone="us-east5-b",
        accelerator_type="v6e-8",
        runtime_version="rt",
        labels={"tpuctl-request": "other"},
    )
    with pytest.raises(UsageError, match="conflicts"):
        cloud().plan_create_node(labelled, request_id="mine")
    body = cloud().plan_create_node(labelled, request_id="other")[0].body
    assert body is not None and body["labels"] == {"tpuctl-request": "other"}  # type: ignore[index]


SHARED = HostNetwork(
    VpcNetwork("shared", "host-proj"), VpcSubnetwork("tpu", "host-proj", "us-central1"), ("tpu-ssh", "web")
)


def test_a_node_joins_the_named_network_with_its_tags_and_service_account() -> None:
    req = NodeRequest(name="n", zone="us-central1-a", accelerator_type="v5litepod-8",
                      runtime_version="v2-alpha-tpuv5-lite", network=SHARED, external_ips=True,
                      service_account="trainer@p.iam.gserviceaccount.com")  # fmt: skip
    body = cloud().plan_create_node(req)[0].body
    assert body is not None
    assert body["networkConfig"] == {
        "network": "projects/host-proj/global/networks/shared",
        "subnetwork": "projects/host-proj/regions/us-central1/subnetworks/tpu",
        "enableExternalIps": True,
    }
    assert body["tags"] == ["tpu-ssh", "web"]
    assert body["serviceAccount"] == {
        "email": "trainer@p.iam.gserviceaccount.com",
        "scope": ["https://www.googleapis.com/auth/cloud-platform"],
    }


def test_a_subnetwork_named_alone_is_in_the_zones_region_of_the_slices_project() -> None:
    req = NodeRequest(name="n", zone="europe-west4-b", accelerator_type="v5litepod-8",
                      runtime_version="v2-alpha-tpuv5-lite",
                      network=HostNetwork(VpcNetwork("vpc"), VpcSubnetwork("sub")))  # fmt: skip
    body = cloud().plan_create_node(req)[0].body
    assert body is not None and body["networkConfig"] == {
        "network": "projects/proj/global/networks/vpc",
        "subnetwork": "projects/proj/regions/europe-west4/subnetworks/sub",
    }
    assert "serviceAccount" not in body and "tags" not in body  # the API's defaults where none is named
