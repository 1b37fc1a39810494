"""The Cloud Quotas quotaInfos surface, the metadata-server surface, the admin API and the server's
plumbing (loopback binding, unknown routes, bad JSON, stop)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from google.cloud import tpu_v2
from sim_helpers import AUTH, PARENT, PROJECT, ZONE, create_ready, make_world, node, spot_node
from vm_helpers import start_vms

from tpuctl.errors import NotFoundError
from tpuctl.sim import SimAdminClient, SimServer

QUOTAS = f"/v1/projects/{PROJECT}/locations/global/services/tpu.googleapis.com/quotaInfos"


def test_quota_infos_list_shape_and_pages(start_server: Callable[..., SimServer]) -> None:
    server = start_server(
        make_world(
            quotas={
                "generations": {"v5e": {"preemptible": {"zone": 48, "region": 96}}},
                "overrides": [
                    {"generation": "v5e", "capacity": "preemptible", "location": "us-east5-b", "limit": 8}
                ],
            }
        )
    )
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        everything = http.get(QUOTAS).json()
        infos = {i["quotaId"]: i for i in everything["quotaInfos"]}
        # v5e and v6e and v5p are offered: on-demand and preemptible, per zone and per region; and v5e's
        # serving family, on-demand and preemptible, per zone only.
        assert len(infos) == 3 * 2 * 2 + 2
        zone_info = infos["TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"]
        assert zone_info["name"] == f"{QUOTAS[4:]}/TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"
        assert zone_info["service"] == "tpu.googleapis.com"
        assert zone_info["dimensions"] == ["zone"]
        assert zone_info["containerType"] == "PROJECT"
        assert zone_info["isPrecise"] is True
        assert zone_info["metric"].startswith("tpu.googleapis.com/")
        # Google's shape: one default entry (no dimensions) for every zone it lists, then the overrides.
        default, *overrides = zone_info["dimensionsInfos"]
        assert "dimensions" not in default
        assert default["details"]["value"] == "48"  # int64 as a JSON string
        assert default["applicableLocations"] == ["us-central1-a"]
        by_zone = {d["dimensions"]["zone"]: d for d in overrides}
        assert by_zone["us-east5-b"]["details"]["value"] == "8"
        assert by_zone["us-east5-b"]["applicableLocations"] == ["us-east5-b"]
        region_info = infos["TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI"]
        assert region_info["dimensions"] == ["region"]
        (region_default,) = region_info["dimensionsInfos"]
        assert region_default["details"]["value"] == "96"
        assert region_default["applicableLocations"] == ["us-central1", "us-east5"]
        assert infos["TPUV5PPerProjectPerZoneForTPUAPI"]["dimensionsInfos"][0]["details"]["value"] == "512"

        collected: list[str] = []
        token = ""
        pages = 0
        while True:
            page = http.get(QUOTAS, params={"pageSize": 5, "pageToken": token}).json()
            collected += [i["quotaId"] for i in page["quotaInfos"]]
            pages += 1
            token = page.get("nextPageToken", "")
            if not token:
                break
        assert pages == 3 and collected == [i["quotaId"] for i in everything["quotaInfos"]]

        one = http.get(f"{QUOTAS}/TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI")
        assert one.status_code == 200 and one.json() == zone_info
        missing = http.get(f"{QUOTAS}/NoSuchQuota")
        assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
        assert http.get(QUOTAS, params={"pageToken": "garbage!"}).status_code == 400


def test_metadata_server(server: SimServer) -> None:
    vms = start_vms(
        server,
        "md",
        metadata={"startup-script": "echo hi"},
        scheduling_config=tpu_v2.SchedulingConfig(spot=True),
    )
    base = vms.metadata_base(2) + "/computeMetadata/v1"
    google = {"Metadata-Flavor": "Google"}
    with httpx.Client() as http:
        refused = http.get(f"{base}/instance/preempted")
        assert refused.status_code == 403
        answer = http.get(f"{base}/instance/preempted", headers=google)
        assert answer.status_code == 200 and answer.text == "FALSE"
        assert answer.headers["Metadata-Flavor"] == "Google"
        assert http.get(f"{base}/instance/attributes/agent-worker-number", headers=google).text == "2"
        endpoints = http.get(f"{base}/instance/attributes/worker-network-endpoints", headers=google).text
        assert endpoints == ",".join(f"unknown:unknown:{a}" for a in vms.addresses)
        assert http.get(f"{base}/instance/maintenance-event", headers=google).text == "NONE"
        assert http.get(f"{base}/instance/attributes/startup-script", headers=google).text == "echo hi"
        assert http.get(f"{base}/instance/scheduling/preemptible", headers=google).text == "TRUE"
        assert http.get(f"{base}/instance/attributes/accelerator-type", headers=google).text == "v5litepod-16"
        assert http.get(f"{base}/project/project-id", headers=google).text == PROJECT
        assert http.get(f"{base}/instance/nope", headers=google).status_code == 404
        listing = http.get(f"{base}/instance/attributes/", headers=google).text.splitlines()
        assert {"agent-worker-number", "ssh-keys", "tpu-env", "worker-network-endpoints"} <= set(listing)
    with SimAdminClient(server.url) as admin, pytest.raises(NotFoundError):
        admin.metadata(ZONE, "md", 4)  # a 4-host node has workers 0..3


def test_metadata_wait_for_change(start_server: Callable[..., SimServer]) -> None:
    # A grace long enough that the VM still answers when the watcher's request arrives, however late a
    # loaded machine lets it start (the base world's 0.03 s grace wiped it first under load).
    server = start_server(make_world(durations={"preemption_grace_s": 30}))
    vms = start_vms(server, "wait", "v5litepod-4", scheduling_config=tpu_v2.SchedulingConfig(spot=True))
    url = vms.metadata_base(0) + "/computeMetadata/v1/instance/preempted"
    google = {"Metadata-Flavor": "Google"}
    first = httpx.get(url, headers=google)
    assert first.text == "FALSE" and first.headers["ETag"]
    answers: list[str] = []

    def watch() -> None:
        # last_etag: answered at once if the value changed before this request arrived (as on GCE).
        params = {"wait_for_change": "true", "timeout_sec": "10", "last_etag": first.headers["ETag"]}
        answers.append(httpx.get(url, params=params, headers=google, timeout=15).text)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with SimAdminClient(server.url) as admin:
        admin.preempt(ZONE, "wait", notice=True)
        watcher.join(timeout=12)
        assert answers == ["TRUE"]
        assert admin.metadata(ZONE, "wait", 0) == "TRUE"


def test_admin_status(server: SimServer, client: tpu_v2.TpuClient, admin: SimAdminClient) -> None:
    create_ready(client, "s1", node("v5litepod-16"))
    create_ready(client, "s2", spot_node("v5litepod-8"))
    status = admin.status()
    assert status["backend"] == "sim" and status["project"] == PROJECT and status["speed"] == 1000
    assert status["sim_time_s"] > 0
    zone = next(z for z in status["zones"] if z["zone"] == ZONE)
    pools = {(p["generation"], p["capacity_class"]): p for p in zone["pools"]}
    assert pools[("v5e", "on_demand")] == {
        "generation": "v5e",
        "capacity_class": "on_demand",
        "capacity_chips": 64,
        "in_use_chips": 16,
        "free_chips": 48,
    }
    assert pools[("v5e", "preemptible")]["in_use_chips"] == 8
    assert {n["name"]: n["state"] for n in status["nodes"]} == {"s1": "READY", "s2": "READY"}
    assert status["reservations"][0]["name"] == "res-a" and status["reservations"][0]["free_chips"] == 16
    assert status["world"]["zones"] == ["us-central1-a", "us-central1-b", "us-east5-b"]


def test_admin_endpoints_override(server: SimServer, client: tpu_v2.TpuClient, admin: SimAdminClient) -> None:
    create_ready(client, "ep", node("v5litepod-16"))
    ssh = [{"ipAddress": "127.0.0.1", "port": 22000 + i} for i in range(4)]
    answer = admin.set_endpoints(ZONE, "ep", ssh)
    assert answer["networkEndpoints"] == ssh
    got = client.get_node(name=f"{PARENT}/nodes/ep")
    assert [e.port for e in got.network_endpoints] == [22000, 22001, 22002, 22003]
    admin.set_endpoints(ZONE, "ep", None)
    assert {e.port for e in client.get_node(name=f"{PARENT}/nodes/ep").network_endpoints} == {8470}
    with pytest.raises(NotFoundError):
        admin.set_endpoints(ZONE, "nope", ssh)
    with pytest.raises(Exception, match="ipAddress"):
        admin.set_endpoints(ZONE, "ep", [{"port": 1}])


def test_admin_errors(admin: SimAdminClient) -> None:
    with pytest.raises(NotFoundError):
        admin.preempt(ZONE, "ghost")
    with pytest.raises(Exception, match="zone"):
        admin.stockout("")
    with pytest.raises(NotFoundError):
        admin.metadata(ZONE, "ghost", 0)


def test_binds_loopback_only(server: SimServer) -> None:
    assert server.url.startswith("http://127.0.0.1:")
    with socket.create_connection(("127.0.0.1", server.port), timeout=2):
        pass


def test_unknown_routes_and_bad_json(server: SimServer) -> None:
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        missing = http.get("/v3/nothing")
        assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
        bad = http.post(f"/v2/{PARENT}/nodes", params={"nodeId": "x"}, content=b"{not json")
        assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
        wrong_method = http.put(f"/v2/{PARENT}/nodes")
        assert wrong_method.status_code == 405
        # The client's query suffix is accepted.
        assert http.get(f"/v2/{PARENT}/nodes?$alt=json;enum-encoding=int").status_code == 200


def test_context_manager_and_fast_start_stop(tmp_path: Path) -> None:
    state = tmp_path / "cm"
    with SimServer(state, make_world(), vms="hypervisor"):  # a first start creates the state
        pass
    # As every CLI command uses it (its start and stop times are in scripts/bench_cli.py's figures).
    with SimServer(state, vms="hypervisor") as server:
        url = server.url
        assert httpx.get(f"{url}/sim/v1/status").status_code == 200
        keep_alive = httpx.Client()
        keep_alive.get(f"{url}/sim/v1/faults")
    with pytest.raises(httpx.TransportError):
        keep_alive.get(f"{url}/sim/v1/faults")
    keep_alive.close()
    with pytest.raises(RuntimeError):
        _ = server.url
