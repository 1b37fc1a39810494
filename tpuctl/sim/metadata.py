"""The simulated hosts' metadata server: ``/sim/metadata/{zone}/{node}/{worker}/computeMetadata/v1/...``.

Answers plain text as GCE's metadata server does: 403 without ``Metadata-Flavor: Google``, 404 for an
unknown host or key, and ``?wait_for_change=true`` long-polls until the value's ETag differs.
"""

from __future__ import annotations

import hashlib
import time

from tpuctl.sim.api_errors import ApiError
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.exchange import SimRequest, SimResponse, first, text_response

NOT_FOUND = "not found\n"
#: The longest long-poll a client may ask for, in seconds (GCE's own cap).
MAX_WAIT_S = 300.0
_POLL_S = 0.02


def etag(value: str) -> str:
    return hashlib.sha1(value.encode(), usedforsecurity=False).hexdigest()[:16]


def answer(
    engine: SimEngine, request: SimRequest, zone: str, node: str, worker: int, key: str
) -> SimResponse:
    """What host ``worker`` of ``node`` reads at ``key`` (the path after ``computeMetadata/v1/``)."""
    if request.headers.get("metadata-flavor") != "Google":
        # What the real metadata server says without the header.
        return text_response("Missing required header: Metadata-Flavor\n", 403)
    value = _value(engine, zone, node, worker, key)
    if value is None:
        return text_response(NOT_FOUND, 404)
    query = request.query
    if first(query, "wait_for_change") == "true":
        # As on GCE: answer when the value's ETag differs from last_etag (default: the ETag at the
        # time of the request), or at timeout_sec with the unchanged value.
        last_etag = first(query, "last_etag") or etag(value)
        timeout = min(float(first(query, "timeout_sec") or 60), MAX_WAIT_S)
        deadline = time.monotonic() + timeout
        while etag(value) == last_etag and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            value = _value(engine, zone, node, worker, key)
            if value is None:
                return text_response(NOT_FOUND, 404)
    return text_response(value, etag=etag(value))


def _value(engine: SimEngine, zone: str, node: str, worker: int, key: str) -> str | None:
    """The value, or None for an unknown host as for an unknown key (both are a plain 404)."""
    try:
        return engine.metadata_value(zone, node, worker, key)
    except ApiError:
        return None
