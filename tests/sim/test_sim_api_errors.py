"""The TPU API's errors as Google answers them, table-driven: HTTP status, google.rpc code, message shape
and details, for bad requests (JSON transcoding), unknown locations, missing and clashing resources,
quota, reservations and preempted nodes. Raw HTTP, so nothing a client library does hides the answer."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sim_helpers import AUTH, PARENT, PROJECT, make_world

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.testing.clock import wait_for

BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
RESOURCE_INFO = "type.googleapis.com/google.rpc.ResourceInfo"
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
RUNTIME = "v2-alpha-tpuv5-lite"


def _node(**fields: Any) -> dict[str, Any]:
    return {"acceleratorType": "v5litepod-8", "runtimeVersion": RUNTIME, **fields}


@dataclass(frozen=True)
class Case:
    id: str
    method: str
    path: str  # under /v2 (or the version given)
    body: dict[str, Any] | None = None
    http_status: int = 400
    status: str = "INVALID_ARGUMENT"
    message: str = ""  # a regex the whole message matches
    details: dict[str, dict[str, Any]] = field(default_factory=dict)  # @type -> fields it holds
    version: str = "v2"
    setup: Callable[[httpx.Client, SimAdminClient], None] | None = None


def _create(client: httpx.Client, node_id: str, body: dict[str, Any]) -> None:
    answer = client.post(f"/v2/{PARENT}/nodes", params={"nodeId": node_id}, json=body)
    assert answer.status_code == 200, answer.text
    wait_for(lambda: client.get(f"/v2/{PARENT}/nodes/{node_id}").json().get("state") == "READY")


CASES = [
    Case(
        "unknown-field",
        "POST",
        f"{PARENT}/nodes?nodeId=n",
        _node(schedulingConfig={"spott": True}),
        message=re.escape(
            "Invalid JSON payload received. "
            "Unknown name \"spott\" at 'node.scheduling_config': Cannot find field."
        ),
        details={BAD_REQUEST: {"fieldViolations": [{"field": "node.scheduling_config"}]}},
    ),
    Case(
        "unknown-top-level-field-v2alpha1",
        "POST",
        f"{PARENT}/nodes?nodeId=n",
        _node(spot=True),
        message=re.escape(
            "Invalid JSON payload received. Unknown name \"spot\" at 'node': Cannot find field."
        ),
        details={BAD_REQUEST: {"fieldViolations": [{"field": "node"}]}},
        version="v2alpha1",
    ),
    Case(
        "bool-as-string",
        "POST",
        f"{PARENT}/nodes?nodeId=n",
        _node(schedulingConfig={"preemptible": "yes"}),
        message=re.escape("Invalid value at 'node.scheduling_config.preemptible' (TYPE_BOOL), \"yes\""),
        details={BAD_REQUEST: {"fieldViolations": [{"field": "node.scheduling_config.preemptible"}]}},
    ),
    Case(
        "unknown-enum",
        "POST",
        f"{PARENT}/nodes?nodeId=n",
        {"acceleratorConfig": {"type": "V9", "topology": "2x2"}, "runtimeVersion": RUNTIME},
        message=re.escape(
            "Invalid value at 'node.accelerator_config.type' "
            '(type.googleapis.com/google.cloud.tpu.v2.AcceleratorConfig.Type), "V9"'
        ),
    ),
    Case(
        "bad-duration",
        "POST",
        f"{PARENT}/queuedResources?queuedResourceId=q",
        {
            "tpu": {"nodeSpec": [{"parent": PARENT, "nodeId": "q0", "node": _node()}]},
            "queueingPolicy": {"validUntilDuration": "1h"},
        },
        message=r"Invalid value at 'queued_resource\.queueing_policy\.valid_until_duration' "
        r"\(type\.googleapis\.com/google\.protobuf\.Duration\), .*duration must end with 's'",
    ),
    Case(
        "unknown-runtime-version",
        "POST",
        f"{PARENT}/nodes?nodeId=n",
        _node(runtimeVersion="tpu-vm-nope"),
        message=r"Cloud TPU received an invalid argument\. "
        r'The field "RuntimeVersion" cannot be "tpu-vm-nope"\. '
        r"\[EID: 0x[0-9a-f]{16}\]",
        details={BAD_REQUEST: {"fieldViolations": [{"field": "node.runtime_version"}]}},
    ),
    Case(
        "unknown-query-parameter",
        "GET",
        f"{PARENT}/nodes?spot=true",
        message=re.escape('Invalid JSON payload received. Unknown name "spot": Cannot find field.'),
        details={BAD_REQUEST: {"fieldViolations": [{"field": ""}]}},
    ),
    Case(
        "bool-query-parameter",
        "DELETE",
        f"{PARENT}/queuedResources/q?force=yes",
        message=re.escape("Invalid value at 'force' (TYPE_BOOL), \"yes\""),
        details={BAD_REQUEST: {"fieldViolations": [{"field": "force"}]}},
    ),
    Case(
        "zone-without-tpus",
        "GET",
        f"projects/{PROJECT}/locations/europe-west4-a/nodes",
        http_status=403,
        status="PERMISSION_DENIED",
        message=re.escape("Location europe-west4-a is not found or access is unauthorized."),
    ),
    Case(
        "not-found",
        "GET",
        f"{PARENT}/nodes/ghost",
        http_status=404,
        status="NOT_FOUND",
        message=re.escape(f"Resource '{PARENT}/nodes/ghost' was not found"),
        details={
            RESOURCE_INFO: {
                "resourceType": "tpu.googleapis.com/Node",
                "resourceName": f"{PARENT}/nodes/ghost",
            }
        },
    ),
    Case(
        "already-exists",
        "POST",
        f"{PARENT}/nodes?nodeId=twin",
        _node(),
        http_status=409,
        status="ALREADY_EXISTS",
        message=re.escape(f"Resource '{PARENT}/nodes/twin' already exists"),
        details={
            RESOURCE_INFO: {"resourceType": "tpu.googleapis.com/Node", "resourceName": f"{PARENT}/nodes/twin"}
        },
        setup=lambda client, admin: _create(client, "twin", _node()),
    ),
]


@pytest.fixture
def http(server: SimServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers=AUTH)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_error_answers(case: Case, http: httpx.Client, admin: SimAdminClient) -> None:
    if case.setup is not None:
        case.setup(http, admin)
    answer = http.request(case.method, f"/{case.version}/{case.path}", json=case.body)
    assert answer.status_code == case.http_status, answer.text
    error = answer.json()["error"]
    assert error["code"] == case.http_status
    assert error["status"] == case.status
    assert re.fullmatch(case.message, error["message"]), error["message"]
    details = {d["@type"]: d for d in error.get("details", [])}
    for type_url, wanted in case.details.items():
        assert type_url in details, details
        for key, value in wanted.items():
            if key == "fieldViolations":
                assert [v["field"] for v in details[type_url][key]] == [v["field"] for v in value]
                assert all(v["description"] for v in details[type_url][key])
            else:
                assert details[type_url][key] == value


def test_quota_error_lists_each_id(start_server: Callable[..., SimServer]) -> None:
    world = make_world(
        zones={"us-central1-a": {"v5e": {"on_demand": 256, "preemptible": 256}}},
        quotas={"generations": {"v5e": {"on_demand": {"zone": 8, "region": 8}}}},
    )
    server = start_server(world)
    answer = httpx.post(
        f"{server.url}/v2/{PARENT}/nodes",
        params={"nodeId": "big"},
        json=_node(acceleratorType="v5litepod-16"),
        headers=AUTH,
    )
    assert answer.status_code == 429
    error = answer.json()["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED"
    (failure,) = [d for d in error["details"] if d["@type"] == QUOTA_FAILURE]
    ids = [v["quotaId"] for v in failure["violations"]]
    assert len(ids) == 2
    quoted = re.findall(
        r"Quota limit '([^']+)' has been exceeded\. Limit: 8 in (?:zone|region) [a-z0-9-]+\.",
        error["message"],
    )
    assert quoted == ids  # each id quoted on its own, never "A,B"


def _op_error(client: httpx.Client, op: dict[str, Any]) -> dict[str, Any]:
    done = wait_for(lambda: (o := client.get(f"/v2/{op['name']}").json())["done"] and o)
    error: dict[str, Any] = done["error"]
    return error


def test_undersized_reservation_fails_with_code_9(http: httpx.Client) -> None:
    body = {
        "tpu": {
            "nodeSpec": [{"parent": PARENT, "nodeId": "r0", "node": _node(acceleratorType="v5litepod-32")}]
        },
        "reservationName": f"{PARENT}/reservations/res-a",  # holds 16 chips
    }
    answer = http.post(f"/v2/{PARENT}/queuedResources", params={"queuedResourceId": "r"}, json=body)
    assert answer.status_code == 200, answer.text
    qr = wait_for(
        lambda: (q := http.get(f"/v2/{PARENT}/queuedResources/r").json())["state"]["state"] == "FAILED" and q
    )
    error = qr["state"]["failedData"]["error"]
    assert error["code"] == 9
    assert re.fullmatch(
        r"Insufficient reserved capacity\. Contact customer support to increase your reservation\. "
        r"\[EID: 0x[0-9a-f]{16}\]",
        error["message"],
    )


def test_update_of_preempted_node_fails_with_code_3(http: httpx.Client, admin: SimAdminClient) -> None:
    _create(http, "gone", _node(schedulingConfig={"spot": True}))
    admin.preempt("us-central1-a", "gone", notice=False)
    answer = http.patch(
        f"/v2/{PARENT}/nodes/gone", params={"updateMask": "labels"}, json={"labels": {"a": "b"}}
    )
    assert answer.status_code == 200, answer.text
    error = _op_error(http, answer.json())
    assert error["code"] == 3
    assert "PREEMPTED" in error["message"]


def test_lone_node_spec_object_is_accepted_as_a_list(http: httpx.Client) -> None:
    body = {"tpu": {"nodeSpec": {"parent": PARENT, "nodeId": "s0", "node": _node()}}, "spot": {}}
    answer = http.post(f"/v2/{PARENT}/queuedResources", params={"queuedResourceId": "s"}, json=body)
    assert answer.status_code == 200, answer.text
    qr = http.get(f"/v2/{PARENT}/queuedResources/s").json()
    assert isinstance(qr["tpu"]["nodeSpec"], list) and qr["tpu"]["nodeSpec"][0]["nodeId"] == "s0"


def test_snake_case_names_and_nulls_are_read_as_proto3_json(http: httpx.Client) -> None:
    body = {"accelerator_type": "v5litepod-8", "runtime_version": RUNTIME, "description": None}
    answer = http.post(f"/v2/{PARENT}/nodes", params={"nodeId": "snake"}, json=body)
    assert answer.status_code == 200, answer.text
    assert http.get(f"/v2/{PARENT}/nodes/snake").json()["acceleratorType"] == "v5litepod-8"
