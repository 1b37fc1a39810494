"""``SurfaceRouter``: one ``TpuCloud`` over Google's two TPU surfaces, the Cloud TPU API and Compute Engine.

A create goes to the surface its request names (``NodeRequest.surface``, chosen where the placement
request is built); everything else about a slice goes to the surface it lives on. A slice's surface is
remembered from the create or listing that showed it; one never seen is looked for on the TPU API first,
then on Compute Engine (a slice's name is unique within a zone across both: tpuctl's names carry a
request id). Queued resources exist only on the TPU API. Listings are the union of both surfaces.

Least privilege: a caller may hold roles on one surface only (roles/tpu.admin holds no Compute Engine
permission). So a request asks only the surfaces its generation can use (``asking_only``: v5e never asks
Compute Engine, TPU7x never the TPU API), and a listing that one surface refuses (403) lists the other's,
with a note of what it could not see (``notes``) instead of failing; it fails only when every surface it
asked refused.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from tpuctl.catalog import Surface
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
from tpuctl.errors import CloudError, NotFoundError, PermissionDeniedError

T = TypeVar("T")

_SURFACE_NAMES = {Surface.TPU_API: "Cloud TPU API", Surface.COMPUTE: "Compute Engine"}


def asking_only(cloud: TpuCloud, surfaces: Iterable[Surface]) -> TpuCloud:
    """``cloud`` asking only ``surfaces`` where it routes between surfaces (a cloud of one surface is
    already that)."""
    return cloud.only(surfaces) if isinstance(cloud, SurfaceRouter) else cloud


def notes_of(cloud: TpuCloud) -> tuple[str, ...]:
    """What ``cloud`` could not see so far (a surface that refused a listing), one line each."""
    return cloud.notes if isinstance(cloud, SurfaceRouter) else ()


class SurfaceRouter:
    """See the module docstring. ``tpu`` answers for the backend, project and endpoint."""

    def __init__(self, tpu: TpuCloud, compute: TpuCloud) -> None:
        self._clouds = {Surface.TPU_API: tpu, Surface.COMPUTE: compute}
        self._tpu = tpu
        self._compute = compute
        self._asked: tuple[Surface, ...] = (Surface.TPU_API, Surface.COMPUTE)
        self._owner = True
        # Shared with every view (``only``): what was learnt and what could not be seen.
        self._known: dict[tuple[str, str], Surface] = {}
        self._notes: list[str] = []
        self._lock = threading.Lock()

    def only(self, surfaces: Iterable[Surface]) -> SurfaceRouter:
        """A view of this router that lists, surveys and looks for slices on ``surfaces`` only (creates
        still go where their request says); it shares what this router remembers, and closing it closes
        nothing."""
        wanted = set(surfaces)
        view = copy.copy(self)
        view._asked = tuple(s for s in self._asked if s in wanted)
        view._owner = False
        return view

    @property
    def notes(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._notes)

    def _note(self, surface: Surface, what: str, exc: PermissionDeniedError) -> None:
        if exc.permission and exc.role:
            why = f"{exc.permission}, which {exc.role} holds"
        else:
            why = exc.permission or exc.fix or exc.message
        line = f"{_SURFACE_NAMES[surface]} {what} not listed: no permission ({why})"
        with self._lock:
            if line not in self._notes:
                self._notes.append(line)

    def _from_each(self, what: str, call: Callable[[Surface, TpuCloud], list[T]]) -> list[T]:
        """``call`` on every asked surface, joined; a surface that refuses (403) is noted, unless every
        one refused (then its error stands)."""
        joined: list[T] = []
        denied: list[tuple[Surface, PermissionDeniedError]] = []
        for surface in self._asked:
            try:
                joined.extend(call(surface, self._clouds[surface]))
            except PermissionDeniedError as exc:
                denied.append((surface, exc))
        if denied and len(denied) == len(self._asked):
            raise denied[0][1]
        for surface, refusal in denied:
            self._note(surface, what, refusal)
        return joined

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
        if self._owner:
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
        """The surface holding the slice, and the slice: the remembered surface alone, else each asked
        surface in turn (the TPU API first). Not found on one and refused by the next is not found (with
        a note); refused by every one is the refusal."""
        known = self._known_surface(zone, name)
        surfaces = [known] if known is not None else list(self._asked)
        missing: NotFoundError | None = None
        denied: list[tuple[Surface, PermissionDeniedError]] = []
        for surface in surfaces:
            try:
                node = self._clouds[surface].get_node(zone, name)
            except NotFoundError as exc:
                missing = exc  # the last surface's word, as it was asked last
                continue
            except PermissionDeniedError as exc:
                denied.append((surface, exc))
                continue
            self._remember(zone, name, surface)
            return surface, node
        if missing is None and denied:
            raise denied[0][1]
        for surface, refusal in denied:
            self._note(surface, "slices", refusal)
        raise missing or NotFoundError(f"get node {name} in {zone}: not found", code=5)

    def _surface_of(self, zone: str, name: str) -> Surface:
        """Where a slice lives, for a call that reads it itself (delete, stop, host keys): the remembered
        surface without asking, else found with one look-up."""
        return self._known_surface(zone, name) or self._on_slice(zone, name)[0]

    # --- slices ----------------------------------------------------------------------------------

    def list_nodes(self, zone: str | None = None) -> list[Node]:
        def listed(surface: Surface, cloud: TpuCloud) -> list[Node]:
            nodes = cloud.list_nodes(zone)
            for node in nodes:
                self._remember(node.zone, node.name, surface)
            return nodes

        return self._from_each("slices", listed)

    def get_node(self, zone: str, name: str) -> Node:
        return self._on_slice(zone, name)[1]

    def host_identities(self, zone: str, name: str) -> list[HostIdentity]:
        surface = self._surface_of(zone, name)
        return self._clouds[surface].host_identities(zone, name)

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
        return self._tpu.list_queued_resources(zone) if Surface.TPU_API in self._asked else []

    def delete_queued_resource(
        self, zone: str, qr_id: str, *, force: bool = False, wait: bool = True, request_id: str | None = None
    ) -> None:
        self._tpu.delete_queued_resource(zone, qr_id, force=force, wait=wait, request_id=request_id)

    def reset_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        return self._tpu.reset_queued_resource(zone, qr_id)

    # --- catalog and quota -----------------------------------------------------------------------

    def list_accelerator_types(self, zone: str) -> list[str]:
        """What the asked surfaces offer in the zone. A zone one surface does not know (a Compute Engine
        only zone such as us-central1-ai1a on the TPU API) offers nothing there; NotFoundError only when
        none knows it, and a refusal (403) only when every one refused. The union does not say which
        surface offers a v6e or v5p type (both name it alike): ask one surface (``only``) to know."""
        names: set[str] = set()
        failed: list[tuple[Surface, CloudError]] = []
        for surface in self._asked:
            try:
                names.update(self._clouds[surface].list_accelerator_types(zone))
            except (NotFoundError, PermissionDeniedError) as exc:
                failed.append((surface, exc))
        if failed and len(failed) == len(self._asked):
            refused = [exc for _, exc in failed if isinstance(exc, PermissionDeniedError)]
            raise refused[0] if refused else failed[0][1]
        for surface, error in failed:
            if isinstance(error, PermissionDeniedError):
                self._note(surface, f"accelerator types in {zone}", error)
        return sorted(names)

    def list_runtime_versions(self, zone: str) -> list[str]:
        return self._tpu.list_runtime_versions(zone) if Surface.TPU_API in self._asked else []

    def list_zones(self) -> list[str]:
        return sorted(set(self._from_each("zones", lambda _, cloud: cloud.list_zones())))

    def quota_limits(self) -> list[QuotaLimit]:
        return self._from_each("quota limits", lambda _, cloud: cloud.quota_limits())

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
