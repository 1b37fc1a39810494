"""Compute Engine's route table, ``/compute/v1/projects/{project}/...``, as google-cloud-compute's REST
transport sends it (JSON bodies, enums as strings, int64 as strings; listManagedInstances is a POST)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tpuctl.sim.compute.errors import ComputeError, invalid_field
from tpuctl.sim.compute.listing import ListQuery
from tpuctl.sim.exchange import SimRequest, first

Answer = Mapping[str, Any]
#: (engine, request, path groups) -> answer; the engine is typed loosely to keep this module light.
Handler = Callable[[Any, SimRequest, tuple[str, ...]], Answer]

_S = r"([^/]+)"
_P = rf"/compute/v1/projects/{_S}"
_Z = _P + rf"/zones/{_S}"
_R = _P + rf"/regions/{_S}"
_INST = _Z + "/instances"
_MIG = _Z + rf"/instanceGroupManagers/{_S}"


def _page(request: SimRequest) -> tuple[int, str]:
    raw = first(request.query, "maxResults", "0") or "0"
    if not raw.isdigit():
        raise invalid_field("maxResults", raw, "Must be an integer.")
    return int(raw), first(request.query, "pageToken")


def _c(engine: Any) -> Any:
    return engine.compute


def _op(scope: str) -> Handler:
    def get(e: Any, r: SimRequest, a: tuple[str, ...]) -> Answer:
        project, *rest = a
        where, name = (rest[0], rest[1]) if scope != "global" else ("", rest[0])
        return _c(e).get_operation(project, scope, where, name)  # type: ignore[no-any-return]

    return get


def _ops_list(scope: str) -> Handler:
    def handler(e: Any, r: SimRequest, a: tuple[str, ...]) -> Answer:
        where = a[1] if scope != "global" else ""
        return _c(e).list_operations(a[0], scope, where, first(r.query, "filter"), *_page(r))  # type: ignore[no-any-return]

    return handler


def _logged_delete(
    e: Any, r: SimRequest, a: tuple[str, ...], resource: str, delete: Callable[..., Answer]
) -> Answer:
    """A slice's delete, with who asked in the simulator's deletion log (``tpuctl.sim.deletions``)."""
    from tpuctl.sim import deletions

    project, zone, name = a
    return deletions.delete_answer(
        e, r, lambda: delete(*a), project=project, zone=zone, name=name, resource=resource, compute=True
    )


ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", _P, lambda e, r, a: _c(e).get_project(a[0])),
    ("GET", _P + "/zones", lambda e, r, a: _c(e).list_zones(a[0], *_page(r))),
    ("GET", _Z, lambda e, r, a: _c(e).get_zone(*a)),
    ("GET", _Z + "/machineTypes", lambda e, r, a: _c(e).list_machine_types(a[0], a[1], *_page(r))),
    ("GET", _Z + rf"/machineTypes/{_S}", lambda e, r, a: _c(e).get_machine_type(*a)),
    ("POST", _INST, lambda e, r, a: _c(e).instances.insert(a[0], a[1], dict(r.body))),
    ("GET", _INST, lambda e, r, a: _c(e).instances.list(a[0], a[1], *_page(r))),
    (
        "GET",
        _P + "/aggregated/instances",
        lambda e, r, a: _c(e).instances.aggregated_list(a[0], ListQuery.of(r.query)),
    ),
    (
        "GET",
        _P + "/aggregated/instanceGroupManagers",
        lambda e, r, a: _c(e).groups.aggregated_list_migs(a[0], ListQuery.of(r.query)),
    ),
    ("GET", _INST + rf"/{_S}", lambda e, r, a: _c(e).instances.get(*a)),
    (
        "DELETE",
        _INST + rf"/{_S}",
        lambda e, r, a: _logged_delete(e, r, a, "instance", _c(e).instances.delete),
    ),
    (
        "GET",
        _INST + rf"/{_S}/getGuestAttributes",
        lambda e, r, a: _c(e).instances.get_guest_attributes(
            *a, first(r.query, "queryPath"), first(r.query, "variableKey")
        ),
    ),
    ("GET", _Z + "/operations", _ops_list("zones")),
    ("GET", _Z + rf"/operations/{_S}", _op("zones")),
    ("POST", _Z + rf"/operations/{_S}/wait", lambda e, r, a: _c(e).wait_operation(a[0], "zones", a[1], a[2])),
    ("GET", _R + "/operations", _ops_list("regions")),
    ("GET", _R + rf"/operations/{_S}", _op("regions")),
    ("GET", _P + "/global/operations", _ops_list("global")),
    ("GET", _P + rf"/global/operations/{_S}", _op("global")),
    ("POST", _R + "/resourcePolicies", lambda e, r, a: _c(e).groups.insert_policy(a[0], a[1], dict(r.body))),
    ("GET", _R + rf"/resourcePolicies/{_S}", lambda e, r, a: _c(e).groups.get_policy(*a)),
    ("DELETE", _R + rf"/resourcePolicies/{_S}", lambda e, r, a: _c(e).groups.delete_policy(*a)),
    (
        "POST",
        _P + "/global/instanceTemplates",
        lambda e, r, a: _c(e).groups.insert_template(a[0], dict(r.body)),
    ),
    ("GET", _P + rf"/global/instanceTemplates/{_S}", lambda e, r, a: _c(e).groups.get_template(*a)),
    ("DELETE", _P + rf"/global/instanceTemplates/{_S}", lambda e, r, a: _c(e).groups.delete_template(*a)),
    (
        "POST",
        _Z + "/instanceGroupManagers",
        lambda e, r, a: _c(e).groups.insert_mig(a[0], a[1], dict(r.body)),
    ),
    ("GET", _Z + "/instanceGroupManagers", lambda e, r, a: _c(e).groups.list_migs(a[0], a[1], *_page(r))),
    ("GET", _MIG, lambda e, r, a: _c(e).groups.get_mig(*a)),
    (
        "DELETE",
        _MIG,
        lambda e, r, a: _logged_delete(e, r, a, "instance group manager", _c(e).groups.delete_mig),
    ),
    ("POST", _MIG + "/resize", lambda e, r, a: _c(e).groups.resize(*a, first(r.query, "size"))),
    (
        "POST",
        _MIG + "/listManagedInstances",
        lambda e, r, a: _c(e).groups.list_managed_instances(*a, *_page(r)),
    ),
    ("POST", _MIG + "/resizeRequests", lambda e, r, a: _c(e).groups.insert_resize_request(*a)),
)


def unrouted(request: SimRequest, path_known: bool) -> ComputeError:
    if path_known:
        return ComputeError(
            405, f"Method {request.method} is not allowed on {request.path}.", "methodNotAllowed"
        )
    return ComputeError(404, f"The requested URL {request.path} was not found on this server.", "notFound")
