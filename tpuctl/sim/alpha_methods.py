"""The methods only ``v2alpha1``'s discovery document lists: reservations, maintenance info, manual and
simulated maintenance. Answered here in v2 terms; the frontend turns the answer into v2alpha1's.

Nothing in the simulated world schedules maintenance, so a queued resource's maintenance info lists no
node, and ``performMaintenance`` refuses with FAILED_PRECONDITION (no pending maintenance to start;
unconfirmed wording, the stricter choice). ``simulateMaintenanceEvent`` completes at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tpuctl.sim.api_errors import failed_precondition
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.exchange import SimRequest, first

Answer = Mapping[str, Any]
_LOC = r"/v2alpha1/projects/([^/:]+)/locations/([^/:]+)"
_NODE = _LOC + r"/nodes/([^/:]+)"
_QR = _LOC + r"/queuedResources/([^/:]+)"


def _page(request: SimRequest) -> tuple[int, str]:
    raw = first(request.query, "pageSize", "0") or "0"
    return (int(raw) if raw.lstrip("-").isdigit() else 0), first(request.query, "pageToken")


def _perform_maintenance(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    node = engine.get_node(*args)
    raise failed_precondition(f"Node '{node['name']}' has no pending maintenance to perform.")


def _perform_qr_maintenance(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    qr = engine.get_queued_resource(*args)
    raise failed_precondition(f"Queued resource '{qr['name']}' has no node with pending maintenance.")


def _maintenance_info(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    engine.get_queued_resource(*args)  # NOT_FOUND when there is none
    return {}


def _simulate(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    workers = [str(w) for w in request.body.get("workerIds", [])]
    project, zone, node_id = args
    return engine.simulate_maintenance(project, zone, node_id, workers)


_ROUTES: tuple[tuple[str, str, Callable[[SimEngine, SimRequest, tuple[str, ...]], Answer]], ...] = (
    ("GET", _LOC + "/reservations", lambda e, r, a: e.list_reservations(a[0], a[1], *_page(r))),
    ("POST", _NODE + ":performMaintenance", _perform_maintenance),
    ("POST", _NODE + ":simulateMaintenanceEvent", _simulate),
    ("GET", _QR + ":getMaintenanceInfo", _maintenance_info),
    ("POST", _QR + ":performMaintenanceQueuedResource", _perform_qr_maintenance),
)


def answer(engine: SimEngine, request: SimRequest) -> Answer | None:
    """The answer when ``request`` is one of v2alpha1's own methods, else None."""
    for method, pattern, handler in _ROUTES:
        match = re.fullmatch(pattern, request.path)
        if match is not None and method == request.method:
            return handler(engine, request, match.groups())
    return None
