"""The slices a placement made, as `pod list` shows them, each with its slice index and request id: what
`pod create` answers, here and through a server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuctl.services.attempts import Placement
    from tpuctl.services.session import Session


def placed_views(sess: Session, placement: Placement) -> list[dict[str, Any]]:
    """The placed slices as `pod list` shows them (as the placement recorded them where the listing does
    not have them yet), each with its slice index."""
    from tpuctl.services.pods import PodService

    by_name = {d["name"]: d for d in placement.to_dict()["pods"]}
    views: list[dict[str, Any]] = []
    pods = PodService(sess).list(placement.candidate.zone, surfaces=(placement.request.surface,))
    listed = {(v.zone, v.name): v for v in pods}
    for name, pod in by_name.items():
        view = listed.get((placement.candidate.zone, name))
        data = view.to_dict() if view is not None else dict(pod)
        data["slice_index"] = pod["slice_index"]
        data["request_id"] = placement.request.request_id
        views.append(data)
    return views
