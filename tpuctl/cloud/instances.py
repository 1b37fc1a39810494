"""General-purpose Compute Engine VMs (the team server's): create one from an exact ``instances.insert``
body, read it, delete it, each mutation waited on through its zone operation; and the SSH host keys its
guest agent publishes. Over google-cloud-compute (REST), at Google's endpoint or a simulator's, with the
``CloudConfig`` its backend gives (``Backend.open_instances``); Google's errors are translated here, at the
boundary, as everywhere in ``tpuctl.cloud``.

As in ``tpuctl.cloud.compute``: mutations use the ``*_unary`` forms and the operation is polled with a
client built on the same endpoint (the library's own poller would ask compute.googleapis.com); messages
cross this module's edge as their REST JSON, so the body sent is the one ``--dry-run`` prints.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.compute import compute_request_id, wait_operation
from tpuctl.cloud.compute_sdk import ComputeClients, compute_v1, to_json
from tpuctl.cloud.google_calls import GoogleCalls
from tpuctl.errors import NotFoundError

if TYPE_CHECKING:
    from tpuctl.cloud.config import CloudConfig


@dataclass(frozen=True)
class VmInstance:
    """One VM as ``instances.get`` describes it, in the terms tpuctl uses."""

    name: str
    zone: str
    status: str  # PROVISIONING, STAGING, RUNNING, STOPPING, STOPPED, TERMINATED, ...
    machine_type: str  # the short name, e.g. e2-small
    internal_ip: str | None
    external_ip: str | None
    metadata: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str | None:
        """Where SSH reaches it: its external IP where it has one, else its internal IP (as for slices)."""
        return self.external_ip or self.internal_ip

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "zone": self.zone,
            "status": self.status,
            "machine_type": self.machine_type,
            "internal_ip": self.internal_ip,
            "external_ip": self.external_ip,
            "labels": dict(self.labels),
        }


def vm_of(body: Mapping[str, Any], zone: str) -> VmInstance:
    """The ``VmInstance`` of an instance's REST JSON."""
    nics = body.get("networkInterfaces") or [{}]
    access = (nics[0].get("accessConfigs") or [{}])[0]
    items = (body.get("metadata") or {}).get("items") or []
    return VmInstance(
        name=str(body.get("name", "")),
        zone=zone,
        status=str(body.get("status", "")),
        machine_type=str(body.get("machineType", "")).rsplit("/", 1)[-1],
        internal_ip=nics[0].get("networkIP") or None,
        external_ip=access.get("natIP") or None,
        metadata={str(i["key"]): str(i.get("value", "")) for i in items if "key" in i},
        labels=dict(body.get("labels") or {}),
    )


class InstanceClient:
    """Compute Engine's ``instances`` and ``zoneOperations`` of one project at one endpoint."""

    def __init__(self, *, project: str, endpoint: str, config: CloudConfig) -> None:
        self._project = project
        self._endpoint = endpoint.rstrip("/")
        self._config = config
        self._calls = GoogleCalls(config.retry, config.sleep)
        self._clients = ComputeClients(self._endpoint, config)

    @property
    def project(self) -> str:
        return self._project

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def close(self) -> None:
        self._clients.close()

    def create(self, zone: str, body: Mapping[str, Any], *, request_id: str | None = None) -> VmInstance:
        """``instances.insert`` of ``body`` as given, waited on until its operation is DONE; the VM as it
        is then. With ``request_id`` a retried insert is not a second VM (Compute Engine's requestId)."""
        name = str(body["name"])
        sdk = compute_v1()
        request: dict[str, Any] = {
            "project": self._project,
            "zone": zone,
            "instance_resource": sdk.Instance.from_json(json.dumps(body), ignore_unknown_fields=False),
        }
        rid = compute_request_id(request_id, "instances", name)
        if rid:
            request["request_id"] = rid
        op = self._calls.mutate(
            "create instance",
            name,
            lambda: to_json(self._client("instances").insert_unary(request=request, timeout=self._timeout)),
            zone=zone,
            idempotent=rid is not None,
        )
        self._wait(op, f"create instance {name}", zone)
        return self.get(zone, name)

    def get(self, zone: str, name: str) -> VmInstance:
        """The VM; ``NotFoundError`` when there is none of that name in ``zone``."""

        def fetch() -> dict[str, Any]:
            client = self._client("instances")
            return to_json(client.get(project=self._project, zone=zone, instance=name, timeout=self._timeout))

        return vm_of(self._calls.read("get instance", f"{name} in {zone}", fetch), zone)

    def find(self, zone: str, name: str) -> VmInstance | None:
        """The VM, None when there is none."""
        try:
            return self.get(zone, name)
        except NotFoundError:
            return None

    def delete(self, zone: str, name: str) -> None:
        """``instances.delete``, waited on; ``NotFoundError`` when there is no such VM."""
        op = self._calls.mutate(
            "delete instance",
            name,
            lambda: to_json(
                self._client("instances").delete_unary(
                    project=self._project, zone=zone, instance=name, timeout=self._timeout
                )
            ),
            zone=zone,
            idempotent=True,  # a repeat finds it gone (NotFoundError)
        )
        self._wait(op, f"delete instance {name}", zone)

    def host_keys(self, zone: str, name: str) -> tuple[str, ...]:
        """The VM's SSH host keys as its guest agent publishes them (guest attributes, ``hostkeys/``;
        https://cloud.google.com/compute/docs/connect/verify-host-keys); empty until it has."""

        def fetch() -> dict[str, Any]:
            request = {"project": self._project, "zone": zone, "instance": name, "query_path": "hostkeys/"}
            client = self._client("instances")
            return to_json(client.get_guest_attributes(request=request, timeout=self._timeout))

        try:
            attrs = self._calls.read("get guest attributes", f"{name} in {zone}", fetch)
        except NotFoundError:
            return ()
        items = (attrs.get("queryValue") or {}).get("items") or []
        return tuple(
            f"{i['key']} {i['value']}"
            for i in items
            if i.get("namespace") == "hostkeys" and i.get("key") and i.get("value")
        )

    # --- calls -----------------------------------------------------------------------------------

    @property
    def _timeout(self) -> float:
        return self._config.request_timeout_s  # passed to every call: the library sets none

    def _client(self, kind: str) -> Any:
        return self._clients.get(kind)

    def _wait(self, op: dict[str, Any], what: str, zone: str) -> None:
        wait_operation(self._client, self._config, self._project, op, what, zone)
