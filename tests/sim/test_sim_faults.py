"""Injected faults: transient errors at the configured rate (a mix of 429/500/503), ambiguous drops of
mutations that were performed, latency; never on the admin or metadata surfaces."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable

import httpx
import pytest
import requests
from google.api_core import exceptions
from google.cloud import tpu_v2
from sim_helpers import AUTH, PARENT, create_ready, make_world, node, tpu_client

from tpuctl.sim import SimAdminClient, SimServer


def test_transient_error_rate_is_statistically_right(start_server: Callable[..., SimServer]) -> None:
    server = start_server(make_world(faults={"transient_error_rate": 0.25}))
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        for _ in range(400):
            response = http.get(f"/v2/{PARENT}/nodes")
            statuses[response.status_code] += 1
            if response.status_code != 200:
                error = response.json()["error"]
                assert error["code"] == response.status_code
                assert error["status"] in {"RESOURCE_EXHAUSTED", "INTERNAL", "UNAVAILABLE"}
        # The admin and metadata surfaces never fail.
        for _ in range(50):
            assert http.get("/sim/v1/status").status_code == 200
    failures = 400 - statuses[200]
    # Binomial(400, 0.25): mean 100, sd ~8.7; 60..140 is beyond 4.5 sd.
    assert 60 <= failures <= 140, statuses
    assert set(statuses) == {200, 429, 500, 503}, statuses


def test_faults_change_at_runtime(server: SimServer, admin: SimAdminClient) -> None:
    assert admin.faults() == {"transient_error_rate": 0.0, "ambiguous_error_rate": 0.0}
    admin.set_faults(transient_error_rate=1.0)
    assert httpx.get(f"{server.url}/v2/{PARENT}/nodes").status_code in (429, 500, 503)
    quotas = f"{server.url}/v1/projects/p/locations/global/services/tpu.googleapis.com/quotaInfos"
    assert httpx.get(quotas).status_code in (429, 500, 503)
    assert admin.set_faults(transient_error_rate=0.0)["transient_error_rate"] == 0.0
    assert httpx.get(f"{server.url}/v2/{PARENT}/nodes", headers=AUTH).status_code == 200
    with pytest.raises(Exception, match="Invalid fault rates"):
        admin.set_faults(ambiguous_error_rate=2.0)


def test_transient_errors_happen_before_the_mutation(server: SimServer, admin: SimAdminClient) -> None:
    client = tpu_client(server.url)
    admin.set_faults(transient_error_rate=1.0)
    with pytest.raises(
        (exceptions.TooManyRequests, exceptions.InternalServerError, exceptions.ServiceUnavailable)
    ):
        client.create_node(parent=PARENT, node_id="never", node=node())
    admin.set_faults(transient_error_rate=0.0)
    assert list(client.list_nodes(parent=PARENT)) == []


def test_ambiguous_drop_performs_the_mutation(server: SimServer, admin: SimAdminClient) -> None:
    client = tpu_client(server.url)
    admin.set_faults(ambiguous_error_rate=1.0)
    # What the real client raises: the connection closed with no response (not a google.api_core error).
    with pytest.raises(requests.exceptions.ConnectionError):
        client.create_node(parent=PARENT, node_id="maybe", node=node())
    # Reads are never dropped.
    names = [n.name.rsplit("/", 1)[-1] for n in client.list_nodes(parent=PARENT)]
    assert names == ["maybe"]  # it happened
    with pytest.raises(requests.exceptions.ConnectionError):
        client.delete_node(name=f"{PARENT}/nodes/maybe")
    admin.set_faults(ambiguous_error_rate=0.0)
    # The delete happened: the node is going, or (a slow machine, a fast world) already gone.
    with contextlib.suppress(exceptions.NotFound):
        assert client.get_node(name=f"{PARENT}/nodes/maybe").state == tpu_v2.Node.State.DELETING


def test_ambiguous_rate_is_statistically_right(start_server: Callable[..., SimServer]) -> None:
    server = start_server(make_world(faults={"ambiguous_error_rate": 0.3}))
    dropped = 0
    body = {"acceleratorType": "v5litepod-1", "runtimeVersion": "v2-alpha-tpuv5-lite"}
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        for i in range(200):
            try:
                response = http.post(f"/v2/{PARENT}/nodes", params={"nodeId": f"n{i}"}, json=body)
                assert response.status_code == 200
            except httpx.TransportError:
                dropped += 1
        # Every create happened, answered or not (an operation each; the later ones stock out).
        operations = http.get(f"/v2/{PARENT}/operations").json()["operations"]
    assert len(operations) == 200
    # Binomial(200, 0.3): mean 60, sd ~6.5.
    assert 30 <= dropped <= 90, dropped


def test_latency_applies_to_the_tpu_api_only(start_server: Callable[..., SimServer]) -> None:
    server = start_server(make_world(latency={"base_ms": 200, "jitter_ms": 0}))
    with httpx.Client(base_url=server.url) as http:
        http.get("/sim/v1/status")  # connect first
        started = time.perf_counter()
        http.get(f"/v2/{PARENT}/nodes")
        api_s = time.perf_counter() - started
        started = time.perf_counter()
        http.get("/sim/v1/faults")
        admin_s = time.perf_counter() - started
    assert api_s >= 0.195, api_s
    assert admin_s < 0.15, admin_s


def test_lro_polling_survives_no_faults_and_default_polling_is_slow(server: SimServer) -> None:
    # The client's default LRO polling starts at 1 s: callers should pass a faster polling object
    # against the simulator (as FAST_POLLING here).
    client = tpu_client(server.url)
    started = time.perf_counter()
    create_ready(client, "quick", node())
    assert time.perf_counter() - started < 1.0
    assert client.get_node(name=f"{PARENT}/nodes/quick").state == tpu_v2.Node.State.READY
