"""The API in process (FastAPI's test client) over the in-process simulator: every endpoint's good and bad
input, the idempotent submission, and a hypothesis fuzz of the submission body (never a 500)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuctl.errors import EXIT_INFEASIBLE
from tpuctl.server.admission import SUBMITTED_REASON
from tpuctl.server.app import build_app
from tpuctl.server.bundles import MAX_BUNDLE_BYTES, BundleStore
from tpuctl.server.replica import Replica
from tpuctl.server.wire_views import CostReportOut
from tpuctl.services.session import Session, open_session
from tpuctl.settings import load_settings
from tpuctl.store.records import LeaseOwner, RunStatus
from tpuctl.teams.workspaces import Workspaces
from tpuctl.testing.backend import InProcessCli

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note on which httpx it prefers, at import
    from fastapi.testclient import TestClient

PROGRAM = b"print('hello from the server')\n"
JOB: dict[str, Any] = {
    "script": "prog.py",
    "resources": {"accelerators": "v5e-8", "zone": "us-central1-a"},
    "runtime_deps": False,
}
ERROR_KEYS = {"error", "message", "exit_code"}
#: One zone: a survey (a plan, `pod gc`) lists every zone, and the default world's many make it slow.
WORLD: dict[str, Any] = {
    "project": "tpuctl-sim",
    "zones": {"us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}}},
    "quotas": {
        "default": {"on_demand": {"zone": 64, "region": 64}, "preemptible": {"zone": 64, "region": 64}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
}


def bundle_of(files: dict[str, bytes]) -> tuple[bytes, str]:
    """A .tar.gz of ``files`` and its SHA-256."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = raw.getvalue()
    return data, hashlib.sha256(data).hexdigest()


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return WORLD


@pytest.fixture
def session(sim_cli: InProcessCli, state_dir: Path) -> Iterator[Session]:
    opened = open_session(load_settings({"backend": "sim", "state_dir": state_dir}), backend=sim_cli.backend)
    with opened:
        yield opened


@pytest.fixture
def api(session: Session, state_dir: Path) -> TestClient:
    return TestClient(build_app(session, BundleStore(state_dir / "bundles"), None))


@pytest.fixture
def uploaded(api: TestClient) -> str:
    data, sha = bundle_of({"prog.py": PROGRAM})
    response = api.put(f"/v1/bundles/{sha}", content=data, headers={"content-type": "application/gzip"})
    assert response.status_code == 201 and response.json() == {"sha256": sha, "size": len(data)}
    return sha


def submit(api: TestClient, body: Any, key: str = "key-0001", **headers: str) -> Any:
    return api.post("/v1/runs", json=body, headers={"Idempotency-Key": key, **headers})


def assert_document(response: Any, status: int, *, field: str | None = None) -> dict[str, Any]:
    """A 4xx/5xx answered with the CLI's error document."""
    assert response.status_code == status, response.text
    document: dict[str, Any] = response.json()
    assert set(document) >= ERROR_KEYS and "Traceback" not in response.text
    if field is not None:
        assert document.get("field") == field, document
    return document


def test_health_and_readiness_without_a_replica(api: TestClient) -> None:
    assert api.get("/healthz").json()["status"] == "ok"
    ready = api.get("/readyz")
    assert ready.status_code == 503 and ready.json()["ledger"] is True and ready.json()["replica"] is False


def test_the_openapi_document_names_every_path(api: TestClient) -> None:
    paths = set(api.get("/openapi.json").json()["paths"])
    assert {"/healthz", "/readyz", "/v1/bundles/{sha256}", "/v1/runs", "/v1/runs/{run}",
            "/v1/runs/{run}/logs", "/v1/runs/{run}/cancel", "/v1/cost/report", "/v1/cost/estimate",
            "/v1/catalog/prices", "/v1/quota", "/v1/pods", "/v1/pods/{name}", "/v1/pods/delete",
            "/v1/pods/gc", "/v1/queue"} <= paths  # fmt: skip


