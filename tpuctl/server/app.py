"""The HTTP API of `tpuctl server` (FastAPI; its OpenAPI document at ``/openapi.json``):

- ``GET /healthz``: the process answers. ``GET /readyz``: the ledger answers (within
  ``LedgerProbe``'s time) and the replica ticks (503 otherwise).
- ``PUT /v1/bundles/{sha256}``: a program's files (``application/gzip``, at most the ledger's 64 MiB).
- ``POST /v1/runs``: submit a run (``wire.SubmitRun``, ``Idempotency-Key`` header); 201 with the new run,
  200 with the first one for a retry.
- ``GET /v1/runs``, ``GET /v1/runs/{run}``, ``GET /v1/runs/{run}/logs?after=CURSOR``,
  ``POST /v1/runs/{run}/cancel``: as `runs list`, `runs describe`, `runs logs` and `runs cancel`.
- ``GET /v1/queue``: as `tpuctl queue` (``routes_queue``).
- ``/v1/cost/...``, ``/v1/catalog/prices``, ``/v1/quota``, ``GET /v1/pods[/{name}]``: the read-only
  commands (``routes_views``); ``POST /v1/pods``, ``POST /v1/pods/delete``: `pod create` and `pod
  delete` (``routes_pods``).

``{run}`` names a run as the CLI's RUN argument does (a whole id, a unique start or end, ``latest``). Every
error is the CLI's error document (``problems``). The handlers are plain functions: FastAPI runs them on
its thread pool, over the server's one session (the replica's too).
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.responses import JSONResponse

from tpuctl.server import problems
from tpuctl.server.bundles import MAX_BUNDLE_BYTES, too_large
from tpuctl.server.gate import note, scoped
from tpuctl.server.problems import RequestProblem
from tpuctl.server.routes_pods import pod_routes
from tpuctl.server.routes_queue import queue_routes
from tpuctl.server.routes_views import view_routes
from tpuctl.server.wire import (
    BUNDLE_MEDIA_TYPE,
    IDEMPOTENCY_HEADER,
    IDEMPOTENCY_KEY_PATTERN,
    SHA256_PATTERN,
    BundleOut,
    CancelOut,
    ErrorOut,
    Health,
    LogLineOut,
    LogsOut,
    Resumed,
    ResumeRun,
    RunDescriptionOut,
    RunList,
    RunOut,
    RunPlanOut,
    SubmitRun,
    Submitted,
)
from tpuctl.teams.workspaces import Workspaces

if TYPE_CHECKING:
    from tpuctl.server.auth import Authenticator
    from tpuctl.server.bundles import BundleStore
    from tpuctl.server.replica import Replica
    from tpuctl.services.session import Session
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.records import RunRecord
    from tpuctl.teams.workspaces import Workspaces

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 409, 413, 415, 422, 500)
}
RunRef = Annotated[str, Path(min_length=1, max_length=200, description="A run id, a unique part, or latest.")]


def build_app(
    session: Session,
    bundles: BundleStore,
    replica: Replica | None,
    *,
    auth: Authenticator | None = None,
    workspaces: Workspaces | None = None,
) -> FastAPI:
    """The API over ``session`` (its ledger and cloud), ``bundles`` and ``replica`` (None: an API that
    supervises nothing, never ready). ``auth``: how requests are authenticated (None: not at all, the
    one-user server on loopback, acting as ``session.actor``); ``workspaces``: the server's (default:
    ``auth``'s, else the implicit local one)."""
    from tpuctl import __version__
    from tpuctl.dashboard.routes import dashboard_router
    from tpuctl.server.gate import Gate
    from tpuctl.server.metrics import metrics_router
    from tpuctl.server.routes_teams import team_routes
    from tpuctl.teams.workspaces import Workspaces

    if workspaces is None:
        if auth is not None:
            workspaces = auth.config.workspaces
        else:
            workspaces = Workspaces.implicit() if replica is None else replica.workspaces
    app = FastAPI(title="tpuctl server", version=__version__, responses=_ERRORS)
    problems.install(app)
    # Every request but the health checks passes the gate: who asks, and the audit row of what it did.
    app.add_middleware(Gate, session=session, authenticator=auth, router=app.router)
    # The dashboard's pages, at /, as the caller sees the ledger (the same scope as the API's JSON).
    app.include_router(dashboard_router(session, workspaces=workspaces, acting=lambda: scoped(session)))
    app.include_router(view_routes(session, _json_body))
    app.include_router(pod_routes(session, _json_body))
    app.include_router(team_routes(session, workspaces))
    app.include_router(metrics_router(session, workspaces))  # /metrics, behind the same gate
    app.include_router(queue_routes(session, workspaces))

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        return Health(status="ok")

    ledger_probe = LedgerProbe(session.ledger)

    @app.get("/readyz", response_model=Health, responses={503: {"model": Health}})
    def readyz() -> Any:
        ledger_ok = ledger_probe.answers()
        replica_ok = replica is not None and replica.ready
        health = Health(
            status="ready" if ledger_ok and replica_ok else "not ready",
            ledger=ledger_ok,
            replica=replica_ok,
            replica_id=None if replica is None else replica.owner.owner_id,
            supervising=None if replica is None else replica.supervising(),
        )
        return health if health.status == "ready" else JSONResponse(health.model_dump(), status_code=503)

    @app.put("/v1/bundles/{sha256}", response_model=BundleOut, status_code=201)
    async def put_bundle(request: Request, sha256: Annotated[str, Path(pattern=SHA256_PATTERN)]) -> BundleOut:
        _require_type(request, BUNDLE_MEDIA_TYPE)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BUNDLE_BYTES:
            raise too_large(int(declared))
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_BUNDLE_BYTES:
                raise too_large(len(data))
        size = bundles.put(sha256, bytes(data))
        return BundleOut(sha256=sha256, size=size)

    @app.post(
        "/v1/runs",
        response_model=Submitted,
        status_code=201,
        dependencies=[Depends(_json_body)],
        responses={200: {"model": Submitted, "description": "a retry: the run its key made"}},
    )
    def submit_run(
        body: SubmitRun,
        idempotency_key: Annotated[str, Header(alias=IDEMPOTENCY_HEADER, pattern=IDEMPOTENCY_KEY_PATTERN)],
    ) -> Any:
        from tpuctl.server.submit import submit
        from tpuctl.services.run.views import RunView

        accepted = submit(scoped(session), bundles, body, idempotency_key, workspaces)
        note(target=accepted.record.run_id, workspace=accepted.record.workspace)
        if replica is not None and accepted.created:
            replica.wake()
        out = Submitted(run=RunOut(**RunView.of(accepted.record).to_dict()), created=accepted.created)
        return out if accepted.created else JSONResponse(out.model_dump(), status_code=200)

    @app.post("/v1/runs:plan", response_model=RunPlanOut, dependencies=[Depends(_json_body)])
    def plan_run(body: SubmitRun) -> RunPlanOut:
        from tpuctl.server.submit import plan

        return RunPlanOut(plan=plan(scoped(session), bundles, body, workspaces))

    @app.get("/v1/runs", response_model=RunList)
    def list_runs(
        limit: Annotated[int, Query(ge=1, le=10_000)] = 50,
        workspace: Annotated[str | None, Query(max_length=200, description="Only this workspace's.")] = None,
        user: Annotated[str | None, Query(max_length=320, description="Only this principal's.")] = None,
    ) -> RunList:
        views = _runs(scoped(session)).list_runs(limit=limit, workspace=workspace, principal=user)
        return RunList(runs=[RunOut(**v.to_dict()) for v in views])

    @app.get("/v1/runs/{run}", response_model=RunDescriptionOut)
    def describe_run(run: RunRef) -> RunDescriptionOut:
        return RunDescriptionOut(**_runs(scoped(session)).describe(run).to_dict())

    @app.get("/v1/runs/{run}/logs", response_model=LogsOut)
    def run_logs(
        run: RunRef,
        after: Annotated[str, Query(max_length=10_000, description="The cursor a previous page gave.")] = "",
        worker: Annotated[int | None, Query(ge=0)] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 2_000,
    ) -> LogsOut:
        return _logs(scoped(session), run, after=after, worker=worker, limit=limit)

    @app.post("/v1/runs/{run}/resume", response_model=Resumed, dependencies=[Depends(_json_body)])
    def resume_run(run: RunRef, body: ResumeRun) -> Resumed:
        """Made ready here (prepared again, RECOVERING) and its lease given back: a replica's next tick
        takes it up, as it takes up any run nobody holds."""
        from tpuctl.services.run.views import RunView

        runs = _runs(scoped(session))
        _found(runs.get(run))
        ready = runs.resume(run, budget_usd=body.budget_usd, max_preemptions=body.max_preemptions)
        if replica is not None:
            replica.wake()
        return Resumed(run=RunOut(**RunView.of(runs.get(ready.run_id)).to_dict()), note=ready.note)

    @app.post("/v1/runs/{run}/cancel", response_model=CancelOut, response_model_exclude_unset=True)
    def cancel_run(run: RunRef) -> CancelOut:
        runs = _runs(scoped(session))
        record = _found(runs.get(run))
        scoped(session).actor.check_change(record.workspace, "cancel its runs")  # 403 before any change
        run_id = record.run_id
        if replica is not None and runs.holder(run_id) is not None:
            # Ours: the ledger's request first (the authority), then our supervisor told at once.
            session.ledger.request_cancel(run_id, f"tpuctl server {replica.owner.owner_id}: runs cancel")
            replica.cancel(run_id)
        return CancelOut(**runs.cancel(run_id, wait_s=60.0).to_dict())

    return app


