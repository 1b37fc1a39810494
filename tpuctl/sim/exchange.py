"""One request to the simulator and its answer, apart from HTTP: what ``routes.dispatch`` reads and
returns, so the HTTP handler and an in-process caller speak to the simulator alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuctl.sim.api_errors import ApiError, invalid_argument

JSON = "application/json; charset=UTF-8"
#: What the metadata server's plain-text answers are labelled (the simulator always said so).
TEXT = "application/text"


@dataclass(frozen=True)
class SimRequest:
    method: str  # "GET", "POST", "PATCH", "DELETE", "PUT"
    path: str  # URL path only (percent-decoded), e.g. "/v2/projects/p/locations/z/nodes"
    query: Mapping[str, list[str]]  # urllib.parse.parse_qs of the query string
    body: Mapping[str, Any]  # the decoded JSON body, {} when none
    headers: Mapping[str, str]  # header names lower-cased


@dataclass(frozen=True)
class SimResponse:
    status: int
    body: bytes
    content_type: str  # JSON or TEXT above
    etag: str | None = None


def json_response(payload: Mapping[str, Any], status: int = 200) -> SimResponse:
    return SimResponse(status, json.dumps(payload).encode(), JSON)


def text_response(text: str, status: int = 200, *, etag: str | None = None) -> SimResponse:
    return SimResponse(status, text.encode(), TEXT, etag)


def error_response(error: ApiError) -> SimResponse:
    """An error in Google's JSON shape."""
    return json_response(error.body(), error.http_status)


def parse_body(raw: bytes) -> dict[str, Any]:
    """A request body as the API reads it: empty is ``{}``, anything but a JSON object is a 400."""
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise invalid_argument("Invalid JSON payload received.") from None
    if not isinstance(data, dict):
        raise invalid_argument("Invalid JSON payload received: expected an object.")
    return data


def first(query: Mapping[str, list[str]], key: str, default: str = "") -> str:
    """The first value of a query parameter."""
    values = query.get(key)
    return values[0] if values else default
