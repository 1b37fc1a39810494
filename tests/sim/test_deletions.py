"""The simulator's deletion log: who deleted each slice and how. A TPU API node deleted by the caller, and
by a host's service account (the token a host's metadata server hands out, the reason header kept); a token
the simulator never issued is refused with Google's 401 and deletes nothing. A Compute Engine instance
ends at its terminationTime (a scheduled termination in the log), and the time limits the simulator
cannot keep are refused."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from compute_helpers import ZONE as CE_ZONE
from compute_helpers import Clients, compute_world, instance_body
from google.api_core import exceptions
from sim_helpers import FAST_POLLING, PARENT, PROJECT, ZONE, make_world, node, tpu_client

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.engine.metadata_values import FAKE_TOKEN
from tpuctl.sim.wire import rfc3339
from tpuctl.testing.clock import wait_for


def _node_url(server: SimServer, name: str) -> str:
    return f"{server.url}/v2/{PARENT}/nodes/{name}"


def test_api_deletes_say_who_asked_and_an_unknown_token_deletes_nothing(
    start_server: Callable[..., SimServer],
) -> None:
    server = start_server(make_world())
    client = tpu_client(server.url)
    for name in ("mine", "hosts", "forged"):
        client.create_node(parent=PARENT, node_id=name, node=node()).result(polling=FAST_POLLING)
    with httpx.Client() as http:
        assert http.delete(_node_url(server, "mine")).status_code == 200
        by_host = http.delete(
            _node_url(server, "hosts"),
            headers={"Authorization": f"Bearer {FAKE_TOKEN}", "X-Goog-Request-Reason": "the program ended"},
        )
        assert by_host.status_code == 200
        forged = http.delete(_node_url(server, "forged"), headers={"Authorization": "Bearer not-issued"})
        assert forged.status_code == 401 and forged.json()["error"]["status"] == "UNAUTHENTICATED"
    assert client.get_node(name=f"{PARENT}/nodes/forged").name.endswith("/forged")
    with SimAdminClient(server.url) as admin:
        log = {d["name"]: d for d in admin.deletions()}
    assert set(log) == {"mine", "hosts"}
    assert log["mine"]["path"] == "api" and log["mine"]["principal"].startswith("the caller")
    assert log["hosts"]["principal"] == f"{PROJECT}-compute@developer.gserviceaccount.com (a host's token)"
    assert log["hosts"]["reason"] == "the program ended" and log["hosts"]["zone"] == ZONE


def test_an_instance_ends_at_its_termination_time(start_server: Callable[..., SimServer]) -> None:
    server = start_server(compute_world())
    c = Clients(server.url)
    ends_at = time.time() + 1.0
    body = instance_body("limited", instance_termination_action="DELETE")
    body.scheduling.termination_time = rfc3339(ends_at)
    c.done(c.instances.insert(project=PROJECT, zone=CE_ZONE, instance_resource=body))
    assert c.instances.get(project=PROJECT, zone=CE_ZONE, instance="limited").status == "RUNNING"

    def gone() -> bool:
        try:
            c.instances.get(project=PROJECT, zone=CE_ZONE, instance="limited")
        except exceptions.NotFound:
            return True
        return False

    wait_for(gone, timeout=20.0, what="the instance's scheduled termination")
    with SimAdminClient(server.url) as admin:
        (entry,) = admin.deletions()
    assert entry["path"] == "scheduled termination" and entry["name"] == "limited"
    assert entry["at"] >= ends_at and entry["principal"] is None
    assert entry["reason"].startswith("its time limit passed (terminationTime ")


@pytest.mark.parametrize(
    ("scheduling", "refusal"),
    [
        ({"instance_termination_action": "STOP"}, "only with DELETE"),
        (
            {"instance_termination_action": "DELETE", "max_run_duration": {"seconds": 3600}},
            "either maxRunDuration or terminationTime",
        ),
    ],
)
def test_time_limits_the_simulator_cannot_keep_are_refused(
    start_server: Callable[..., SimServer], scheduling: dict[str, Any], refusal: str
) -> None:
    server = start_server(compute_world())
    c = Clients(server.url)
    body = instance_body("x", **scheduling)
    body.scheduling.termination_time = rfc3339(time.time() + 3600)
    with pytest.raises(exceptions.BadRequest, match=refusal):
        c.instances.insert(project=PROJECT, zone=CE_ZONE, instance_resource=body)
