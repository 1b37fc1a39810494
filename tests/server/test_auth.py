"""The API with a workspace file, in process (FastAPI's test client over the in-process simulator), its
tokens minted by a served simulator's issuer and verified by google-auth against its certificates: who
gets 401, 403 and 404, what each caller sees, and the audit row of each change and refusal."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.cloud.identity import GCLOUD_CLIENT_ID, IAP_HEADER, IdentityIssuer
from tpuctl.server.app import build_app
from tpuctl.server.auth import AuthConfig, Authenticator
from tpuctl.server.bundles import BundleStore
from tpuctl.services.session import Session, open_session
from tpuctl.settings import load_settings
from tpuctl.sim import SimServer
from tpuctl.sim.issuer import Issuer, issuer_of
from tpuctl.store.records import RunStatus
from tpuctl.teams.workspaces import load_workspaces
from tpuctl.testing.backend import InProcessCli

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

AUDIENCE = "http://tpuctl.test"
IAP_AUDIENCE = "/projects/123/global/backendServices/456"
CI = "ci@proj.iam.gserviceaccount.com"
WORKSPACES = f"""\
workspaces:
  team-a:
    project: proj-a
    chips: {{v5e: 32}}
    usd_per_month: 50
    members:
      a1@example.com: member
      a2@example.com: viewer
      boss@example.com: admin
  team-b:
    chips: {{v5e: 16}}
    members:
      b1@example.com: member
      {CI}: member
metrics:
  scrape_token_sha256: {hashlib.sha256(b"scrape-me").hexdigest()}