def test_a_run_its_workspace_can_never_hold_is_refused_and_the_queue_lists_the_waiting_ones(
    api: TestClient, uploaded: str, session: Session, state_dir: Path
) -> None:
    body = {"job": JOB, "bundle_sha256": uploaded, "script_in_bundle": "prog.py"}
    small = Workspaces.model_validate({"workspaces": {"default": {"chips": {"v5e": 4}}}})
    replica = Replica(session, LeaseOwner.of_this_process(), listen="test", max_runs=1, tick_s=1.0,
                      workspaces=small)  # fmt: skip
    limited = TestClient(build_app(session, BundleStore(state_dir / "bundles"), replica))
    refused = assert_document(submit(limited, body), 422)
    assert refused["exit_code"] == EXIT_INFEASIBLE
    assert (
        refused["message"]
        == "the run needs 8 v5e chips, more than workspace default may ever hold at once (4)"
    )
    assert session.ledger.list_runs() == []  # nothing recorded, the key not kept

    run_id = submit(api, body).json()["run"]["run_id"]
    queue = api.get("/v1/queue").json()
    assert [(q["position"], q["run_id"], q["reason"]) for q in queue["runs"]] == [
        (1, run_id, SUBMITTED_REASON)
    ]


def test_a_run_of_several_types_keeps_those_its_workspace_can_hold_and_is_refused_only_without_one(
    session: Session, uploaded: str, state_dir: Path
) -> None:
    small = Workspaces.model_validate({"workspaces": {"default": {"chips": {"v5e": 8}}}})
    replica = Replica(session, LeaseOwner.of_this_process(), listen="test", max_runs=1, tick_s=1.0,
                      workspaces=small)  # fmt: skip
    limited = TestClient(build_app(session, BundleStore(state_dir / "bundles"), replica))

    def body(*types: str) -> dict[str, Any]:
        resources = {**JOB["resources"], "accelerators": list(types)}
        return {
            "job": {**JOB, "resources": resources},
            "bundle_sha256": uploaded,
            "script_in_bundle": "prog.py",
        }

    # v5e-16 can never fit 8 v5e chips; v5e-8 can: the run is v5e-8's alone, queued, not refused.
    kept = submit(limited, body("v5e-16", "v5e-8"), key="key-0101")
    assert kept.status_code == 201, kept.text
    run = session.ledger.get_run(kept.json()["run"]["run_id"])
    assert run is not None and run.accelerator_type == "v5litepod-8"
    plan = limited.post("/v1/runs:plan", json=body("v5e-16", "v5e-8")).json()["plan"]
    assert "v5litepod-16" not in json.dumps(plan) and "v5litepod-8" in json.dumps(plan)
    # Neither fits: the first one's reason.
    refused = assert_document(submit(limited, body("v5e-16", "v5e-32"), key="key-0102"), 422)
    assert refused["exit_code"] == EXIT_INFEASIBLE
    assert (
        refused["message"]
        == "the run needs 16 v5e chips, more than workspace default may ever hold at once (8)"
    )


def test_a_submission_records_a_run_for_a_replica_and_a_retry_with_its_key_finds_it(
    api: TestClient, uploaded: str, session: Session
) -> None:
    body = {"job": JOB, "bundle_sha256": uploaded, "script_in_bundle": "prog.py"}
    first = submit(api, body)
    assert first.status_code == 201, first.text
    run = first.json()["run"]
    assert first.json()["created"] is True and run["status"] == RunStatus.QUEUED.value
    assert run["accelerator_type"] == "v5litepod-8" and run["detail"]["supervised"] is True
    assert session.ledger.lease_of(run["run_id"]) is None  # nobody holds it yet: a replica will

    again = submit(api, body)
    assert again.status_code == 200 and again.json() == {**first.json(), "created": False}
    assert [r.run_id for r in session.ledger.list_runs()] == [run["run_id"]]

    other = submit(api, {**body, "job": {**JOB, "args": ["--x"]}})
    assert "another submission" in assert_document(other, 422, field="Idempotency-Key")["message"]

    listed = api.get("/v1/runs").json()["runs"]
    assert [r["run_id"] for r in listed] == [run["run_id"]]
    described = api.get(f"/v1/runs/{run['run_id'][-6:]}").json()  # a unique end names it, as in the CLI
    assert described["run_id"] == run["run_id"] and described["segments"] == []


