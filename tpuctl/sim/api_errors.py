"""Google's JSON error responses, as the simulator answers them.

Shape (what google.api_core's ``from_http_response`` reads): ``{"error": {"code": <HTTP status>,
"message": ..., "status": <google.rpc.Code name>, "details": [...]}}``. Details are JSON forms of
google.rpc messages with an ``@type``; the client exposes them as ``exc.details`` (a list of dicts) and
an ErrorInfo's reason as ``exc.reason``.
"""

from __future__ import annotations

import secrets
from typing import Any

#: google.rpc.Code numbers, used in Operation.error and QueuedResource failedData.
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

ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
QUOTA_FAILURE_TYPE = "type.googleapis.com/google.rpc.QuotaFailure"
BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"
RESOURCE_INFO_TYPE = "type.googleapis.com/google.rpc.ResourceInfo"

#: The ResourceInfo ``resourceType`` of each TPU API collection (Google names a resource type by its
#: service and kind, as in google.api.resource's ``type``: "tpu.googleapis.com/Node").
_RESOURCE_TYPES = {
    "nodes": "tpu.googleapis.com/Node",
    "queuedResources": "tpu.googleapis.com/QueuedResource",
    "operations": "tpu.googleapis.com/Operation",
    "acceleratorTypes": "tpu.googleapis.com/AcceleratorType",
    "runtimeVersions": "tpu.googleapis.com/RuntimeVersion",
    "locations": "locations.googleapis.com/Location",
    "quotaInfos": "cloudquotas.googleapis.com/QuotaInfo",
}


class ApiError(Exception):
    """An error answer: HTTP status, google.rpc status name, message and details."""

    def __init__(
        self, http_status: int, status: str, message: str, details: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.status = status
        self.message = message
        self.details = details or []

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.http_status, "message": self.message, "status": self.status}
        if self.details:
            error["details"] = self.details
        return {"error": error}


def eid() -> str:
    """An error id like the ones GCP appends to TPU capacity errors (``[EID: 0x1a2b...]``)."""
    return f"[EID: 0x{secrets.token_hex(8)}]"


def resource_info(resource_name: str, description: str) -> dict[str, Any]:
    """A google.rpc.ResourceInfo detail naming the resource an error is about (AIP-193: NOT_FOUND and
    ALREADY_EXISTS carry one)."""
    parts = resource_name.split("/")
    kind = parts[-2] if len(parts) >= 2 else ""
    project = parts[1] if len(parts) > 1 and parts[0] == "projects" else ""
    return {
        "@type": RESOURCE_INFO_TYPE,
        "resourceType": _RESOURCE_TYPES.get(kind, kind),
        "resourceName": resource_name,
        "owner": f"projects/{project}" if project else "",
        "description": description,
    }


def not_found(resource_name: str) -> ApiError:
    message = f"Resource '{resource_name}' was not found"
    return ApiError(404, "NOT_FOUND", message, [resource_info(resource_name, message)])


def already_exists(resource_name: str) -> ApiError:
    message = f"Resource '{resource_name}' already exists"
    return ApiError(409, "ALREADY_EXISTS", message, [resource_info(resource_name, message)])


def invalid_argument(message: str, field: str | None = None) -> ApiError:
    details: list[dict[str, Any]] = []
    if field is not None:
        details.append(
            {"@type": BAD_REQUEST_TYPE, "fieldViolations": [{"field": field, "description": message}]}
        )
    return ApiError(400, "INVALID_ARGUMENT", message, details)


def failed_precondition(message: str) -> ApiError:
    return ApiError(400, "FAILED_PRECONDITION", message)


def rate_limited(project: str, method: str) -> ApiError:
    """The request-rate 429: distinguishable from a resource-quota 429 by its ErrorInfo reason."""
    message = (
        "Quota exceeded for quota metric 'tpu.googleapis.com/qps/create' and limit "
        f"'{method} requests per minute' of service 'tpu.googleapis.com' for consumer 'project:{project}'."
    )
    details = [
        {
            "@type": ERROR_INFO_TYPE,
            "reason": "RATE_LIMIT_EXCEEDED",
            "domain": "googleapis.com",
            "metadata": {
                "service": "tpu.googleapis.com",
                "quota_metric": "tpu.googleapis.com/qps/create",
                "quota_limit": f"{method}RequestsPerMinutePerProject",
                "consumer": f"projects/{project}",
            },
        }
    ]
    return ApiError(429, "RESOURCE_EXHAUSTED", message, details)


def internal_error() -> ApiError:
    return ApiError(500, "INTERNAL", "Internal error encountered.")


def unavailable() -> ApiError:
    return ApiError(503, "UNAVAILABLE", "The service is currently unavailable.")


def rpc_status(status: str, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A google.rpc.Status as it appears in an Operation's ``error`` or a queued resource's
    ``failedData.error`` (numeric code), with its details (a quota failure keeps its QuotaFailure)."""
    return {"code": RPC_CODES[status], "message": message, "details": list(details or [])}
