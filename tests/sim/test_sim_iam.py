"""The simulator authenticates and authorizes as Google's front ends do: no token is 401, a token it did
not issue is 401, a missing permission is 403 naming it (each API in its own words), a project the caller
has no role on is 403; Policy Troubleshooter answers from the same policy; a host's metadata server hands
out its service account's own token. In process: the route
table, no server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.sim.iam import ADC_TOKEN, access_token, default_service_account
from tpuctl.sim.world import World, world_from_data
from tpuctl.testing.cloud import ENDPOINT, InProcessSim, answer

PROJECT = "tpuctl-sim"
USER = "sim-user@example.com"
HOSTS = default_service_account(PROJECT)
AUTH = {"Authorization": f"Bearer {ADC_TOKEN}"}
TPU_NODES = f"{ENDPOINT}/v2/projects/{PROJECT}/locations/us-central1-a/nodes"
INSTANCES = f"{ENDPOINT}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances"
#: A caller with TPU roles only, and hosts that may read the bucket but not write it.
TPU_ONLY = {
    PROJECT: [
        {"role": "roles/tpu.admin", "members": [f"user:{USER}"]},
        {"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{HOSTS}"]},
    ]
}


def _world(iam: dict[str, Any] | None) -> World:
    return world_from_data({"zones": {"us-central1-a": {"v5e": {"on_demand": 8}}}, "iam": iam}, "test world")


@pytest.fixture
def sim(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[InProcessSim]:
    iam = getattr(request, "param", None)
    with InProcessSim(tmp_path, _world(iam)) as sim:
        yield sim


def call(sim: InProcessSim, method: str, url: str, headers: dict[str, str] | None = None, **body: Any) -> Any:
    sent = json.dumps(body).encode() if body else b""
    response = answer(sim.engine, method, url, headers or {}, sent)
    return response.status, json.loads(response.body)


def test_no_token_is_401_in_each_api_s_shape(sim: InProcessSim) -> None:
    status, tpu = call(sim, "GET", TPU_NODES)
    assert status == 401 and tpu["error"]["status"] == "UNAUTHENTICATED"
    assert tpu["error"]["message"].startswith("Request is missing required authentication credential.")
    assert tpu["error"]["details"][0]["reason"] == "CREDENTIALS_MISSING"
    status, compute = call(sim, "GET", INSTANCES)
    assert status == 401 and compute["error"]["errors"][0]["reason"] == "required"
    assert compute["error"]["errors"][0]["location"] == "Authorization"
    status, bad = call(sim, "GET", TPU_NODES, {"Authorization": "Bearer made-up"})
    assert status == 401 and bad["error"]["details"][0]["reason"] == "ACCESS_TOKEN_TYPE_UNSUPPORTED"
    # Even a URL no route serves: authentication comes first.
    assert call(sim, "GET", f"{ENDPOINT}/v2/nothing")[0] == 401
    # The discovery documents and the admin API take anyone.
    assert answer(sim.engine, "GET", f"{ENDPOINT}/$discovery/rest?version=v2", {}, b"").status == 200
    assert answer(sim.engine, "GET", f"{ENDPOINT}/sim/v1/status", {}, b"").status == 200


@pytest.mark.parametrize("sim", [TPU_ONLY], indirect=True)
def test_a_missing_permission_is_403_naming_it(sim: InProcessSim) -> None:
    assert call(sim, "GET", TPU_NODES, AUTH)[0] == 200
    status, compute = call(sim, "GET", INSTANCES, AUTH)
    assert status == 403
    assert compute == {
        "error": {
            "code": 403,
            "message": f"Required 'compute.instances.list' permission for 'projects/{PROJECT}'",
            "errors": [
                {
                    "message": f"Required 'compute.instances.list' permission for 'projects/{PROJECT}'",
                    "domain": "global",
                    "reason": "forbidden",
                }
            ],
        }
    }
    quotas = f"{ENDPOINT}/v1/projects/{PROJECT}/locations/global/services/tpu.googleapis.com/quotaInfos"
    status, denied = call(sim, "GET", quotas, AUTH)
    assert status == 403 and denied["error"]["status"] == "PERMISSION_DENIED"
    assert denied["error"]["message"] == (
        "Permission 'cloudquotas.quotas.get' denied on resource '//cloudquotas.googleapis.com/projects/"
        f"{PROJECT}/locations/global/services/tpu.googleapis.com/quotaInfos' (or it may not exist)."
    )
    info = denied["error"]["details"][0]
    assert (
        info["reason"] == "IAM_PERMISSION_DENIED"
        and info["metadata"]["permission"] == "cloudquotas.quotas.get"
    )


def test_a_project_the_caller_has_no_role_on_is_403(sim: InProcessSim) -> None:
    other = TPU_NODES.replace(PROJECT, "someone-else")
    status, denied = call(sim, "GET", other, AUTH)
    assert status == 403 and denied["error"]["details"][0]["metadata"]["permission"] == "tpu.nodes.list"
    # The hosts' account is the project's editor by default; another account is nobody here.
    assert call(sim, "GET", TPU_NODES, {"Authorization": f"Bearer {access_token(HOSTS)}"})[0] == 200
    assert call(sim, "GET", TPU_NODES, {"Authorization": f"Bearer {access_token('x@example.com')}"})[0] == 403


@pytest.mark.parametrize("sim", [TPU_ONLY], indirect=True)
def test_the_troubleshooter_answers_from_the_policy(sim: InProcessSim) -> None:
    def troubleshoot(principal: str, permission: str, token: str = ADC_TOKEN) -> Any:
        tuple_ = {
            "principal": principal,
            "fullResourceName": "//storage.googleapis.com/projects/_/buckets/tpuctl-sim",
            "permission": permission,
        }
        headers = {"Authorization": f"Bearer {token}"}
        return call(sim, "POST", f"{ENDPOINT}/v1/iam:troubleshoot", headers, accessTuple=tuple_)

    # The TPU-only caller may not read the project's policy: the troubleshooter cannot tell it.
    assert troubleshoot(HOSTS, "storage.objects.get")[1]["access"] == "UNKNOWN_INFO_DENIED"
    owner = access_token("admin@example.com")
    sim.engine.install_world(
        _world(
            {PROJECT: [*TPU_ONLY[PROJECT], {"role": "roles/owner", "members": ["user:admin@example.com"]}]}
        )
    )
    assert troubleshoot(HOSTS, "storage.objects.get", owner)[1]["access"] == "GRANTED"
    status, verdict = troubleshoot(HOSTS, "storage.objects.create", owner)
    assert status == 200 and verdict["access"] == "NOT_GRANTED"
    assert (
        verdict["explainedPolicies"][0]["fullResourceName"]
        == f"//cloudresourcemanager.googleapis.com/projects/{PROJECT}"
    )


def test_tokeninfo_names_the_token_s_account(sim: InProcessSim) -> None:
    assert call(sim, "GET", f"{ENDPOINT}/tokeninfo?access_token={ADC_TOKEN}")[1]["email"] == USER
    assert call(sim, "GET", f"{ENDPOINT}/tokeninfo?access_token={access_token(HOSTS)}")[1]["email"] == HOSTS
    status, refused = call(sim, "GET", f"{ENDPOINT}/tokeninfo?access_token=nope")
    assert status == 400 and refused["error"] == "invalid_token"


def test_a_host_s_metadata_server_hands_out_its_account_s_token() -> None:
    from tpuctl.sim.engine.metadata_values import host_service_account

    assert host_service_account(PROJECT, {}) == HOSTS
    assert host_service_account(PROJECT, {"serviceAccount": {"email": "default"}}) == HOSTS
    mine = "runner@tpuctl-sim.iam.gserviceaccount.com"
    assert host_service_account(PROJECT, {"serviceAccount": {"email": mine}}) == mine