def test_logs_page_by_cursor_and_cancel_cleans_up_a_run_nobody_holds(
    api: TestClient, uploaded: str, session: Session
) -> None:
    from tpuctl.store.records import LeaseOwner

    run_id = submit(api, {"job": JOB, "bundle_sha256": uploaded, "script_in_bundle": "prog.py"}).json()[
        "run"
    ]["run_id"]
    claim = session.ledger.claim_lease(run_id, LeaseOwner.of_this_process(), 30)
    session.ledger.append_log_lines(claim, 0, 0, [(1.0, "one"), (2.0, "two"), (3.0, "three")])
    session.ledger.release_lease(claim)

    first = api.get(f"/v1/runs/{run_id}/logs", params={"limit": 2}).json()
    assert [line["text"] for line in first["lines"]] == ["one", "two"] and first["cursor"] == "0:1"
    rest = api.get(f"/v1/runs/{run_id}/logs", params={"after": first["cursor"]}).json()
    assert [line["text"] for line in rest["lines"]] == ["three"] and rest["live"] is True
    assert_document(api.get(f"/v1/runs/{run_id}/logs", params={"after": "zz"}), 400, field="after")

    cancelled = api.post(f"/v1/runs/{run_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json() == {"run_id": run_id, "status": "cancelled", "cancelled": True,
                                "hosts_killed": 0, "deleted": None}  # fmt: skip
    again = api.post(f"/v1/runs/{run_id}/cancel").json()
    assert again == {
        "run_id": run_id,
        "status": "cancelled",
        "cancelled": False,
        "note": "the run had already ended",
    }
    assert api.get(f"/v1/runs/{run_id}/logs", params={"after": rest["cursor"]}).json()["live"] is False


def test_a_cancelled_run_resumed_through_the_server_waits_for_a_replica_to_take_it_up(
    api: TestClient, uploaded: str, session: Session
) -> None:
    run_id = submit(api, {"job": JOB, "bundle_sha256": uploaded, "script_in_bundle": "prog.py"}).json()[
        "run"
    ]["run_id"]
    assert api.post(f"/v1/runs/{run_id}/cancel").json()["status"] == "cancelled"
    assert session.ledger.orphans() == []  # ended: nobody's to take up

    resumed = api.post(f"/v1/runs/{run_id}/resume", json={"budget_usd": 5.0})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["run"]["run_id"] == run_id and resumed.json()["run"]["status"] == "recovering"
    assert session.ledger.lease_of(run_id) is None  # given back: the replica's tick claims it
    assert session.ledger.cancel_requested(run_id) is None  # answered: the replica must not cancel it again
    assert session.ledger.orphans() == [run_id]
    assert_document(api.post(f"/v1/runs/{run_id}/resume", json={"budget_usd": -1}), 422, field="budget_usd")
    assert_document(api.post("/v1/runs/run-nope/resume", json={}), 404)


@pytest.mark.parametrize(
    ("send", "status", "field"),
    [
        ({"content": b"{", "headers": {"content-type": "application/json"}}, 422, "body"),
        ({"content": b"x", "headers": {"content-type": "text/plain"}}, 415, "Content-Type"),
        ({"json": {"job": JOB, "bundle_sha256": "0" * 64, "zzz": 1}}, 422, "zzz"),
        ({"json": {"job": 5, "bundle_sha256": "0" * 64}}, 422, "job"),
        ({"json": {"job": JOB, "bundle_sha256": 7}}, 422, "bundle_sha256"),
        ({"json": {"job": JOB, "bundle_sha256": "not-a-digest"}}, 422, "bundle_sha256"),
        ({"json": {"job": JOB, "bundle_sha256": "0" * 64}}, 409, "bundle_sha256"),  # never uploaded
        ({"json": [1, 2]}, 422, None),
    ],
)
def test_bad_submissions_are_4xx_with_the_error_document(
    api: TestClient, send: dict[str, Any], status: int, field: str | None
) -> None:
    headers = {"Idempotency-Key": "key-0002", **send.pop("headers", {})}
    assert_document(api.post("/v1/runs", headers=headers, **send), status, field=field)


