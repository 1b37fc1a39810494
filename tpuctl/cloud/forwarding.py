"""A ``TpuCloud`` that hands every call to another one: the base of the wrappers that change a few calls
(a fenced supervisor's mutations, a server's shared node reads) and must pass the rest as they are."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.cloud.base import (
        HostIdentity,
        Node,
        NodeRequest,
        OperationProgress,
        PlannedRequest,
        QueuedResource,
        QueuedResourceRequest,
        QuotaLimit,
        TpuCloud,
    )


class ForwardingCloud:
    """Every ``TpuCloud`` call, as ``cloud`` answers it; a subclass overrides what it changes."""

    def __init__(self, cloud: TpuCloud) -> None:
        self._cloud = cloud

    @property
    def backend(self) -> str:
        return self._cloud.backend

    @property
    def project(self) -> str:
        return self._cloud.project

    @property
    def endpoint(self) -> str:
        return self._cloud.endpoint

    def list_nodes(self, zone: str | None = None) -> list[Node]:
        return self._cloud.list_nodes(zone)

    def get_node(self, zone: str, name: str) -> Node:
        return self._cloud.get_node(zone, name)

    def host_identities(self, zone: str, name: str) -> list[HostIdentity]:
        return self._cloud.host_identities(zone, name)

    def create_node(
        self,
        request: NodeRequest,
        *,
        request_id: str | None = None,
        wait: bool = True,
        progress: OperationProgress | None = None,
    ) -> Node:
        return self._cloud.create_node(request, request_id=request_id, wait=wait, progress=progress)

    def delete_node(
        self, zone: str, name: str, *, wait: bool = True, progress: OperationProgress | None = None
    ) -> None:
        self._cloud.delete_node(zone, name, wait=wait, progress=progress)

    def stop_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        return self._cloud.stop_node(zone, name, wait=wait)

    def start_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        return self._cloud.start_node(zone, name, wait=wait)

    def create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> QueuedResource:
        return self._cloud.create_queued_resource(request, request_id=request_id)

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        return self._cloud.get_queued_resource(zone, qr_id)

    def list_queued_resources(self, zone: str | None = None) -> list[QueuedResource]:
        return self._cloud.list_queued_resources(zone)

    def delete_queued_resource(
        self,
        zone: str,
        qr_id: str,
        *,
        force: bool = False,
        wait: bool = True,
        request_id: str | None = None,
    ) -> None:
        self._cloud.delete_queued_resource(zone, qr_id, force=force, wait=wait, request_id=request_id)

    def reset_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        return self._cloud.reset_queued_resource(zone, qr_id)

    def list_accelerator_types(self, zone: str) -> list[str]:
        return self._cloud.list_accelerator_types(zone)

    def list_runtime_versions(self, zone: str) -> list[str]:
        return self._cloud.list_runtime_versions(zone)

    def list_zones(self) -> list[str]:
        return self._cloud.list_zones()

    def quota_limits(self) -> list[QuotaLimit]:
        return self._cloud.quota_limits()

    def plan_create_node(
        self, request: NodeRequest, *, request_id: str | None = None
    ) -> list[PlannedRequest]:
        return self._cloud.plan_create_node(request, request_id=request_id)

    def plan_create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> PlannedRequest:
        return self._cloud.plan_create_queued_resource(request, request_id=request_id)

    def plan_delete_node(self, zone: str, name: str) -> list[PlannedRequest]:
        return self._cloud.plan_delete_node(zone, name)

    def plan_delete_queued_resource(
        self, zone: str, qr_id: str, *, force: bool = False, request_id: str | None = None
    ) -> PlannedRequest:
        return self._cloud.plan_delete_queued_resource(zone, qr_id, force=force, request_id=request_id)

    def close(self) -> None:
        self._cloud.close()
