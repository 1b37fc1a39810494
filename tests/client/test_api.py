"""The client of `tpuctl server` against the real API in process: a submission whose first reply is
dropped is retried with its key and makes one run; the server's error documents come back as the errors
they stand for (same kind, message and exit code); a server that does not answer is exit 15."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tpuctl.client.api import ServerClient, ServerError
from tpuctl.client.submission import submission_of
from tpuctl.errors import UnreachableError, UsageError
from tpuctl.jobs.request import HostFlags, JobRequest
from tpuctl.server.app import build_app
from tpuctl.server.bundles import BundleStore
from tpuctl.services.run.model import RecoveryPolicy, RunRequest
from tpuctl.services.session import Session, open_session
from tpuctl.settings import load_settings
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.ports import unused_port

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note on which httpx it prefers, at import
    from fastapi.testclient import TestClient


@pytest.fixture
def session(sim_cli: InProcessCli, state_dir: Path) -> Iterator[Session]:
    opened = open_session(load_settings({"backend": "sim", "state_dir": state_dir}), backend=sim_cli.backend)
    with opened:
        yield opened


@pytest.fixture
def app_client(session: Session, state_dir: Path) -> TestClient:
    return TestClient(build_app(session, BundleStore(state_dir / "bundles"), None))


def forwarding(app_client: TestClient, *, drop_first_reply_to: str | None = None) -> httpx.MockTransport:
    """A transport that hands each request to the app; the first one to ``drop_first_reply_to`` is served
    and its reply lost, as a connection dropped after the server acted."""
    dropped: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        served = app_client.request(
            request.method, request.url.path, params=request.url.params, content=request.content,
            headers=dict(request.headers),
        )  # fmt: skip
        if request.url.path == drop_first_reply_to and not dropped:
            dropped.append(request.url.path)
            raise httpx.ReadError("connection reset by peer", request=request)
        return httpx.Response(served.status_code, headers=served.headers, content=served.content)

    return httpx.MockTransport(handle)


def job_for(script: Path) -> JobRequest:
    request = dataclasses.replace(
        RunRequest(), script=str(script), accelerator_type="v5e-8", runtime_deps=False
    )
    return JobRequest(request=request, budget_usd=None, policy=RecoveryPolicy(), host_flags=HostFlags())


def test_a_retried_submission_after_a_dropped_reply_makes_one_run(
    app_client: TestClient, session: Session, tmp_path: Path
) -> None:
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    (script.parent / "data.txt").write_text("x\n")
    job = job_for(script)
    submission = submission_of(job, job.request)
    assert submission.body.script_in_bundle == "train.py"
    transport = forwarding(app_client, drop_first_reply_to="/v1/runs")
    with ServerClient("http://server.test", transport=transport, retry_after_s=0.0) as api:
        api.upload_bundle(submission.sha256, submission.bundle)
        submitted = api.submit(submission.body, key="retry-key-1")
    assert submitted.created is False  # the retry found the run the first try made
    assert [r.run_id for r in session.ledger.list_runs()] == [submitted.run.run_id]
    unpacked = session.state_dir / "runs" / submitted.run.run_id / "program"
    assert sorted(p.name for p in unpacked.iterdir()) == ["data.txt", "train.py"]


def test_a_runs_secrets_travel_with_its_submission_and_the_server_keeps_them(
    app_client: TestClient, session: Session, tmp_path: Path
) -> None:
    from tpuctl.services.run.runkey import secret_key
    from tpuctl.services.run.secretenv import load_secrets

    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    job = job_for(script)
    request = dataclasses.replace(job.request, secret_names=("WANDB_API_KEY",))
    job = dataclasses.replace(job, request=request, secret_values={"WANDB_API_KEY": "k-123"})
    submission = submission_of(job, request)
    assert submission.body.secrets == {"WANDB_API_KEY": "k-123"}
    with ServerClient("http://server.test", transport=forwarding(app_client)) as api:
        api.upload_bundle(submission.sha256, submission.bundle)
        submitted = api.submit(submission.body, key="secret-key-1")
    stored = load_secrets(session.ledger, submitted.run.run_id, secret_key(session.settings))
    assert stored == {"WANDB_API_KEY": "k-123"}


def test_error_documents_come_back_as_the_errors_they_stand_for(app_client: TestClient) -> None:
    api = ServerClient("http://server.test", transport=forwarding(app_client))
    with api, pytest.raises(ServerError) as caught:
        api.describe("no-such-run")
    error = caught.value
    assert (error.kind, error.exit_code) == ("not_found", 11)
    assert error.message == "no run 'no-such-run'" and error.to_dict()["field"] == "RUN"


def test_a_script_outside_the_working_directory_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    (tmp_path / "elsewhere").mkdir()
    job = job_for(script)
    request = dataclasses.replace(job.request, workdir=str(tmp_path / "elsewhere"))
    with pytest.raises(UsageError, match="outside the working directory"):
        submission_of(job, request)


def test_a_server_that_does_not_answer_is_unreachable() -> None:
    with ServerClient(f"http://127.0.0.1:{unused_port()}") as api, pytest.raises(UnreachableError) as caught:
        api.list_runs(limit=5)
    assert caught.value.exit_code == 15


def test_a_retried_pod_create_after_a_dropped_reply_places_one_slice_and_a_delete_deletes_it(
    app_client: TestClient, session: Session
) -> None:
    from tpuctl.server.wire_pods import CreatePod, DeletePods
    from tpuctl.services.placement_choices import PlacementChoices

    body = CreatePod(
        accelerator_type="v5e-8", name="once", choices=PlacementChoices(zones=("us-central1-a",))
    )
    transport = forwarding(app_client, drop_first_reply_to="/v1/pods")
    with ServerClient("http://server.test", transport=transport, retry_after_s=0.0) as api:
        answer = api.create_pod(body)
    assert answer.created is False and [p["name"] for p in answer.pods] == ["once"]
    assert [(n.name, n.zone) for n in session.cloud.list_nodes(None)] == [("once", "us-central1-a")]
    assert [p.name for p in session.ledger.list_pods(alive=True)] == ["once"]
    with ServerClient("http://server.test", transport=forwarding(app_client)) as api:
        deleted = api.delete_pods(DeletePods(names=["once"], zone="us-central1-a"))
    assert deleted.deleted == [{"name": "once", "zone": "us-central1-a"}] and deleted.failures == []
    assert session.cloud.list_nodes("us-central1-a") == []