def _found(record: RunRecord) -> RunRecord:
    """``record``, named in the request's audit row (its id and workspace)."""
    note(target=record.run_id, workspace=record.workspace)
    return record


def _runs(session: Session) -> Any:
    from tpuctl.services.run.service import Runs

    return Runs(session)


def _require_type(request: Request, media_type: str) -> None:
    given = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if given != media_type:
        raise RequestProblem(
            f"this endpoint takes {media_type}, not {given or 'a body without a content type'}",
            status=415,
            field="Content-Type",
            value=given or None,
            fix=f"send the body as {media_type}",
        )


def _json_body(request: Request) -> None:
    _require_type(request, "application/json")


def _logs(session: Session, ref: str, *, after: str, worker: int | None, limit: int) -> LogsOut:
    """The run's stored host lines after ``after`` (``worker:seq`` pairs, comma-separated: each worker's
    last line already seen), as they arrived, and the cursor to ask from next."""
    runs = _runs(session)
    record = runs.get(ref)
    seen = _cursor(after)
    hosts = int((record.detail or {}).get("hosts", 0) or 0)
    workers = [worker] if worker is not None else list(range(max(hosts, 1)))
    lines = []
    for w in workers:
        got = session.ledger.log_lines(record.run_id, worker=w, after_seq=seen.get(w, -1), limit=limit)
        lines.extend(got)
        if got:
            seen[w] = got[-1].seq
    lines.sort(key=lambda line: (line.at, line.worker, line.seq))
    return LogsOut(
        run_id=record.run_id,
        lines=[LogLineOut(worker=x.worker, seq=x.seq, at=x.at, text=x.text) for x in lines],
        cursor=",".join(f"{w}:{s}" for w, s in sorted(seen.items())),
        live=runs.is_live(record.run_id),
    )