"""


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """A served simulator: the issuer whose certificates the server fetches over HTTP (one for the
    module: its keys are what every test verifies against)."""
    with SimServer(tmp_path_factory.mktemp("idp")) as server:
        yield server


@pytest.fixture
def issuer(idp: SimServer) -> Issuer:
    return issuer_of(idp.engine)


@pytest.fixture
def session(sim_cli: InProcessCli, state_dir: Path) -> Iterator[Session]:
    opened = open_session(load_settings({"backend": "sim", "state_dir": state_dir}), backend=sim_cli.backend)
    with opened:
        yield opened


@pytest.fixture
def api(session: Session, idp: SimServer, tmp_path: Path) -> TestClient:
    path = tmp_path / "workspaces.yaml"
    path.write_text(WORKSPACES)
    config = AuthConfig(
        workspaces=load_workspaces(path),
        audience=AUDIENCE,
        issuer=IdentityIssuer.at(idp.url),
        iap_audience=IAP_AUDIENCE,
    )
    app = build_app(session, BundleStore(tmp_path / "bundles"), None, auth=Authenticator(config))
    return TestClient(app)


def as_(issuer: Issuer, email: str, audience: str = AUDIENCE) -> dict[str, str]:
    return {"Authorization": f"Bearer {issuer.id_token(email, audience)}"}


def runs_of(session: Session) -> dict[str, str]:
    """One run of team-a (a1's) and one of team-b (b1's), as a submission records them."""
    ids = {"a": "run-20261127-100000-aaaa", "b": "run-20261127-100001-bbbb"}
    for team, run_id in ids.items():
        session.ledger.create_run(run_id, script="prog.py", status=RunStatus.FAILED,
                                  principal=f"{team}1@example.com", workspace=f"team-{team}")  # fmt: skip
    return ids


def test_no_token_or_a_bad_one_is_401_with_www_authenticate(
    api: TestClient, issuer: Issuer, tmp_path: Path
) -> None:
    bare = api.get("/v1/runs")
    assert bare.status_code == 401 and bare.headers["www-authenticate"] == 'Bearer realm="tpuctl"'
    assert bare.json()["error"] == "unauthenticated" and "gcloud auth login" in bare.json()["fix"]
    for headers in (
        {"Authorization": "Bearer not-a-jwt"},
        as_(issuer, "a1@example.com", audience="https://another.server"),
    ):
        refused = api.get("/v1/runs", headers=headers)
        assert refused.status_code == 401, refused.text
        assert 'error="invalid_token"' in refused.headers["www-authenticate"]
    assert api.get("/healthz").status_code == 200  # the probes need no token
    scrape = {"Authorization": "Bearer scrape-me"}  # the workspace file's scrape token opens /metrics only
    assert api.get("/metrics", headers=scrape).status_code == 200
    assert api.get("/metrics", headers={"Authorization": "Bearer guess"}).status_code == 401
    assert api.get("/v1/runs", headers=scrape).status_code == 401
    assert api.get("/", headers={}).status_code == 401  # nor do the dashboard's pages go without one
    forged = Issuer(tmp_path / "elsewhere").id_token("a1@example.com", AUDIENCE)  # same claims, other keys
    refused = api.get("/v1/runs", headers={"Authorization": f"Bearer {forged}"})
    assert refused.status_code == 401 and "Certificate for key id" in refused.json()["message"]


def test_gcloud_iap_and_rotated_keys_are_taken_and_a_stranger_is_403(
    api: TestClient, issuer: Issuer, session: Session
) -> None:
    assert api.get("/v1/runs", headers=as_(issuer, "a1@example.com", GCLOUD_CLIENT_ID)).status_code == 200
    stranger = api.get("/v1/runs", headers=as_(issuer, "eve@example.com", GCLOUD_CLIENT_ID))
    assert stranger.status_code == 403 and "not a member of any workspace" in stranger.json()["message"]
    refused = session.ledger.audit_entries(principal="eve@example.com")  # who was refused is written
    assert [(e.action, e.status, e.workspace) for e in refused] == [("runs.list", 403, None)]
    # A metadata server's token without format=full has no email: refused.
    bare = issuer.id_token(CI, AUDIENCE, full=False)
    assert api.get("/v1/runs", headers={"Authorization": f"Bearer {bare}"}).status_code == 401
    good = {IAP_HEADER: issuer.iap_token("b1@example.com", IAP_AUDIENCE)}
    assert api.get("/v1/workspaces", headers=good).json()["workspaces"][0]["name"] == "team-b"
    wrong = {IAP_HEADER: issuer.iap_token("b1@example.com", "/projects/123/global/backendServices/9")}
    assert api.get("/v1/workspaces", headers=wrong).status_code == 401
    # Keys the server fetched (and keeps) before the issuer rotated: a token of the new key still verifies.
    issuer.rotate()
    assert api.get("/v1/runs", headers=as_(issuer, "a1@example.com")).status_code == 200


def test_another_workspaces_run_is_not_found_and_a_viewer_may_not_cancel(
    api: TestClient, issuer: Issuer, session: Session
) -> None:
    ids = runs_of(session)
    b1 = as_(issuer, "b1@example.com")
    listed = api.get("/v1/runs", headers=b1).json()["runs"]
    assert [r["run_id"] for r in listed] == [ids["b"]]
    hidden = api.get(f"/v1/runs/{ids['a']}", headers=b1)
    absent = api.get("/v1/runs/run-20261127-999999-zzzz", headers=b1)
    assert hidden.status_code == absent.status_code == 404
    assert hidden.json()["message"] == f"no run {ids['a']!r}"  # exactly an absent run's words
    assert api.get("/v1/runs/aaaa", headers=b1).status_code == 404  # nor by its end
    assert api.get("/v1/runs/latest", headers=b1).json()["run_id"] == ids["b"]
    assert api.post(f"/v1/runs/{ids['a']}/cancel", headers=b1).status_code == 404

    a2 = as_(issuer, "a2@example.com")
    assert api.get(f"/v1/runs/{ids['a']}", headers=a2).status_code == 200  # a viewer sees
    forbidden = api.post(f"/v1/runs/{ids['a']}/cancel", headers=a2)
    assert forbidden.status_code == 403 and forbidden.json()["exit_code"] == 13
    assert "viewer of workspace team-a" in forbidden.json()["message"]

    # Workspaces: those the caller belongs to; another team's is not found.
    names = [w["name"] for w in api.get("/v1/workspaces", headers=a2).json()["workspaces"]]
    assert names == ["team-a"]
    described: dict[str, Any] = api.get("/v1/workspaces/team-a", headers=a2).json()["workspace"]
    assert described["members"]["a2@example.com"] == "viewer" and described["usd_per_month"] == 50
    assert api.get("/v1/workspaces/team-b", headers=a2).status_code == 404


def test_every_change_and_refusal_is_audited_and_admins_read_their_workspaces(
    api: TestClient, issuer: Issuer, session: Session
) -> None:
    ids = runs_of(session)
    api.post(f"/v1/runs/{ids['a']}/cancel")  # no token
    api.post(f"/v1/runs/{ids['a']}/cancel", headers=as_(issuer, "a2@example.com"))
    api.get(f"/v1/runs/{ids['a']}", headers=as_(issuer, "b1@example.com"))
    api.post(f"/v1/runs/{ids['b']}/cancel", headers=as_(issuer, "b1@example.com"))  # ended: no change
    api.get("/v1/runs", headers=as_(issuer, "b1@example.com"))  # a served read: not audited

    boss = api.get("/v1/audit", headers=as_(issuer, "boss@example.com")).json()["entries"]
    seen = [(e["principal"], e["workspace"], e["action"], e["target"], e["status"]) for e in boss]
    assert seen == [
        ("b1@example.com", None, "runs.describe", ids["a"], 404),
        ("a2@example.com", "team-a", "runs.cancel", ids["a"], 403),
        ("(anonymous)", None, "runs.cancel", ids["a"], 401),
    ]  # team-b's own cancel is not team-a's admin's to read
    assert boss[1]["detail"]["error"] == "forbidden"
    refused = api.get("/v1/audit", headers=as_(issuer, "a1@example.com"))
    assert refused.status_code == 403 and "administers no workspace" in refused.json()["message"]
    every = session.ledger.audit_entries(limit=10)  # the ledger holds team-b's row too, and the refusal
    assert [(e.principal, e.action, e.status) for e in every][:2] == [
        ("a1@example.com", "GET /v1/audit", 403),
        ("b1@example.com", "runs.cancel", 200),
    ]


def test_the_cli_client_sends_a_token_once_the_server_wants_one_and_names_the_fix_for_a_refused_one(
    api: TestClient, idp: SimServer, session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from tpuctl.client.api import NotAuthenticatedError, ServerClient

    ids = runs_of(session)
    key = tmp_path / "ci.json"
    key.write_text(json.dumps(issuer_of(idp.engine).credentials_file(CI, idp.url)))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))

    def forward(request: httpx.Request) -> httpx.Response:
        served = api.request(request.method, request.url.path, params=request.url.params,
                             content=request.content, headers=dict(request.headers))  # fmt: skip
        return httpx.Response(served.status_code, headers=served.headers, content=served.content)

    with ServerClient(AUDIENCE, transport=httpx.MockTransport(forward)) as client:
        assert [r.run_id for r in client.list_runs(limit=10).runs] == [ids["b"]]
        assert client.cancel(ids["b"]).run_id == ids["b"]  # a change, with the token the read needed
    elsewhere = ServerClient("http://another.name:8471", transport=httpx.MockTransport(forward))
    with elsewhere, pytest.raises(NotAuthenticatedError) as refused:  # a token for another audience
        elsewhere.cancel(ids["b"])
    assert refused.value.exit_code == 13 and "audience" in refused.value.message
    assert "GOOGLE_APPLICATION_CREDENTIALS" in (refused.value.fix or "")
    rows = [(e.principal, e.action, e.status) for e in session.ledger.audit_entries(limit=10)]
    # The refused change (tried with a token, then once with a fresh one: neither taken); the reads that
    # taught each client that the server wants a token are not written.
    assert rows == [("(anonymous)", "runs.cancel", 401)] * 2 + [(CI, "runs.cancel", 200)]


def test_metrics_show_the_scrape_token_every_workspace_and_a_member_their_own(
    api: TestClient, issuer: Issuer, session: Session
) -> None:
    runs_of(session)

    def workspaces_in(text: str) -> set[str]:
        from prometheus_client.parser import text_string_to_metric_families

        return {
            s.labels["workspace"]
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if "workspace" in s.labels
        }

    everything = api.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
    assert everything.status_code == 200, everything.text
    assert workspaces_in(everything.text) == {"team-a", "team-b"}
    mine = api.get("/metrics", headers=as_(issuer, "a1@example.com"))
    assert mine.status_code == 200 and workspaces_in(mine.text) == {"team-a"}
    assert workspaces_in(api.get("/metrics", headers=as_(issuer, CI)).text) == {"team-b"}
    assert api.get("/metrics", headers=as_(issuer, "eve@example.com")).status_code == 403
