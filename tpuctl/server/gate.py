"""The gate every request of the API and the dashboard passes (an ASGI middleware): who asks
(``auth``), the session the request's handlers act through (the server's, with the caller as its actor:
``scoped``), and the audit row of what the request did.

Audited: every request that may change something (POST, PUT, PATCH, DELETE), served or refused (401
included), and every read refused as forbidden or not found (403, 404): who probes what is what an admin
looks for. A read's 401 is not: it is how a client learns that the server wants a token. The row
is written once the response's status is known, with the action the route stands for (``runs.cancel``),
its target (the run a handler resolved, else the path's own ``{run}``), and the workspace a handler
noted (``note``; None when refused before one was known).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from tpuctl.errors import TpuctlError
from tpuctl.server.auth import Authenticator, NotAuthenticated
from tpuctl.store.audit import ANONYMOUS, AuditRecord
from tpuctl.teams.actor import Actor

if TYPE_CHECKING:
    from starlette.routing import Router

    from tpuctl.services.session import Session

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: What answers without a token: a load balancer's and an orchestrator's probes.
OPEN_PATHS: Final = frozenset({"/healthz", "/readyz"})
CHANGING_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: The refusals of a read that are audited.
REFUSALS: Final = frozenset({403, 404})
#: A route (method, path template) -> the action its audit rows name; others: "METHOD TEMPLATE".
ACTIONS: Final = {
    ("POST", "/v1/runs"): "runs.submit",
    ("POST", "/v1/runs:plan"): "runs.plan",
    ("GET", "/v1/runs"): "runs.list",
    ("GET", "/v1/runs/{run}"): "runs.describe",
    ("GET", "/v1/runs/{run}/logs"): "runs.logs",
    ("POST", "/v1/runs/{run}/cancel"): "runs.cancel",
    ("POST", "/v1/runs/{run}/resume"): "runs.resume",
    ("PUT", "/v1/bundles/{sha256}"): "bundles.put",
    ("POST", "/v1/pods"): "pods.create",
    ("POST", "/v1/pods/delete"): "pods.delete",
    ("POST", "/v1/pods/gc"): "pods.gc",
    ("POST", "/v1/cost/estimate"): "cost.estimate",
}
_ERROR_BODY_BYTES: Final = 4096


@dataclass
class RequestScope:
    """One request's actor, and what its handlers noted for the audit row."""

    actor: Actor
    #: The verified principal (None: none yet, or none at all).
    principal: str | None = None
    workspace: str | None = None
    target: str | None = None
    session: Session | None = None


_SCOPE: ContextVar[RequestScope | None] = ContextVar("tpuctl_request_scope", default=None)


def scoped(server: Session) -> Session:
    """The session a handler acts through: the server's own with this request's caller as actor (made
    once per request; its lazily opened clients are the server's, ``Session._opened``). Outside a
    request (a test calling a handler directly): the server's own."""
    scope = _SCOPE.get()
    if scope is None or scope.actor is server.actor:
        return server
    if scope.session is None:
        scope.session = dataclasses.replace(server, actor=scope.actor)
    return scope.session


def note(*, target: str | None = None, workspace: str | None = None) -> None:
    """Name the request's target (a run id) and its workspace in its audit row."""
    scope = _SCOPE.get()
    if scope is not None:
        scope.target = target or scope.target
        scope.workspace = workspace or scope.workspace


class Gate:
    """``authenticator`` None: no workspace file, every request acts as the server's own session's actor.
    ``router``: the app's, to name a request's route in its audit row."""

    def __init__(self, app: App, *, session: Session, authenticator: Authenticator | None,
                 router: Router) -> None:  # fmt: skip
        self.app = app
        self._session = session
        self._authenticator = authenticator
        self._router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        from starlette.concurrency import run_in_threadpool

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        answer = _Answer(send)
        request = RequestScope(actor=self._session.actor)
        try:
            try:
                await self._authenticate(scope, headers, request)
            except TpuctlError as exc:
                await _refuse(exc, answer, scope, receive)
                return
            token = _SCOPE.set(request)
            try:
                await self.app(scope, receive, answer.send)
            finally:
                _SCOPE.reset(token)
        finally:  # a request the app failed on (a 500) is written too
            if scope["method"] in CHANGING_METHODS or answer.status in REFUSALS:
                record = self._record(scope, request, answer)
                await run_in_threadpool(self._write, record)

    async def _authenticate(self, scope: Scope, headers: dict[str, str], request: RequestScope) -> None:
        """Set the request's principal and actor; ``TpuctlError`` (401, 403) refuses it. The principal
        is set before a 403 is raised, so the audit row says who was refused."""
        from starlette.concurrency import run_in_threadpool

        auth = self._authenticator
        scraper = None if auth is None else auth.scraper(scope["path"], headers)
        if auth is None or scraper is not None:
            request.actor = scraper or request.actor
            request.principal = request.actor.principal
            return
        request.principal = await run_in_threadpool(auth.principal_of, headers)
        request.actor = auth.actor_for(request.principal)

    def _write(self, record: AuditRecord) -> None:
        """The row, written after the answer was sent: a ledger that cannot take it (an outage) is said in
        the server's log, never turned into a failure of a request already answered."""
        try:
            self._session.ledger.record_audit(record)
        except Exception as exc:
            print(f"tpuctl server: audit row not written ({record.principal} {record.method} {record.path} "
                  f"-> {record.status}): {exc}", file=sys.stderr, flush=True)  # fmt: skip

    def _record(self, scope: Scope, request: RequestScope, answer: _Answer) -> AuditRecord:
        template, params = self._route(scope)
        method = str(scope["method"])
        target = request.target or next(iter(params.values()), None)
        return AuditRecord(
            principal=request.principal or ANONYMOUS,
            workspace=request.workspace,
            method=method,
            path=str(scope["path"]),
            action=ACTIONS.get((method, template), f"{method} {template}"),
            target=None if target is None else str(target),
            status=answer.status,
            detail=answer.error(),
        )

    def _route(self, scope: Scope) -> tuple[str, dict[str, Any]]:
        from starlette.routing import Match

        for route in self._router.routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                return str(getattr(route, "path", scope["path"])), dict(child.get("path_params", {}))
        return str(scope["path"]), {}


class _Answer:
    """The response as it is sent: its status, and the start of an error's body (its document)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 500  # what the client gets if the app dies before it answers
        self._body = bytearray()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        elif message["type"] == "http.response.body" and self.status >= 400:
            room = _ERROR_BODY_BYTES - len(self._body)
            self._body += bytes(message.get("body", b""))[: max(room, 0)]
        await self._send(message)

    def error(self) -> dict[str, Any]:
        if self.status < 400:
            return {}
        try:
            document = json.loads(bytes(self._body))
        except ValueError:
            return {"error": "http", "message": bytes(self._body[:300]).decode("utf-8", "replace")}
        if not isinstance(document, dict):
            return {}
        return {k: document[k] for k in ("error", "message") if k in document}


async def _refuse(exc: TpuctlError, answer: _Answer, scope: Scope, receive: Receive) -> None:
    from tpuctl.server.problems import respond

    response = respond(exc)
    if isinstance(exc, NotAuthenticated):
        # RFC 6750: a protected resource says how to authenticate; with a token given, that it failed.
        given = any(k == b"authorization" for k, _ in scope["headers"])
        response.headers["WWW-Authenticate"] = 'Bearer realm="tpuctl"' + (
            ', error="invalid_token"' if given else ""
        )
    await response(scope, receive, answer.send)