def test_a_submissions_secrets_are_kept_encrypted_by_the_server_and_never_shown(
    api: TestClient, uploaded: str, session: Session
) -> None:
    from tpuctl.services.run.runkey import secret_key
    from tpuctl.services.run.secretenv import load_secrets

    value = "hf_s3cr3t-value-0123456789"
    job = {**JOB, "secrets": {"HF_TOKEN": None}}
    body = {
        "job": job,
        "bundle_sha256": uploaded,
        "script_in_bundle": "prog.py",
        "secrets": {"HF_TOKEN": value},
    }
    first = submit(api, body, key="key-secret-1")
    assert first.status_code == 201, first.text
    run_id = first.json()["run"]["run_id"]
    assert load_secrets(session.ledger, run_id, secret_key(session.settings)) == {"HF_TOKEN": value}
    described = api.get(f"/v1/runs/{run_id}")
    assert value not in first.text and value not in described.text
    assert "HF_TOKEN" in json.dumps(described.json())  # by name
    # The submission's stored digest does not hash the value: the same key with another value is the
    # same submission (a retry), with other names another one.
    stored = session.ledger.submission("key-secret-1")
    assert stored is not None and stored.run_id == run_id
    again = submit(api, {**body, "secrets": {"HF_TOKEN": "another"}}, key="key-secret-1")
    assert again.status_code == 200 and again.json()["run"]["run_id"] == run_id
    # A value for a name the job does not give as a secret is refused, naming it and not its value.
    stray = submit(api, {**body, "secrets": {"HF_TOKEN": value, "OTHER": "zzz-secret"}}, key="key-secret-2")
    problem = assert_document(stray, 400, field="secret")
    assert "OTHER" in problem["message"] and "zzz-secret" not in stray.text


def test_a_plan_says_what_a_submission_would_do_and_leaves_nothing_behind(
    api: TestClient, uploaded: str, session: Session, state_dir: Path
) -> None:
    before = sorted(p.name for p in state_dir.iterdir())
    body = {"job": JOB, "bundle_sha256": uploaded, "script_in_bundle": "prog.py"}
    answered = api.post("/v1/runs:plan", json=body)
    assert answered.status_code == 200, answered.text
    plan = answered.json()["plan"]
    assert plan["target"]["accelerator_type"] == "v5litepod-8" and plan["target"]["zone"] == "us-central1-a"
    assert plan["program"][-1].endswith("prog.py") and plan["target"]["existing"] is False
    assert session.ledger.list_runs() == [] and session.cloud.list_nodes() == []
    assert sorted(p.name for p in state_dir.iterdir()) == before  # no run directory, no unpacked program
    # A bad job is the same 400 as at submission, naming what is wrong.
    bad = {**body, "job": {**JOB, "resources": {"accelerators": "v5e-8", "zone": "mars-1-a"}}}
    assert_document(api.post("/v1/runs:plan", json=bad), 400)


def test_a_submission_needs_a_well_formed_key(api: TestClient, uploaded: str) -> None:
    body = {"job": JOB, "bundle_sha256": uploaded, "script_in_bundle": "prog.py"}
    assert_document(api.post("/v1/runs", json=body), 422, field="Idempotency-Key")
    assert_document(submit(api, body, key="short"), 422, field="Idempotency-Key")


