"""``SurfaceRouter``: one ``TpuCloud`` over Google's two TPU surfaces, the Cloud TPU API and Compute Engine.

A create goes to the surface its request names (``NodeRequest.surface``, chosen where the placement
request is built); everything else about a slice goes to the surface it lives on. A slice's surface is
remembered from the create or listing that showed it; one never seen is looked for on the TPU API first,
then on Compute Engine (a slice's name is unique within a zone across both: tpuctl's names carry a
request id). Queued resources exist only on the TPU API. Listings are the union of both surfaces.
"""

from __future__ import annotations

import threading

from tpuctl.catalog import Surface
from tpuctl.cloud.base import (
    Node,
    NodeRequest,
    OperationProgress,
    PlannedRequest,
    QueuedResource,
    QueuedResourceRequest,
    QuotaLimit,
    TpuCloud,
)
from tpuctl.errors import NotFoundError


class SurfaceRouter:
    """See the module docstring. ``tpu`` answers for the backend, project and endpoint."""

    def __init__(self, tpu: TpuCloud, compute: TpuCloud) -> None:
        self._clouds = {Surface.TPU_API: tpu, Surface.COMPUTE: compute}
        self._tpu = tpu
        self._compute = compute
        self._known: dict[tuple[str, str], Surface] = {}
        self._lock = threading.Lock()

    @property
    def backend(self) -> str:
        return self._tpu.backend

    @property
    def project(self) -> str:
        return self._tpu.project

    @property
    def endpoint(self) -> str:
        return self._tpu.endpoint

    def close(self) -> None:
        self._compute.close()
        self._tpu.close()

    # --- where a slice lives ---------------------------------------------------------------------

    def _remember(self, zone: str, name: str, surface: Surface) -> None:
        with self._lock:
            self._known[(zone, name)] = surface

    def _known_surface(self, zone: str, name: str) -> Surface | None:
        with self._lock:
            return self._known.get((zone, name))

    def _on_slice(self, zone: str, name: str) -> tuple[Surface, Node]:
        """The surface holding the slice, and the slice: the remembered surface alone, else the TPU API
        first, then Compute Engine; NotFoundError from the last surface tried."""
        known = self._known_surface(zone, name)
        surfaces = [known] if known is not None else [Surface.TPU_API, Surface.COMPUTE]
        for i, surface in enumerate(surfaces):
            try:
                node = self._clouds[surface].get_node(zone, name)
            except NotFoundError:
                if i == len(surfaces) - 1:
                    raise
                continue
            self._remember(zone, name, surface)
            return surface, node
        raise NotFoundError(f"get node {name} in {zone}: not found", code=5)  # pragma: no cover

    def _surface_of(self, zone: str, name: str) -> Surface:
        """Where a slice lives, for a call that reads it itself (delete, stop, host keys): the remembered
        surface without asking, else found with one look-up."""
        return self._known_surface(zone, name) or self._on_slice(zone, name)[0]

    # --- slices ----------------------------------------------------------------------------------

    def list_nodes(self, zone: str | None = None) -> list[Node]:
        nodes: list[Node] = []
        for surface, cloud in self._clouds.items():
            for node in cloud.list_nodes(zone):
                self._remember(node.zone, node.name, surface)
                nodes.append(node)
        return nodes

    def get_node(self, zone: str, name: str) -> Node:
        return self._on_slice(zone, name)[1]

    def host_keys(self, zone: str, name: str) -> list[tuple[str, ...]]:
        surface = self._surface_of(zone, name)
        return self._clouds[surface].host_keys(zone, name)

    def create_node(
        self,
        request: NodeRequest,
        *,
        request_id: str | None = None,
        wait: bool = True,
        progress: OperationProgress | None = None,
    ) -> Node:
        self._remember(request.zone, request.name, request.surface)
        cloud = self._clouds[request.surface]
        return cloud.create_node(request, request_id=request_id, wait=wait, progress=progress)

    def delete_node(
        self, zone: str, name: str, *, wait: bool = True, progress: OperationProgress | None = None
    ) -> None:
        surface = self._surface_of(zone, name)
        self._clouds[surface].delete_node(zone, name, wait=wait, progress=progress)

    def stop_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        surface = self._surface_of(zone, name)
        return self._clouds[surface].stop_node(zone, name, wait=wait)

    def start_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        surface = self._surface_of(zone, name)
        return self._clouds[surface].start_node(zone, name, wait=wait)

    # --- queued resources: the TPU API's ---------------------------------------------------------

    def create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> QueuedResource:
        return self._tpu.create_queued_resource(request, request_id=request_id)

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        return self._tpu.get_queued_resource(zone, qr_id)

    def list_queued_resources(self, zone: str | None = None) -> list[QueuedResource]:
        return self._tpu.list_queued_resources(zone)

    def delete_queued_resource(
        self, zone: str, qr_id: str, *, force: bool = False, wait: bool = True, request_id: str | None = None
    ) -> None:
        self._tpu.delete_queued_resource(zone, qr_id, force=force, wait=wait, request_id=request_id)

    def reset_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        return self._tpu.reset_queued_resource(zone, qr_id)

    # --- catalog and quota -----------------------------------------------------------------------

    def list_accelerator_types(self, zone: str) -> list[str]:
        """What either surface offers in the zone. A zone one surface does not know (a Compute Engine
        only zone such as us-central1-ai1a on the TPU API) offers nothing there; NotFoundError only when
        neither knows it. The union does not say which surface offers a v6e or v5p type (both name it
        alike); a create on the other surface then answers for itself (not offered: a failover)."""
        names: set[str] = set()
        missing: list[NotFoundError] = []
        for cloud in (self._tpu, self._compute):
            try:
                names.update(cloud.list_accelerator_types(zone))
            except NotFoundError as exc:
                missing.append(exc)
        if len(missing) == 2:
            raise missing[0]
        return sorted(names)

    def list_runtime_versions(self, zone: str) -> list[str]:
        return self._tpu.list_runtime_versions(zone)

    def list_zones(self) -> list[str]:
        return sorted(set(self._tpu.list_zones()) | set(self._compute.list_zones()))

    def quota_limits(self) -> list[QuotaLimit]:
        return self._tpu.quota_limits() + self._compute.quota_limits()

    # --- dry-run plans ---------------------------------------------------------------------------

    def plan_create_node(
        self, request: NodeRequest, *, request_id: str | None = None
    ) -> list[PlannedRequest]:
        return self._clouds[request.surface].plan_create_node(request, request_id=request_id)

    def plan_create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> PlannedRequest:
        return self._tpu.plan_create_queued_resource(request, request_id=request_id)

    def plan_delete_node(self, zone: str, name: str) -> list[PlannedRequest]:
        surface = self._surface_of(zone, name)
        return self._clouds[surface].plan_delete_node(zone, name)

    def plan_delete_queued_resource(
        self, zone: str, qr_id: str, *, force: bool = False, request_id: str | None = None
    ) -> PlannedRequest:
        return self._tpu.plan_delete_queued_resource(zone, qr_id, force=force, request_id=request_id)
