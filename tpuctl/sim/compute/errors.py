"""Compute Engine's error answers: the synchronous body (``{"error": {"code", "message", "errors":
[{"message", "domain", "reason"}]}}``) and the errors a failed operation carries
(docs/google-facts.md#compute-engine-errors)."""

from __future__ import annotations

from typing import Any

from tpuctl.sim.api_errors import ApiError

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


class ComputeError(ApiError):
    """A synchronous Compute Engine error, in Compute's own JSON shape (not the TPU API's).
    ``location``: the request part the error is about, as (location, locationType) (a 401 names the
    Authorization header); ``details``: google.rpc details, sent with the status name (Compute's
    401s carry both, its other errors neither)."""

    def __init__(
        self,
        http_status: int,
        message: str,
        reason: str,
        domain: str = "global",
        *,
        location: tuple[str, str] | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(http_status, _STATUS.get(http_status, "UNKNOWN"), message, details)
        self.reason = reason
        self.domain = domain
        self.location = location

    def body(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"message": self.message, "domain": self.domain, "reason": self.reason}
        if self.location is not None:
            entry["location"], entry["locationType"] = self.location
        error: dict[str, Any] = {"code": self.http_status, "message": self.message, "errors": [entry]}
        if self.details:
            error["status"] = self.status
            error["details"] = self.details
        return {"error": error}


def invalid(message: str) -> ComputeError:
    return ComputeError(400, message, "invalid")


def invalid_field(field: str, value: Any, why: str) -> ComputeError:
    """Compute's wording for a bad field: ``Invalid value for field 'F': 'V'. Why.``"""
    return invalid(f"Invalid value for field '{field}': '{value}'. {why}")


def not_found(path: str) -> ComputeError:
    """``path`` is the resource's relative name, ``projects/P/zones/Z/instances/X``."""
    return ComputeError(404, f"The resource '{path}' was not found", "notFound")


def already_exists(path: str) -> ComputeError:
    return ComputeError(409, f"The resource '{path}' already exists", "alreadyExists")


def not_ready(path: str) -> ComputeError:
    return ComputeError(400, f"The resource '{path}' is not ready", "resourceNotReady")


# --- the transport's transient faults, as Compute answers them -----------------------------------


def rate_limited(project: str) -> ComputeError:
    """The request-rate 429 (Compute's per-project API rate quota; text unc. beyond its shape)."""
    message = (
        "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service "
        f"'compute.googleapis.com' for consumer 'project:{project}'."
    )
    return ComputeError(429, message, "rateLimitExceeded", "usageLimits")


def backend_error() -> ComputeError:
    return ComputeError(500, "Internal error. Please try again or contact Google Support.", "backendError")


def unavailable() -> ComputeError:
    return ComputeError(503, "The service is currently unavailable.", "backendError")


# --- errors an operation ends with ---------------------------------------------------------------


def stockout(project: str, zone: str, machine_type: str) -> dict[str, Any]:
    """A stockout, as an operation's stored error: 503 SERVICE UNAVAILABLE with the
    ZONE_RESOURCE_POOL_EXHAUSTED error and its details (docs/google-facts.md#compute-engine-errors)."""
    message = (
        f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
        "fulfill the request.  Try a different zone, or try again later."
    )
    details = [
        {
            "errorInfo": {
                "domain": "compute.googleapis.com",
                "reason": "stockout",
                "metadatas": {"vmType": machine_type, "zone": zone, "zonesAvailable": ""},
            }
        },
        {
            "localizedMessage": {
                "locale": "en-US",
                "message": f"A {machine_type} VM instance is currently unavailable in the {zone} zone. "
                "Alternatively, you can try your request again with a different VM hardware "
                "configuration or at a later time. For more information, see the troubleshooting "
                "documentation.",
            }
        },
        {
            "help": {
                "links": [
                    {
                        "description": "Troubleshooting documentation",
                        "url": "https://cloud.google.com/compute/docs/resource-error",
                    }
                ]
            }
        },
    ]
    error = {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": message, "errorDetails": details}
    return {"http": [503, "SERVICE UNAVAILABLE"], "errors": [error]}


def quota_exceeded(
    quota_id: str, metric: str, limit: int, dimensions: dict[str, str], where: str
) -> dict[str, Any]:
    """A quota failure, as an operation's stored error: 403 FORBIDDEN with QUOTA_EXCEEDED and a
    quotaInfo detail (docs/google-facts.md#compute-engine-errors). ``where`` is ``region us-central1`` or
    ``zone us-east5-a``."""
    name = quota_name(quota_id)
    message = f"Quota '{name}' exceeded.  Limit: {float(limit)} in {where}."
    info = {"metricName": metric, "limitName": quota_id, "dimensions": dimensions, "limit": float(limit)}
    error = {"code": "QUOTA_EXCEEDED", "message": message, "errorDetails": [{"quotaInfo": info}]}
    return {"http": [403, "FORBIDDEN"], "errors": [error]}


def quota_name(quota_id: str) -> str:
    """The name Compute's message quotes: TPUS-PER-TPU-FAMILY-per-project-region -> TPUS_PER_TPU_FAMILY."""
    base = quota_id.removesuffix("-per-project-region").removesuffix("-per-project-zone")
    return base.replace("-", "_")