@pytest.mark.parametrize(
    ("job", "script", "status", "field"),
    [
        ({**JOB, "bogus": 1}, "prog.py", 400, "bogus"),  # the job file's own checks, naming the key
        ({**JOB, "resources": {"accelerators": "v9z-8"}}, "prog.py", 400, None),
        (JOB, "missing.py", 400, "script_in_bundle"),
        (JOB, "../prog.py", 400, "script_in_bundle"),
        (JOB, None, 400, "script_in_bundle"),
        ({**JOB, "secrets": {"TOKEN": None}}, "prog.py", 400, "secret"),  # named, its value not sent
    ],
)
def test_bad_jobs_are_400_naming_what_is_wrong(
    api: TestClient, uploaded: str, job: dict[str, Any], script: str | None, status: int, field: str | None
) -> None:
    body = {"job": job, "bundle_sha256": uploaded, "script_in_bundle": script}
    assert_document(submit(api, body, key="key-0003"), status, field=field)


def test_bundle_uploads_are_checked(api: TestClient) -> None:
    data, sha = bundle_of({"prog.py": PROGRAM})
    gz = {"content-type": "application/gzip"}
    assert_document(api.put(f"/v1/bundles/{'0' * 64}", content=data, headers=gz), 400, field="sha256")
    assert_document(api.put(f"/v1/bundles/{sha}", content=data, headers={"content-type": "text/plain"}), 415)
    assert_document(api.put("/v1/bundles/nothex", content=data, headers=gz), 422, field="sha256")
    big = {**gz, "content-length": str(MAX_BUNDLE_BYTES + 1)}
    assert_document(api.put(f"/v1/bundles/{sha}", content=b"x", headers=big), 413, field="bundle")


def test_a_bundle_that_is_not_a_tarball_is_refused_at_submission(api: TestClient) -> None:
    data = b"not a tarball"
    sha = hashlib.sha256(data).hexdigest()
    api.put(f"/v1/bundles/{sha}", content=data, headers={"content-type": "application/gzip"})
    body = {"job": JOB, "bundle_sha256": sha, "script_in_bundle": "prog.py"}
    assert_document(submit(api, body, key="key-0004"), 400, field="bundle_sha256")


def test_an_unknown_run_is_404_everywhere(api: TestClient) -> None:
    for response in (
        api.get("/v1/runs/nope"),
        api.get("/v1/runs/nope/logs"),
        api.post("/v1/runs/nope/cancel"),
    ):
        assert assert_document(response, 404, field="RUN")["exit_code"] == 11
    assert_document(api.get("/v1/runs", params={"limit": 0}), 422, field="limit")


#: Bad reads: the path, its query, and the status and field of the answer.
BAD_READS: list[tuple[str, dict[str, Any], int, str | None]] = [
    ("/v1/cost/report", {"group_by": "colour"}, 400, "group_by"),
    ("/v1/cost/report", {"since": 20.0, "until": 10.0}, 400, "since"),
    ("/v1/cost/report", {"since": -1}, 422, "since"),
    ("/v1/cost/report", {"limit": 0}, 422, "limit"),
    ("/v1/cost/report", {"reconcile": "maybe"}, 422, "reconcile"),
    ("/v1/pods", {"zone": "not a zone"}, 400, "zone"),
]
#: Bad estimates: the body, and the status and field of the answer.
BAD_ESTIMATES: list[tuple[dict[str, Any], int, str | None]] = [
    ({"accelerator_type": "v9z-8"}, 400, None),
    ({"accelerator_type": "v5e-8", "hours": 0}, 422, "hours"),
    ({"accelerator_type": "v5e-8", "zones": "us-central1-a"}, 422, "zones"),
    ({"accelerator_type": "v5e-8", "zones": ["nowhere"]}, 400, "zones"),
    ({"accelerator_type": "v5e-8", "colour": 1}, 422, "colour"),
    ({}, 422, "accelerator_type"),
]


def test_reads_answer_typed_results_and_bad_ones_are_4xx_with_the_error_document(api: TestClient) -> None:
    for path, params, status, field in BAD_READS:
        assert_document(api.get(path, params=params), status, field=field)
    for body, status, field in BAD_ESTIMATES:
        assert_document(api.post("/v1/cost/estimate", json=body), status, field=field)
    assert_document(api.post("/v1/cost/estimate", content=b"x", headers={"content-type": "text/plain"}), 415)

    good = api.get("/v1/cost/report", params={"group_by": "run", "reconcile": False})
    answer = CostReportOut.model_validate(good.json())  # the service's typed report
    assert answer.report.group_by.name == "run" and answer.report.groups == []
    assert answer.served_by.backend.name == "sim" and answer.report.prices.source


