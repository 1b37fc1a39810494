"""``TpuApiCloud``: the one ``TpuCloud`` implementation, over google-cloud-tpu's ``tpu_v2.TpuClient`` (REST).

The same code talks to Google (https://tpu.googleapis.com, ADC credentials) and to the simulator
(http://127.0.0.1:PORT, the simulated Application Default Credentials, no proxy): the backend that
builds the client decides the endpoint and its ``CloudConfig`` (``config.py``); the client never asks
which backend it serves.

Facts about the client this module relies on (google-cloud-tpu 1.28.0, checked by the tests):

* The REST transport sends ``$alt=json;enum-encoding=int``: enums in request bodies are integers
  (``"type": 9`` for V5LITE_POD); responses may use names or numbers, the parser takes both.
* Its methods have NO default timeout and NO default retry. We pass ``timeout=request_timeout_s`` to every
  call (else a dead server hangs us forever) and retry with our own tenacity policies (``retry.py``).
* An ``http://`` scheme in ``api_endpoint`` is kept (google-cloud-tpu's ``_BaseTpuRestTransport`` keeps
  a scheme given in the host), so the simulator needs no custom transport.
* Transport errors are ``requests`` exceptions (the transport is google-auth's ``AuthorizedSession``),
  HTTP errors are ``google.api_core.exceptions`` with the JSON error body still attached; both are
  translated in ``translate.py``.
* api_core's LRO future (``operation.result()``) polls slowly with its own retry; we poll
  ``operations.get`` ourselves with a bounded, growing interval and report progress on each poll.

``google.cloud.tpu_v2`` costs ~0.6 s to import, so it (and protobuf) is imported only inside the methods
that need it; constructing a ``TpuApiCloud`` imports nothing heavy.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from tpuctl.catalog import CapacityType, region_of_zone
from tpuctl.cloud.base import (
    CLOUD_PLATFORM_SCOPE,
    HOSTNAME_GUEST_ATTRIBUTE,
    LABEL_REQUEST,
    HostIdentity,
    NetworkEndpoint,
    Node,
    NodeRequest,
    OperationProgress,
    PlannedRequest,
    QueuedResource,
    QueuedResourceRequest,
    QuotaLimit,
    TpuCloud,
)
from tpuctl.cloud.config import CloudConfig
from tpuctl.cloud.google_calls import GoogleCalls
from tpuctl.cloud.quotas import CloudQuotasClient
from tpuctl.cloud.retry import OPERATION_GOES_ON, Polling
from tpuctl.cloud.translate import error_from_status
from tpuctl.errors import CloudError, NotFoundError, PermissionDeniedError, UsageError

#: What Google's 403 for a location without Cloud TPU says (after the location's name).
_LOCATION_UNKNOWN = "is not found or access is unauthorized"

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

log = logging.getLogger(__name__)

T = TypeVar("T")

GOOGLE_TPU_ENDPOINT = "https://tpu.googleapis.com"
_INSTALL_HINT = "pip install 'google-cloud-tpu>=1.28,<2' (it is a dependency of tpuctl: reinstall tpuctl)"

_LABEL_VALUE_RE = re.compile(r"[a-z0-9_-]{1,63}")


def _tpu_v2() -> Any:
    """``google.cloud.tpu_v2``, imported on first use (explicitly v2: bare ``google.cloud.tpu`` is v1)."""
    try:
        from google.cloud import tpu_v2
    except ImportError as exc:
        raise CloudError(f"google-cloud-tpu is not importable ({exc})", fix=_INSTALL_HINT) from None
    return tpu_v2


def _types() -> Any:
    try:
        from google.cloud.tpu_v2.types import cloud_tpu
    except ImportError as exc:
        raise CloudError(f"google-cloud-tpu is not importable ({exc})", fix=_INSTALL_HINT) from None
    return cloud_tpu


class TpuApiCloud:
    """``TpuCloud`` over the Cloud TPU API v2 (google-cloud-tpu, REST transport)."""

    def __init__(
        self,
        *,
        project: str,
        endpoint: str = GOOGLE_TPU_ENDPOINT,
        config: CloudConfig | None = None,
        quotas: CloudQuotasClient | None = None,
        http_adapter: Any = None,
    ) -> None:
        """``config``: how to call (Google's defaults unless given). ``quotas``: where the TPU quota limits
        come from (None: Google's Cloud Quotas API, with ``config``, built when first asked).
        ``http_adapter`` (a ``requests`` transport adapter) carries every request of the client's session
        instead of a socket: tests serve the simulator in-process through it."""
        if not project:
            raise UsageError(
                "a project is required", field="project", fix="pass --project or set one in a profile"
            )
        self._project = project
        self._endpoint = endpoint.rstrip("/")
        self._config = config or CloudConfig()
        self._timeout = self._config.request_timeout_s  # passed to every call: the library sets none
        self._credentials: Credentials | None = None
        self._quotas = quotas
        self._http_adapter = http_adapter
        self._client_obj: Any = None
        # The allocator may drive one cloud from several threads (queued-resource races): build the
        # client once.
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:  # never show the credentials
        return (
            f"TpuApiCloud(backend={self.backend!r}, project={self._project!r}, endpoint={self._endpoint!r})"
        )

    def __enter__(self) -> TpuApiCloud:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- construction --------------------------------------------------------------------------------

    @classmethod
    def for_simulator(
        cls,
        project: str,
        base_url: str,
        *,
        quotas: CloudQuotasClient | None = None,
        http_adapter: Any = None,
        **overrides: Any,
    ) -> TpuApiCloud:
        """Against the simulator at ``base_url`` (http kept) as its backend calls it
        (``tpuctl.backends.sim``: the simulated ADC, no proxy, fast retries and polls); ``overrides``:
        fields of its ``CloudConfig``. For tests and tools that talk to a simulator without a session."""
        from tpuctl.backends.sim import SIM_CLIENTS

        config = replace(SIM_CLIENTS, **overrides)
        quotas = quotas or CloudQuotasClient.from_config(config, base_url=base_url)
        return cls(
            project=project, endpoint=base_url, config=config, quotas=quotas, http_adapter=http_adapter
        )

    # -- TpuCloud: identity --------------------------------------------------------------------------

    @property
    def backend(self) -> str:
        return self._config.backend

    @property
    def project(self) -> str:
        return self._project

    @property
    def endpoint(self) -> str:
        return self._endpoint

    # -- nodes ---------------------------------------------------------------------------------------

    def list_nodes(self, zone: str | None = None) -> list[Node]:
        parent = self._parent(zone or "-")
        where = f"in {zone}" if zone else "in all zones"

        def _list() -> list[Any]:
            pager = self._client.list_nodes(request={"parent": parent}, timeout=self._timeout)
            nodes: list[Any] = []
            for page in pager.pages:
                nodes.extend(page.nodes)
                if page.unreachable:
                    # A partial list: say so rather than pretend the missing zones are empty.
                    log.warning("list nodes %s: unreachable locations %s", where, list(page.unreachable))
            return nodes

        raw = self._read("list nodes", where, _list)
        return [node_from_proto(n) for n in raw]

    def get_node(self, zone: str, name: str) -> Node:
        full = self._node_name(zone, name)
        pb = self._read(
            "get node", f"{name} in {zone}", lambda: self._client.get_node(name=full, timeout=self._timeout)
        )
        return node_from_proto(pb)

    def host_identities(self, zone: str, name: str) -> list[HostIdentity]:
        """Each worker's keys and instance name, asked for by its worker id. The guest agent writes each
        host key under namespace "hostkeys", key = the key type, value = the base64 blob
        (https://cloud.google.com/compute/docs/connect/verify-host-keys). A ``GuestAttributes`` names no
        worker and the method does not say in which order it lists every worker's
        (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/getGuestAttributes),
        so one request per worker (``workerIds: [w]``) is the only answer that says whose keys they are.
        No query path: the same answer carries the worker's ``hostname`` item, its instance name, which
        gcloud's ``tpu-vm ssh --tunnel-through-iap`` reads the same way
        (docs/google-facts.md#iap-tcp-forwarding)."""
        workers = len(self.get_node(zone, name).network_endpoints) or 1
        return [self._host_identity_of(zone, name, worker) for worker in range(workers)]

    def _host_identity_of(self, zone: str, name: str, worker: int) -> HostIdentity:
        full = self._node_name(zone, name)
        response = self._read(
            "get guest attributes",
            f"worker {worker} of {name} in {zone}",
            lambda: self._client.get_guest_attributes(
                request={"name": full, "worker_ids": [str(worker)]}, timeout=self._timeout
            ),
        )
        # One worker asked, one entry answered; anything else is nothing published for it yet.
        if len(response.guest_attributes) != 1:
            return HostIdentity()
        items = response.guest_attributes[0].query_value.items
        keys = tuple(
            f"{item.key} {item.value}"
            for item in items
            if item.namespace == "hostkeys" and item.key and item.value
        )
        # Matched by key in any namespace, as gcloud does: which namespace holds it is not documented.
        names = [item.value for item in items if item.key == HOSTNAME_GUEST_ATTRIBUTE and item.value]
        return HostIdentity(keys, names[0] if names else None)

    def create_node(
        self,
        request: NodeRequest,
        *,
        request_id: str | None = None,
        wait: bool = True,
        progress: OperationProgress | None = None,
    ) -> Node:
        """Create a node; with ``wait``, until its operation is done (READY), else return it CREATING.

        The v2 API has no requestId for node create: a node's id is what makes a create idempotent (a
        repeat gets ALREADY_EXISTS -> ``AlreadyExistsError``). ``request_id``, when given, is stored as
        the ``tpuctl-request`` label so a caller that lost the response can tell the node is its own
        (``tpuctl.cloud.idempotent.create_node_idempotent``). A connection that breaks after sending
        raises ``AmbiguousError``; only refusals (429/503, connect errors) are retried here.
        """
        msg = self.build_create_node_request(request, request_id=request_id)
        what = ("create node", f"{request.name} in {request.zone}")
        op = self._mutate(
            *what,
            lambda: self._client.create_node(request=msg, timeout=self._timeout).operation,
            zone=request.zone,
        )
        if not wait:
            try:
                return self.get_node(request.zone, request.name)
            except NotFoundError:
                # Not visible yet: report what was accepted.
                return _node_from_request(request, msg)
        done = self._wait(op, " ".join(what), zone=request.zone, progress=progress)
        return self._node_from_op(done, request.zone, request.name)

    def delete_node(
        self, zone: str, name: str, *, wait: bool = True, progress: OperationProgress | None = None
    ) -> None:
        full = self._node_name(zone, name)
        what = ("delete node", f"{name} in {zone}")
        op = self._mutate(
            *what, lambda: self._client.delete_node(name=full, timeout=self._timeout).operation, zone=zone
        )
        if wait:
            self._wait(op, " ".join(what), zone=zone, progress=progress)

    def stop_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        full = self._node_name(zone, name)
        what = ("stop node", f"{name} in {zone}")
        op = self._mutate(
            *what,
            lambda: self._client.stop_node(request={"name": full}, timeout=self._timeout).operation,
            zone=zone,
        )
        if not wait:
            return self.get_node(zone, name)
        return self._node_from_op(self._wait(op, " ".join(what), zone=zone, progress=None), zone, name)

    def start_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        full = self._node_name(zone, name)
        what = ("start node", f"{name} in {zone}")
        op = self._mutate(
            *what,
            lambda: self._client.start_node(request={"name": full}, timeout=self._timeout).operation,
            zone=zone,
        )
        if not wait:
            return self.get_node(zone, name)
        return self._node_from_op(self._wait(op, " ".join(what), zone=zone, progress=None), zone, name)

    # -- queued resources ----------------------------------------------------------------------------

    def create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> QueuedResource:
        """Create a queued resource and return it as accepted (usually WAITING_FOR_RESOURCES).

        With ``request_id`` the create is idempotent on the server, so ambiguous failures are retried too.
        A queued resource does not fail for a stockout; it waits (``get_queued_resource`` to follow it).
        """
        msg = self.build_create_queued_resource_request(request, request_id=request_id)
        what = ("create queued resource", f"{request.id} in {request.zone}")
        op = self._mutate(
            *what,
            lambda: self._client.create_queued_resource(request=msg, timeout=self._timeout).operation,
            zone=request.zone,
            idempotent=request_id is not None,
        )
        done = self._wait(op, " ".join(what), zone=request.zone, progress=None)
        qr = _unpack(done, "google.cloud.tpu.v2.QueuedResource", _types().QueuedResource)
        if qr is not None and qr.name:
            return queued_resource_from_proto(qr)
        return self.get_queued_resource(request.zone, request.id)

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        full = self._qr_name(zone, qr_id)
        pb = self._read(
            "get queued resource",
            f"{qr_id} in {zone}",
            lambda: self._client.get_queued_resource(name=full, timeout=self._timeout),
        )
        return queued_resource_from_proto(pb)

    def list_queued_resources(self, zone: str | None = None) -> list[QueuedResource]:
        parent = self._parent(zone or "-")

        def _list() -> list[Any]:
            pager = self._client.list_queued_resources(request={"parent": parent}, timeout=self._timeout)
            out: list[Any] = []
            for page in pager.pages:
                out.extend(page.queued_resources)
                if page.unreachable:
                    log.warning("list queued resources: unreachable locations %s", list(page.unreachable))
            return out

        raw = self._read("list queued resources", f"in {zone}" if zone else "in all zones", _list)
        return [queued_resource_from_proto(q) for q in raw]

    def delete_queued_resource(
        self,
        zone: str,
        qr_id: str,
        *,
        force: bool = False,
        wait: bool = True,
        request_id: str | None = None,
    ) -> None:
        msg = self.build_delete_queued_resource_request(zone, qr_id, force=force, request_id=request_id)
        what = ("delete queued resource", f"{qr_id} in {zone}")
        op = self._mutate(
            *what,
            lambda: self._client.delete_queued_resource(request=msg, timeout=self._timeout).operation,
            zone=zone,
            idempotent=request_id is not None,
        )
        if wait:
            self._wait(op, " ".join(what), zone=zone, progress=None)

    def reset_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        full = self._qr_name(zone, qr_id)
        what = ("reset queued resource", f"{qr_id} in {zone}")
        op = self._mutate(
            *what,
            lambda: (
                self._client.reset_queued_resource(request={"name": full}, timeout=self._timeout).operation
            ),
            zone=zone,
        )
        done = self._wait(op, " ".join(what), zone=zone, progress=None)
        qr = _unpack(done, "google.cloud.tpu.v2.QueuedResource", _types().QueuedResource)
        if qr is not None and qr.name:
            return queued_resource_from_proto(qr)
        return self.get_queued_resource(zone, qr_id)

    # -- catalog-ish reads ---------------------------------------------------------------------------

    def list_accelerator_types(self, zone: str) -> list[str]:
        parent = self._parent(zone)
        try:
            raw = self._read(
                "list accelerator types",
                f"in {zone}",
                lambda: list(
                    self._client.list_accelerator_types(request={"parent": parent}, timeout=self._timeout)
                ),
            )
        except PermissionDeniedError as exc:
            # A zone without Cloud TPU answers 403 "Location Z is not found or access is unauthorized.":
            # it offers no type (a 403 for any other reason still stops the command).
            if _LOCATION_UNKNOWN not in str(exc):
                raise
            return []
        return [str(a.type_ or a.name.rsplit("/", 1)[-1]) for a in raw]

    def list_runtime_versions(self, zone: str) -> list[str]:
        parent = self._parent(zone)
        raw = self._read(
            "list runtime versions",
            f"in {zone}",
            lambda: list(
                self._client.list_runtime_versions(request={"parent": parent}, timeout=self._timeout)
            ),
        )
        return [str(r.version or r.name.rsplit("/", 1)[-1]) for r in raw]

    def list_zones(self) -> list[str]:
        def _list() -> list[str]:
            zones: list[str] = []
            token = ""
            seen: set[str] = set()
            # The locations mixin returns a raw response, not a pager: follow next_page_token ourselves.
            for _ in range(1000):
                resp = self._client.list_locations(
                    request={"name": f"projects/{self._project}", "page_token": token}, timeout=self._timeout
                )
                zones.extend(loc.location_id or loc.name.rsplit("/", 1)[-1] for loc in resp.locations)
                token = resp.next_page_token
                if not token or token in seen:
                    break
                seen.add(token)
            return zones

        return self._read("list zones", f"of project {self._project}", _list)

    def quota_limits(self) -> list[QuotaLimit]:
        if self._quotas is None:
            self._quotas = CloudQuotasClient.from_config(self._config)
        return self._quotas.list_quota_limits(self._project)

    # -- dry-run plans -------------------------------------------------------------------------------

    def plan_create_node(
        self, request: NodeRequest, *, request_id: str | None = None
    ) -> list[PlannedRequest]:
        """The exact HTTP request ``create_node`` would send, built from the same proto; sends nothing."""
        msg = self.build_create_node_request(request, request_id=request_id)
        return [self._plan(_http_options("CreateNode"), msg)]

    def plan_create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> PlannedRequest:
        msg = self.build_create_queued_resource_request(request, request_id=request_id)
        return self._plan(_http_options("CreateQueuedResource"), msg)

    def plan_delete_node(self, zone: str, name: str) -> list[PlannedRequest]:
        msg = _types().DeleteNodeRequest(name=self._node_name(zone, name))
        return [self._plan(_http_options("DeleteNode"), msg)]

    def plan_delete_queued_resource(
        self, zone: str, qr_id: str, *, force: bool = False, request_id: str | None = None
    ) -> PlannedRequest:
        msg = self.build_delete_queued_resource_request(zone, qr_id, force=force, request_id=request_id)
        return self._plan(_http_options("DeleteQueuedResource"), msg)

    def close(self) -> None:
        if self._client_obj is not None:
            try:
                self._client_obj.transport.close()
            finally:
                self._client_obj = None
        if self._quotas is not None:
            self._quotas.close()

    # -- request builders (public: the plan and the call use the same message) -----------------------

    def build_create_node_request(self, request: NodeRequest, *, request_id: str | None = None) -> Any:
        """The ``CreateNodeRequest`` proto for ``request`` (node id in the query, the Node in the body)."""
        t = _types()
        return t.CreateNodeRequest(
            parent=self._parent(request.zone),
            node_id=request.name,
            node=_node_message(request, self._project, request_id=request_id, in_queued_resource=False),
        )

    def build_create_queued_resource_request(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> Any:
        t = _types()
        if request.node_count < 1:
            raise UsageError(
                f"queued resource {request.id}: node_count must be >= 1, got {request.node_count}",
                field="slices",
                value=request.node_count,
                fix="use --slices 1 or more",
            )
        spec: dict[str, Any] = {
            "parent": self._parent(request.zone),
            "node": _node_message(
                request.node, self._project, request_id=request_id, in_queued_resource=True
            ),
        }
        if request.node_count == 1:
            spec["node_id"] = request.node.name
        else:
            # The API requires node_count > 1 for multisliceParams; nodes are <prefix>-0 .. <prefix>-(n-1).
            spec["multislice_params"] = {
                "node_count": request.node_count,
                "node_id_prefix": request.node_id_prefix or request.id,
            }
        qr: dict[str, Any] = {"tpu": {"node_spec": [spec]}}
        tier = request.tier.lower()
        if tier == "spot":
            qr["spot"] = {}
        elif tier == "guaranteed":
            qr["guaranteed"] = {}
        else:
            raise UsageError(
                f"unknown queued-resource tier {request.tier!r}",
                field="tier",
                value=request.tier,
                fix="use spot or guaranteed",
            )
        if request.valid_for_seconds is not None:
            if request.valid_for_seconds <= 0:
                raise UsageError(
                    f"valid-for must be positive, got {request.valid_for_seconds}s",
                    field="valid-for",
                    value=request.valid_for_seconds,
                    fix="use a duration such as 2h or 30m",
                )
            qr["queueing_policy"] = {"valid_until_duration": _duration(request.valid_for_seconds)}
        reservation = request.reservation or request.node.reservation
        if reservation:
            qr["reservation_name"] = self._reservation_name(request.zone, reservation)
        return t.CreateQueuedResourceRequest(
            parent=self._parent(request.zone),
            queued_resource_id=request.id,
            queued_resource=qr,
            request_id=request_id or "",
        )

    def build_delete_queued_resource_request(
        self, zone: str, qr_id: str, *, force: bool = False, request_id: str | None = None
    ) -> Any:
        return _types().DeleteQueuedResourceRequest(
            name=self._qr_name(zone, qr_id), force=force, request_id=request_id or ""
        )

    # -- internals -----------------------------------------------------------------------------------

    @property
    def _client(self) -> Any:
        if self._client_obj is not None:
            return self._client_obj
        with self._client_lock:
            if self._client_obj is not None:
                return self._client_obj
            tpu_v2 = _tpu_v2()
            from google.api_core.client_options import ClientOptions

            self._client_obj = tpu_v2.TpuClient(
                credentials=self._resolve_credentials(),
                transport="rest",
                client_options=ClientOptions(api_endpoint=self._endpoint),
            )
            session = getattr(self._client_obj.transport, "_session", None)
            if session is not None:
                # The transport's requests session honours HTTP(S)_PROXY unless told, even for loopback.
                session.trust_env = self._config.trust_env
            if self._http_adapter is not None:
                if session is None:
                    raise CloudError("the TPU client's transport has no requests session to adapt")
                for scheme in ("http://", "https://"):
                    session.mount(scheme, self._http_adapter)
        return self._client_obj

    def _resolve_credentials(self) -> Credentials:
        if self._credentials is None:
            self._credentials = self._config.credentials()
        return self._credentials

    def _parent(self, zone: str) -> str:
        return f"projects/{self._project}/locations/{zone}"

    def _node_name(self, zone: str, name: str) -> str:
        return f"{self._parent(zone)}/nodes/{name}"

    def _qr_name(self, zone: str, qr_id: str) -> str:
        return f"{self._parent(zone)}/queuedResources/{qr_id}"

    def _reservation_name(self, zone: str, reservation: str) -> str:
        if "/" in reservation:
            return reservation
        return f"{self._parent(zone)}/reservations/{reservation}"

    def _read(self, action: str, resource: str, fn: Callable[[], T]) -> T:
        return GoogleCalls(self._config.retry, self._config.sleep).read(action, resource, fn)

    def _mutate(
        self, action: str, resource: str, fn: Callable[[], T], *, zone: str | None, idempotent: bool = False
    ) -> T:
        """A mutation: translated (a broken connection is ambiguous), retried only where that is safe."""
        calls = GoogleCalls(self._config.retry, self._config.sleep)
        return calls.mutate(action, resource, fn, zone=zone, idempotent=idempotent)

    def _wait(self, op: Any, what: str, *, zone: str | None, progress: OperationProgress | None) -> Any:
        """Poll the operation until done; raise its translated error if it failed."""
        name = op.name
        if progress is not None:
            progress.update(_describe_op(op, what), elapsed_s=0.0)
        if not op.done:

            def get() -> Any:
                return self._read(
                    "get operation",
                    name,
                    lambda: self._client.get_operation(request={"name": name}, timeout=self._timeout),
                )

            def on_poll(current: Any, elapsed: float) -> None:
                if progress is not None:
                    progress.update(_describe_op(current, what), elapsed_s=elapsed)

            c = self._config
            polling = Polling(c.operation_timeout_s, c.poll_interval_s, c.poll_cap_s, c.sleep)
            op = polling.until(
                get,
                lambda o: bool(o.done),
                still=f"{what}: operation {name} is still running",
                fix=OPERATION_GOES_ON,
                on_poll=on_poll,
            )
        if op.HasField("error") and op.error.code != 0:
            raise error_from_status(
                what=what,
                message=op.error.message,
                rpc_code=op.error.code,
                details=_details_to_dicts(op.error.details),
                zone=zone,
                from_operation=True,
            )
        return op

    def _node_from_op(self, op: Any, zone: str, name: str) -> Node:
        node = _unpack(op, "google.cloud.tpu.v2.Node", _types().Node)
        if node is not None and node.name:
            return node_from_proto(node)
        return self.get_node(zone, name)

    def _plan(self, http_options: list[dict[str, str]], msg: Any) -> PlannedRequest:
        """Transcode ``msg`` exactly as the REST transport does (same helper, same flags), send nothing."""
        import requests
        from google.api_core import rest_helpers

        transcoded, body, query = rest_helpers.transcode_request(http_options, msg, rest_numeric_enums=True)
        flatten: Any = rest_helpers.flatten_query_params
        params = flatten(query, strict=True)
        host = self._endpoint if "://" in self._endpoint else f"https://{self._endpoint}"
        # requests builds the URL the session will send (same encoding of "$alt=json;enum-encoding=int").
        url = (
            requests.Request(transcoded["method"].upper(), host + transcoded["uri"], params=params)
            .prepare()
            .url
        )
        return PlannedRequest(
            method=transcoded["method"].upper(),
            url=str(url),
            body=json.loads(body) if body else None,
        )


# ----------------------------------------------------------------------------------------------------
# proto <-> dataclass


def _node_message(
    request: NodeRequest, project: str, *, request_id: str | None, in_queued_resource: bool
) -> Any:
    """The ``Node`` proto for a ``NodeRequest``.

    In a queued resource the tier (spot/guaranteed) lives on the queued resource, so the node template
    carries no spot/preemptible scheduling; reserved capacity is flagged on the node in both cases (the v2
    Node has no reservation-name field: a named reservation goes on a queued resource's reservationName).
    """
    t = _types()
    labels = dict(request.labels)
    if request_id is not None:
        _check_request_id(request_id)
        existing = labels.get(LABEL_REQUEST)
        if existing is not None and existing != request_id:
            raise UsageError(
                f"label {LABEL_REQUEST}={existing} conflicts with request id {request_id}",
                field="labels",
                value=existing,
            )
        labels[LABEL_REQUEST] = request_id
    node: dict[str, Any] = {
        "accelerator_type": request.accelerator_type,
        "runtime_version": request.runtime_version,
        "labels": labels,
        "metadata": dict(request.metadata),
    }
    if request.description:
        node["description"] = request.description
    capacity = request.capacity
    if request.reservation and capacity == CapacityType.ON_DEMAND:
        capacity = CapacityType.RESERVED
    sched: dict[str, bool] = {}
    if capacity == CapacityType.RESERVED:
        sched["reserved"] = True
    elif not in_queued_resource and capacity == CapacityType.SPOT:
        sched["spot"] = True
    elif not in_queued_resource and capacity == CapacityType.PREEMPTIBLE:
        sched["preemptible"] = True
    if sched:
        node["scheduling_config"] = sched
    network_config = _network_config(request, project)
    if network_config:
        node["network_config"] = network_config
    if request.network.tags:
        node["tags"] = list(request.network.tags)
    if request.service_account is not None:
        node["service_account"] = {"email": request.service_account, "scope": [CLOUD_PLATFORM_SCOPE]}
    return t.Node(**node)


def _network_config(request: NodeRequest, project: str) -> dict[str, Any]:
    """The node's networkConfig: external IPs where asked for, and the network and subnetwork where named
    (the API's default is the project's ``default`` network and its subnetwork in the zone's region,
    docs/google-facts.md#networks): a Shared VPC's as full paths in the host project."""
    config: dict[str, Any] = {}
    network = request.network
    if network.network is not None or network.subnetwork is not None:
        config["network"] = network.network_path(project)
    subnetwork = network.subnetwork_path(project, region_of_zone(request.zone))
    if subnetwork is not None:
        config["subnetwork"] = subnetwork
    if request.external_ips:
        config["enable_external_ips"] = True
    return config


def _check_request_id(request_id: str) -> None:
    # It travels as a label value (and as the API's requestId, a UUID): the label rules are the stricter.
    if not _LABEL_VALUE_RE.fullmatch(request_id):
        raise UsageError(
            f"request id {request_id!r} is not a valid label value",
            field="request_id",
            value=request_id,
            fix="use lowercase letters, digits, '-' or '_' (at most 63), e.g. str(uuid.uuid4())",
        )


def _http_options(method: str) -> list[dict[str, str]]:
    """The REST transport's own HTTP rule for ``method`` (e.g. "CreateNode"): URI template, verb, body."""
    from google.cloud.tpu_v2.services.tpu.transports.rest_base import _BaseTpuRestTransport

    base: Any = getattr(_BaseTpuRestTransport, f"_Base{method}")
    options: list[dict[str, str]] = base._get_http_options()
    return options


def _pb(msg: Any) -> Any:
    """The raw protobuf message behind a proto-plus wrapper (or the message itself)."""
    return getattr(msg, "_pb", msg)


def _enum_name(pb: Any, field: str) -> str:
    value = getattr(pb, field)
    enum = pb.DESCRIPTOR.fields_by_name[field].enum_type
    ev = enum.values_by_number.get(int(value))
    return ev.name if ev is not None else str(int(value))


def _timestamp(pb: Any, field: str) -> datetime | None:
    if not pb.HasField(field):
        return None
    ts = getattr(pb, field)
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=UTC)


def _split_name(name: str, collection: str) -> tuple[str, str]:
    """'projects/P/locations/Z/nodes/N' -> ('Z', 'N')."""
    parts = name.split("/")
    try:
        i = parts.index(collection)
        return parts[i - 1], parts[i + 1]
    except (ValueError, IndexError):
        return "", parts[-1] if parts else ""


def node_from_proto(msg: Any) -> Node:
    """A ``cloud_tpu.Node`` (proto-plus or raw) -> ``Node``."""
    pb = _pb(msg)
    zone, name = _split_name(pb.name, "nodes")
    sched = pb.scheduling_config
    if sched.spot:
        capacity = CapacityType.SPOT
    elif sched.preemptible:
        capacity = CapacityType.PREEMPTIBLE
    elif sched.reserved:
        capacity = CapacityType.RESERVED
    else:
        capacity = CapacityType.ON_DEMAND
    health = _enum_name(pb, "health")
    return Node(
        name=name,
        zone=zone,
        accelerator_type=pb.accelerator_type,
        state=_enum_name(pb, "state"),
        capacity=capacity,
        runtime_version=pb.runtime_version,
        topology=pb.accelerator_config.topology or None,
        health=None if health == "HEALTH_UNSPECIFIED" else health,
        labels=dict(pb.labels),
        metadata=dict(pb.metadata),
        network_endpoints=tuple(
            NetworkEndpoint(
                ip_address=ep.ip_address,
                port=int(ep.port),
                external_ip=ep.access_config.external_ip or None,
            )
            for ep in pb.network_endpoints
        ),
        create_time=_timestamp(pb, "create_time"),
        queued_resource=pb.queued_resource or None,
        multislice_node=bool(pb.multislice_node),
        description=pb.description,
        id=str(pb.id) if pb.id else "",
    )


def queued_resource_from_proto(msg: Any) -> QueuedResource:
    """A ``cloud_tpu.QueuedResource`` (proto-plus or raw) -> ``QueuedResource``."""
    pb = _pb(msg)
    zone, qr_id = _split_name(pb.name, "queuedResources")
    node_ids: list[str] = []
    accelerator_type = ""
    labels: dict[str, str] = {}
    for spec in pb.tpu.node_spec:
        if not accelerator_type:
            accelerator_type = spec.node.accelerator_type
            labels = dict(spec.node.labels)
        if not zone and spec.parent:
            zone = spec.parent.rsplit("/", 1)[-1]
        if spec.node_id:
            node_ids.append(spec.node_id)
        elif spec.HasField("multislice_params"):
            prefix = spec.multislice_params.node_id_prefix or qr_id
            node_ids.extend(f"{prefix}-{i}" for i in range(spec.multislice_params.node_count))
    state_pb = pb.state
    initiator = _enum_name(state_pb, "state_initiator")
    error_message = None
    error_code = None
    if state_pb.HasField("failed_data") and state_pb.failed_data.HasField("error"):
        error_message = state_pb.failed_data.error.message or None
        error_code = int(state_pb.failed_data.error.code)
    return QueuedResource(
        id=qr_id,
        zone=zone,
        state=_enum_name(state_pb, "state"),
        state_initiator=None if initiator == "STATE_INITIATOR_UNSPECIFIED" else initiator,
        tier=pb.WhichOneof("tier"),
        node_ids=tuple(node_ids),
        node_count=max(len(node_ids), 1),
        accelerator_type=accelerator_type,
        error_message=error_message,
        error_code=error_code,
        create_time=_timestamp(pb, "create_time"),
        labels=labels,
    )


def _node_from_request(request: NodeRequest, msg: Any) -> Node:
    """What a create was asked to make, as a CREATING node (when the API does not show it yet)."""
    node = _pb(msg).node
    return Node(
        name=request.name,
        zone=request.zone,
        accelerator_type=request.accelerator_type,
        state="CREATING",
        capacity=request.capacity,
        runtime_version=request.runtime_version,
        labels=dict(node.labels),
        metadata=dict(node.metadata),
        description=request.description,
    )


def _unpack(op: Any, type_name: str, proto_cls: Any) -> Any:
    """The operation's ``response`` unpacked into ``proto_cls`` (proto-plus), or None."""
    if not op.HasField("response") or not op.response.type_url.endswith("/" + type_name):
        return None
    raw = proto_cls.pb()()
    if not op.response.Unpack(raw):
        return None
    return proto_cls.wrap(raw)


def _details_to_dicts(details: Iterable[Any]) -> list[Mapping[str, Any]]:
    """google.rpc.Status details (``Any``) -> JSON-shaped dicts with ``@type``, like REST errors have."""
    from google.protobuf import json_format
    from google.rpc import error_details_pb2  # noqa: F401  (registers QuotaFailure, ErrorInfo, ... types)

    out: list[Mapping[str, Any]] = []
    for d in details:
        try:
            out.append(json_format.MessageToDict(d))
        except Exception:  # a detail type we do not know: keep at least its type
            out.append({"@type": d.type_url})
    return out


def _describe_op(op: Any, what: str) -> str:
    """A one-line progress description from the operation's metadata (statusDetail when given)."""
    detail = ""
    try:
        meta = _types().OperationMetadata.pb()()
        if op.HasField("metadata") and op.metadata.Unpack(meta):
            detail = meta.status_detail
    except Exception:  # metadata of another type: progress without detail is fine
        detail = ""
    state = "done" if op.done else "running"
    return f"{what}: {detail or state}"


def _duration(seconds: float) -> timedelta:
    # proto-plus marshals google.protobuf.Duration fields from timedelta.
    return timedelta(seconds=seconds)


if TYPE_CHECKING:
    # mypy proves TpuApiCloud implements the whole TpuCloud protocol (never runs).
    def _conforms(cloud: TpuApiCloud) -> TpuCloud:
        return cloud
