"""Every error the API answers with is the CLI's error document (``wire.ErrorOut``), with an HTTP status
that says whose fault it is: bad input is 4xx, never a 500 and never a traceback; a failure of tpuctl or
the cloud is 5xx, still as the document."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from tpuctl.errors import (
    EXIT_ALREADY_EXISTS,
    EXIT_ERROR,
    EXIT_INFEASIBLE,
    EXIT_LEASE_HELD,
    EXIT_NOT_FOUND,
    EXIT_PERMISSION,
    EXIT_USAGE,
    CloudError,
    TpuctlError,
    UsageError,
)

if TYPE_CHECKING:
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

#: A tpuctl exit code -> the HTTP status of the same failure.
_STATUS_OF_EXIT: Final = {
    EXIT_USAGE: 400,
    EXIT_NOT_FOUND: 404,
    EXIT_PERMISSION: 403,  # the caller may see the target but not change it (``ForbiddenError``)
    EXIT_ALREADY_EXISTS: 409,
    EXIT_LEASE_HELD: 409,
    EXIT_INFEASIBLE: 422,  # a run its workspace can never hold: the request, not the server, is at fault
}


class RequestProblem(UsageError):
    """Bad input the API itself finds (a body, a header, a content type), with its own HTTP status."""

    def __init__(self, message: str, *, status: int, field: str | None = None, value: object = None,
                 fix: str | None = None) -> None:  # fmt: skip
        super().__init__(message, field=field, value=value, fix=fix)
        self.status = status


class Conflict(TpuctlError):
    """The request is fine but cannot be served now (a submission still being created): retry."""

    kind = "conflict"
    status: Final = 409


def status_of(exc: TpuctlError) -> int:
    own = getattr(exc, "status", None)  # an error that says its own (a bad request, a 401)
    if isinstance(own, int):
        return own
    if exc.kind == "blob_too_large":
        return 413
    if isinstance(exc, CloudError) and exc.exit_code != EXIT_NOT_FOUND:
        return 502  # the cloud failed or refused: not the client's input
    return _STATUS_OF_EXIT.get(exc.exit_code, 500)


def document(exc: TpuctlError) -> dict[str, Any]:
    """The error document, values as strings (``field``/``value`` as the CLI prints them)."""
    return exc.to_dict()


def install(app: FastAPI) -> None:
    """Map every error to the document: tpuctl's by class, the framework's validation errors to 422
    naming the field, anything else to a 500 that says only that it is a bug (never the traceback)."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    async def on_tpuctl(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, TpuctlError)
        return _respond(status_of(exc), document(exc))

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _respond(422, document(validation_problem(exc.errors())))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        problem = RequestProblem(str(exc.detail), status=exc.status_code, value=request.url.path)
        if exc.status_code >= 500:
            return _respond(exc.status_code, document(TpuctlError(str(exc.detail))))
        return _respond(exc.status_code, document(problem))

    async def on_bug(request: Request, exc: Exception) -> Response:
        bug = TpuctlError(
            f"internal error in tpuctl server ({type(exc).__name__}); the request may not have been served",
            fix="see the server's log; retry a submission with the same Idempotency-Key",
        )
        return _respond(500, {**document(bug), "exit_code": EXIT_ERROR})

    app.add_exception_handler(TpuctlError, on_tpuctl)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_bug)


def validation_problem(errors: Any) -> RequestProblem:
    """The framework's first validation error as a usage error naming the field (``job.resources``) and
    what was wrong with it."""
    first = dict(errors[0]) if errors else {}
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path", "header")]
    where = ".".join(loc) or None
    kind = str(first.get("type", ""))
    message = str(first.get("msg", "invalid request"))
    if kind == "json_invalid":
        message = f"the body is not valid JSON: {first.get('ctx', {}).get('error', message)}"
        where = "body"
    elif kind == "extra_forbidden":
        message = f"unknown field {where!r}"
    else:
        message = f"{where or 'the request'}: {message}"
    return RequestProblem(message, status=422, field=where, fix="see the API's schema at /openapi.json")


def respond(exc: TpuctlError) -> Response:
    """The error document of ``exc`` as the response to send, with its status."""
    return _respond(status_of(exc), document(exc))


def _respond(status: int, content: dict[str, Any]) -> Response:
    """The document as JSON text, every non-ASCII character escaped: a message quoting the client's
    input may hold what UTF-8 cannot encode (a lone surrogate from a ``\\ud800`` escape), and the error
    answer must not fail in its turn."""
    import json

    from fastapi.responses import Response

    text = json.dumps(content, ensure_ascii=True, default=str)
    return Response(content=text, status_code=status, media_type="application/json")
