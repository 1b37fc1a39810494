"""The surface router: a create goes where its request says; a slice is read, deleted and planned on the
surface it lives on, found once and remembered; a surface the caller may not see is left out with a
note, and a view asks only the surfaces it is given."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tpuctl.catalog import CapacityType, Surface
from tpuctl.cloud.base import Node, NodeRequest, PlannedRequest, TpuCloud
from tpuctl.cloud.surfaces import SurfaceRouter, asking_only, notes_of
from tpuctl.errors import NotFoundError, PermissionDeniedError


class OneSurface:
    """Just enough of a TpuCloud: slices by (zone, name), and a log of the calls made."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.nodes: dict[tuple[str, str], Node] = {}
        self.calls: list[str] = []
        self.refused: str | None = None  # the permission every call lacks, as a 403 says it

    def _check(self) -> None:
        if self.refused is not None:
            raise PermissionDeniedError(
                f"{self.label}: denied", code=7, permission=self.refused, role="roles/compute.admin"
            )

    def get_node(self, zone: str, name: str) -> Node:
        self.calls.append(f"get {name}")
        self._check()
        try:
            return self.nodes[(zone, name)]
        except KeyError:
            raise NotFoundError(f"{self.label}: {name} not found", code=5) from None

    def list_nodes(self, zone: str | None = None) -> list[Node]:
        self.calls.append("list")
        self._check()
        return [n for (z, _), n in self.nodes.items() if zone in (None, z)]

    def list_accelerator_types(self, zone: str) -> list[str]:
        self.calls.append(f"types {zone}")
        self._check()
        return [f"{self.label}-type"]

    def list_queued_resources(self, zone: str | None = None) -> list[Any]:
        self.calls.append("queued")
        return []

    def create_node(self, request: NodeRequest, **_: Any) -> Node:
        self.calls.append(f"create {request.name}")
        node = Node(request.name, request.zone, request.accelerator_type, "READY", request.capacity)
        self.nodes[(request.zone, request.name)] = node
        return node

    def delete_node(self, zone: str, name: str, **_: Any) -> None:
        self.calls.append(f"delete {name}")
        del self.nodes[(zone, name)]

    def plan_delete_node(self, zone: str, name: str) -> list[PlannedRequest]:
        return [PlannedRequest("DELETE", f"{self.label}/{name}")]


def router() -> tuple[SurfaceRouter, OneSurface, OneSurface]:
    tpu, compute = OneSurface("tpu"), OneSurface("compute")
    return SurfaceRouter(cast(TpuCloud, tpu), cast(TpuCloud, compute)), tpu, compute


def request(name: str, surface: Surface) -> NodeRequest:
    return NodeRequest(name, "us-central1-c", "tpu7x-8", "img", CapacityType.SPOT, surface=surface)


def test_a_create_goes_to_its_surface_and_the_slice_is_then_read_there_only() -> None:
    r, tpu, compute = router()
    r.create_node(request("ce", Surface.COMPUTE))
    assert compute.calls == ["create ce"] and tpu.calls == []
    assert r.get_node("us-central1-c", "ce").name == "ce"
    assert tpu.calls == []  # remembered: no miss on the TPU API first
    assert r.plan_delete_node("us-central1-c", "ce") == [PlannedRequest("DELETE", "compute/ce")]
    r.delete_node("us-central1-c", "ce")
    assert compute.calls[-1] == "delete ce"


def test_a_slice_never_seen_is_looked_for_on_the_tpu_api_then_on_compute_engine() -> None:
    r, tpu, compute = router()
    compute.create_node(request("other", Surface.COMPUTE))
    assert r.get_node("us-central1-c", "other").name == "other"
    assert tpu.calls == ["get other"] and compute.calls[-1] == "get other"
    with pytest.raises(NotFoundError, match="compute: nowhere not found"):
        r.get_node("us-central1-c", "nowhere")


def test_a_listing_is_both_surfaces_and_teaches_where_each_slice_lives() -> None:
    r, tpu, compute = router()
    tpu.create_node(request("old", Surface.TPU_API))
    compute.create_node(request("new", Surface.COMPUTE))
    assert sorted(n.name for n in r.list_nodes()) == ["new", "old"]
    tpu.calls.clear()
    r.get_node("us-central1-c", "new")
    assert tpu.calls == []


def test_a_listing_one_surface_refuses_lists_the_other_with_a_note() -> None:
    r, tpu, compute = router()
    tpu.create_node(request("mine", Surface.TPU_API))
    compute.refused = "compute.instances.list"
    assert [n.name for n in r.list_nodes()] == ["mine"]
    assert r.list_accelerator_types("us-central1-c") == ["tpu-type"]
    why = "no permission (compute.instances.list, which roles/compute.admin holds)"
    assert notes_of(r) == (
        f"Compute Engine slices not listed: {why}",
        f"Compute Engine accelerator types in us-central1-c not listed: {why}",
    )
    # Not found where it may look and refused where it may not: not found, with the note.
    with pytest.raises(NotFoundError):
        r.get_node("us-central1-c", "nowhere")
    tpu.refused = "tpu.nodes.list"
    with pytest.raises(PermissionDeniedError):  # every surface refused: the refusal stands
        r.list_nodes()


def test_a_view_asks_only_its_surfaces_and_shares_what_the_router_learnt() -> None:
    r, tpu, compute = router()
    compute.create_node(request("ce", Surface.COMPUTE))
    tpu_only = asking_only(cast(TpuCloud, r), [Surface.TPU_API])
    assert tpu_only.list_nodes() == [] and tpu_only.list_queued_resources() == []
    assert compute.calls == ["create ce"]  # the view never asked Compute Engine
    compute_only = asking_only(cast(TpuCloud, r), [Surface.COMPUTE])
    asked = list(tpu.calls)
    assert compute_only.list_queued_resources() == [] and tpu.calls == asked  # the TPU API's own
    compute.refused = "compute.instances.list"
    with pytest.raises(PermissionDeniedError):  # its one surface refused
        compute_only.list_nodes()
    compute_only.close()  # a view closes nothing of the router's
    assert notes_of(compute_only) == notes_of(r) == ()
