"""``ComputeCloud``: TPU slices on Compute Engine, as a ``TpuCloud``, over google-cloud-compute (REST).

TPU7x and later exist only here; v6e and v5p may be placed here too (docs/google-facts.md#two-surfaces). Above
this class a Compute Engine slice is a ``Node`` like any other: a one-host slice is an instance, a multi-host
slice a workload policy + instance template + BULK MIG (``compute_shapes`` has the bodies and the mapping).

Facts about the client this module relies on (google-cloud-compute 1.57,
docs/google-facts.md#compute-engine-client):

* Every mutation has a ``*_unary`` form that returns the ``Operation`` as sent, without the library's
  ``ExtendedOperation`` poller, whose operations client ignores a custom endpoint (it would poll
  compute.googleapis.com, not the simulator). Operations are polled here with clients built with the same
  endpoint: ``zoneOperations``/``regionOperations``/``globalOperations.get``.
* A failed operation is ``status: DONE`` with ``httpErrorStatusCode`` and ``error.errors[]``
  (``translate.error_from_compute_errors``). A stockout on a BULK MIG shows on its managed instances'
  ``lastAttempt.errors`` instead, and the MIG never becomes stable.
* Messages go over the wire as REST JSON; this module converts to and from that JSON at its edge
  (``_to_json``/``_message``), so the bodies are the ones ``--dry-run`` shows.

Like ``TpuApiCloud``, google-cloud-compute is imported on first use only, and only the clients it uses
(``compute_sdk``: the package's own ``__init__`` imports about 100 services).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from tpuctl.catalog import AcceleratorType, Catalog, Surface
from tpuctl.cloud import compute_shapes as shapes
from tpuctl.cloud.base import (
    HostIdentity,
    Node,
    NodeRequest,
    OperationProgress,
    PlannedRequest,
    QueuedResource,
    QueuedResourceRequest,
    QuotaLimit,
)
from tpuctl.cloud.compute_sdk import ComputeClients, compute_v1, to_json
from tpuctl.cloud.config import CloudConfig
from tpuctl.cloud.google_calls import GoogleCalls
from tpuctl.cloud.quotas import COMPUTE_SERVICE, CloudQuotasClient
from tpuctl.cloud.retry import OPERATION_GOES_ON, Polling, PollTimeout, poll_until
from tpuctl.cloud.translate import error_from_compute_errors
from tpuctl.errors import CloudError, NotFoundError, StockoutError, TransientError, UsageError

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)
T = TypeVar("T")

GOOGLE_COMPUTE_ENDPOINT = "https://compute.googleapis.com"
#: How long past a flex-start request's --valid-for tpuctl waits for Compute Engine to say it failed.
_FLEX_SLACK_S = 120.0
_NO_QUEUED = (
    "Compute Engine has no queued resources: its flex-start VMs take their place (pod create --queued "
    "places them)"
)


class ComputeCloud:
    """``TpuCloud`` over Compute Engine (TPU VM instances and MIGs). See the module docstring."""

    def __init__(
        self,
        *,
        project: str,
        catalog: Catalog,
        endpoint: str = GOOGLE_COMPUTE_ENDPOINT,
        config: CloudConfig | None = None,
        quotas: CloudQuotasClient | None = None,
    ) -> None:
        """``config``: how to call (Google's defaults unless given). ``quotas``: where Compute Engine's TPU
        quota limits come from (None: none are known, and placement lets the create answer)."""
        if not project:
            raise UsageError("a project is required", field="project", fix="pass --project or set a profile")
        self._project = project
        self._catalog = catalog
        self._endpoint = endpoint.rstrip("/")
        self._config = config or CloudConfig()
        self._timeout = self._config.request_timeout_s  # passed to every call: the library sets none
        self._quotas = quotas
        self._clients = ComputeClients(self._endpoint, self._config)

    @classmethod
    def for_simulator(
        cls,
        project: str,
        catalog: Catalog,
        base_url: str,
        *,
        quotas: CloudQuotasClient | None = None,
        **overrides: Any,
    ) -> ComputeCloud:
        """The simulator's Compute Engine surface at ``base_url``, as its backend calls it
        (``tpuctl.backends.sim``); ``overrides``: fields of its ``CloudConfig``."""
        from tpuctl.backends.sim import SIM_CLIENTS

        config = replace(SIM_CLIENTS, **overrides)
        quotas = quotas or CloudQuotasClient.from_config(config, base_url=base_url, service=COMPUTE_SERVICE)
        return cls(project=project, catalog=catalog, endpoint=base_url, config=config, quotas=quotas)

    # --- identity --------------------------------------------------------------------------------

    @property
    def backend(self) -> str:
        return self._config.backend

    @property
    def project(self) -> str:
        return self._project

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def close(self) -> None:
        self._clients.close()

    # --- slices ----------------------------------------------------------------------------------

    def list_nodes(self, zone: str | None = None) -> list[Node]:
        """Without a zone: every zone of the project in two calls (the aggregated lists of instances and
        of MIGs), however many zones there are."""
        if zone:
            by_zone = {zone: (self._list("instances", zone), self._list("instance_group_managers", zone))}
        else:
            by_zone = self._aggregated()
        nodes: list[Node] = []
        for z, (instances, migs) in sorted(by_zone.items()):
            nodes += self._nodes_in_zone(z, instances, migs)
        return nodes

    def _nodes_in_zone(
        self, zone: str, instances: list[dict[str, Any]], migs: list[dict[str, Any]]
    ) -> list[Node]:
        """The TPU slices among a zone's instances and MIGs: a MIG's VMs are read through their MIG."""
        in_mig = {m["name"] for m in migs}
        nodes: list[Node] = []
        for instance in instances:
            if (instance.get("labels") or {}).get(shapes.LABEL_SLICE, instance["name"]) in in_mig:
                continue
            node = self._node_of_instance(instance, zone)
            if node is not None:
                nodes.append(node)
        for mig in migs:
            meta = shapes.parse_slice_description(str(mig.get("description", "")))
            if meta is not None:
                nodes.append(self._node_of_mig(mig, zone, meta, instances))
        return nodes

    def _aggregated(self) -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
        """zone -> (instances, MIGs), from ``aggregatedList`` (scopes ``zones/Z``; empty ones skipped)."""
        out: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        for position, (kind, field) in enumerate(
            (("instances", "instances"), ("instance_group_managers", "instanceGroupManagers"))
        ):

            def fetch(kind: str = kind, field: str = field) -> list[tuple[str, list[dict[str, Any]]]]:
                pager = self._client(kind).aggregated_list(
                    request={"project": self._project},
                    timeout=self._timeout,
                )
                return [(scope, to_json(scoped).get(field) or []) for scope, scoped in pager]

            for scope, items in self._read(f"list {kind.replace('_', ' ')}", "in all zones", fetch):
                if not scope.startswith("zones/") or not items:
                    continue
                pair = out.setdefault(scope.split("/", 1)[1], ([], []))
                pair[position].extend(items)
        return out

    def get_node(self, zone: str, name: str) -> Node:
        try:
            mig = self._get("instance_group_managers", zone, name)
        except NotFoundError:
            mig = None
        if mig is not None:
            meta = shapes.parse_slice_description(str(mig.get("description", "")))
            if meta is not None:
                return self._node_of_mig(mig, zone, meta, self._list("instances", zone))
        instance = self._get("instances", zone, name)
        node = self._node_of_instance(instance, zone)
        if node is None:
            raise NotFoundError(f"get node {name} in {zone}: {name} is not a TPU VM", code=5)
        return node

    def host_identities(self, zone: str, name: str) -> list[HostIdentity]:
        """Each host's keys as its guest agent publishes them (guest attributes, query path
        ``hostkeys/``; https://cloud.google.com/compute/docs/connect/verify-host-keys), in worker order,
        with the VM's own name: the instance an IAP tunnel targets."""
        node = self.get_node(zone, name)
        return [
            HostIdentity(self._host_keys_of(zone, instance), instance)
            for instance in self._instance_names(zone, node)
        ]

    def _host_keys_of(self, zone: str, instance: str) -> tuple[str, ...]:
        def fetch() -> dict[str, Any]:
            client = self._client("instances")
            return to_json(
                client.get_guest_attributes(
                    request={
                        "project": self._project, "zone": zone, "instance": instance,
                        "query_path": "hostkeys/",  # a field of the request, not a flattened keyword
                    },
                    timeout=self._timeout,
                )
            )  # fmt: skip

        try:
            attrs = self._read("get guest attributes", f"{instance} in {zone}", fetch)
        except NotFoundError:
            return ()  # nothing published yet
        items = (attrs.get("queryValue") or {}).get("items") or []
        return tuple(
            f"{i['key']} {i['value']}"
            for i in items
            if i.get("namespace") == "hostkeys" and i.get("key") and i.get("value")
        )

    def create_node(
        self,
        request: NodeRequest,
        *,
        request_id: str | None = None,
        wait: bool = True,
        progress: OperationProgress | None = None,
    ) -> Node:
        """One host: ``instances.insert``. Several: workload policy, template, MIG
        (docs/google-facts.md#workload-policies and after), and on a failure (a stockout while the MIG waits
        for its VMs among them) what was made is deleted again, so nothing is left billing or holding quota.
        ``request_id`` is the requests' ``requestId``."""
        accel = self._accelerator(request)
        if accel.hosts == 1:
            body = shapes.instance_body(request, accel, project=self._project)
            op = self._insert("instances", body, zone=request.zone, request_id=request_id)
            what = f"create instance {request.name} in {request.zone}"
            if request.flex_valid_for_s is None:
                self._wait(op, what, request.zone, progress)
            elif wait:  # a flex-start insert's operation runs until capacity is granted
                self._wait_flex_instance(request, op, what, progress)
        else:
            self._create_multi_host(request, accel, request_id, progress)
        if not wait:
            return self.get_node(request.zone, request.name)
        return self._wait_ready(request, accel, progress)

    def _wait_flex_instance(
        self, request: NodeRequest, op: dict[str, Any], what: str, progress: OperationProgress | None
    ) -> None:
        """A flex-start insert's operation runs while the instance is PENDING; at its deadline Compute
        Engine fails it and the instance deletes itself (docs/google-facts.md#flex-start). Waited on past the
        deadline (the server's failure is the answer); whatever way the wait ends without the VM, the instance
        is deleted, so nothing is left waiting for capacity, billing or holding quota."""
        assert request.flex_valid_for_s is not None
        try:
            self._wait(op, what, request.zone, progress, timeout_s=request.flex_valid_for_s + _FLEX_SLACK_S)
        except BaseException:
            self._undo(request.name, request.zone, [("instances", request.zone)])
            raise

    def delete_node(
        self, zone: str, name: str, *, wait: bool = True, progress: OperationProgress | None = None
    ) -> None:
        """Everything the slice was made of, in order: the MIG (its VMs with it), then its template and
        workload policy; or the one instance. Parts already gone are skipped."""
        region = _region(zone)
        try:
            mig = self._get("instance_group_managers", zone, name)
        except NotFoundError:
            mig = None
        if mig is None:
            op = self._delete("instances", name, zone=zone)
            if wait:
                self._wait(op, f"delete instance {name} in {zone}", zone, progress)
            return
        op = self._delete("instance_group_managers", name, zone=zone)
        self._wait(op, f"delete MIG {name} in {zone}", zone, progress)
        for kind, where in (("instance_templates", None), ("resource_policies", region)):
            try:
                part = self._delete(kind, name, region=where)
            except NotFoundError:
                continue
            self._wait(part, f"delete {kind.replace('_', ' ')[:-1]} {name}", zone, progress)

    def stop_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        raise UsageError(
            f"stop {name}: a Compute Engine TPU slice cannot be stopped by tpuctl",
            fix=f"delete it (tpuctl pod delete {name}) and create it again",
        )

    def start_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        return self.stop_node(zone, name)

    # --- queued resources: none on Compute Engine ------------------------------------------------

    def create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> QueuedResource:
        raise UsageError(f"queued resource {request.id}: {_NO_QUEUED}", fix="leave out --queued")

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        raise NotFoundError(f"queued resource {qr_id} in {zone}: {_NO_QUEUED}", code=5)

    def list_queued_resources(self, zone: str | None = None) -> list[QueuedResource]:
        return []

    def delete_queued_resource(
        self, zone: str, qr_id: str, *, force: bool = False, wait: bool = True, request_id: str | None = None
    ) -> None:
        raise NotFoundError(f"queued resource {qr_id} in {zone}: {_NO_QUEUED}", code=5)

    def reset_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        return self.get_queued_resource(zone, qr_id)

    # --- catalog and quota -----------------------------------------------------------------------

    def list_accelerator_types(self, zone: str) -> list[str]:
        """The catalog's Compute Engine types whose machine type the zone lists."""
        try:
            machine_types = self._list("machine_types", zone)
        except CloudError as exc:
            # Compute Engine answers a zone it does not know with 400 "Invalid value for field 'zone':
            # ... Unknown zone." where the TPU API answers 404: the same meaning, told the same way.
            if not isinstance(exc, NotFoundError) and "Unknown zone" in exc.message:
                raise NotFoundError(exc.message, code=5) from exc
            raise
        offered = {m["name"] for m in machine_types}
        return [
            accel.api_name
            for accel in self._catalog.types()
            if Surface.COMPUTE in accel.generation.surfaces and accel.machine_type in offered
        ]

    def list_runtime_versions(self, zone: str) -> list[str]:
        return []  # images, not runtime versions: a slice boots its generation's image family

    def list_zones(self) -> list[str]:
        def fetch() -> list[str]:
            return [z.name for z in self._client("zones").list(project=self._project, timeout=self._timeout)]

        return sorted(self._read("list zones", self._project, fetch))

    def quota_limits(self) -> list[QuotaLimit]:
        return [] if self._quotas is None else self._quotas.list_quota_limits(self._project)

    # --- dry-run plans ---------------------------------------------------------------------------

    def plan_create_node(
        self, request: NodeRequest, *, request_id: str | None = None
    ) -> list[PlannedRequest]:
        accel = self._accelerator(request)
        base = f"{self._endpoint}/compute/v1/projects/{self._project}"

        def query(kind: str) -> str:
            rid = compute_request_id(request_id, kind, request.name)
            return f"?requestId={rid}" if rid else ""

        if accel.hosts == 1:
            body = shapes.instance_body(request, accel, project=self._project)
            return [
                PlannedRequest("POST", f"{base}/zones/{request.zone}/instances{query('instances')}", body)
            ]
        policy_url, template_url = self._part_urls(request.zone, request.name)
        region = _region(request.zone)
        return [
            PlannedRequest(
                "POST",
                f"{base}/regions/{region}/resourcePolicies{query('resource_policies')}",
                shapes.workload_policy_body(request.name, accel.topology),
            ),
            PlannedRequest(
                "POST",
                f"{base}/global/instanceTemplates{query('instance_templates')}",
                shapes.template_body(request, accel, project=self._project),
            ),
            PlannedRequest(
                "POST",
                f"{base}/zones/{request.zone}/instanceGroupManagers{query('instance_group_managers')}",
                shapes.mig_body(request, accel, template_url=template_url, policy_url=policy_url),
            ),
            *self._plan_resize(request, accel, base),
        ]

    @staticmethod
    def _plan_resize(request: NodeRequest, accel: AcceleratorType, base: str) -> list[PlannedRequest]:
        if request.flex_valid_for_s is None:
            return []
        url = f"{base}/zones/{request.zone}/instanceGroupManagers/{request.name}/resize?size={accel.hosts}"
        return [PlannedRequest("POST", url)]

    def plan_delete_node(self, zone: str, name: str) -> list[PlannedRequest]:
        base = f"{self._endpoint}/compute/v1/projects/{self._project}"
        try:
            self._get("instance_group_managers", zone, name)
        except NotFoundError:
            return [PlannedRequest("DELETE", f"{base}/zones/{zone}/instances/{name}")]
        return [
            PlannedRequest("DELETE", f"{base}/zones/{zone}/instanceGroupManagers/{name}"),
            PlannedRequest("DELETE", f"{base}/global/instanceTemplates/{name}"),
            PlannedRequest("DELETE", f"{base}/regions/{_region(zone)}/resourcePolicies/{name}"),
        ]

    def plan_create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> PlannedRequest:
        raise UsageError(f"queued resource {request.id}: {_NO_QUEUED}", fix="leave out --queued")

    def plan_delete_queued_resource(
        self, zone: str, qr_id: str, *, force: bool = False, request_id: str | None = None
    ) -> PlannedRequest:
        raise NotFoundError(f"queued resource {qr_id} in {zone}: {_NO_QUEUED}", code=5)

    # --- creating a multi-host slice --------------------------------------------------------------

    def _create_multi_host(
        self,
        request: NodeRequest,
        accel: AcceleratorType,
        request_id: str | None,
        progress: OperationProgress | None,
    ) -> None:
        zone, name, region = request.zone, request.name, _region(request.zone)
        policy_url, template_url = self._part_urls(zone, name)
        made: list[tuple[str, str | None]] = []
        try:
            body = shapes.workload_policy_body(name, accel.topology)
            op = self._insert("resource_policies", body, region=region, request_id=request_id)
            made.append(("resource_policies", region))
            self._wait(op, f"create workload policy {name} in {region}", zone, progress)
            body = shapes.template_body(request, accel, project=self._project)
            op = self._insert("instance_templates", body, request_id=request_id)
            made.append(("instance_templates", None))
            self._wait(op, f"create instance template {name}", zone, progress)
            body = shapes.mig_body(request, accel, template_url=template_url, policy_url=policy_url)
            op = self._insert("instance_group_managers", body, zone=zone, request_id=request_id)
            made.append(("instance_group_managers", zone))
            self._wait(op, f"create MIG {name} in {zone}", zone, progress)
            if request.flex_valid_for_s is not None:
                op = self._resize(name, zone, accel.hosts)
                self._wait(op, f"resize MIG {name} in {zone} to {accel.hosts}", zone, progress)
        except BaseException:
            self._undo(name, zone, made)
            raise

    def _undo(self, name: str, zone: str, made: list[tuple[str, str | None]]) -> None:
        """Delete what a failed create made, last first; a failure here is logged, not raised (the
        create's own error is the one to report; ``pod gc`` finds what is left)."""
        for kind, where in reversed(made):
            try:
                if kind in ("instance_group_managers", "instances"):
                    op = self._delete(kind, name, zone=zone)
                elif kind == "resource_policies":
                    op = self._delete(kind, name, region=where)
                else:
                    op = self._delete(kind, name)
                self._wait(op, f"delete {kind} {name}", zone, None)
            except NotFoundError:
                continue
            except CloudError as exc:
                log.warning("could not delete %s %s after a failed create: %s", kind, name, exc)

    def _wait_ready(
        self, request: NodeRequest, accel: AcceleratorType, progress: OperationProgress | None
    ) -> Node:
        what = f"create node {request.name} in {request.zone}"
        flex = request.flex_valid_for_s

        def poll() -> Node:
            node = self.get_node(request.zone, request.name)
            # A flex-start MIG waits out a stockout (or missing quota) until --valid-for
            # (docs/google-facts.md#provisioning-models).
            if node.state == "CREATING" and accel.hosts > 1 and flex is None:
                self._raise_if_stocked_out(request, what)
            return node

        def on_poll(node: Node, elapsed: float) -> None:
            if progress is not None:
                progress.update(f"{what}: {node.state}", elapsed_s=elapsed)

        try:
            node = poll_until(
                poll,
                lambda n: n.state != "CREATING",
                # A flex-start MIG waits PENDING for as long as it takes (docs/google-facts.md#flex-start):
                # tpuctl gives up at --valid-for (real seconds here: a simulator's faster clock does not
                # apply), as the instance insert's own deadline does.
                timeout_s=self._config.operation_timeout_s if flex is None else flex,
                initial_interval_s=self._config.poll_interval_s,
                max_interval_s=self._config.poll_cap_s,
                on_poll=on_poll,
                sleep=self._config.sleep,
            )
        except StockoutError:
            if accel.hosts > 1:
                self._undo(request.name, request.zone, _multi_host_parts(request.zone))
            raise
        except PollTimeout as exc:
            if flex is not None:
                self._undo(request.name, request.zone, _parts_of(request.zone, accel))
                raise StockoutError(
                    f"{what}: flex-start capacity was not granted within {flex:.0f}s (--valid-for); "
                    "everything made for it was deleted",
                    zone=request.zone,
                ) from None
            raise TransientError(
                f"{what}: not ready after {exc.elapsed_s:.0f}s",
                fix="it goes on on the server: check it later (tpuctl pod describe)",
            ) from None
        if node.state != "READY":
            raise CloudError(
                f"{what}: the slice went {node.state} before it was ready", fix="create it again"
            )
        return node

    def _raise_if_stocked_out(self, request: NodeRequest, what: str) -> None:
        """A BULK MIG short of capacity keeps trying; its managed instances' last attempt says why."""

        def fetch() -> list[dict[str, Any]]:
            pager = self._client("instance_group_managers").list_managed_instances(
                project=self._project, zone=request.zone, instance_group_manager=request.name,
                timeout=self._timeout,
            )  # fmt: skip
            return [to_json(m) for m in pager]

        for managed in self._read("list managed instances", request.name, fetch):
            errors = ((managed.get("lastAttempt") or {}).get("errors") or {}).get("errors") or []
            if errors:
                raise error_from_compute_errors(what=what, errors=errors, zone=request.zone)

    # --- reading ---------------------------------------------------------------------------------

    def _node_of_instance(self, instance: Mapping[str, Any], zone: str) -> Node | None:
        accel = self._type_of_machine(shapes.last_segment(str(instance.get("machineType", ""))))
        if accel is None:
            return None  # not a TPU VM
        return shapes.node_from_instance(instance, zone, accel)

    def _node_of_mig(
        self, mig: Mapping[str, Any], zone: str, meta: Mapping[str, Any], instances: list[dict[str, Any]]
    ) -> Node:
        accel = self._catalog.resolve(str(meta.get("accelerator_type", "")))
        own = [i for i in instances if (i.get("labels") or {}).get(shapes.LABEL_SLICE) == mig["name"]]
        return shapes.node_from_mig(mig, own, zone, meta, accel)

    def _type_of_machine(self, machine_type: str) -> AcceleratorType | None:
        """The one-host type of a machine type (a MIG's hosts are read through the MIG)."""
        for accel in self._catalog.types():
            if accel.hosts == 1 and accel.machine_type == machine_type:
                return accel
        return None

    def _instance_names(self, zone: str, node: Node) -> list[str]:
        """The slice's instances in worker order: a MIG's by name (as ``node_from_mig`` orders them)."""
        own = [
            str(i["name"])
            for i in self._list("instances", zone)
            if (i.get("labels") or {}).get(shapes.LABEL_SLICE) == node.name
        ]
        return sorted(own) or [node.name]

    def _accelerator(self, request: NodeRequest) -> AcceleratorType:
        accel = self._catalog.resolve(request.accelerator_type)
        accel.generation.check_surface(Surface.COMPUTE)
        return accel

    def _part_urls(self, zone: str, name: str) -> tuple[str, str]:
        project = f"projects/{self._project}"
        return (
            f"{project}/regions/{_region(zone)}/resourcePolicies/{name}",
            f"{project}/global/instanceTemplates/{name}",
        )

    # --- calls -----------------------------------------------------------------------------------

    def _client(self, kind: str) -> Any:
        return self._clients.get(kind)

    def _read(self, action: str, resource: str, fn: Callable[[], T]) -> T:
        return GoogleCalls(self._config.retry, self._config.sleep).read(action, resource, fn)

    def _list(self, kind: str, zone: str) -> list[dict[str, Any]]:
        def fetch() -> list[dict[str, Any]]:
            pager = self._client(kind).list(project=self._project, zone=zone, timeout=self._timeout)
            return [to_json(item) for item in pager]

        return self._read(f"list {kind.replace('_', ' ')}", zone, fetch)

    def _get(self, kind: str, zone: str, name: str) -> dict[str, Any]:
        field = _NAME_FIELDS[kind]

        def fetch() -> dict[str, Any]:
            args = {"project": self._project, "zone": zone, field: name, "timeout": self._timeout}
            return to_json(self._client(kind).get(**args))

        return self._read(f"get {kind.replace('_', ' ')[:-1]}", f"{name} in {zone}", fetch)

    def _insert(
        self,
        kind: str,
        body: dict[str, Any],
        *,
        zone: str | None = None,
        region: str | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        sdk = compute_v1()
        resource_field, message_class = _RESOURCE_FIELDS[kind]
        fields: dict[str, Any] = {
            "project": self._project,
            resource_field: _message(getattr(sdk, message_class), body),
        }
        if zone is not None:
            fields["zone"] = zone
        if region is not None:
            fields["region"] = region
        rid = compute_request_id(request_id, kind, str(body["name"]))
        if rid:
            fields["request_id"] = rid  # not a keyword of the flattened call: the request's field
        args = {"request": fields, "timeout": self._timeout}
        calls = GoogleCalls(self._config.retry, self._config.sleep)
        # With a requestId, Compute Engine makes the insert idempotent: a retry after a broken
        # connection does not create twice.
        return calls.mutate(
            f"create {kind.replace('_', ' ')[:-1]}",
            str(body["name"]),
            lambda: to_json(self._client(kind).insert_unary(**args)),
            zone=zone,
            idempotent=rid is not None,
        )

    def _delete(
        self, kind: str, name: str, *, zone: str | None = None, region: str | None = None
    ) -> dict[str, Any]:
        args: dict[str, Any] = {"project": self._project, _NAME_FIELDS[kind]: name, "timeout": self._timeout}
        if zone is not None:
            args["zone"] = zone
        if region is not None:
            args["region"] = region

        calls = GoogleCalls(self._config.retry, self._config.sleep)
        # A delete is idempotent in effect: a repeat finds the resource gone (NotFoundError).
        return calls.mutate(
            f"delete {kind.replace('_', ' ')[:-1]}",
            name,
            lambda: to_json(self._client(kind).delete_unary(**args)),
            zone=zone,
            idempotent=True,
        )

    def _resize(self, name: str, zone: str, size: int) -> dict[str, Any]:
        """``instanceGroupManagers.resize``: a flex-start MIG's request for its VMs
        (docs/google-facts.md#flex-start)."""
        args = {"project": self._project, "zone": zone, "instance_group_manager": name, "size": size}
        calls = GoogleCalls(self._config.retry, self._config.sleep)
        # Idempotent in effect: resizing to the same size again changes nothing.
        return calls.mutate(
            "resize MIG",
            name,
            lambda: to_json(
                self._client("instance_group_managers").resize_unary(**args, timeout=self._timeout)
            ),
            zone=zone,
            idempotent=True,
        )

    def _wait(
        self,
        op: dict[str, Any],
        what: str,
        zone: str | None,
        progress: OperationProgress | None,
        *,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        return wait_operation(
            self._client, self._config, self._project, op, what, zone, progress, timeout_s=timeout_s
        )


def wait_operation(
    client_of: Callable[[str], Any],
    config: CloudConfig,
    project: str,
    op: dict[str, Any],
    what: str,
    zone: str | None,
    progress: OperationProgress | None = None,
    *,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Poll the operation (zonal, regional or global, as its own fields say) until DONE, at ``config``'s
    pace (its operation timeout, or ``timeout_s`` where longer); raise its translated error when it
    failed. ``client_of``: the caller's SDK client of a service (its own, however it makes them). The
    one way every Compute Engine client here waits on an operation."""
    name = str(op["name"])
    op_zone = shapes.last_segment(str(op["zone"])) if op.get("zone") else None
    op_region = shapes.last_segment(str(op["region"])) if op.get("region") else None
    timeout = config.request_timeout_s  # passed to every call: the library sets none
    if op.get("status") != "DONE":

        def get() -> dict[str, Any]:
            if op_zone:
                kind, where = "zone_operations", {"zone": op_zone}
            elif op_region:
                kind, where = "region_operations", {"region": op_region}
            else:
                kind, where = "global_operations", {}
            client = client_of(kind)
            return GoogleCalls(config.retry, config.sleep).read(
                "get operation",
                name,
                lambda: to_json(client.get(project=project, operation=name, timeout=timeout, **where)),
            )

        def on_poll(current: dict[str, Any], elapsed: float) -> None:
            if progress is not None:
                progress.update(f"{what}: {current.get('status', '?')}", elapsed_s=elapsed)

        limit = (
            config.operation_timeout_s if timeout_s is None else max(config.operation_timeout_s, timeout_s)
        )
        polling = Polling(limit, config.poll_interval_s, config.poll_cap_s, config.sleep)
        op = polling.until(
            get,
            lambda o: o.get("status") == "DONE",
            still=f"{what}: operation {name} is still running",
            fix=OPERATION_GOES_ON,
            on_poll=on_poll,
        )
    errors = (op.get("error") or {}).get("errors") or []
    if errors or op.get("httpErrorStatusCode"):
        raise error_from_compute_errors(
            what=what, errors=errors, http_status=_int(op.get("httpErrorStatusCode")), zone=zone
        )
    return op


def _parts_of(zone: str, accel: AcceleratorType) -> list[tuple[str, str | None]]:
    return [("instances", zone)] if accel.hosts == 1 else _multi_host_parts(zone)


def _multi_host_parts(zone: str) -> list[tuple[str, str | None]]:
    """What a multi-host slice is made of, in the order it is created: (kind, region or zone)."""
    return [
        ("resource_policies", _region(zone)),
        ("instance_templates", None),
        ("instance_group_managers", zone),
    ]


#: kind (the service module's name) -> the compute_v1 client class, from compute_sdk's one list.
#: kind -> the keyword naming one resource in get/delete.
_NAME_FIELDS = {
    "instances": "instance",
    "instance_group_managers": "instance_group_manager",
    "instance_templates": "instance_template",
    "resource_policies": "resource_policy",
}
#: kind -> (insert's body keyword, its message class).
_RESOURCE_FIELDS = {
    "instances": ("instance_resource", "Instance"),
    "instance_group_managers": ("instance_group_manager_resource", "InstanceGroupManager"),
    "instance_templates": ("instance_template_resource", "InstanceTemplate"),
    "resource_policies": ("resource_policy_resource", "ResourcePolicy"),
}


def compute_request_id(request_id: str | None, kind: str, name: str) -> str | None:
    """The ``requestId`` of one insert of a create: Compute Engine wants a UUID and ignores a second
    request with an id it has seen (whatever it asked for), so each resource of a slice gets its own,
    derived from the create's request id, the kind and the name: a retry of the same insert sends the
    same id again."""
    if not request_id:
        return None
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"tpuctl:{request_id}/{kind}/{name}"))


def _region(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _int(value: object) -> int | None:
    try:
        return int(str(value)) if value not in (None, "") else None
    except ValueError:
        return None


def _message(cls: Any, body: Mapping[str, Any]) -> Any:
    """The compute_v1 message of a REST JSON body; an unknown field is a bug here, so it raises."""
    return cls.from_json(json.dumps(body), ignore_unknown_fields=False)
