"""TpuApiCloud through the REAL tpu_v2 REST client, against a stdlib fake that answers with Google's shapes.

These pin the client's wire behaviour (URLs, enum encoding, error bodies, LRO polling) and the error
shapes that are awkward to make a simulator produce on cue: a stockout LRO, a 429 QuotaFailure, 503s,
a dropped connection and a read timeout.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cloud_fakes import DROP, QUOTA_MSG, STOCKOUT_MSG, FakeGoogle, Hang, P, error, node_json, operation

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import HostIdentity, NodeRequest, QueuedResourceRequest
from tpuctl.cloud.config import CloudConfig
from tpuctl.cloud.credentials import given
from tpuctl.cloud.retry import RetryPolicy
from tpuctl.cloud.tpu_api import TpuApiCloud
from tpuctl.errors import (
    AlreadyExistsError,
    AmbiguousError,
    NotFoundError,
    QuotaExceededError,
    StockoutError,
    TransientError,
)

FAST = RetryPolicy(max_attempts=4, initial_wait_s=0.0, max_wait_s=0.0, deadline_s=10.0)
NODE_RE = r"/v2/projects/p/locations/us-east5-b/nodes$"
OP_RE = r"/operations/op1$"
REQ = NodeRequest(
    name="n1",
    zone="us-east5-b",
    accelerator_type="v5litepod-8",
    runtime_version="v2-alpha-tpuv5-lite",
    capacity=CapacityType.SPOT,
    labels={"managed-by": "tpuctl"},
)


@pytest.fixture
def fake() -> Iterator[FakeGoogle]:
    f = FakeGoogle()
    f.start()
    yield f
    f.stop()


@pytest.fixture
def cloud(fake: FakeGoogle) -> Iterator[TpuApiCloud]:
    c = TpuApiCloud.for_simulator(
        "p", fake.url, retry=FAST, request_timeout_s=2.0, poll_interval_s=0.001, poll_max_interval_s=0.01
    )
    yield c
    c.close()


class Progress:
    def __init__(self) -> None:
        self.updates: list[tuple[str, float]] = []

    def update(self, description: str, *, elapsed_s: float) -> None:
        self.updates.append((description, elapsed_s))


def test_create_node_polls_the_operation_and_reports_progress(fake: FakeGoogle, cloud: TpuApiCloud) -> None:
    fake.route("POST", NODE_RE, (200, operation(target=f"{P}/nodes/n1")))
    fake.route(
        "GET",
        OP_RE,
        (200, operation(status_detail="allocating 2 hosts")),
        (200, operation(status_detail="booting")),
        (
            200,
            operation(
                done=True, response={"@type": "type.googleapis.com/google.cloud.tpu.v2.Node", **node_json()}
            ),
        ),
    )
    progress = Progress()
    node = cloud.create_node(REQ, request_id="req-1", progress=progress)
    assert (node.name, node.zone, node.state, node.capacity, node.topology) == (
        "n1",
        "us-east5-b",
        "READY",
        CapacityType.SPOT,
        "2x4",
    )
    assert [d for d, _ in progress.updates] == [
        "create node n1 in us-east5-b: running",
        "create node n1 in us-east5-b: allocating 2 hosts",
        "create node n1 in us-east5-b: booting",
        "create node n1 in us-east5-b: done",
    ]
    sent = fake.requests[0]
    # The REST transport: node id in the query, numeric enums, camelCase body; the request id as a label.
    assert sent.query == {"nodeId": ["n1"], "$alt": ["json;enum-encoding=int"]}
    assert sent.body["labels"] == {"managed-by": "tpuctl", "tpuctl-request": "req-1"}
    assert sent.body["schedulingConfig"] == {"spot": True}
    # The dry-run plan is the request that was sent.
    (plan,) = cloud.plan_create_node(REQ, request_id="req-1")
    assert (
        plan.body == sent.body
        and plan.url
        == fake.url + "/v2/projects/p/locations/us-east5-b/nodes?nodeId=n1&%24alt=json%3Benum-encoding%3Dint"
    )


def test_create_node_falls_back_to_get_when_the_operation_has_no_response(
    fake: FakeGoogle, cloud: TpuApiCloud
) -> None:
    fake.route("POST", NODE_RE, (200, operation(done=True)))
    fake.route("GET", r"/nodes/n1$", (200, node_json(state="READY")))
    assert cloud.create_node(REQ).state == "READY"


def test_stockout_operation_raises_stockout_with_zone(fake: FakeGoogle, cloud: TpuApiCloud) -> None:
    fake.route("POST", NODE_RE, (200, operation()))
    fake.route(
        "GET", OP_RE, (200, operation(done=True, error={"code": 8, "message": STOCKOUT_MSG, "details": []}))
    )
    with pytest.raises(StockoutError) as err:
        cloud.create_node(REQ)
    assert err.value.zone == "us-east5-b" and err.value.code == 8
    assert err.value.message.startswith("create node n1 in us-east5-b: There is no more capacity")
    assert fake.hits("POST", NODE_RE) == 1


def test_quota_429_with_quota_failure_is_not_retried(fake: FakeGoogle, cloud: TpuApiCloud) -> None:
    fake.route(
        "POST",
        NODE_RE,
        error(
            429,
            "RESOURCE_EXHAUSTED",
            QUOTA_MSG,
            [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "subject": "project:p",
                            "description": QUOTA_MSG,
                            "quotaId": "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
                            "quotaDimensions": {"region": "us-east5"},
                            "quotaValue": "0",
                        }
                    ],
                }
            ],
        ),
    )
    with pytest.raises(QuotaExceededError) as err:
        cloud.create_node(REQ)
    e = err.value
    assert (e.quota_id, e.limit, e.location) == (
        "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
        0.0,
        "us-east5",
    )
    assert fake.hits("POST", NODE_RE) == 1


def test_503_is_retried_for_reads_and_for_creates(fake: FakeGoogle, cloud: TpuApiCloud) -> None:
    unavailable = error(503, "UNAVAILABLE", "The service is currently unavailable.")
    fake.route("GET", r"/nodes/n1$", unavailable, unavailable, (200, node_json()))
    assert cloud.get_node("us-east5-b", "n1").name == "n1"
    assert fake.hits("GET", r"/nodes/n1$") == 3
    fake.route(
        "POST",
        NODE_RE,
        unavailable,
        (
            200,
            operation(
                done=True, response={"@type": "type.googleapis.com/google.cloud.tpu.v2.Node", **node_json()}
            ),
        ),
    )
    assert cloud.create_node(REQ).state == "READY"
    assert fake.hits("POST", NODE_RE) == 2


def test_500_on_create_is_ambiguous_and_not_retried(fake: FakeGoogle, cloud: TpuApiCloud) -> None:
    fake.route("POST", NODE_RE, error(500, "INTERNAL", "Internal error encountered."))
    with pytest.raises(AmbiguousError):
        cloud.create_node(REQ)
    assert fake.hits("POST", NODE_RE) == 1


def test_dropped_connection_is_ambiguous_for_create_and_retried_for_get(
    fake: FakeGoogle, cloud: TpuApiCloud
) -> None:
    fake.route("POST", NODE_RE, DROP)
    with pytest.raises(AmbiguousError) as err:
        cloud.create_node(REQ)
    assert "may or may not" in err.value.message
    assert fake.hits("POST", NODE_RE) == 1
    fake.route("GET", r"/nodes/n1$", DROP, (200, node_json()))
    assert cloud.get_node("us-east5-b", "n1").name == "n1"
    assert fake.hits("GET", r"/nodes/n1$") == 2


def test_read_timeout(fake: FakeGoogle) -> None:
    c = TpuApiCloud.for_simulator("p", fake.url, retry=FAST, request_timeout_s=0.2)
    fake.route("GET", r"/nodes/n1$", Hang(0.6), (200, node_json()))
    assert c.get_node("us-east5-b", "n1").name == "n1"
    fake.route("POST", NODE_RE, Hang(0.6))
    with pytest.raises(AmbiguousError, match="timed out"):
        c.create_node(REQ)
    assert fake.hits("POST", NODE_RE) == 1
    c.close()


def test_already_exists_and_not_found(fake: FakeGoogle, cloud: TpuApiCloud) -> None:
    fake.route("POST", NODE_RE, error(409, "ALREADY_EXISTS", f"Resource '{P}/nodes/n1' already exists"))
    with pytest.raises(AlreadyExistsError):
        cloud.create_node(REQ)
    with pytest.raises(NotFoundError) as err:
        cloud.get_node("us-east5-b", "n1")
    assert err.value.message.startswith("get node n1 in us-east5-b:")


def test_operation_that_never_finishes_times_out(fake: FakeGoogle) -> None:
    c = TpuApiCloud.for_simulator(
        "p", fake.url, retry=FAST, poll_interval_s=0.01, poll_max_interval_s=0.02, operation_timeout_s=0.1
    )
    fake.route("DELETE", r"/nodes/n1$", (200, operation(verb="delete")))
    fake.route("GET", OP_RE, (200, operation(verb="delete")))
    with pytest.raises(TransientError, match="still running"):
        c.delete_node("us-east5-b", "n1")
    c.close()


def test_list_nodes_all_zones_follows_pages(fake: FakeGoogle, cloud: TpuApiCloud) -> None:
    def page(rec: Any) -> tuple[int, Any]:
        if rec.query.get("pageToken") == ["t2"]:
            return 200, {"nodes": [node_json("n2", "us-west4-a", state="PREEMPTED")]}
        return 200, {"nodes": [node_json("n1")], "nextPageToken": "t2"}

    fake.route("GET", r"/v2/projects/p/locations/-/nodes$", page)
    nodes = cloud.list_nodes()
    assert [(n.name, n.zone, n.state) for n in nodes] == [
        ("n1", "us-east5-b", "READY"),
        ("n2", "us-west4-a", "PREEMPTED"),
    ]


def test_queued_resource_create_with_request_id_is_retried_after_a_drop(
    fake: FakeGoogle, cloud: TpuApiCloud
) -> None:
    qr_json = {
        "name": f"{P}/queuedResources/q1",
        "state": {"state": "WAITING_FOR_RESOURCES"},
        "spot": {},
        "tpu": {
            "nodeSpec": [
                {
                    "parent": P,
                    "multisliceParams": {"nodeCount": 2, "nodeIdPrefix": "ms"},
                    "node": {"acceleratorType": "v5litepod-8"},
                }
            ]
        },
    }
    fake.route(
        "POST",
        r"/queuedResources$",
        DROP,
        (
            200,
            operation(
                done=True,
                response={"@type": "type.googleapis.com/google.cloud.tpu.v2.QueuedResource", **qr_json},
            ),
        ),
    )
    req = QueuedResourceRequest(id="q1", zone="us-east5-b", node=REQ, node_count=2, node_id_prefix="ms")
    qr = cloud.create_queued_resource(req, request_id="rid-7")
    assert (qr.id, qr.state, qr.tier, qr.node_ids) == (
        "q1",
        "WAITING_FOR_RESOURCES",
        "spot",
        ("ms-0", "ms-1"),
    )
    posts = [r for r in fake.requests if r.method == "POST"]
    assert len(posts) == 2 and all(r.query["requestId"] == ["rid-7"] for r in posts)
    # Without a request id the same drop is ambiguous and not retried.
    fake.route("POST", r"/queuedResources$", DROP)
    with pytest.raises(AmbiguousError):
        cloud.create_queued_resource(req)


def test_delete_queued_resource_sends_force_and_request_id(fake: FakeGoogle, cloud: TpuApiCloud) -> None:
    fake.route("DELETE", r"/queuedResources/q1$", (200, operation(done=True, verb="delete")))
    cloud.delete_queued_resource("us-east5-b", "q1", force=True, request_id="rid-8")
    assert fake.requests[-1].query == {
        "force": ["true"],
        "requestId": ["rid-8"],
        "$alt": ["json;enum-encoding=int"],
    }


def test_repr_shows_no_credentials() -> None:
    class Creds:
        token = "ya29.SECRET"

    c = TpuApiCloud(project="p", config=CloudConfig(credentials=given(Creds())))  # type: ignore[arg-type]
    assert "SECRET" not in repr(c) and "Creds" not in repr(c)


def test_importing_and_constructing_loads_no_heavy_sdk() -> None:
    code = (
        "import sys\n"
        "from tpuctl.cloud.config import CloudConfig\n"
        "from tpuctl.cloud.tpu_api import TpuApiCloud\n"
        "from tpuctl.cloud import quotas, retry, translate\n"
        "TpuApiCloud(project='p', endpoint='http://127.0.0.1:9', config=CloudConfig(backend='sim'))\n"
        "heavy = [m for m in ('google.cloud.tpu_v2', 'google.protobuf', 'google.auth', 'google.api_core',"
        " 'httpx', 'tenacity', 'requests') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _attributes(value: str) -> dict[str, Any]:
    item = {"namespace": "hostkeys", "key": "ssh-ed25519", "value": value}
    return {"queryPath": "hostkeys/", "queryValue": {"items": [item]}}


def test_host_keys_are_matched_to_workers_by_worker_id_not_by_list_position(
    fake: FakeGoogle, cloud: TpuApiCloud
) -> None:
    """A GuestAttributes names no worker, and the API does not promise the all-workers answer in worker
    order: each worker's keys are asked for by its worker id. This fake answers the all-workers request
    shuffled, which a reader by position would take for the wrong hosts' keys."""
    endpoints = [{"ipAddress": f"10.0.0.{i}", "port": 8470} for i in range(3)]
    fake.route("GET", NODE_RE[:-1] + "/n1$", (200, node_json(networkEndpoints=endpoints)))
    blobs = {"0": "AAAAzero", "1": "AAAAone", "2": "AAAAtwo"}

    def answer(rec: Any) -> tuple[int, Any]:
        asked = [str(w) for w in (rec.body or {}).get("workerIds") or []]
        workers = asked or ["2", "0", "1"]  # every worker, in an order nothing promises
        return 200, {"guestAttributes": [_attributes(blobs[w]) for w in workers]}

    fake.route("POST", r"/nodes/n1:getGuestAttributes$", answer)
    assert [i.host_keys for i in cloud.host_identities("us-east5-b", "n1")] == [
        ("ssh-ed25519 AAAAzero",),
        ("ssh-ed25519 AAAAone",),
        ("ssh-ed25519 AAAAtwo",),
    ]
    asked = [r.body.get("workerIds") for r in fake.requests if r.path.endswith(":getGuestAttributes")]
    assert sorted(map(tuple, asked)) == [("0",), ("1",), ("2",)]


