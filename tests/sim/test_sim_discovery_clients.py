"""The simulator as a drop-in fake TPU API: google-api-python-client's ``tpu`` v2 and v2alpha1 clients,
built from the discovery document the simulator serves (its URL is all they are given), drive nodes,
queued resources, guest attributes and operations; every answer conforms to Google's own discovery
document (the copy google-api-python-client ships, not the simulator's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_schema import check, google_document, response_schema
from googleapiclient.discovery import build
from sim_helpers import AUTH, PARENT, PROJECT, ZONE

from tpuctl.backends.sim import sim_credentials
from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.testing.clock import wait_for

VERSIONS = ("v2", "v2alpha1")
RUNTIME = "v2-alpha-tpuv5-lite"


class Api:
    """One discovery-built client and the checks made on every answer."""

    def __init__(self, url: str, version: str) -> None:
        self.version = version
        self.service = build(
            "tpu",
            version,
            discoveryServiceUrl=url + "/$discovery/rest?version={apiVersion}",
            credentials=sim_credentials(),
            cache_discovery=False,
            static_discovery=False,
        )
        self.locations = self.service.projects().locations()

    def run(self, request: Any) -> dict[str, Any]:
        result: dict[str, Any] = request.execute()
        schema = response_schema(self.version, request.methodId)
        if schema is not None:
            assert check(self.version, schema, result) == [], request.methodId
        return result

    def wait(self, op: dict[str, Any]) -> dict[str, Any]:
        """The operation once done (checked like every answer); its @type URLs name this version."""
        ops = self.locations.operations()
        done = wait_for(lambda: (o := self.run(ops.get(name=op["name"])))["done"] and o, what=op["name"])
        assert f"google.cloud.tpu.{self.version}." in done["metadata"]["@type"]
        return done

    def qr_state(self, qr_id: str) -> str:
        qr = self.run(self.locations.queuedResources().get(name=f"{PARENT}/queuedResources/{qr_id}"))
        return str(qr["state"]["state"])

    def wait_qr(self, qr_id: str, state: str) -> None:
        wait_for(lambda: self.qr_state(qr_id) == state, what=f"{qr_id} {state}")


@pytest.fixture(params=VERSIONS)
def api(request: pytest.FixtureRequest, server: SimServer) -> Iterator[Api]:
    client = Api(server.url, request.param)
    yield client
    client.service.close()


def _node(accelerator_type: str = "v5litepod-8", **fields: Any) -> dict[str, Any]:
    return {"acceleratorType": accelerator_type, "runtimeVersion": RUNTIME, **fields}


def test_discovery_document_is_googles_pointing_here(server: SimServer) -> None:
    import httpx

    for version in VERSIONS:
        served = httpx.get(server.url + "/$discovery/rest", params={"version": version}).json()
        google = google_document(version)
        assert served["rootUrl"] == server.url + "/"
        assert served["revision"] == google["revision"]
        assert served["schemas"] == google["schemas"] and served["resources"] == google["resources"]


def test_nodes(api: Api) -> None:
    nodes = api.locations.nodes()
    api.wait(api.run(nodes.create(parent=PARENT, nodeId="a", body=_node(labels={"team": "x"}))))
    spot = _node(schedulingConfig={"spot": True}, networkConfig={"enableExternalIps": True})
    api.wait(api.run(nodes.create(parent=PARENT, nodeId="b", body=spot)))
    node = api.run(nodes.get(name=f"{PARENT}/nodes/a"))
    assert node["state"] == "READY" and node["labels"] == {"team": "x"}
    # Google's defaults: the network resolved, no external IP unless asked for.
    assert node["networkConfig"]["network"] == f"projects/{PROJECT}/global/networks/default"
    assert "accessConfig" not in node["networkEndpoints"][0]
    assert api.run(nodes.get(name=f"{PARENT}/nodes/b"))["networkEndpoints"][0]["accessConfig"]["externalIp"]

    # Paged: one node a page, the client follows nextPageToken.
    request, names = nodes.list(parent=PARENT, pageSize=1), []
    while request is not None:
        page = api.run(request)
        names += [n["name"].rsplit("/", 1)[-1] for n in page.get("nodes", [])]
        request = nodes.list_next(request, page)
    assert names == ["a", "b"]

    patched = api.wait(
        api.run(nodes.patch(name=f"{PARENT}/nodes/a", updateMask="labels", body={"labels": {"t": "y"}}))
    )
    assert patched["response"]["labels"] == {"t": "y"}
    api.wait(api.run(nodes.stop(name=f"{PARENT}/nodes/a", body={})))
    assert api.run(nodes.get(name=f"{PARENT}/nodes/a"))["state"] == "STOPPED"
    api.wait(api.run(nodes.start(name=f"{PARENT}/nodes/a", body={})))
    attributes = api.run(nodes.getGuestAttributes(name=f"{PARENT}/nodes/a", body={"queryPath": "guest/"}))
    assert attributes["guestAttributes"] == [{"queryPath": "guest/", "queryValue": {"items": []}}]

    ops = api.run(api.locations.operations().list(name=PARENT))["operations"]
    assert {o["metadata"]["verb"] for o in ops} >= {"create", "update", "stop", "start"}
    for node_id in ("a", "b"):
        api.wait(api.run(nodes.delete(name=f"{PARENT}/nodes/{node_id}")))
    assert api.run(nodes.list(parent=PARENT)).get("nodes", []) == []


def test_filtered_and_ordered_lists(api: Api) -> None:
    types = api.locations.acceleratorTypes()
    only = api.run(types.list(parent=PARENT, filter="type=v5litepod-8"))["acceleratorTypes"]
    assert [t["type"] for t in only] == ["v5litepod-8"]
    ordered = api.run(types.list(parent=PARENT, filter="type:v5litepod", orderBy="type desc", pageSize=2))
    assert [t["type"] for t in ordered["acceleratorTypes"]] == ["v5litepod-8", "v5litepod-64"]
    assert "nextPageToken" in ordered
    versions = api.run(api.locations.runtimeVersions().list(parent=PARENT, filter="version:tpuv5"))
    assert {v["version"] for v in versions["runtimeVersions"]} == {"v2-alpha-tpuv5", "v2-alpha-tpuv5-lite"}


def _spec(api: Api, **fields: Any) -> dict[str, Any]:
    return {"parent": PARENT, "node": _node("v5litepod-4"), **fields}


def _multislice(api: Api, count: int, prefix: str) -> dict[str, Any]:
    key = "multisliceParams" if api.version == "v2" else "multiNodeParams"
    return _spec(api, **{key: {"nodeCount": count, "nodeIdPrefix": prefix}})


def test_queued_resources(api: Api) -> None:
    qrs = api.locations.queuedResources()
    bodies = {
        "single": {"tpu": {"nodeSpec": [_spec(api, nodeId="single-0")]}, "guaranteed": {}},
        "multi": {"tpu": {"nodeSpec": [_multislice(api, 2, "ms")]}, "spot": {}},
        # One object where the schema says a list: what SkyPilot sends, and Google accepts.
        "lone": {"tpu": {"nodeSpec": _spec(api, nodeId="lone-0")}, "spot": {}},
    }
    if api.version == "v2alpha1":
        bodies["best"] = {"tpu": {"nodeSpec": [_spec(api, nodeId="best-0")]}, "bestEffort": {}}
    for qr_id, body in bodies.items():
        api.wait(api.run(qrs.create(parent=PARENT, queuedResourceId=qr_id, body=body)))
    for qr_id in bodies:
        api.wait_qr(qr_id, "ACTIVE")
    multi = api.run(qrs.get(name=f"{PARENT}/queuedResources/multi"))
    assert ("multisliceParams" if api.version == "v2" else "multiNodeParams") in multi["tpu"]["nodeSpec"][0]
    nodes = api.run(api.locations.nodes().list(parent=PARENT))["nodes"]
    assert {n["name"].rsplit("/", 1)[-1] for n in nodes} == {"single-0", "ms-0", "ms-1", "lone-0"} | (
        {"best-0"} if api.version == "v2alpha1" else set()
    )
    assert all(n["schedulingConfig"].get("spot") for n in nodes if n["name"].endswith(("ms-0", "lone-0")))
    if api.version == "v2alpha1":
        assert "bestEffort" in api.run(qrs.get(name=f"{PARENT}/queuedResources/best"))
    listed = api.run(qrs.list(parent=PARENT))["queuedResources"]
    assert len(listed) == len(bodies)
    for qr_id in bodies:  # ACTIVE with nodes: only a forced delete goes through
        api.wait(api.run(qrs.delete(name=f"{PARENT}/queuedResources/{qr_id}", force=True)))
    wait_for(lambda: not api.run(qrs.list(parent=PARENT)).get("queuedResources"), what="deleted")


def test_valid_until_expiry_and_reset(api: Api, admin: SimAdminClient) -> None:
    qrs = api.locations.queuedResources()
    admin.stockout(ZONE)
    body = {
        "tpu": {"nodeSpec": [_spec(api, nodeId="late-0")]},
        "spot": {},
        "queueingPolicy": {"validUntilDuration": "5s"},
    }
    api.wait(api.run(qrs.create(parent=PARENT, queuedResourceId="late", body=body)))
    api.wait_qr("late", "FAILED")
    failed = api.run(qrs.get(name=f"{PARENT}/queuedResources/late"))
    assert failed["state"]["failedData"]["error"]["code"] == 8
    admin.stockout(ZONE, clear=True)
    api.wait(api.run(qrs.reset(name=f"{PARENT}/queuedResources/late", body={})))
    api.wait_qr("late", "ACTIVE")


def test_google_cloud_tpu_v2alpha1_types_round_trip(server: SimServer) -> None:
    """google-cloud-tpu's v2alpha1 messages (gRPC-only in the package: their JSON forms over HTTP here)
    are accepted as sent, every default field included, and the answers parse back strictly."""
    import httpx
    from google.cloud import tpu_v2alpha1 as alpha

    node = alpha.Node(accelerator_type="v5litepod-4", runtime_version=RUNTIME, autocheckpoint_enabled=True)
    params = alpha.QueuedResource.Tpu.NodeSpec.MultiNodeParams(node_count=2, node_id_prefix="ck")
    spec = alpha.QueuedResource.Tpu.NodeSpec(parent=PARENT, node=node, multi_node_params=params)
    request = alpha.QueuedResource(tpu=alpha.QueuedResource.Tpu(node_spec=[spec]), best_effort={})
    url = f"{server.url}/v2alpha1/{PARENT}/queuedResources"
    answer = httpx.post(
        url, params={"queuedResourceId": "ck"}, content=alpha.QueuedResource.to_json(request), headers=AUTH
    )
    assert answer.status_code == 200, answer.text
    wait_for(lambda: httpx.get(f"{url}/ck", headers=AUTH).json()["state"]["state"] == "ACTIVE")
    qr = alpha.QueuedResource.from_json(
        httpx.get(f"{url}/ck", headers=AUTH).text, ignore_unknown_fields=False
    )
    assert qr.tpu.node_spec[0].multi_node_params.node_count == 2
    assert "best_effort" in qr
    listed = httpx.get(f"{server.url}/v2alpha1/{PARENT}/nodes", headers=AUTH).text
    nodes = alpha.ListNodesResponse.from_json(listed, ignore_unknown_fields=False).nodes
    assert sorted(n.name.rsplit("/", 1)[-1] for n in nodes) == ["ck-0", "ck-1"]
    assert all(n.autocheckpoint_enabled and n.api_version == alpha.Node.ApiVersion.V2_ALPHA1 for n in nodes)


def test_v2alpha1_own_methods(server: SimServer) -> None:
    from googleapiclient.errors import HttpError

    api = Api(server.url, "v2alpha1")
    nodes, qrs = api.locations.nodes(), api.locations.queuedResources()
    reservations = api.run(api.locations.reservations().list(parent=PARENT))["reservations"]
    assert [(r["name"].rsplit("/", 1)[-1], r["standard"]["size"]) for r in reservations] == [("res-a", 16)]
    api.wait(api.run(nodes.create(parent=PARENT, nodeId="m", body=_node())))
    done = api.wait(
        api.run(nodes.simulateMaintenanceEvent(name=f"{PARENT}/nodes/m", body={"workerIds": ["0"]}))
    )
    assert done["response"]["name"] == f"{PARENT}/nodes/m"
    with pytest.raises(HttpError) as info:
        nodes.performMaintenance(name=f"{PARENT}/nodes/m", body={}).execute()
    assert info.value.status_code == 400
    body = {"tpu": {"nodeSpec": [_spec(api, nodeId="q-0")]}, "spot": {}}
    api.wait(api.run(qrs.create(parent=PARENT, queuedResourceId="q", body=body)))
    assert api.run(qrs.getMaintenanceInfo(name=f"{PARENT}/queuedResources/q")) == {}
    api.service.close()
