"""What Google's frontend does before and after the TPU API's methods run, for ``v2`` and ``v2alpha1``.

The engine speaks v2. In front of it, driven by the version's discovery document:

- the request body is read as Google's JSON transcoding reads it (``transcoding.read_body``);
- a ``v2alpha1`` request is put in v2 terms (``multiNodeParams`` is v2's ``multisliceParams``; the
  ``bestEffort`` tier draws on preemptible capacity like ``spot``) and its answer back in v2alpha1 terms
  (``@type`` URLs, ``apiVersion: V2_ALPHA1``);
- every answer keeps only the fields of the version's schema (``transcoding.project``);
- a location that offers no TPUs is 403 "Location X is not found or access is unauthorized." (the text
  Google answers for a zone without Cloud TPU; tools such as SkyPilot key on it:
  docs/google-facts.md#tpu-api-errors);
- ``filter`` and ``orderBy``, on the list methods whose document declares them, are applied before paging.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

from tpuctl.sim import alpha_methods, discovery, transcoding
from tpuctl.sim.api_errors import ApiError, invalid_argument
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.exchange import SimRequest, SimResponse, first, json_response
from tpuctl.sim.listing_query import apply_query
from tpuctl.sim.wire import ZONE_RE, paginate

Dispatch = Callable[[SimEngine, SimRequest], SimResponse]

_LOCATION_RE = re.compile(r"^/[^/]+/projects/[^/]+/locations/([^/:]+)")
_V2_TYPE_PREFIX = "type.googleapis.com/google.cloud.tpu.v2."


def answer(engine: SimEngine, request: SimRequest, version: str, dispatch_v2: Dispatch) -> SimResponse:
    """The answer to one TPU API request of ``version`` (the path starts with ``/<version>/``)."""
    _check_location(engine, request)
    method = discovery.method_for(version, request.method, request.path)
    body = dict(request.body)
    if method is not None:
        transcoding.read_query(version, method.parameters, request.query)
    if method is not None and method.request is not None:
        body = transcoding.read_body(version, method.request, body)
        if version == "v2alpha1":
            body = _alpha_body_to_v2(method.request, body)
    own = None
    if version == "v2alpha1":
        own = alpha_methods.answer(engine, dataclasses.replace(request, body=body))
    path = "/v2/" + request.path[len(version) + 2 :]
    listing = _listing_query(request, method)
    query = dict(request.query)
    if listing is not None:
        for key in ("pageSize", "pageToken", "filter", "orderBy"):
            query.pop(key, None)
    if own is not None:
        response = json_response(own)
    else:
        response = dispatch_v2(engine, dataclasses.replace(request, path=path, body=body, query=query))
    if response.status != 200 or method is None or method.response is None:
        return response
    data = json.loads(response.body)
    if listing is not None:
        data = _filtered_page(data, listing)
    if version == "v2alpha1":
        data = _v2_answer_to_alpha(data)
    return json_response(transcoding.project(version, method.response, data))


def _check_location(engine: SimEngine, request: SimRequest) -> None:
    match = _LOCATION_RE.match(request.path)
    if match is None or match.group(1) == "-":
        return
    zone = match.group(1)
    # A malformed location stays the engine's 400 (check_zone); a well-formed one without TPUs is 403.
    if ZONE_RE.match(zone) and not engine.world.zones.get(zone):
        raise ApiError(403, "PERMISSION_DENIED", f"Location {zone} is not found or access is unauthorized.")


class _Listing:
    def __init__(self, filter_: str, order_by: str, page_size: int, page_token: str) -> None:
        self.filter = filter_
        self.order_by = order_by
        self.page_size = page_size
        self.page_token = page_token


def _listing_query(request: SimRequest, method: discovery.Method | None) -> _Listing | None:
    """The list query to apply here, when the method declares filter/orderBy and the request uses one."""
    if method is None or not ({"filter", "orderBy"} & set(method.parameters)):
        return None
    filter_, order_by = first(request.query, "filter"), first(request.query, "orderBy")
    if not filter_ and not order_by:
        return None
    raw = first(request.query, "pageSize", "0") or "0"
    try:
        size = int(raw)
    except ValueError:
        raise invalid_argument(f"Invalid value for field 'pageSize': {raw!r}.", "pageSize") from None
    return _Listing(filter_, order_by, size, first(request.query, "pageToken"))


def _filtered_page(data: dict[str, Any], listing: _Listing) -> dict[str, Any]:
    key = next(k for k, v in data.items() if isinstance(v, list) and k != "unreachable")
    items = apply_query(data[key], listing.filter, listing.order_by)
    page, token = paginate(items, listing.page_size, listing.page_token)
    out = {k: v for k, v in data.items() if k != "nextPageToken"}
    out[key] = page
    if token:
        out["nextPageToken"] = token
    return out


# --- v2alpha1 in v2 terms ------------------------------------------------------------------------


def _alpha_body_to_v2(schema_name: str, body: dict[str, Any]) -> dict[str, Any]:
    if schema_name != "QueuedResource":
        return body
    out = dict(body)
    if "bestEffort" in out:
        # v2 has no best-effort tier; it draws on preemptible capacity and quota, like spot. Kept in the
        # stored spec so a v2alpha1 read shows it (a v2 read projects it away).
        out["spot"] = {}
    tpu = out.get("tpu")
    if isinstance(tpu, dict):
        specs = []
        for spec in tpu.get("nodeSpec", []):
            spec = dict(spec)
            if "multiNodeParams" in spec:
                params = spec.pop("multiNodeParams")
                spec["multisliceParams"] = {
                    k: params[k] for k in ("nodeCount", "nodeIdPrefix") if k in params
                }
            specs.append(spec)
        out["tpu"] = {**tpu, "nodeSpec": specs}
    return out


def _v2_answer_to_alpha(value: Any) -> Any:
    if isinstance(value, list):
        return [_v2_answer_to_alpha(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "@type" and isinstance(item, str) and item.startswith(_V2_TYPE_PREFIX):
            out[key] = "type.googleapis.com/google.cloud.tpu.v2alpha1." + item[len(_V2_TYPE_PREFIX) :]
        elif key == "apiVersion" and item in ("V2", "v2"):
            out[key] = "V2_ALPHA1" if item == "V2" else "v2alpha1"
        elif key == "multisliceParams":
            out["multiNodeParams"] = item
        elif key == "spot" and "bestEffort" in value:
            continue  # the tier the request chose was bestEffort (spot is how v2 holds it)
        else:
            out[key] = _v2_answer_to_alpha(item)
    return out
