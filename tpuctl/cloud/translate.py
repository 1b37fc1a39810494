"""Vendor exceptions -> ``tpuctl.errors``, in ONE place.

Everything the provider can throw at us goes through ``translate_errors`` (a context manager in the spirit
of httpx's ``map_exceptions``): google.api_core exceptions from the tpu_v2 REST client, the ``requests`` /
urllib3 connection errors and timeouts its transport raises, google-auth errors from credential refresh,
and httpx errors from our own httpx clients (Cloud Quotas). Failed long-running operations (a
``google.rpc.Status`` inside an Operation) go through ``error_from_status``, which shares the same rules.

Rules worth knowing (the why behind the table in the module's tests):

* A connection that never reached the server (refused, DNS, connect timeout, TLS handshake) is a plain
  ``TransientError``: nothing happened, so even a mutation may be retried.
* A connection that broke *after* the request was sent (reset, read timeout, remote disconnected) during a
  MUTATING call is an ``AmbiguousError``: the server may have acted; the caller must look before it
  retries. During a read it is a ``TransientError``.
* 503 UNAVAILABLE and 429 mean the server refused before acting, so mutations may retry them. 500, 502 and
  504 on a mutation may hide a completed action, so they are ``AmbiguousError`` (still a TransientError).
* Messages name what failed (the action and the resource) and carry the server's own text; they never
  include headers, tokens or credentials. URLs are stripped of query strings that could hold an API key.

Heavy modules (google.api_core, requests, httpx, google.auth) are never imported here just to classify an
exception: an exception can only be an instance of a class whose module is already loaded, so the checks
look in ``sys.modules`` first. Importing this module costs nothing.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tpuctl.cloud.iam import ROLES_REFERENCE, grant_fix, role_for
from tpuctl.errors import (
    AlreadyExistsError,
    AmbiguousError,
    CloudError,
    NetworkError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    RateLimitedError,
    StockoutError,
    TpuctlError,
    TransientError,
    UnauthenticatedError,
)

# google.rpc.Code, by name (the REST error payload's "status") and number.
RPC_CODES: dict[str, int] = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}
RPC_NAMES: dict[int, str] = {v: k for k, v in RPC_CODES.items()}

# The HTTP status Google's REST front end uses for each code (google/rpc/code.proto), and the reverse
# for responses that carry no "status" field.
_HTTP_TO_RPC: dict[int, int] = {
    400: 3,
    401: 16,
    403: 7,
    404: 5,
    409: 6,
    412: 9,
    416: 11,
    429: 8,
    499: 1,
    500: 13,
    501: 12,
    502: 14,
    503: 14,
    504: 4,
}

FIX_LOGIN = "gcloud auth application-default login"
FIX_QUOTA = (
    "request a quota increase (https://console.cloud.google.com/iam-admin/quotas), or try another zone, "
    "type or capacity type (spot/preemptible quota is separate from on-demand)"
)
FIX_AMBIGUOUS = "the request may have been applied: look (get/list) before sending it again"
FIX_TRANSIENT = "retry; if it persists, check https://status.cloud.google.com"

_STOCKOUT_RE = re.compile(
    r"no more capacity|insufficient reserved capacity|does not have enough resources available",
    re.IGNORECASE,
)
_STOCKOUT_ZONE_RE = re.compile(r"in the zone \"([^\"]+)\"")
# One place, or a comma-joined list of them: "region us-east5", "zone us-central1-a", "us-central2".
_LOCS = r"(?:(?:region|zone|location)\s+)?[a-z0-9-]+(?:\s*,\s*(?:(?:region|zone|location)\s+)?[a-z0-9-]+)*"
# "Quota limit 'A' has been exceeded. Limit: 0 in region us-east5."
# "RESOURCE_EXHAUSTED: Quota limit 'A,B' has been exceeded. Limit: 0,0 in region us-central1,zone us-c1-a."
_QUOTA_LIMIT_RE = re.compile(
    rf"Quota limit '(?P<ids>[^']+)' has been exceeded\.?\s*Limit:\s*(?P<limits>-?[\d.]+(?:\s*,\s*-?[\d.]+)*)"
    rf"\s+in\s+(?P<locs>{_LOCS})"
)
# "Quota 'X' exhausted. Limit 20800 in region us-central2"
_QUOTA_EXHAUSTED_RE = re.compile(
    rf"Quota '(?P<id>[^']+)' exhausted\.?\s*Limit:?\s*(?P<limit>-?[\d.]+)\s+in\s+(?P<loc>{_LOCS})"
)
# Compute Engine's form: "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally." / "... in region R."
_QUOTA_EXCEEDED_RE = re.compile(
    rf"Quota '(?P<id>[^']+)' exceeded\.?\s*Limit:?\s*(?P<limit>-?[\d.]+)\s+(?:in\s+(?P<loc>{_LOCS})|globally)"
)
_URL_RE = re.compile(r"https?://\S+")
# How a 403 names the missing permission, by API (docs/google-facts.md#permission-errors):
# "Permission 'tpu.nodes.list' denied on resource '//tpu.googleapis.com/...' (or it may not exist)."
# (most APIs); "Required 'compute.instances.list' permission for 'projects/p'" (Compute Engine);
# "a@b does not have storage.objects.create access to the Google Cloud Storage object." (Cloud Storage).
_PERMISSION_RES = (
    re.compile(r"Permission '([A-Za-z0-9_.]+)' denied"),
    re.compile(r"Required '([A-Za-z0-9_.]+)' permission"),
    re.compile(r"does not have ([a-z0-9]+(?:\.[A-Za-z0-9_]+)+) access"),
)


@dataclass(frozen=True)
class QuotaViolation:
    """One violated quota, parsed from a QuotaFailure detail or the error message."""

    quota_id: str | None
    limit: float | None
    location: str | None  # a zone or region name, or "global"


@contextmanager
def translate_errors(
    action: str,
    resource: str = "",
    *,
    mutating: bool = False,
    zone: str | None = None,
) -> Iterator[None]:
    """Translate anything vendor-raised inside the block into a ``tpuctl.errors`` class.

    ``action`` and ``resource`` name what failed ("create node", "n1 in us-east5-b"); ``mutating`` says
    whether the call changes state (so a broken connection is ambiguous rather than merely transient);
    ``zone`` is used when the error itself does not name one (stockouts). ``TpuctlError`` passes through
    untouched; exceptions that are not vendor errors (bugs) propagate unchanged.
    """
    try:
        yield
    except TpuctlError:
        raise
    except Exception as exc:
        translated = translate_exception(exc, action, resource, mutating=mutating, zone=zone)
        if translated is None:
            raise
        raise translated from exc


def translate_exception(
    exc: BaseException,
    action: str,
    resource: str = "",
    *,
    mutating: bool = False,
    zone: str | None = None,
) -> TpuctlError | None:
    """The tpuctl error for ``exc``, or None when ``exc`` is not a provider/transport error."""
    if isinstance(exc, TpuctlError):
        return exc
    what = _what(action, resource)
    for translator in (
        _from_api_core,
        _from_google_auth,
        _from_httpx,
        _from_requests,
        _from_protobuf,
        _from_builtin,
    ):
        out = translator(exc, what, mutating, zone)
        if out is not None:
            return out
    return None


# --------------------------------------------------------------------------------------------------------
# The shared classification: a status (rpc code and/or HTTP status) + message + details -> error.


def error_from_status(
    *,
    what: str,
    message: str,
    rpc_code: int | None = None,
    http_status: int | None = None,
    details: Sequence[Mapping[str, Any]] = (),
    mutating: bool = False,
    zone: str | None = None,
    from_operation: bool = False,
) -> CloudError:
    """Classify one failure reported by the server.

    ``from_operation`` is true for the ``error`` of a finished long-running operation: there, code 8
    (RESOURCE_EXHAUSTED) that is not a quota is a stockout, because capacity is what an operation runs out
    of (rate limits are answered synchronously, never through an operation).
    """
    if rpc_code is None and http_status is not None:
        rpc_code = _rpc_code_of_http(http_status)
    error_info = _find_detail(details, "google.rpc.ErrorInfo")
    reason = str(error_info.get("reason", "")) if error_info else ""
    text = f"{what}: {message}" if message else f"{what} failed"

    if rpc_code == 5:
        return NotFoundError(text, code=5, fix="check the name, the zone and the project")
    if rpc_code == 6:
        return AlreadyExistsError(
            text, code=6, fix="choose another name, or delete the existing resource first"
        )
    if rpc_code == 10:
        # ABORTED (also HTTP 409): a concurrency conflict; the server did not act.
        return TransientError(text, code=10, fix=FIX_TRANSIENT)
    if rpc_code == 7:
        return _permission_denied(text, reason, error_info)
    if rpc_code == 16:
        return UnauthenticatedError(text, code=16, fix=FIX_LOGIN)
    if rpc_code == 8:
        return _resource_exhausted(text, message, details, reason, zone=zone, from_operation=from_operation)
    if rpc_code == 9 and _STOCKOUT_RE.search(message):
        # Google answers "Insufficient reserved capacity" with FAILED_PRECONDITION: still a stockout.
        return _stockout(text, message, zone)
    if rpc_code == 14:
        # UNAVAILABLE: the server refused before acting (a 503), safe to retry even for a mutation.
        # A 502 also lands here; for a mutation it may hide a completed action.
        if mutating and http_status == 502:
            return AmbiguousError(text, code=14, fix=FIX_AMBIGUOUS)
        return TransientError(text, code=14, fix=FIX_TRANSIENT)
    if rpc_code in (4, 13, 1, 2, 15) and (rpc_code != 2 or (http_status or 0) >= 500):
        # DEADLINE_EXCEEDED, INTERNAL, CANCELLED, UNKNOWN 5xx, DATA_LOSS: the server may have acted.
        if mutating and not from_operation:
            return AmbiguousError(text, code=rpc_code, fix=FIX_AMBIGUOUS)
        return TransientError(text, code=rpc_code, fix=FIX_TRANSIENT)
    return _bad_request(text, rpc_code, details)


#: Compute Engine operation error codes that mean the zone has no capacity for the request
#: (docs/google-facts.md#compute-engine-errors).
_COMPUTE_STOCKOUT_CODES = frozenset(
    {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}
)


def error_from_compute_errors(
    *,
    what: str,
    errors: Sequence[Mapping[str, Any]],
    http_status: int | None = None,
    zone: str | None = None,
) -> CloudError:
    """Classify a failed Compute Engine operation (or a MIG's last attempt): its ``error.errors[]``
    entries (``code``, ``message``, ``errorDetails[]``) and ``httpErrorStatusCode``
    (docs/google-facts.md#compute-engine-errors). A stockout is ``ZONE_RESOURCE_POOL_EXHAUSTED*`` (or an
    errorInfo reason ``stockout``); a quota is ``QUOTA_EXCEEDED``, named by its ``quotaInfo`` detail or,
    failing that, by its message."""
    first: Mapping[str, Any] = errors[0] if errors else {}
    code = str(first.get("code", ""))
    message = scrub(str(first.get("message", "")))
    text = f"{what}: {message}" if message else f"{what} failed ({code or http_status})"
    details = [d for d in first.get("errorDetails") or [] if isinstance(d, Mapping)]
    info = next((d["errorInfo"] for d in details if isinstance(d.get("errorInfo"), Mapping)), None)
    if code in _COMPUTE_STOCKOUT_CODES or (info is not None and info.get("reason") == "stockout"):
        return StockoutError(text, zone=zone, code=14)
    if code == "QUOTA_EXCEEDED":
        quota = next((d["quotaInfo"] for d in details if isinstance(d.get("quotaInfo"), Mapping)), None)
        parsed = _parse_quota_message(message)
        fallback = parsed[0] if parsed else QuotaViolation(None, None, None)
        dims = (quota or {}).get("dimensions") or {}
        location = dims.get("region") or dims.get("zone") if isinstance(dims, Mapping) else None
        return QuotaExceededError(
            text,
            quota_id=str((quota or {}).get("limitName") or (quota or {}).get("metricName") or "")
            or fallback.quota_id,
            limit=_to_float((quota or {}).get("limit")) if quota else fallback.limit,
            location=str(location) if location else fallback.location,
            code=8,
            fix=FIX_QUOTA,
        )
    return error_from_status(
        what=what, message=f"{message} [{code}]" if code else message, http_status=http_status or 400,
        zone=zone, from_operation=True,
    )  # fmt: skip


def _rpc_code_of_http(http_status: int) -> int:
    """The RPC code an HTTP status stands for; unlisted: INTERNAL (5xx), INVALID_ARGUMENT (4xx), else
    UNKNOWN."""
    rpc_code = _HTTP_TO_RPC.get(http_status)
    if rpc_code is None:
        rpc_code = 13 if http_status >= 500 else (3 if http_status >= 400 else 2)
    return rpc_code


def _permission_denied(text: str, reason: str, error_info: Mapping[str, Any] | None) -> CloudError:
    """PERMISSION_DENIED: a disabled API (enable it) or a missing permission (grant the role that holds
    it). Google names the permission in an ErrorInfo's metadata (IAM_PERMISSION_DENIED) or only in its
    message, in each API's own words (docs/google-facts.md#permission-errors)."""
    if reason == "SERVICE_DISABLED":
        service = _meta(error_info, "service") or "tpu.googleapis.com"
        return PermissionDeniedError(text, code=7, fix=f"enable the API: gcloud services enable {service}")
    permission = _meta(error_info, "permission") or _permission_in(text)
    if permission is None:
        return PermissionDeniedError(
            text,
            code=7,
            fix="check that the project is the one you meant, and grant the caller a role on it that "
            f"allows this (roles: {ROLES_REFERENCE})",
        )
    return PermissionDeniedError(
        text, code=7, fix=grant_fix(permission), permission=permission, role=role_for(permission)
    )


def _permission_in(message: str) -> str | None:
    """The permission a 403's message names, in any of Google's forms, else None."""
    for pattern in _PERMISSION_RES:
        m = pattern.search(message)
        if m:
            return m.group(1)
    return None


def _resource_exhausted(
    text: str,
    message: str,
    details: Sequence[Mapping[str, Any]],
    reason: str,
    *,
    zone: str | None,
    from_operation: bool,
) -> CloudError:
    """RESOURCE_EXHAUSTED: a stockout, a quota, or a rate limit (never from an operation: there, a
    stockout)."""
    if _STOCKOUT_RE.search(message):
        return _stockout(text, message, zone)
    violations = quota_violations(message, details)
    if violations or reason in ("QUOTA_EXCEEDED", "RESOURCE_QUOTA_EXCEEDED"):
        first = violations[0] if violations else QuotaViolation(None, None, None)
        return QuotaExceededError(
            text,
            quota_id=first.quota_id,
            limit=first.limit,
            location=first.location,
            code=8,
            fix=FIX_QUOTA,
        )
    if from_operation:
        return _stockout(text, message, zone)
    return RateLimitedError(
        text, code=8, fix="wait a minute and retry (tpuctl retries rate limits with backoff)"
    )


def _bad_request(text: str, rpc_code: int | None, details: Sequence[Mapping[str, Any]]) -> CloudError:
    """INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE, UNIMPLEMENTED, ...: the request itself is wrong;
    the server's message names the field. Keep the status name so the user can search for it."""
    code_name = RPC_NAMES.get(rpc_code or -1, "UNKNOWN")
    if _NETWORK_REFUSED_RE.search(text):
        return NetworkError(f"{text} [{code_name}]", code=rpc_code, fix=FIX_NETWORK)
    bad = _find_detail(details, "google.rpc.BadRequest")
    if bad:
        fields = [
            f"{v.get('field', '?')}: {v.get('description', '')}".strip()
            for v in bad.get("fieldViolations", [])
            if isinstance(v, Mapping)
        ]
        if fields:
            text = f"{text} ({'; '.join(fields)})"
    return CloudError(f"{text} [{code_name}]", code=rpc_code)


#: Compute Engine's refusals of an instance's network or subnetwork (docs/google-facts.md#networks); the
#: simulator's TPU API answers in the same words, its own being unconfirmed.
_NETWORK_REFUSED_RE = re.compile(
    r"The referenced (?:sub)?network resource cannot be found|Subnetwork should be specified for custom "
    r"subnetmode network|is not valid for Network|The subnetwork must be in the region"
)
FIX_NETWORK = (
    "name a VPC network of the project with --network (a Shared VPC's as projects/HOST_PROJECT/global/"
    "networks/NAME) and, for a custom-mode network, its subnetwork in the slice's region with --subnetwork "
    "(regions/REGION/subnetworks/NAME keeps placement there), or set network and subnetwork in the profile; "
    "`gcloud compute networks list` and `gcloud compute networks subnets list` show them"
)


def quota_violations(message: str, details: Sequence[Mapping[str, Any]] = ()) -> list[QuotaViolation]:
    """Every violated quota named by a QuotaFailure detail or by the message (all known message forms)."""
    parsed = _parse_quota_message(message)
    failure = _find_detail(details, "google.rpc.QuotaFailure")
    out: list[QuotaViolation] = []
    if failure:
        for i, v in enumerate(failure.get("violations", []) or []):
            if not isinstance(v, Mapping):
                continue
            from_text = _parse_quota_message(str(v.get("description", "")))
            fallback = from_text[0] if from_text else (parsed[i] if i < len(parsed) else None)
            dims = v.get("quotaDimensions") or {}
            location = None
            if isinstance(dims, Mapping):
                location = dims.get("zone") or dims.get("region")
            limit = _to_float(v.get("quotaValue"))
            quota_id = v.get("quotaId") or (fallback.quota_id if fallback else None)
            if not quota_id:
                # An old-style violation names the quota only in its subject/description.
                quota_id = _quota_id_from_subject(str(v.get("subject", "")))
            out.append(
                QuotaViolation(
                    quota_id=str(quota_id) if quota_id else None,
                    limit=limit if limit is not None else (fallback.limit if fallback else None),
                    location=str(location) if location else (fallback.location if fallback else None),
                )
            )
    return out or parsed


def _parse_quota_message(message: str) -> list[QuotaViolation]:
    m = _QUOTA_LIMIT_RE.search(message)
    if m:
        ids = [s.strip() for s in m.group("ids").split(",")]
        limits = [_to_float(s) for s in m.group("limits").split(",")]
        locs = [_location(s) for s in m.group("locs").split(",")]
        return [
            QuotaViolation(
                quota_id=qid,
                limit=limits[i] if i < len(limits) else (limits[-1] if limits else None),
                location=locs[i] if i < len(locs) else (locs[-1] if locs else None),
            )
            for i, qid in enumerate(ids)
        ]
    m = _QUOTA_EXHAUSTED_RE.search(message)
    if m:
        return [QuotaViolation(m.group("id"), _to_float(m.group("limit")), _location(m.group("loc")))]
    m = _QUOTA_EXCEEDED_RE.search(message)
    if m:
        loc = m.group("loc")
        return [
            QuotaViolation(m.group("id"), _to_float(m.group("limit")), _location(loc) if loc else "global")
        ]
    return []


def _location(text: str) -> str:
    """'region us-east5' -> 'us-east5'; 'zone us-central1-a.' -> 'us-central1-a'."""
    words = text.strip().rstrip(".").split()
    return words[-1] if words else ""


def _quota_id_from_subject(subject: str) -> str | None:
    m = re.search(r"([A-Za-z0-9]+ForTPUAPI)", subject)
    return m.group(1) if m else None


def _to_float(value: object) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def _stockout(text: str, message: str, zone: str | None) -> StockoutError:
    m = _STOCKOUT_ZONE_RE.search(message)
    return StockoutError(text, zone=m.group(1) if m else zone)


def _find_detail(details: Sequence[Mapping[str, Any]], type_name: str) -> Mapping[str, Any] | None:
    for d in details or ():
        if isinstance(d, Mapping) and str(d.get("@type", "")).endswith("/" + type_name):
            return d
    return None


def _meta(error_info: Mapping[str, Any] | None, key: str) -> str | None:
    if not error_info:
        return None
    meta = error_info.get("metadata")
    if isinstance(meta, Mapping) and meta.get(key):
        return str(meta[key])
    return None


def _what(action: str, resource: str) -> str:
    return f"{action} {resource}".strip()


def scrub(text: str) -> str:
    """Drop query strings from URLs in ``text`` (they can carry ``key=`` API keys)."""
    return _URL_RE.sub(lambda m: m.group(0).split("?", 1)[0], text)


def parse_error_payload(payload: object) -> tuple[str | None, str, list[Mapping[str, Any]]]:
    """(status name, message, details) from a Google JSON error body ``{"error": {...}}``."""
    if isinstance(payload, list):  # some front ends wrap the error in a one-element list
        payload = next((p for p in payload if isinstance(p, Mapping)), {})
    if not isinstance(payload, Mapping):
        return None, "", []
    err = payload.get("error")
    if isinstance(err, str):  # OAuth-style {"error": "invalid_grant", "error_description": ...}
        return None, f"{err}: {payload.get('error_description', '')}".rstrip(": "), []
    if not isinstance(err, Mapping):
        return None, "", []
    details = [d for d in err.get("details", []) or [] if isinstance(d, Mapping)]
    status = err.get("status")
    return (str(status) if status else None), str(err.get("message", "")), details


def error_from_http_response(
    status_code: int, body: bytes | str, *, what: str, mutating: bool = False, zone: str | None = None
) -> CloudError:
    """Classify an HTTP error response (any client) from its status and Google-shaped JSON body."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        payload: object = json.loads(text) if text else {}
    except ValueError:
        payload = {}
    status, message, details = parse_error_payload(payload)
    if not message:
        message = f"HTTP {status_code}" + (f": {text.strip()[:200]}" if text.strip() else "")
    return error_from_status(
        what=what,
        message=scrub(message),
        rpc_code=RPC_CODES.get(status) if status else None,
        http_status=status_code,
        details=details,
        mutating=mutating,
        zone=zone,
    )


# --------------------------------------------------------------------------------------------------------
# Per-library translators. Each returns None when the exception is not one of its library's.


def _from_api_core(exc: BaseException, what: str, mutating: bool, zone: str | None) -> CloudError | None:
    if "google.api_core.exceptions" not in sys.modules:
        return None
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.RetryError):
        # api_core's own retry gave up (we do not use it, but a library call might).
        return TransientError(f"{what}: {scrub(str(exc.message))}", fix=FIX_TRANSIENT)
    if not isinstance(exc, gexc.GoogleAPICallError):
        if isinstance(exc, gexc.GoogleAPIError):
            return CloudError(f"{what}: {scrub(str(exc))}")
        return None
    status: str | None = None
    message = ""
    details: list[Mapping[str, Any]] = [d for d in exc.details if isinstance(d, Mapping)]
    response = exc.response
    # The REST transport keeps the requests.Response: its JSON has the canonical "status" name, which
    # api_core drops (409 can be ALREADY_EXISTS or ABORTED; 400 can be INVALID_ARGUMENT or
    # FAILED_PRECONDITION).
    if response is not None and hasattr(response, "json"):
        try:
            status, message, payload_details = parse_error_payload(response.json())
            details = details or list(payload_details)
        except Exception:  # a non-JSON error body: fall back to api_core's message
            status = None
    if not message:
        message = str(exc.message or "")
        # api_core prefixes "GET https://host/path?query: " — we name the action ourselves.
        message = re.sub(r"^[A-Z]+ https?://\S+: ", "", message)
    http_status = exc.code if isinstance(exc.code, int) else None
    rpc_code = RPC_CODES.get(status) if status else None
    if rpc_code is None and exc.grpc_status_code is not None:
        value = getattr(exc.grpc_status_code, "value", None)
        if isinstance(value, tuple) and value and isinstance(value[0], int):
            rpc_code = value[0]
    return error_from_status(
        what=what,
        message=scrub(message),
        rpc_code=rpc_code,
        http_status=http_status,
        details=details,
        mutating=mutating,
        zone=zone,
    )


def _from_google_auth(exc: BaseException, what: str, mutating: bool, zone: str | None) -> CloudError | None:
    if "google.auth.exceptions" not in sys.modules:
        return None
    from google.auth import exceptions as aexc

    # The token refresh happens before the API request is sent, so none of these is ambiguous.
    if isinstance(exc, aexc.DefaultCredentialsError):
        return UnauthenticatedError(
            f"{what}: no Application Default Credentials found", code=16, fix=FIX_LOGIN
        )
    if isinstance(exc, aexc.RefreshError):
        retryable = bool(getattr(exc, "retryable", False))
        if retryable:
            return TransientError(
                f"{what}: could not refresh credentials ({_first_line(exc)})", fix=FIX_TRANSIENT
            )
        return UnauthenticatedError(
            f"{what}: credentials were rejected when refreshed ({_first_line(exc)})", code=16, fix=FIX_LOGIN
        )
    if isinstance(exc, aexc.TransportError):
        return TransientError(
            f"{what}: could not reach the token endpoint ({_first_line(exc)})", fix=FIX_TRANSIENT
        )
    if isinstance(exc, aexc.GoogleAuthError):
        return UnauthenticatedError(f"{what}: {_first_line(exc)}", code=16, fix=FIX_LOGIN)
    return None


def _from_httpx(exc: BaseException, what: str, mutating: bool, zone: str | None) -> CloudError | None:
    if "httpx" not in sys.modules:
        return None
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return error_from_http_response(
            exc.response.status_code, exc.response.content, what=what, mutating=mutating, zone=zone
        )
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return _not_sent(what, exc)
    if isinstance(exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError):
        return _broken(what, exc, mutating)
    if isinstance(exc, httpx.HTTPError | httpx.InvalidURL):
        return CloudError(f"{what}: {type(exc).__name__}: {scrub(_first_line(exc))}")
    return None


def _from_requests(exc: BaseException, what: str, mutating: bool, zone: str | None) -> CloudError | None:
    if "requests" not in sys.modules:
        return None
    import requests

    if isinstance(exc, requests.exceptions.HTTPError) and exc.response is not None:
        return error_from_http_response(
            exc.response.status_code, exc.response.content, what=what, mutating=mutating, zone=zone
        )
    if isinstance(exc, requests.exceptions.ConnectTimeout | requests.exceptions.SSLError):
        return _not_sent(what, exc)
    if isinstance(exc, requests.exceptions.ConnectionError):
        # requests wraps urllib3's NewConnectionError (refused, DNS) in a ConnectionError, the same class
        # it uses for a reset mid-response: look inside to tell "never sent" from "sent, then broken".
        if _chain_has(exc, ("NewConnectionError", "NameResolutionError", "ConnectTimeoutError")):
            return _not_sent(what, exc)
        return _broken(what, exc, mutating)
    if isinstance(exc, requests.exceptions.Timeout | requests.exceptions.ChunkedEncodingError):
        return _broken(what, exc, mutating)
    if isinstance(exc, requests.exceptions.RequestException):
        return CloudError(f"{what}: {type(exc).__name__}: {scrub(_first_line(exc))}")
    return None


def _from_protobuf(exc: BaseException, what: str, mutating: bool, zone: str | None) -> CloudError | None:
    # The client parses every response with json_format; an answer it cannot read (a field out of range,
    # a wrong type) is a server-side defect, not a transient. After a mutation was sent, though, the server
    # has acted on it: we just cannot read what it said.
    if "google.protobuf.json_format" not in sys.modules:
        return None
    from google.protobuf import json_format, message

    if not isinstance(exc, json_format.ParseError | message.DecodeError):
        return None
    if mutating:
        return AmbiguousError(
            f"{what}: the server's answer could not be parsed ({_first_line(exc)}); it may have been applied",
            fix=FIX_AMBIGUOUS,
        )
    return CloudError(
        f"{what}: the server's answer could not be parsed ({_first_line(exc)})",
        fix="check that the endpoint is the Cloud TPU API v2; this is a server-side defect",
    )


def _from_builtin(exc: BaseException, what: str, mutating: bool, zone: str | None) -> CloudError | None:
    if isinstance(exc, ConnectionRefusedError):
        return _not_sent(what, exc)
    if isinstance(exc, ConnectionError | TimeoutError):
        return _broken(what, exc, mutating)
    return None


def _not_sent(what: str, exc: BaseException) -> TransientError:
    return TransientError(
        f"{what}: could not connect ({_describe(exc)}); nothing was sent",
        fix="check the network and the endpoint, then retry",
    )


def _broken(what: str, exc: BaseException, mutating: bool) -> TransientError:
    if mutating:
        return AmbiguousError(
            f"{what}: the connection broke after the request was sent ({_describe(exc)}); "
            "it may or may not have been applied",
            fix=FIX_AMBIGUOUS,
        )
    return TransientError(f"{what}: the connection broke ({_describe(exc)})", fix=FIX_TRANSIENT)


def _describe(exc: BaseException) -> str:
    if _chain_has(exc, ("ReadTimeout", "ReadTimeoutError", "TimeoutError", "timeout")):
        return "timed out waiting for the response"
    if _chain_has(exc, ("RemoteDisconnected",)):
        return "the server closed the connection without a response"
    if _chain_has(exc, ("ConnectionResetError",)):
        return "connection reset by peer"
    if _chain_has(exc, ("ConnectionRefusedError",)) or "refused" in str(exc).lower():
        return "connection refused"
    if _chain_has(exc, ("NameResolutionError", "gaierror")):
        return "name resolution failed"
    return f"{type(exc).__name__}: {scrub(_first_line(exc))}"[:300]


def _chain_has(exc: BaseException, names: tuple[str, ...]) -> bool:
    """Whether ``exc`` or anything it wraps (args, .reason, cause, context) has a class named in ``names``."""
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        cur = stack.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, BaseException):
            if any(cls.__name__ in names for cls in type(cur).__mro__):
                return True
            stack.extend(a for a in cur.args if isinstance(a, BaseException))
            stack.append(getattr(cur, "reason", None))
            stack.append(cur.__cause__)
            stack.append(cur.__context__)
    return False


def _first_line(exc: BaseException) -> str:
    # args[0] rather than str(exc): google-auth errors carry the raw token-endpoint response as a second
    # argument, which has no business in a user-facing message.
    first = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    text = first.strip()
    return text.splitlines()[0] if text else type(exc).__name__
