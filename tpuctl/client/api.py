"""The HTTP client of `tpuctl server`: one method per endpoint, each returning the typed body
(``tpuctl.server.wire``) or raising the server's error document as a ``TpuctlError`` with the same kind,
message, fix and exit code, so the CLI renders and exits exactly as it would for a local error.

A submission is retried with its idempotency key on a dropped connection or timeout: the server answers
a retry with the run the key first made, never a second one.

A team server (one with a workspace file) wants a Google ID token on every request
(``tpuctl.client.identity``); a one-user server on loopback wants none. The client learns which from the
server: before its first change it asks an authenticated read (``GET /v1/workspaces``), and a read
answered 401 is sent again with a token; from then on every request carries one.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any, Final, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from tpuctl.client.identity import IdentityTokens
from tpuctl.errors import EXIT_PERMISSION, TpuctlError, UnreachableError, UsageError
from tpuctl.server.wire import (
    BUNDLE_MEDIA_TYPE,
    IDEMPOTENCY_HEADER,
    BundleOut,
    CancelOut,
    LogsOut,
    Resumed,
    ResumeRun,
    RunDescriptionOut,
    RunList,
    RunPlanOut,
    SubmitRun,
    Submitted,
)
from tpuctl.server.wire_pods import (
    CollectGarbage,
    CreatePod,
    DeletePods,
    GarbageCollected,
    PodCreated,
    PodsDeleted,
)
from tpuctl.server.wire_queue import QueueOut
from tpuctl.server.wire_teams import AuditOut, WorkspaceList, WorkspaceOut
from tpuctl.server.wire_views import (
    CostReportOut,
    EstimateIn,
    EstimateOut,
    PodDescriptionOut,
    PodListOut,
    PricesOut,
    QuotaOut,
)

if TYPE_CHECKING:
    from types import TracebackType

_Body = TypeVar("_Body", bound=BaseModel)
#: Tries of a submission (the first and the retries), all with one idempotency key, and the pause before
#: the first retry (twice that before the second).
SUBMIT_TRIES: Final = 3
RETRY_AFTER_S: Final = 1.0
#: How long a request that places or deletes slices may take: it waits for the cloud (a slice's create
#: can take many minutes), so it has its own limit, not the reads'.
PLACE_TIMEOUT_S: Final = 3600.0


class ServerError(TpuctlError):
    """An error document from the server, as the error it stands for."""

    def __init__(self, document: dict[str, Any]) -> None:
        super().__init__(str(document.get("message") or "the server refused the request"),
                         fix=document.get("fix"))  # fmt: skip
        self.kind = str(document.get("error") or "error")
        code = document.get("exit_code")
        self.exit_code = code if isinstance(code, int) and 0 < code < 256 else 1
        self._extra = {k: v for k, v in document.items() if k not in ("error", "message", "fix", "exit_code")}

    def details(self) -> dict[str, Any]:
        return dict(self._extra)


class ServerClient:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 120.0,
        retry_after_s: float = RETRY_AFTER_S,
        transport: httpx.BaseTransport | None = None,
        identity: IdentityTokens | None = None,
    ) -> None:
        self.url = url
        self._retry_after_s = retry_after_s
        self._http = httpx.Client(base_url=url, timeout=timeout_s, transport=transport)
        self._identity = identity or IdentityTokens(url.rstrip("/"))
        #: Whether the server wants a token: None until it said (a 401, or the probe's answer).
        self._needs_token: bool | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()

    # --- endpoints ------------------------------------------------------------------------------

    def upload_bundle(self, sha256: str, data: bytes) -> BundleOut:
        return self._call(BundleOut, "PUT", f"/v1/bundles/{sha256}", content=data,
                          headers={"content-type": BUNDLE_MEDIA_TYPE}, command="run")  # fmt: skip

    def submit(self, body: SubmitRun, *, key: str | None = None) -> Submitted:
        """Submit a run; retried with the same key when the connection drops or times out, or while the
        server is still recording the run an earlier try of the key started (409 ``conflict``)."""
        return self._idempotent(Submitted, "/v1/runs", body, key, command="run")

    def plan(self, body: SubmitRun) -> RunPlanOut:
        """What submitting ``body`` would do (nothing recorded, nothing created)."""
        return self._call(
            RunPlanOut, "POST", "/v1/runs:plan", json=body.model_dump(), command="run --dry-run"
        )

    def resume(self, ref: str, body: ResumeRun) -> Resumed:
        """Carry a stopped run on under the server (`runs resume`)."""
        return self._call(
            Resumed, "POST", f"/v1/runs/{_quoted(ref)}/resume", json=body.model_dump(), command="runs resume"
        )

    def list_runs(self, *, limit: int, workspace: str | None = None, principal: str | None = None) -> RunList:
        wanted = {"limit": limit, "workspace": workspace, "user": principal}
        params = {k: v for k, v in wanted.items() if v is not None}
        return self._call(RunList, "GET", "/v1/runs", params=params, command="runs list")

    def describe(self, ref: str) -> RunDescriptionOut:
        return self._call(RunDescriptionOut, "GET", f"/v1/runs/{_quoted(ref)}", command="runs describe")

    def logs(self, ref: str, *, after: str = "", worker: int | None = None) -> LogsOut:
        params: dict[str, Any] = {"after": after}
        if worker is not None:
            params["worker"] = worker
        return self._call(LogsOut, "GET", f"/v1/runs/{_quoted(ref)}/logs", params=params, command="runs logs")

    def cancel(self, ref: str) -> CancelOut:
        return self._call(CancelOut, "POST", f"/v1/runs/{_quoted(ref)}/cancel", command="runs cancel")

    def create_pod(self, body: CreatePod, *, key: str | None = None) -> PodCreated:
        """Place a slice (the request waits for the placement: ``PLACE_TIMEOUT_S``); retried with the same
        key as a submission is, which never places a second slice."""
        return self._idempotent(PodCreated, "/v1/pods", body, key, command="pod create")

    def delete_pods(self, body: DeletePods, *, key: str | None = None) -> PodsDeleted:
        return self._idempotent(PodsDeleted, "/v1/pods/delete", body, key, command="pod delete")

    def collect_garbage(self, body: CollectGarbage, *, key: str | None = None) -> GarbageCollected:
        return self._idempotent(GarbageCollected, "/v1/pods/gc", body, key, command="pod gc")

    def cost_report(self, query: dict[str, Any]) -> CostReportOut:
        """``query``: ``group_by``, ``since``, ``until``, ``limit``, ``reconcile``, ``dry_run`` (a None
        is left out)."""
        params = {k: v for k, v in query.items() if v is not None}
        return self._call(CostReportOut, "GET", "/v1/cost/report", params=params, command="cost report")

    def cost_estimate(self, body: EstimateIn) -> EstimateOut:
        return self._call(EstimateOut, "POST", "/v1/cost/estimate", json=body.model_dump(),
                          command="cost estimate")  # fmt: skip

    def catalog_prices(self) -> PricesOut:
        return self._call(PricesOut, "GET", "/v1/catalog/prices", command="catalog prices")

    def queue(self) -> QueueOut:
        return self._call(QueueOut, "GET", "/v1/queue", command="queue")

    def quota(self) -> QuotaOut:
        return self._call(QuotaOut, "GET", "/v1/quota", command="quota")

    def list_pods(self, zone: str | None) -> PodListOut:
        params = {} if zone is None else {"zone": zone}
        return self._call(PodListOut, "GET", "/v1/pods", params=params, command="pod list")

    def describe_pod(self, name: str, zone: str | None) -> PodDescriptionOut:
        params = {} if zone is None else {"zone": zone}
        return self._call(PodDescriptionOut, "GET", f"/v1/pods/{_quoted(name, 'NAME')}", params=params,
                          command="pod describe")  # fmt: skip

    def workspaces(self) -> WorkspaceList:
        return self._call(WorkspaceList, "GET", "/v1/workspaces", command="workspace list")

    def workspace(self, name: str) -> WorkspaceOut:
        return self._call(WorkspaceOut, "GET", f"/v1/workspaces/{_quoted(name, 'WORKSPACE')}",
                          command="workspace describe")  # fmt: skip

    def audit(self, *, since: float | None, principal: str | None, limit: int) -> AuditOut:
        query = {"since": since, "principal": principal, "limit": limit}
        params = {k: v for k, v in query.items() if v is not None}
        return self._call(AuditOut, "GET", "/v1/audit", params=params, command="audit")

    # --- plumbing -------------------------------------------------------------------------------

    def _idempotent(self, model: type[_Body], path: str, body: BaseModel, key: str | None, *,
                    command: str) -> _Body:  # fmt: skip
        """POST ``body`` with an idempotency key, retried with that key on a dropped connection or a
        timeout, and while the server is still serving an earlier try of it (409 ``conflict``)."""
        key = key or uuid.uuid4().hex
        for attempt in range(1, SUBMIT_TRIES + 1):
            try:
                return self._call(model, "POST", path, json=body.model_dump(mode="json"),
                                  headers={IDEMPOTENCY_HEADER: key}, timeout=PLACE_TIMEOUT_S,
                                  command=command)  # fmt: skip
            except (UnreachableError, ServerError) as exc:
                if attempt == SUBMIT_TRIES or (isinstance(exc, ServerError) and exc.kind != "conflict"):
                    raise
                time.sleep(self._retry_after_s * attempt)
        raise AssertionError("unreachable")

    def forward(self, method: str, path: str, *, params: list[tuple[str, str]]) -> httpx.Response:
        """The server's answer to a request passed on as it is (`tpuctl dashboard --server`'s pages),
        exchanged the way every call is (``_exchange``: the caller's token where the server wants one)."""
        return self._exchange(method, path, params=params)

    def _call(self, model: type[_Body], method: str, path: str, *, command: str | None = None,
              **kwargs: Any) -> _Body:  # fmt: skip
        """The typed answer to one request; ``command``: the CLI command it serves, named when the server
        does not know the path (a server older than this client)."""
        response = self._exchange(method, path, **kwargs)
        if response.is_success:
            try:
                return model.model_validate(response.json())
            except (ValueError, ValidationError) as exc:
                raise TpuctlError(
                    f"tpuctl server at {self.url} answered {path} with an unexpected body: {str(exc)[:300]}",
                    fix="use a tpuctl of the server's version",
                ) from None
        raise _error_of(response, self.url, command)

    def _exchange(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request and its answer, with the caller's ID token where the server wants one: learnt from a
        read's 401 (a change is never sent twice to learn it: its refusal is audited), a token refused
        once fetched afresh and tried once more, then ``NotAuthenticatedError``."""
        if self._needs_token is None and method != "GET":
            self._needs_token = self._send("GET", "/v1/workspaces").status_code == 401
        response = self._send(method, path, **kwargs)
        if response.status_code == 401 and not self._needs_token and method == "GET":
            self._needs_token = True
            response = self._send(method, path, **kwargs)
        if response.status_code == 401 and self._needs_token:
            self._identity.forget()  # it may have expired on the way (clocks differ): one fresh try
            response = self._send(method, path, **kwargs)
            if response.status_code == 401:
                self._identity.forget()
                raise _refused_token(response, self._identity)
        return response

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Every request to the server goes out here (whatever each must carry is added in one place)."""
        headers = dict(kwargs.pop("headers", None) or {})
        if self._needs_token:
            headers["Authorization"] = f"Bearer {self._identity.token().token}"
        try:
            return self._http.request(method, path, headers=headers, **kwargs)
        except httpx.TransportError as exc:
            raise UnreachableError(
                f"cannot reach tpuctl server at {self.url}: {exc or type(exc).__name__}",
                fix="check that `tpuctl server` runs there (its /healthz answers), or fix --server",
            ) from None


class NotAuthenticatedError(TpuctlError):
    """The server refused the caller's ID token, or wants one (HTTP 401)."""

    exit_code = EXIT_PERMISSION
    kind = "unauthenticated"


def _refused_token(response: httpx.Response, identity: IdentityTokens) -> TpuctlError:
    """A 401 as the error that says which credentials were tried and how to log in."""
    try:
        document = response.json()
    except ValueError:
        document = {}
    said = document.get("message") if isinstance(document, dict) else None
    return NotAuthenticatedError(
        f"tpuctl server at {identity.audience} refused the ID token: {said or response.text[:200]}",
        fix="a team server takes a Google ID token of a workspace member: set GOOGLE_APPLICATION_CREDENTIALS "
        "to a service account key (CI), run on a VM whose service account is a member, or log in with "
        "`gcloud auth login`; ask a workspace admin to add that account (docs/teams.md)",
    )


def _error_of(response: httpx.Response, url: str, command: str | None) -> TpuctlError:
    try:
        document = response.json()
    except ValueError:
        document = None
    if response.status_code in (404, 405) and _unrouted(document, response):
        return UsageError(
            f"tpuctl server at {url} does not serve `{command or response.request.url.path}` "
            f"({response.request.method} {response.request.url.path}: HTTP {response.status_code})",
            field="--server",
            value=url,
            fix="run a tpuctl server of this client's version, or run the command without --server",
        )
    if isinstance(document, dict) and "message" in document:
        return ServerError(document)
    return TpuctlError(
        f"tpuctl server answered HTTP {response.status_code}: {response.text[:300]}",
        fix="check --server: it must be a tpuctl server's address",
    )


def _unrouted(document: Any, response: httpx.Response) -> bool:
    """The framework's own "no such path" (or "no such method there"), not a tpuctl not-found: its
    document names the path as its value and carries no field."""
    if not isinstance(document, dict):
        return True
    return document.get("field") is None and document.get("value") == response.request.url.path


def _quoted(ref: str, what: str = "RUN") -> str:
    from urllib.parse import quote

    if not ref.strip():
        if what == "RUN":
            raise UsageError(
                "an empty run id", field="RUN", value=ref, fix="`tpuctl runs list` shows the runs"
            )
        raise UsageError(f"an empty {what}", field=what, value=ref, fix="give a name")
    return quote(ref, safe="")