_CHOICES: dict[str, Any] = {"zones": ["us-central1-a"]}
_POD: dict[str, Any] = {"accelerator_type": "v5e-8", "name": "p", "choices": _CHOICES}
#: Bad pod creates: the body, and the status and field of the answer.
BAD_CREATES: list[tuple[Any, int, str | None]] = [
    ({**_POD, "colour": 1}, 422, "colour"),
    ({**_POD, "slices": "2"}, 422, "slices"),
    ({**_POD, "name": ""}, 422, "name"),
    ({**_POD, "choices": {"capacity_types": ["free"]}}, 422, "choices.capacity_types.0"),
    ({**_POD, "choices": {"zones": 5}}, 422, "choices.zones"),
    ({**_POD, "choices": {"zonez": ["us-central1-a"]}}, 422, "choices"),
    ({**_POD, "choices": {"network": {"network": {"name": "Bad Net!"}}}}, 400, "network"),
    ({**_POD, "choices": {"zones": ["nowhere"]}}, 400, "zones"),
    ({**_POD, "name": "Bad_Name"}, 400, None),
    ({**_POD, "accelerator_type": "v9z-8"}, 400, None),
    ([1], 422, None),
]


def test_bad_pod_creates_and_deletes_are_4xx_with_the_error_document(api: TestClient) -> None:
    key = {"Idempotency-Key": "pod-key-0001"}
    for body, status, field in BAD_CREATES:
        assert_document(api.post("/v1/pods", json=body, headers=key), status, field=field)
    assert_document(api.post("/v1/pods", json=_POD), 422, field="Idempotency-Key")
    assert_document(api.post("/v1/pods/delete", json={"names": []}, headers=key), 422, field="names")
    gc = {"confirmed": [{"kind": "slice", "zone": "us-central1-a"}]}
    assert_document(api.post("/v1/pods/gc", json=gc, headers=key), 422, field="confirmed.0.name")
    assert_document(api.post("/v1/pods/gc", json={"zone": "nowhere"}, headers=key), 400, field="zone")
    assert_document(
        api.post("/v1/pods/delete", json={"names": ["x"], "zone": 3}, headers=key), 422, field="zone"
    )


def test_a_pod_create_dry_run_answers_the_plan_the_server_would_carry_out(
    api: TestClient, session: Session
) -> None:
    from tpuctl.server.pods import request_id_of
    from tpuctl.server.wire_pods import PodCreated

    answer = api.post("/v1/pods", json={**_POD, "dry_run": True}, headers={"Idempotency-Key": "pod-key-0002"})
    assert answer.status_code == 200, answer.text
    plan = PodCreated.model_validate(answer.json()).plan
    assert plan is not None and plan.feasible and plan.request.name == "p"
    assert plan.request.request_id == request_id_of("pod-key-0002") and plan.chosen is not None
    assert session.ledger.list_pods() == [] and session.ledger.attempts(plan.request.request_id) == []


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
_JOB_KEYS = st.sampled_from(["script", "resources", "args", "envs", "budget", "timeout", "run", "example",
                             "max_preemptions", "slices", "labels", "name", "workdir"])  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        _JSON,
        st.fixed_dictionaries(
            {"job": st.dictionaries(_JOB_KEYS, _JSON, max_size=4)},
            optional={
                "bundle_sha256": st.text(max_size=70),
                "script_in_bundle": _JSON,
                "secrets": st.one_of(_JSON, st.dictionaries(st.text(max_size=8), _JSON, max_size=2)),
            },
        ),
    )
)
def test_fuzzed_submissions_and_plans_never_answer_500(api: TestClient, uploaded: str, body: Any) -> None:
    if isinstance(body, dict) and body.get("bundle_sha256") == "":
        body["bundle_sha256"] = uploaded  # now and then a body that gets as far as the job's checks
    key = "fuzz-" + hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]
    for response in (submit(api, body, key=key), api.post("/v1/runs:plan", json=body)):
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            assert set(response.json()) >= ERROR_KEYS