def _cursor(text: str) -> dict[int, int]:
    seen: dict[int, int] = {}
    for part in filter(None, text.split(",")):
        worker, _, seq = part.partition(":")
        if not (worker.isdigit() and seq.isdigit()):
            raise RequestProblem(
                f"a bad log cursor part {part!r}",
                status=400,
                field="after",
                value=text,
                fix="pass back the cursor the previous page gave (worker:seq pairs), or none",
            )
        seen[int(worker)] = int(seq)
    return seen


class LedgerProbe:
    """Whether the ledger answers, asked on a thread of its own and waited for at most ``timeout_s``: a
    readiness probe must answer while the database does not (a transaction waits for a database out of
    reach, up to the ledger's busy timeout). One question at a time: while one waits, later probes wait on
    the same answer rather than stack threads up behind the ledger."""

    def __init__(self, ledger: Ledger, *, timeout_s: float = 2.0) -> None:
        self._ledger = ledger
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._pending: concurrent.futures.Future[float] | None = None

    def answers(self) -> bool:
        with self._lock:
            pending = self._pending
            if pending is None or pending.done():
                self._pending = pending = concurrent.futures.Future()
                threading.Thread(target=self._ask, args=(pending,), name="tpuctl-readyz", daemon=True).start()
        try:
            pending.result(timeout=self._timeout_s)
        except Exception:  # no answer in time, or any failure to read the ledger: not ready
            return False
        return True

    def _ask(self, pending: concurrent.futures.Future[float]) -> None:
        try:
            pending.set_result(self._ledger.db_now())
        except Exception as exc:
            pending.set_exception(exc)
