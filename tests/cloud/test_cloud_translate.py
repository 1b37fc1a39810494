"""Every translated exception class, from the exceptions the real libraries raise.

api_core errors are built with ``google.api_core.exceptions.from_http_response`` on a ``requests.Response``
carrying Google's JSON error body: exactly what the tpu_v2 REST transport does on a >= 400 answer.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc

from tpuctl.cloud.translate import error_from_status, quota_violations, translate_errors, translate_exception
from tpuctl.errors import (
    AlreadyExistsError,
    AmbiguousError,
    CloudError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    RateLimitedError,
    StockoutError,
    TransientError,
    UnauthenticatedError,
    UsageError,
)

URL = "https://tpu.googleapis.com/v2/projects/p/locations/us-east5-b/nodes?nodeId=n1&key=SECRET123"
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
V6E_QUOTA_MSG = (
    "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. "
    "Limit: 0 in region us-east5."
)


def api_error(
    http_status: int,
    status: str | None,
    message: str,
    details: list[dict[str, Any]] | None = None,
    *,
    body: bytes | None = None,
) -> gexc.GoogleAPICallError:
    """What the REST transport raises for this HTTP answer."""
    err: dict[str, Any] = {"code": http_status, "message": message}
    if status:
        err["status"] = status
    if details:
        err["details"] = details
    resp = requests.Response()
    resp.status_code = http_status
    resp._content = body if body is not None else json.dumps({"error": err}).encode()
    resp.headers["Content-Type"] = "application/json"
    resp.request = requests.Request("POST", URL).prepare()
    resp.url = URL
    exc = gexc.from_http_response(resp)
    assert isinstance(exc, gexc.GoogleAPICallError)
    return exc


def translate(exc: BaseException, *, mutating: bool = False, zone: str | None = None) -> Any:
    out = translate_exception(exc, "create node", "n1 in us-east5-b", mutating=mutating, zone=zone)
    assert out is not None, f"{exc!r} was not translated"
    # Messages name what failed, and never carry a secret from a URL.
    assert "create node n1 in us-east5-b" in out.message
    assert "SECRET123" not in str(out)
    return out


# ---- HTTP answers -------------------------------------------------------------------------------------


def test_not_found() -> None:
    out = translate(api_error(404, "NOT_FOUND", "Resource 'projects/p/locations/z/nodes/n1' was not found"))
    assert type(out) is NotFoundError and out.code == 5
    assert "was not found" in out.message and out.fix


def test_already_exists_and_bare_conflict() -> None:
    out = translate(api_error(409, "ALREADY_EXISTS", "Resource 'n1' already exists"), mutating=True)
    assert type(out) is AlreadyExistsError and out.code == 6
    # A 409 with no status name (api_core's Conflict) is read as ALREADY_EXISTS too.
    out = translate(api_error(409, None, "conflict"), mutating=True)
    assert type(out) is AlreadyExistsError


def test_permission_denied_names_the_permission_and_the_role_in_every_api_s_words() -> None:
    info = {
        "@type": ERROR_INFO,
        "reason": "IAM_PERMISSION_DENIED",
        "domain": "iam.googleapis.com",
        "metadata": {"permission": "cloudquotas.quotas.get", "resource": "projects/p"},
    }
    cases = [
        (
            api_error(403, "PERMISSION_DENIED", "The caller does not have permission", [info]),
            "cloudquotas.quotas.get",
        ),
        (
            api_error(403, None, "Required 'compute.instances.list' permission for 'projects/p'"),
            "compute.instances.list",
        ),
        (
            api_error(
                403,
                None,
                "sa@p.iam.gserviceaccount.com does not have storage.objects.create access to the Google "
                "Cloud Storage object. Permission 'storage.objects.create' denied on resource (or it may "
                "not exist).",
            ),
            "storage.objects.create",
        ),
    ]
    for exc, permission in cases:
        out = translate(exc)
        assert type(out) is PermissionDeniedError and out.permission == permission, out
        assert out.role is not None and out.role in (out.fix or "") and permission in (out.fix or "")
        assert out.to_dict()["permission"] == permission
    # A 403 that names no permission (a location without TPUs) says to check the project instead.
    where = translate(
        api_error(403, "PERMISSION_DENIED", "Location us-east1-d is not found or access is unauthorized.")
    )
    assert where.permission is None and "project" in (where.fix or "")


def test_aborted_409_is_transient_not_already_exists() -> None:
    out = translate(api_error(409, "ABORTED", "concurrent modification"), mutating=True)
    assert type(out) is TransientError and out.code == 10


def test_permission_denied_and_service_disabled() -> None:
    out = translate(api_error(403, "PERMISSION_DENIED", "Permission 'tpu.nodes.create' denied"))
    assert type(out) is PermissionDeniedError and out.code == 7 and "roles/tpu.admin" in (out.fix or "")
    disabled = api_error(
        403,
        "PERMISSION_DENIED",
        "Cloud TPU API has not been used in project p before or it is disabled.",
        [
            {
                "@type": ERROR_INFO,
                "reason": "SERVICE_DISABLED",
                "domain": "googleapis.com",
                "metadata": {"service": "tpu.googleapis.com", "consumer": "projects/p"},
            }
        ],
    )
    out = translate(disabled)
    assert type(out) is PermissionDeniedError
    assert out.fix == "enable the API: gcloud services enable tpu.googleapis.com"


def test_unauthenticated() -> None:
    out = translate(api_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials."))
    assert type(out) is UnauthenticatedError and out.fix == "gcloud auth application-default login"


def test_quota_from_quota_failure_detail() -> None:
    exc = api_error(
        429,
        "RESOURCE_EXHAUSTED",
        "Quota exceeded.",
        [
            {
                "@type": QUOTA_FAILURE,
                "violations": [
                    {
                        "subject": "project:p",
                        "description": "TPU quota",
                        "quotaId": "TPUV5sLitepodPerProjectPerZoneForTPUAPI",
                        "quotaMetric": "tpu.googleapis.com/v5e",
                        "quotaDimensions": {"zone": "us-east5-b"},
                        "quotaValue": "64",
                    }
                ],
            }
        ],
    )
    out = translate(exc, mutating=True)
    assert type(out) is QuotaExceededError
    assert (out.quota_id, out.limit, out.location) == (
        "TPUV5sLitepodPerProjectPerZoneForTPUAPI",
        64.0,
        "us-east5-b",
    )
    assert out.code == 8 and "quota increase" in (out.fix or "")


def test_quota_from_detail_with_only_a_description() -> None:
    # Old-style violations say it in prose; the message parser fills the fields.
    msg = V6E_QUOTA_MSG
    exc = api_error(
        429,
        "RESOURCE_EXHAUSTED",
        msg,
        [{"@type": QUOTA_FAILURE, "violations": [{"subject": "project:p", "description": msg}]}],
    )
    out = translate(exc)
    assert (out.quota_id, out.limit, out.location) == (
        "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
        0.0,
        "us-east5",
    )


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            V6E_QUOTA_MSG,
            ("TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", 0.0, "us-east5"),
        ),
        (
            "RESOURCE_EXHAUSTED: Quota limit "
            "'TPUV2sPodPerProjectPerRegionForTPUAPI,TPUV2sPodPerProjectPerZoneForTPUAPI' "
            "has been exceeded. Limit: 0,0 in region us-central1,zone us-central1-a.",
            ("TPUV2sPodPerProjectPerRegionForTPUAPI", 0.0, "us-central1"),
        ),
        (
            "Quota 'TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI' exhausted. "
            "Limit 20800 in region us-central2",
            ("TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI", 20800.0, "us-central2"),
        ),
    ],
)
def test_quota_from_the_three_message_forms(message: str, expected: tuple[str, float, str]) -> None:
    out = translate(api_error(429, "RESOURCE_EXHAUSTED", message), mutating=True)
    assert type(out) is QuotaExceededError
    assert (out.quota_id, out.limit, out.location) == expected


def test_gcloud_comma_form_keeps_every_violation() -> None:
    got = quota_violations(
        "Quota limit 'A,B' has been exceeded. Limit: 0,8 in region us-central1,zone us-central1-a."
    )
    assert [(v.quota_id, v.limit, v.location) for v in got] == [
        ("A", 0.0, "us-central1"),
        ("B", 8.0, "us-central1-a"),
    ]


def test_rate_limit_by_error_info_and_by_message() -> None:
    exc = api_error(
        429,
        "RESOURCE_EXHAUSTED",
        "Quota exceeded for quota metric 'tpu.googleapis.com/qps/create' and limit 'CreateNode requests per "
        "minute' of service 'tpu.googleapis.com' for consumer 'project:p'.",
        [{"@type": ERROR_INFO, "reason": "RATE_LIMIT_EXCEEDED", "domain": "googleapis.com"}],
    )
    out = translate(exc, mutating=True)
    assert type(out) is RateLimitedError and out.retryable
    out = translate(api_error(429, "RESOURCE_EXHAUSTED", "Maximum number of CreateNode requests per minute"))
    assert type(out) is RateLimitedError


@pytest.mark.parametrize(
    ("http_status", "status"), [(500, "INTERNAL"), (502, None), (504, "DEADLINE_EXCEEDED")]
)
def test_5xx_transient_on_reads_ambiguous_on_mutations(http_status: int, status: str | None) -> None:
    exc = api_error(http_status, status, "Internal error encountered.")
    assert type(translate(exc, mutating=False)) is TransientError
    assert type(translate(exc, mutating=True)) is AmbiguousError


def test_503_is_transient_even_for_a_mutation() -> None:
    out = translate(api_error(503, "UNAVAILABLE", "The service is currently unavailable."), mutating=True)
    assert type(out) is TransientError and out.code == 14


def test_bad_request_names_the_field() -> None:
    exc = api_error(
        400,
        "INVALID_ARGUMENT",
        "Invalid value for field 'node.acceleratorType': 'v5litepod-48'.",
        [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": "node.acceleratorType", "description": "unknown type"}],
            }
        ],
    )
    out = translate(exc, mutating=True)
    assert type(out) is CloudError and out.code == 3
    assert "node.acceleratorType" in out.message and "INVALID_ARGUMENT" in out.message


def test_failed_precondition_keeps_its_code() -> None:
    out = translate(api_error(400, "FAILED_PRECONDITION", "Node n1 is not STOPPED."), mutating=True)
    assert type(out) is CloudError and out.code == 9 and "is not STOPPED" in out.message


def test_non_json_error_body_and_secret_in_url() -> None:
    out = translate(api_error(502, None, "", body=b"<html>Bad Gateway</html>"))
    assert type(out) is TransientError
    assert "SECRET123" not in out.message


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (gexc.DeadlineExceeded("deadline"), TransientError),
        (gexc.InternalServerError("boom"), TransientError),
        (gexc.ServiceUnavailable("later"), TransientError),
        (gexc.NotFound("gone"), NotFoundError),
        (gexc.AlreadyExists("dup"), AlreadyExistsError),
        (gexc.Conflict("dup"), AlreadyExistsError),
        (gexc.PermissionDenied("no"), PermissionDeniedError),
        (gexc.Forbidden("no"), PermissionDeniedError),
        (gexc.Unauthenticated("who"), UnauthenticatedError),
        (gexc.Unauthorized("who"), UnauthenticatedError),
        (gexc.InvalidArgument("bad"), CloudError),
        (gexc.BadRequest("bad"), CloudError),
        (gexc.FailedPrecondition("not now"), CloudError),
        (gexc.TooManyRequests("slow down"), RateLimitedError),
        (gexc.ResourceExhausted("slow down"), RateLimitedError),
        (gexc.RetryError("gave up", None), TransientError),
    ],
)
def test_api_core_classes_without_a_response(exc: Exception, cls: type) -> None:
    assert type(translate(exc)) is cls


def test_deadline_exceeded_on_a_mutation_is_ambiguous() -> None:
    assert type(translate(gexc.DeadlineExceeded("deadline"), mutating=True)) is AmbiguousError


# ---- transport errors (requests / urllib3, as the REST transport raises them) ---------------------------


def _requests_error(kind: str) -> Exception:
    import http.client

    import urllib3

    if kind == "disconnected":
        inner = urllib3.exceptions.ProtocolError(
            "Connection aborted.",
            http.client.RemoteDisconnected("Remote end closed connection without response"),
        )
        return requests.exceptions.ConnectionError(inner)
    if kind == "reset":
        inner = urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset"))
        return requests.exceptions.ConnectionError(inner)
    if kind == "read_timeout":
        return requests.exceptions.ReadTimeout(
            "HTTPSConnectionPool(host='tpu.googleapis.com'): Read timed out."
        )
    if kind == "refused":
        conn = urllib3.connection.HTTPConnection("127.0.0.1", 1)
        new = urllib3.exceptions.NewConnectionError(
            conn, "Failed to establish a new connection: [Errno 111] refused"
        )
        pool = urllib3.HTTPConnectionPool("127.0.0.1", 1)
        return requests.exceptions.ConnectionError(urllib3.exceptions.MaxRetryError(pool, "/", new))
    if kind == "connect_timeout":
        return requests.exceptions.ConnectTimeout("connect timed out")
    if kind == "chunked":
        return requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead")
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["disconnected", "reset", "read_timeout", "chunked"])
def test_broken_after_sending_is_ambiguous_for_mutations_transient_for_reads(kind: str) -> None:
    out = translate(_requests_error(kind), mutating=True)
    assert type(out) is AmbiguousError and "may or may not" in out.message
    assert type(translate(_requests_error(kind), mutating=False)) is TransientError


@pytest.mark.parametrize("kind", ["refused", "connect_timeout"])
def test_never_sent_is_transient_even_for_mutations(kind: str) -> None:
    out = translate(_requests_error(kind), mutating=True)
    assert type(out) is TransientError and "nothing was sent" in out.message


def test_builtin_socket_errors() -> None:
    assert type(translate(ConnectionResetError(104, "reset"), mutating=True)) is AmbiguousError
    assert type(translate(TimeoutError("timed out"), mutating=False)) is TransientError
    assert type(translate(ConnectionRefusedError(111, "refused"), mutating=True)) is TransientError


# ---- httpx (our own clients) -------------------------------------------------------------------------


def test_httpx_errors() -> None:
    import httpx

    req = httpx.Request("GET", "https://cloudquotas.googleapis.com/v1/x")
    assert type(translate(httpx.ConnectError("refused", request=req), mutating=True)) is TransientError
    assert type(translate(httpx.ReadTimeout("slow", request=req), mutating=True)) is AmbiguousError
    assert type(translate(httpx.ReadTimeout("slow", request=req))) is TransientError
    assert type(translate(httpx.RemoteProtocolError("closed", request=req))) is TransientError
    resp = httpx.Response(
        403, request=req, json={"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}}
    )
    status_error = httpx.HTTPStatusError("403", request=req, response=resp)
    assert type(translate(status_error)) is PermissionDeniedError


# ---- google-auth ---------------------------------------------------------------------------------------


def test_google_auth_errors() -> None:
    from google.auth import exceptions as aexc

    out = translate(aexc.RefreshError("invalid_grant: Token has been expired or revoked.", {"error": "x"}))
    assert type(out) is UnauthenticatedError and out.fix == "gcloud auth application-default login"
    assert "{'error'" not in out.message  # the raw token-endpoint response stays out
    assert type(translate(aexc.DefaultCredentialsError("none"))) is UnauthenticatedError
    assert type(translate(aexc.TransportError("dns"), mutating=True)) is TransientError


# ---- failed long-running operations ------------------------------------------------------------------


def test_operation_stockout_and_reserved_capacity() -> None:
    msg = (
        'There is no more capacity in the zone "us-central1-c"; you can try in another zone where Cloud TPU '
        "Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1234]"
    )
    out = error_from_status(what="create node n1", message=msg, rpc_code=8, from_operation=True, zone="x")
    assert type(out) is StockoutError and out.zone == "us-central1-c" and out.code == 8
    out = error_from_status(
        what="create node n1",
        rpc_code=8,
        from_operation=True,
        zone="us-east5-b",
        message="Insufficient reserved capacity. Contact customer support to increase your reservation. "
        "[EID: 0x1]",
    )
    assert type(out) is StockoutError and out.zone == "us-east5-b"


def test_operation_quota_and_other_codes() -> None:
    out = error_from_status(
        what="create node",
        rpc_code=8,
        from_operation=True,
        message="Quota 'X' exhausted. Limit 8 in zone us-east5-b",
    )
    assert type(out) is QuotaExceededError and (out.quota_id, out.limit, out.location) == (
        "X",
        8.0,
        "us-east5-b",
    )
    assert (
        type(error_from_status(what="w", rpc_code=13, message="internal", from_operation=True))
        is TransientError
    )
    assert type(error_from_status(what="w", rpc_code=3, message="bad", from_operation=True)) is CloudError
    # Code 8 without a capacity or quota message, in an operation: capacity is what operations run out of.
    assert (
        type(error_from_status(what="w", rpc_code=8, message="exhausted", from_operation=True))
        is StockoutError
    )


# ---- the context manager ------------------------------------------------------------------------------


def test_context_manager_translates_chains_and_passes_others_through() -> None:
    with pytest.raises(NotFoundError) as info, translate_errors("get node", "n1 in z"):
        raise gexc.NotFound("gone")
    assert isinstance(info.value.__cause__, gexc.NotFound)
    assert info.value.message.startswith("get node n1 in z:")
    with pytest.raises(ValueError), translate_errors("get node", "n1"):
        raise ValueError("a bug stays a bug")
    with pytest.raises(UsageError), translate_errors("get node", "n1"):
        raise UsageError("already ours")


def test_quota_message_with_trailing_text_and_compute_engine_form() -> None:
    got = quota_violations("Quota limit 'Q' has been exceeded. Limit: 16 in zone us-west4-a. In use: 16.")
    assert [(v.quota_id, v.limit, v.location) for v in got] == [("Q", 16.0, "us-west4-a")]
    got = quota_violations("Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.")
    assert [(v.quota_id, v.limit, v.location) for v in got] == [("GPUS_ALL_REGIONS", 0.0, "global")]
    assert quota_violations("Quota exceeded for quota metric 'tpu.googleapis.com/qps/create'") == []


def test_unparseable_answers() -> None:
    from google.protobuf import json_format

    exc = json_format.ParseError("Failed to parse id field: Value out of range: 9733224497149883078.")
    out = translate(exc)
    assert type(out) is CloudError and "could not be parsed" in out.message and "out of range" in out.message
    assert type(translate(exc, mutating=True)) is AmbiguousError