_ESTIMATE_KEYS = st.sampled_from(["accelerator_type", "hours", "zones", "region", "slices"])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        _JSON, st.dictionaries(_ESTIMATE_KEYS, _JSON | st.sampled_from(["v5e-8", "us-central1-a"]))
    )
)
def test_fuzzed_estimates_never_answer_500(api: TestClient, body: Any) -> None:
    response = api.post("/v1/cost/estimate", json=body)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert set(response.json()) >= ERROR_KEYS


_POD_KEYS = st.sampled_from(["accelerator_type", "name", "choices", "slices", "runtime_version", "labels",
                             "wait"])  # fmt: skip
# Not zones or region: a plan over every zone of the default world is slow (their bad values are cases of
# BAD_CREATES).
_CHOICE_KEYS = st.sampled_from(["capacity_types", "max_price", "strategy", "race_k", "surface", "network",
                                "valid_for_s", "reserved", "queued", "service_account"])  # fmt: skip


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        _JSON,
        st.dictionaries(_POD_KEYS, _JSON, max_size=5),
        st.fixed_dictionaries(
            {
                "accelerator_type": st.just("v5e-8"),
                "name": st.just("p"),
                "choices": st.dictionaries(_CHOICE_KEYS, _JSON, max_size=4).map(
                    lambda choices: {"zones": ["us-central1-a"], **choices}
                ),
            },
        ),
    )
)
def test_fuzzed_pod_creates_never_answer_500(api: TestClient, body: Any) -> None:
    if isinstance(body, dict) and body.get("name") == "p":
        body["dry_run"] = True  # a body that gets as far as the plan must place nothing
    response = api.post("/v1/pods", json=body, headers={"Idempotency-Key": "pod-fuzz-0001"})
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert set(response.json()) >= ERROR_KEYS


_DELETE_KEYS = st.sampled_from(["names", "zone", "wait", "force", "dry_run", "confirmed"])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/v1/pods/delete", "/v1/pods/gc"]),
       body=st.one_of(_JSON, st.dictionaries(_DELETE_KEYS, _JSON, max_size=4)))  # fmt: skip
def test_fuzzed_pod_deletes_and_gcs_never_answer_500(api: TestClient, path: str, body: Any) -> None:
    if isinstance(body, dict):
        body["dry_run"] = True  # nothing of the simulator's is deleted by the fuzz
    response = api.post(path, json=body, headers={"Idempotency-Key": "pod-fuzz-0002"})
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert set(response.json()) >= ERROR_KEYS


def test_an_error_quoting_input_utf8_cannot_encode_is_still_the_document(
    api: TestClient, uploaded: str
) -> None:
    job = '{"script": "prog.py", "resources": {"\\ud800": 1}}'  # a lone surrogate: JSON has it, UTF-8 not
    raw = f'{{"job": {job}, "bundle_sha256": "{uploaded}"}}'
    headers = {"content-type": "application/json", "Idempotency-Key": "key-0005"}
    assert_document(api.post("/v1/runs", content=raw.encode(), headers=headers), 400, field="resources")


def test_a_bug_is_a_500_with_the_document_and_no_traceback(
    session: Session, state_dir: Path, uploaded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tpuctl.server.submit

    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(tpuctl.server.submit, "submit", broken)
    api = TestClient(
        build_app(session, BundleStore(state_dir / "bundles"), None), raise_server_exceptions=False
    )
    response = submit(
        api, {"job": JOB, "bundle_sha256": uploaded, "script_in_bundle": "prog.py"}, key="key-0006"
    )
    document = assert_document(response, 500)
    assert (
        document["error"] == "error"
        and "RuntimeError" in document["message"]
        and "a bug" not in response.text
    )
