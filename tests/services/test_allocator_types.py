"""A request of several slice types: every type x zone x capacity candidate judged and ranked in one plan
(by price, or the user's order first), and placement failing over from one type to the next as it does
from one zone to the next. Against the simulator in this process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from allocator_helpers import InProcessEnv

from tpuctl.catalog import Catalog, Surface
from tpuctl.errors import UsageError
from tpuctl.services.allocator import build_request
from tpuctl.services.placement import TypePreference
from tpuctl.settings import Settings
from tpuctl.store.records import AttemptOutcome

ZONES = ["us-central1-a", "us-east1-d", "us-east5-b"]
#: v5e in us-central1-a, v6e in us-east1-d, both in us-east5-b. Spot prices for the whole request:
#: v5e-16 3.92 (us-central1-a) and 9.60 (us-east5-b); v6e-8 4.352 (us-east1-d) and 9.72 (us-east5-b).
WORLD: dict[str, Any] = {
    "zones": {
        "us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}},
        "us-east1-d": {"v6e": {"on_demand": 64, "preemptible": 64}},
        "us-east5-b": {
            "v5e": {"on_demand": 64, "preemptible": 64},
            "v6e": {"on_demand": 64, "preemptible": 64},
        },
    }
}
#: The same places with no v5e capacity left anywhere (every v5e create is a stockout).
NO_V5E: dict[str, Any] = {
    "zones": {
        "us-central1-a": {"v5e": {"on_demand": 0, "preemptible": 0}},
        "us-east1-d": {"v6e": {"on_demand": 64, "preemptible": 64}},
        "us-east5-b": {
            "v5e": {"on_demand": 0, "preemptible": 0},
            "v6e": {"on_demand": 64, "preemptible": 64},
        },
    }
}


def _request(env: InProcessEnv, first: str, *others: str, preference: str = "cheapest") -> Any:
    return env.request(
        first, zones=ZONES, spot=True, other_types=others, type_preference=TypePreference(preference)
    )


def _order(plan: Any) -> list[tuple[str, str, float]]:
    return [(c.slice_type.accelerator.api_name, c.zone, round(c.price_per_hour, 3)) for c in plan.order]


def test_the_plan_ranks_every_type_zone_and_capacity_by_price_in_one_list(
    in_process_sim: Callable[..., InProcessEnv],
) -> None:
    env = in_process_sim(**WORLD)
    plan = env.allocator().plan(_request(env, "v5e-16", "v6e-8"))

    assert plan.feasible
    assert _order(plan) == [
        ("v5litepod-16", "us-central1-a", 3.92),
        ("v6e-8", "us-east1-d", 4.352),
        ("v5litepod-16", "us-east5-b", 9.6),
        ("v6e-8", "us-east5-b", 9.72),
    ]
    shown = plan.to_dict()
    assert shown["order"] == [
        "us-central1-a/spot/v5litepod-16",
        "us-east1-d/spot/v6e-8",
        "us-east5-b/spot/v5litepod-16",
        "us-east5-b/spot/v6e-8",
    ]
    assert [t["accelerator_type"] for t in shown["request"]["slice_types"]] == ["v5litepod-16", "v6e-8"]
    assert shown["request"]["type_preference"] == "cheapest"
    # Each type is judged in its own zones: v6e is not offered where only v5e is, and the other way round.
    rejected = {c["accelerator_type"] + "@" + c["zone"]: c["rejection"] for c in shown["candidates"]}
    assert rejected["v6e-8@us-central1-a"] == "not_offered"
    assert rejected["v5litepod-16@us-east1-d"] == "not_offered"
    assert shown["chosen"]["accelerator_type"] == "v5litepod-16"
    # What would be sent is of the chosen candidate's type.
    assert "v5litepod-16" in str(shown["requests"][0])


def test_ordered_keeps_the_users_order_before_price(in_process_sim: Callable[..., InProcessEnv]) -> None:
    env = in_process_sim(**WORLD)
    plan = env.allocator().plan(_request(env, "v6e-8", "v5e-16", preference="ordered"))

    assert _order(plan) == [
        ("v6e-8", "us-east1-d", 4.352),
        ("v6e-8", "us-east5-b", 9.72),
        ("v5litepod-16", "us-central1-a", 3.92),
        ("v5litepod-16", "us-east5-b", 9.6),
    ]
    chosen = plan.to_dict()["chosen"]
    assert chosen["reason"].startswith(
        "cheapest feasible candidate of the first type that has one (4.35 USD/h)"
    )
    # Cheapest, given in the same order, ranks by price alone.
    cheapest = env.allocator().plan(_request(env, "v6e-8", "v5e-16", preference="cheapest"))
    assert [c.zone for c in cheapest.order] == ["us-central1-a", "us-east1-d", "us-east5-b", "us-east5-b"]


def test_the_cheaper_type_stocked_out_everywhere_lands_on_the_other(
    in_process_sim: Callable[..., InProcessEnv],
) -> None:
    env = in_process_sim(**NO_V5E)
    allocator = env.allocator()
    request = _request(env, "v5e-16", "v6e-8")

    placement = allocator.place(request)

    assert placement.candidate.slice_type is not None
    assert placement.candidate.slice_type.accelerator.api_name == "v6e-8"
    assert placement.candidate.zone == "us-east1-d"
    assert placement.to_dict()["accelerator_type"] == "v6e-8"
    recorded = [(a.zone, a.outcome) for a in env.session().ledger.attempts(request.request_id)]
    assert recorded == [
        ("us-central1-a", AttemptOutcome.STOCKOUT),
        ("us-east1-d", AttemptOutcome.CREATED),
    ]
    nodes = env.session().cloud.list_nodes(None)
    assert [(n.name, n.zone, n.accelerator_type, n.state) for n in nodes] == [
        (request.name, "us-east1-d", "v6e-8", "READY")
    ]


def test_no_type_placeable_names_each_types_reason(in_process_sim: Callable[..., InProcessEnv]) -> None:
    env = in_process_sim(**WORLD)
    request = env.request("v5e-16", zones=["us-east1-d"], spot=True, other_types=("v6e-8",), max_price=1.0)
    plan = env.allocator().plan(request)

    assert not plan.feasible
    assert plan.message is not None
    assert plan.message.startswith("no slice type can take the request: v5e-16: v5litepod-16 is not offered")
    assert "; v6e-8: every priced candidate for v6e-8 is over the price cap of 1.00 USD/h" in plan.message


def _build(first: str, *others: str, **kw: Any) -> Any:
    return build_request(Catalog.load(), Settings(owner="t"), first, other_types=others, **kw)


def test_each_type_carries_its_own_api_and_runtime() -> None:
    request = _build("v6e-8", "tpu7x-8", "v6e-8", "v6e-8")  # repeats dropped

    types = request.slice_types
    assert [(t.accelerator.api_name, t.surface) for t in types] == [
        ("v6e-8", Surface.TPU_API),
        ("tpu7x-8", Surface.COMPUTE),
    ]
    assert types[0].runtime_version != types[1].runtime_version
    assert request.for_type(types[1]).surface is Surface.COMPUTE
    assert request.for_type(types[1]).other_types == ()


@pytest.mark.parametrize("flags", [{"queued": True}, {"slices": 2}])
def test_several_types_through_a_queued_resource_are_refused(flags: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match="several slice types") as info:
        _build("v5e-16", "v6e-8", **flags)
    assert info.value.field == "type"


def test_one_type_is_planned_as_before() -> None:
    request = _build("v5e-16")
    assert request.other_types == ()
    assert "slice_types" not in request.to_dict()