def test_a_worker_that_published_nothing_has_no_keys_and_the_others_keep_theirs(
    fake: FakeGoogle, cloud: TpuApiCloud
) -> None:
    fake.route("GET", NODE_RE[:-1] + "/n1$", (200, node_json()))  # two workers

    def answer(rec: Any) -> tuple[int, Any]:
        (worker,) = rec.body["workerIds"]
        empty = {"queryPath": "hostkeys/", "queryValue": {}}
        return 200, {"guestAttributes": [_attributes("AAAAzero") if worker == "0" else empty]}

    fake.route("POST", r"/nodes/n1:getGuestAttributes$", answer)
    assert cloud.host_identities("us-east5-b", "n1") == [
        HostIdentity(("ssh-ed25519 AAAAzero",)),
        HostIdentity(),
    ]


def test_each_workers_instance_name_comes_from_its_hostname_item_in_the_same_request(
    fake: FakeGoogle, cloud: TpuApiCloud
) -> None:
    """An IAP tunnel targets a worker's instance name, which gcloud reads from the worker's ``hostname``
    guest attribute (matched by key, any namespace). It comes in the answer that carries the keys: one
    request per worker, with no query path, and a worker without the item has no name."""
    fake.route("GET", NODE_RE[:-1] + "/n1$", (200, node_json()))  # two workers

    def answer(rec: Any) -> tuple[int, Any]:
        (worker,) = rec.body["workerIds"]
        attributes = _attributes(f"AAAA{worker}")
        if worker == "0":
            attributes["queryValue"]["items"].append(
                {"namespace": "some-namespace", "key": "hostname", "value": "t1v-n-0123abcd-w-0"}
            )
        attributes["queryPath"] = rec.body.get("queryPath", "")
        return 200, {"guestAttributes": [attributes]}

    fake.route("POST", r"/nodes/n1:getGuestAttributes$", answer)
    assert cloud.host_identities("us-east5-b", "n1") == [
        HostIdentity(("ssh-ed25519 AAAA0",), "t1v-n-0123abcd-w-0"),
        HostIdentity(("ssh-ed25519 AAAA1",), None),
    ]
    asked = [r.body for r in fake.requests if r.path.endswith(":getGuestAttributes")]
    assert sorted(asked, key=str) == [{"workerIds": ["0"]}, {"workerIds": ["1"]}]
