"""`--queued` on Compute Engine is flex-start (docs/google-facts.md#flex-start): how the request is built and
checked, before anything is contacted."""

from __future__ import annotations

from typing import Any

import pytest

from tpuctl.catalog import CapacityType, Catalog, Surface
from tpuctl.errors import UsageError
from tpuctl.services.allocator import build_request
from tpuctl.services.attempts import node_request
from tpuctl.services.placement import Candidate, PlacementRequest, Strategy
from tpuctl.settings import Settings

ZONE = "us-central1-c"


def _build(type_name: str = "tpu7x-8", **kw: Any) -> PlacementRequest:
    return build_request(Catalog.load(), Settings(owner="t"), type_name, zones=(ZONE,), **kw)


def test_queued_on_compute_is_flex_start_as_preemptible_capacity_for_at_most_2h() -> None:
    req = _build(queued=True)
    assert req.flex_start and not req.uses_queued_resource
    assert req.capacity_types == (CapacityType.PREEMPTIBLE,)
    assert req.valid_for_s == 7200.0  # flex-start's own cap is the default
    assert _build(queued=True, valid_for_s=600.0).valid_for_s == 600.0


def test_queued_on_the_tpu_api_is_still_a_queued_resource() -> None:
    req = _build("v6e-8", queued=True, surface=Surface.TPU_API)
    assert req.uses_queued_resource and not req.flex_start and req.valid_for_s is None


def test_a_flex_node_request_carries_its_wait_and_a_plain_one_does_not() -> None:
    req = _build(queued=True, valid_for_s=900.0)
    cand = Candidate(
        zone=ZONE,
        capacity=CapacityType.PREEMPTIBLE,
        offered=True,
        price_per_chip_hour=None,
        price_per_hour=None,
        max_price=None,
        quota=(),
        rejection=None,
        reason=None,
    )
    assert node_request(req, cand, "rid").flex_valid_for_s == 900.0
    assert node_request(_build(), cand, "rid").flex_valid_for_s is None


@pytest.mark.parametrize(
    ("kw", "field", "named"),
    [
        ({"slices": 2}, "slices", "--slices"),
        ({"strategy": Strategy.RACE}, "strategy", "--strategy race"),
        ({"queued": True, "valid_for_s": 3 * 3600.0}, "valid_for", "--valid-for"),
        ({"queued": True, "reserved": "r1"}, "capacity_types", "reservation"),
    ],
)
def test_what_flex_start_cannot_do_is_refused_by_name(kw: dict[str, Any], field: str, named: str) -> None:
    with pytest.raises(UsageError) as caught:
        _build(**kw)
    assert caught.value.field == field and named in str(caught.value)
