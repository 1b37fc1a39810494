"""What the simulator answers, as a route table: ``dispatch(engine, request)`` for every surface.

Surfaces (all JSON unless noted):

- ``/v2/...`` and ``/v2alpha1/...``: the Cloud TPU API as Google serves it, behind Google's frontend
  (``tpuctl.sim.frontend``: transcoding, version mapping, location check, filter/orderBy). google-cloud-tpu's
  REST transport appends ``?$alt=json;enum-encoding=int``; we answer enum NAMES, as Google's JSON does,
  which the client parses too.
- ``/$discovery/rest?version=v2|v2alpha1``: Google's discovery documents (``tpuctl.sim.discovery``),
  pointing at this server.
- ``/v1/projects/{p}/locations/global/services/tpu.googleapis.com/quotaInfos[/{id}]``: Cloud Quotas.
- ``/v1/users/...``: OS Login (importSshPublicKey, sshPublicKeys.patch, loginProfile;
  ``tpuctl.sim.engine.oslogin``); ``/tokeninfo``: OAuth's tokeninfo (who the caller is).
- ``/oauth2/v1/certs``, ``/oauth2/v3/certs``, ``/iap/verify/public_key``, ``/token``: the identity
  issuer (``tpuctl.sim.issuer``): its keys as Google publishes them, and the OAuth token endpoint.
- ``/v1/iam:troubleshoot``: Policy Troubleshooter (who may do what, another account included).
- ``/sim/v1/...``: the admin API (status, reset, preempt, maintenance, stockout, metadata, endpoints,
  faults); see ``SimAdminClient``.

Every API surface authenticates its callers and checks each route's permission as Google does
(``tpuctl.sim.iam``); the discovery documents, tokeninfo and the admin API take anyone.

Each simulated host's own metadata server and sshd are not here: they listen on the host's address
(``tpuctl.sim.vms``).

Transport faults (latency, transient 5xx/429, dropped connections) are the HTTP server's, not here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from tpuctl.cloud.base import HOSTNAME_GUEST_ATTRIBUTE
from tpuctl.errors import ConfigError
from tpuctl.sim import api_errors, deletions, discovery, frontend, iam, issuer
from tpuctl.sim.api_errors import ApiError, invalid_argument
from tpuctl.sim.compute import routes as compute_routes
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.exchange import (
    SimRequest,
    SimResponse,
    error_response,
    first,
    json_response,
    parse_body,
)
from tpuctl.sim.iam import Guard
from tpuctl.sim.wire import paginate
from tpuctl.sim.world import world_from_data

__all__ = ["SimRequest", "SimResponse", "dispatch", "error_response", "internal_error", "parse_body"]

Answer = Mapping[str, Any] | SimResponse
#: A route's handler: the engine, the request and the path pattern's groups.
Handler = Callable[[SimEngine, SimRequest, tuple[str, ...]], Answer]

#: A route that answers every method (the metadata server does not look at it).
ANY = "*"


class Route(NamedTuple):
    method: str
    #: Matched against the whole path. Kept as text: ``re`` compiles it on first use and caches it, so
    #: importing this module (every CLI command starts a simulator) compiles nothing.
    pattern: str
    handler: Handler
    #: The IAM permission the caller needs on the project (the pattern's first group); None: none beyond
    #: being signed in.
    permission: str | None = None


class Surface(NamedTuple):
    """The routes under one path prefix and what it answers when none fits (``path_known``: some route's
    pattern matched the path, for another method). ``guard``: how the API authenticates its callers and
    checks their permissions (None: it does not, as the discovery documents and the admin API)."""

    prefix: str
    routes: tuple[Route, ...]
    unrouted: Callable[[SimRequest, bool], SimResponse]
    guard: Guard | None = None


def route(method: str, pattern: str, handler: Handler, permission: str | None = None) -> Route:
    return Route(method, pattern, handler, permission)


def dispatch(engine: SimEngine, request: SimRequest) -> SimResponse:
    """The simulator's answer to one request; errors come back in Google's JSON shape."""
    try:
        return _dispatch(engine, request)
    except ApiError as exc:
        return error_response(exc)
    except Exception as exc:
        # A bug in the simulator: answer as Google's frontend would, never leave the client hanging.
        return error_response(internal_error(exc))


def internal_error(exc: Exception) -> ApiError:
    return ApiError(500, "INTERNAL", f"Internal error in the simulator: {exc!r}")


def _dispatch(engine: SimEngine, request: SimRequest) -> SimResponse:
    surface = next((s for s in SURFACES if request.path.startswith(s.prefix)), None)
    if surface is None:
        raise _url_not_found(request)
    if surface.guard is not None:
        # Authentication comes first, as at Google's front end: even a wrong URL answers 401 without one.
        surface.guard.caller(engine.world, request.headers)
    return _answer_from(surface.routes, surface.unrouted, engine, request, surface.guard)


def _answer_from(
    routes: tuple[Route, ...],
    unrouted: Callable[[SimRequest, bool], SimResponse],
    engine: SimEngine,
    request: SimRequest,
    guard: Guard | None = None,
) -> SimResponse:
    path_known = False
    for entry in routes:
        match = re.fullmatch(entry.pattern, request.path)
        if match is None:
            continue
        if entry.method in (ANY, request.method):
            if guard is not None and entry.permission is not None:
                guard.check(engine.world, request.headers, match.group(1), entry.permission, request.path)
            answer = entry.handler(engine, request, match.groups())
            return answer if isinstance(answer, SimResponse) else json_response(answer)
        path_known = True
    return unrouted(request, path_known)


# --- shared pieces -------------------------------------------------------------------------------


def _url_not_found(request: SimRequest) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"The requested URL {request.path} was not found on this server.")


def _not_allowed(request: SimRequest) -> ApiError:
    return ApiError(405, "UNIMPLEMENTED", f"Method {request.method} is not allowed on {request.path}.")


def _page(request: SimRequest) -> tuple[int, str]:
    raw = first(request.query, "pageSize", "0") or "0"
    try:
        size = int(raw)
    except ValueError:
        raise invalid_argument(f"Invalid value for field 'pageSize': {raw!r}.", "pageSize") from None
    return size, first(request.query, "pageToken")


def _flag(request: SimRequest, key: str) -> bool:
    return first(request.query, key).lower() in ("true", "1")


def _required(body: Mapping[str, Any], key: str) -> Any:
    value = body.get(key)
    if value is None or value == "":
        raise invalid_argument(f"Field '{key}' is required.", key)
    return value


def _unimplemented(message: str) -> Handler:
    def handler(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
        raise ApiError(501, "UNIMPLEMENTED", message)

    return handler


# --- the TPU API v2 ------------------------------------------------------------------------------

_SEGMENT = r"([^/:]+)"
_LOC = rf"/v2/projects/{_SEGMENT}/locations/{_SEGMENT}"
_NODE = _LOC + rf"/nodes/{_SEGMENT}"
_QR = _LOC + rf"/queuedResources/{_SEGMENT}"
_OP = _LOC + rf"/operations/{_SEGMENT}"


def _service_identity(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    project = args[0]
    return {
        "identity": {
            "email": f"service-{project}@cloud-tpu.iam.gserviceaccount.com",
            "uid": "100000000000000000001",
        }
    }


def _guest_attributes(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    """Each asked worker's guest attributes under ``queryPath``, one entry per asked worker in order
    (GuestAttributes names no worker: discovery document). A simulated host publishes what a TPU VM
    does: its SSH host keys under ``hostkeys/`` (namespace ``hostkeys``, key the key type, value the
    base64 key; GoogleCloudPlatform/guest-agent, google_guest_agent/instance_setup.go writes them for
    ``gcloud compute ssh``'s host key check), and its instance name under the key ``hostname``, which
    gcloud's ``tpu-vm ssh --tunnel-through-iap`` reads (docs/google-facts.md#iap-tcp-forwarding). A worker
    whose VM has no disk yet (not booted) answers no items."""
    node = engine.get_node(*args)
    keys = engine.host_keys(*args)
    names = engine.instance_names(*args)
    workers = [str(i) for i in range(len(node.get("networkEndpoints", [])) or 1)]
    asked = [str(w) for w in request.body.get("workerIds", [])] or workers
    for worker in asked:
        if worker not in workers:
            raise invalid_argument(
                f"Invalid value for field 'worker_ids': worker {worker} does not exist.", "worker_ids"
            )
    query_path = str(request.body.get("queryPath", ""))
    return {
        "guestAttributes": [
            {
                "queryPath": query_path,
                "queryValue": {
                    "items": _host_key_items(keys, int(w), query_path)
                    + _hostname_items(keys, names, int(w), query_path)
                },
            }
            for w in asked
        ]
    }


def _host_key_items(keys: list[str | None], worker: int, query_path: str) -> list[dict[str, str]]:
    line = keys[worker] if worker < len(keys) else None
    if line is None or not ("hostkeys/".startswith(query_path) or query_path.startswith("hostkeys/")):
        return []
    key_type, blob = line.split()[:2]
    item = {"namespace": "hostkeys", "key": key_type, "value": blob}
    wanted = query_path.removeprefix("hostkeys/").strip("/")
    return [item] if wanted in ("", key_type) else []


#: The namespace of a TPU VM's ``hostname`` guest attribute. Unconfirmed: gcloud matches the key in any
#: namespace and Google documents none, so the simulator picks one of its own; tpuctl, like gcloud, asks
#: with no query path and matches the key alone, so no client here depends on this guess.
_HOSTNAME_NAMESPACE = "tpu"


def _hostname_items(
    keys: list[str | None], names: list[str], worker: int, query_path: str
) -> list[dict[str, str]]:
    """The worker's instance name, published when its host key is (both once its VM has booted)."""
    if worker >= len(keys) or keys[worker] is None:
        return []
    namespace, _, key = query_path.partition("/")
    if namespace not in ("", _HOSTNAME_NAMESPACE) or key not in ("", HOSTNAME_GUEST_ATTRIBUTE):
        return []
    return [{"namespace": _HOSTNAME_NAMESPACE, "key": HOSTNAME_GUEST_ATTRIBUTE, "value": names[worker]}]


def _create_queued_resource(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    project, zone = args
    return engine.create_queued_resource(
        project,
        zone,
        first(request.query, "queuedResourceId"),
        dict(request.body),
        first(request.query, "requestId"),
    )


def _delete_queued_resource(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    """queuedResources.delete, with who asked in the simulator's deletion log (``tpuctl.sim.deletions``):
    with ``force`` it deletes the queued resource's slices too."""
    project, zone, qr = args
    return deletions.delete_answer(
        engine,
        request,
        lambda: engine.delete_queued_resource(
            project, zone, qr, force=_flag(request, "force"), request_id=first(request.query, "requestId")
        ),
        project=project,
        zone=zone,
        name=qr,
        resource="queued resource",
    )


def _tpu_unrouted(request: SimRequest, path_known: bool) -> SimResponse:
    raise _not_allowed(request) if path_known else _url_not_found(request)


def _route_v2(engine: SimEngine, request: SimRequest) -> SimResponse:
    """The v2 route table's answer (the engine's own surface, behind the frontend)."""
    return _answer_from(TPU_ROUTES, _tpu_unrouted, engine, request, iam.TPU_API)


def _versioned(version: str) -> Handler:
    def handler(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
        return frontend.answer(engine, request, version, _route_v2)

    return handler


def _discovery_document(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    # /$discovery/rest?version=V (the API's own host) or /discovery/v1/apis/tpu/V/rest (the discovery
    # service's form, google-api-python-client's fallback).
    version = args[0] if args else first(request.query, "version")
    if version not in discovery.VERSIONS:
        raise ApiError(404, "NOT_FOUND", f"Discovery document for API tpu version {version!r} not found.")
    host = request.headers.get("host", "127.0.0.1")
    return discovery.served_document(version, f"http://{host}/")


def _delete_node(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    """nodes.delete, with who asked in the simulator's deletion log (``tpuctl.sim.deletions``)."""
    project, zone, name = args
    return deletions.delete_answer(
        engine,
        request,
        lambda: engine.delete_node(project, zone, name),
        project=project,
        zone=zone,
        name=name,
        resource="tpu node",
    )


TPU_ROUTES = (
    route(
        "GET",
        rf"/v2/projects/{_SEGMENT}/locations",
        lambda e, r, a: e.list_locations(a[0], *_page(r)),
        "tpu.locations.list",
    ),
    route("GET", _LOC, lambda e, r, a: e.get_location(*a), "tpu.locations.get"),
    route(
        "POST", _LOC + ":generateServiceIdentity", _service_identity, "tpu.locations.generateServiceIdentity"
    ),
    route("GET", _LOC + "/nodes", lambda e, r, a: e.list_nodes(a[0], a[1], *_page(r)), "tpu.nodes.list"),
    route(
        "POST",
        _LOC + "/nodes",
        lambda e, r, a: e.create_node(a[0], a[1], first(r.query, "nodeId"), dict(r.body)),
        "tpu.nodes.create",
    ),
    route("GET", _NODE, lambda e, r, a: e.get_node(*a), "tpu.nodes.get"),
    route("DELETE", _NODE, _delete_node, "tpu.nodes.delete"),
    route(
        "PATCH",
        _NODE,
        lambda e, r, a: e.update_node(a[0], a[1], a[2], dict(r.body), first(r.query, "updateMask")),
        "tpu.nodes.update",
    ),
    route("POST", _NODE + ":stop", lambda e, r, a: e.stop_node(*a), "tpu.nodes.stop"),
    route("POST", _NODE + ":start", lambda e, r, a: e.start_node(*a), "tpu.nodes.start"),
    route("POST", _NODE + ":getGuestAttributes", _guest_attributes, "tpu.nodes.get"),
    route(
        "GET",
        _LOC + "/queuedResources",
        lambda e, r, a: e.list_queued_resources(a[0], a[1], *_page(r)),
        "tpu.queuedResources.list",
    ),
    route("POST", _LOC + "/queuedResources", _create_queued_resource, "tpu.queuedResources.create"),
    route("GET", _QR, lambda e, r, a: e.get_queued_resource(*a), "tpu.queuedResources.get"),
    route("DELETE", _QR, _delete_queued_resource, "tpu.queuedResources.delete"),
    route("POST", _QR + ":reset", lambda e, r, a: e.reset_queued_resource(*a), "tpu.queuedResources.reset"),
    route(
        "GET",
        _LOC + "/operations",
        lambda e, r, a: e.list_operations(a[0], a[1], *_page(r)),
        "tpu.operations.list",
    ),
    route("GET", _OP, lambda e, r, a: e.get_operation(*a), "tpu.operations.get"),
    route("DELETE", _OP, lambda e, r, a: e.delete_operation(*a), "tpu.operations.delete"),
    route("POST", _OP + ":cancel", _unimplemented("Cancelling TPU operations is not supported.")),
    route(
        "GET",
        _LOC + "/acceleratorTypes",
        lambda e, r, a: e.list_accelerator_types(a[0], a[1], *_page(r)),
        "tpu.acceleratortypes.list",
    ),
    route(
        "GET",
        _LOC + rf"/acceleratorTypes/{_SEGMENT}",
        lambda e, r, a: e.get_accelerator_type(*a),
        "tpu.acceleratortypes.get",
    ),
    route(
        "GET",
        _LOC + "/runtimeVersions",
        lambda e, r, a: e.list_runtime_versions(a[0], a[1], *_page(r)),
        "tpu.runtimeversions.list",
    ),
    route(
        "GET",
        _LOC + rf"/runtimeVersions/{_SEGMENT}",
        lambda e, r, a: e.get_runtime_version(*a),
        "tpu.runtimeversions.get",
    ),
)


# --- Cloud Quotas --------------------------------------------------------------------------------

_QUOTA_INFOS = rf"/v1/projects/{_SEGMENT}/locations/global/services/{_SEGMENT}/quotaInfos"
_TPU_SERVICE = "tpu.googleapis.com"


_COMPUTE_SERVICE = "compute.googleapis.com"


def _service_quota_infos(engine: SimEngine, project: str, service: str) -> list[dict[str, Any]]:
    """The quotas of ``service``: the TPU API's, or Compute Engine's TPU quotas (disjoint pools)."""
    if service == _TPU_SERVICE:
        return engine.quota_infos(project)
    if service == _COMPUTE_SERVICE:
        return engine.compute.quota_infos(project)
    return []


def _list_quota_infos(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    project, service = args
    infos = _service_quota_infos(engine, project, service)
    page, token = paginate(infos, *_page(request))
    out: dict[str, Any] = {"quotaInfos": page}
    if token:
        out["nextPageToken"] = token
    return out


def _get_quota_info(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    project, service, quota_id = args
    for info in _service_quota_infos(engine, project, service):
        if info["quotaId"] == quota_id:
            return info
    raise api_errors.not_found(
        f"projects/{project}/locations/global/services/{service}/quotaInfos/{quota_id}"
    )


def _quotas_unrouted(request: SimRequest, path_known: bool) -> SimResponse:
    # The surface is read-only: any other method is refused whatever the path.
    raise _not_allowed(request) if request.method != "GET" else _url_not_found(request)


QUOTA_ROUTES = (
    route("GET", _QUOTA_INFOS, _list_quota_infos, "cloudquotas.quotas.get"),
    route("GET", _QUOTA_INFOS + rf"/{_SEGMENT}", _get_quota_info, "cloudquotas.quotas.get"),
)


# --- OS Login (oslogin v1) ----------------------------------------------------------------------


def _import_ssh_public_key(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    _required(request.body, "key")
    caller = iam.OS_LOGIN.caller(engine.world, request.headers)
    return engine.import_ssh_public_key(
        args[0], request.body, first(request.query, "projectId") or None, caller=caller
    )


def _update_ssh_public_key(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    caller = iam.OS_LOGIN.caller(engine.world, request.headers)
    return engine.update_ssh_public_key(
        args[0], args[1], request.body, first(request.query, "updateMask"), caller=caller
    )


def _login_profile(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    caller = iam.OS_LOGIN.caller(engine.world, request.headers)
    return engine.login_profile(args[0], first(request.query, "projectId") or None, caller=caller)


OSLOGIN_ROUTES = (
    route("POST", r"/v1/users/([^/:]+):importSshPublicKey", _import_ssh_public_key),
    route("PATCH", r"/v1/users/([^/:]+)/sshPublicKeys/([^/:]+)", _update_ssh_public_key),
    route("GET", r"/v1/users/([^/:]+)/loginProfile", _login_profile),
)

# --- OAuth tokeninfo ------------------------------------------------------------------------------


def _tokeninfo(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    """oauth2.googleapis.com/tokeninfo: the account the ``access_token`` parameter (or the bearer
    token) was issued to; a token the simulator did not issue is OAuth's 400 invalid_token."""
    token = first(request.query, "access_token") or iam.bearer_token(request.headers)
    email = iam.account_of(engine.world, token)
    if email is None:
        return json_response({"error": "invalid_token", "error_description": "Invalid Value"}, 400)
    return engine.tokeninfo(email)


TOKENINFO_ROUTES = (route("GET", r"/tokeninfo", _tokeninfo),)


IDENTITY_ROUTES = (
    route("GET", r"/oauth2/v1/certs", issuer.certs_v1),
    route("GET", r"/oauth2/v3/certs", issuer.certs_v3),
    route("GET", r"/iap/verify/public_key", issuer.iap_public_keys),
    route("POST", r"/token", issuer.token),
)


# --- Policy Troubleshooter ------------------------------------------------------------------------


def _troubleshoot(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    caller = iam.POLICY_TROUBLESHOOTER.caller(engine.world, request.headers)
    return iam.troubleshoot(engine.world, caller, request.body)


TROUBLESHOOTER_ROUTES = (route("POST", r"/v1/iam:troubleshoot", _troubleshoot),)


# --- the admin API -------------------------------------------------------------------------------


def _admin(name: str) -> str:
    # Trailing slashes are forgiven.
    return rf"/sim/v1/{name}/*"


def _reset(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    new_world = None
    if isinstance(request.body.get("world"), dict):
        try:
            new_world = world_from_data(request.body["world"], "POST /sim/v1/reset")
        except ConfigError as exc:
            raise invalid_argument(str(exc), exc.field) from None
    return {"world": engine.reset(new_world).summary()}


def _preempt(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    body = request.body
    zone, node = _required(body, "zone"), _required(body, "node")
    return engine.preempt(zone, node, notice=bool(body.get("notice", True)), project=body.get("project"))


def _preempt_compute(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    body = request.body
    zone, name = _required(body, "zone"), _required(body, "name")
    return engine.compute.preempt(
        zone, name, notice=bool(body.get("notice", True)), project=body.get("project")
    )


def _maintain(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    body = request.body
    return engine.maintain(_required(body, "zone"), _required(body, "node"), project=body.get("project"))


def _stockout(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    zone = _required(request.body, "zone")
    return {"zone": zone, "stockout": engine.set_stockout(zone, clear=bool(request.body.get("clear", False)))}


def _metadata(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    """What a host's metadata server answers for ``key`` (an operator's view, no long-poll)."""
    query = request.query
    value = engine.metadata_value(
        first(query, "zone"),
        first(query, "node"),
        int(first(query, "worker") or 0),
        first(query, "key"),
        project=first(query, "project") or None,
    )
    if value is None:
        raise ApiError(404, "NOT_FOUND", f"No metadata key {first(query, 'key')!r}.")
    return {"value": value}


def _set_endpoints(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    body = request.body
    return engine.set_endpoints(
        _required(body, "zone"), _required(body, "node"), body.get("endpoints"), project=body.get("project")
    )


def _set_faults(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    try:
        faults = engine.set_faults(
            transient_error_rate=request.body.get("transient_error_rate"),
            ambiguous_error_rate=request.body.get("ambiguous_error_rate"),
        )
    except ValueError as exc:
        raise invalid_argument(f"Invalid fault rates: {exc}") from None
    return faults.model_dump()


def _advance(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    engine.advance()
    return {"now": engine.clock()}


def _credentials(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> Answer:
    """A new credentials file for simulated account ``email`` (``tpuctl.sim.issuer``), naming this
    simulator as the caller reached it (its Host header) as the token endpoint."""
    email = str(_required(request.body, "email"))
    try:
        return issuer.issuer_of(engine).credentials_file(email, f"http://{request.headers.get('host', '')}")
    except ValueError as exc:
        raise invalid_argument(str(exc), "email") from None


def _admin_unrouted(request: SimRequest, path_known: bool) -> SimResponse:
    raise ApiError(404, "NOT_FOUND", f"No admin route {request.method} {request.path}.")


ADMIN_ROUTES = (
    route("GET", _admin("status"), lambda e, r, a: e.status()),
    route("GET", _admin("mutations"), lambda e, r, a: {"mutations": list(e.mutations)}),
    route("GET", _admin("deletions"), lambda e, r, a: deletions.log(e)),
    route("GET", _admin("world"), lambda e, r, a: e.world.model_dump(mode="json")),
    route("POST", _admin("reset"), _reset),
    route("POST", _admin("preempt"), _preempt),
    route("POST", _admin("compute/preempt"), _preempt_compute),
    route("POST", _admin("maintenance"), _maintain),
    route("POST", _admin("stockout"), _stockout),
    route("GET", _admin("metadata"), _metadata),
    route("POST", _admin("endpoints"), _set_endpoints),
    route("PUT", _admin("endpoints"), _set_endpoints),
    route("GET", _admin("faults"), lambda e, r, a: e.faults().model_dump()),
    route("POST", _admin("faults"), _set_faults),
    route("POST", _admin("advance"), _advance),
    route("POST", _admin("credentials"), _credentials),
    route("POST", _admin("issuer/rotate"), lambda e, r, a: {"kid": issuer.issuer_of(e).rotate()}),
)


FRONT_ROUTES = tuple(route(ANY, rf"/{v}/.*", _versioned(v)) for v in discovery.VERSIONS)
DISCOVERY_ROUTES = (
    route("GET", r"/\$discovery/rest", _discovery_document),
    route("GET", r"/discovery/v1/apis/tpu/([^/]+)/rest", _discovery_document),
)

COMPUTE_ROUTES = tuple(route(m, p, h, permission) for m, p, h, permission in compute_routes.ROUTES)


def _compute_unrouted(request: SimRequest, path_known: bool) -> SimResponse:
    raise compute_routes.unrouted(request, path_known)


SURFACES = (
    Surface("/compute/v1/", COMPUTE_ROUTES, _compute_unrouted, iam.COMPUTE),
    Surface("/v2/", FRONT_ROUTES, _tpu_unrouted, iam.TPU_API),
    Surface("/v2alpha1/", FRONT_ROUTES, _tpu_unrouted, iam.TPU_API),
    Surface("/$discovery/", DISCOVERY_ROUTES, _tpu_unrouted),
    Surface("/discovery/", DISCOVERY_ROUTES, _tpu_unrouted),
    Surface("/v1/users/", OSLOGIN_ROUTES, _tpu_unrouted, iam.OS_LOGIN),
    Surface("/v1/iam:troubleshoot", TROUBLESHOOTER_ROUTES, _tpu_unrouted, iam.POLICY_TROUBLESHOOTER),
    Surface("/tokeninfo", TOKENINFO_ROUTES, _tpu_unrouted),
    # The issuer's documents and token endpoint take anyone, as Google's (after /tokeninfo: a prefix).
    Surface("/oauth2/", IDENTITY_ROUTES, _tpu_unrouted),
    Surface("/iap/", IDENTITY_ROUTES, _tpu_unrouted),
    Surface("/token", IDENTITY_ROUTES, _tpu_unrouted),
    Surface("/v1/", QUOTA_ROUTES, _quotas_unrouted, iam.CLOUD_QUOTAS),
    Surface("/sim/v1/", ADMIN_ROUTES, _admin_unrouted),
)
