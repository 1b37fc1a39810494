"""Decision tables: for a world and a request, the zone and capacity type the allocator ends up in and the
status and reason of every other candidate, asserted exactly. Against the real simulator through the real
TpuApiCloud client."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from allocator_helpers import InProcessEnv

from tpuctl.store.records import AttemptOutcome

V5E16_Z = "TPUV5sLitepodPerProjectPerZoneForTPUAPI"
V5E16_R = "TPUV5sLitepodPerProjectPerRegionForTPUAPI"
SPOT_Z = "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"
SPOT_R = "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI"


@dataclass
class Case:
    id: str
    world: dict[str, Any]
    flags: dict[str, Any]
    placed: tuple[str, str]  # zone, capacity the slice ends up in
    # candidate key "zone/capacity" -> (status, reason) in the plan
    table: dict[str, tuple[str, str]]
    stockouts: list[str] = field(default_factory=list)
    attempts: list[tuple[str, str, AttemptOutcome]] = field(default_factory=list)


CASES = [
    Case(
        id="cheapest-stocked-out-fails-over-to-next-cheapest",
        world={
            "zones": {
                "us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}},
                "us-west4-a": {"v5e": {"on_demand": 64, "preemptible": 64}},
                "us-east5-b": {"v5e": {"on_demand": 64, "preemptible": 64}},
                "us-central1-b": {"v6e": {"on_demand": 64, "preemptible": 64}},
            }
        },
        flags={"zones": ["us-central1-a", "us-west4-a", "us-east5-b", "us-central1-b"], "spot": True},
        stockouts=["us-central1-a"],
        placed=("us-west4-a", "spot"),
        table={
            "us-central1-a/spot": (
                "chosen",
                "cheapest feasible candidate (3.92 USD/h); 2 fallback(s) if it is stocked out",
            ),
            "us-west4-a/spot": (
                "fallback",
                "feasible, tried in rank 2 if the ones before fail, +3.76 USD/h vs the chosen",
            ),
            "us-east5-b/spot": (
                "fallback",
                "feasible, tried in rank 3 if the ones before fail, +5.68 USD/h vs the chosen",
            ),
            "us-central1-b/spot": (
                "rejected",
                "v5litepod-16 is not offered in zone us-central1-b",
            ),
        },
        attempts=[
            ("us-central1-a", "spot", AttemptOutcome.STOCKOUT),
            ("us-west4-a", "spot", AttemptOutcome.CREATED),
        ],
    ),
    Case(
        id="spot-quota-exhausted-on-demand-allowed",
        world={
            "zones": {
                "us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}},
                "us-east5-b": {"v5e": {"on_demand": 64, "preemptible": 64}},
            },
            "quotas": {"default": {"preemptible": {"zone": 8, "region": 512}}},
        },
        flags={"zones": ["us-central1-a", "us-east5-b"], "capacity_types": ["spot", "on-demand"]},
        placed=("us-central1-a", "on-demand"),
        table={
            # Equal on-demand prices (1.20/chip-h in both regions) and equal quota headroom: the tie
            # goes to the zone name.
            "us-central1-a/on-demand": (
                "chosen",
                "cheapest feasible candidate (19.20 USD/h); 1 fallback(s) if it is stocked out",
            ),
            "us-east5-b/on-demand": (
                "fallback",
                "feasible, tried in rank 2 if the ones before fail, +0.00 USD/h vs the chosen",
            ),
            "us-central1-a/spot": (
                "rejected",
                f"zone quota {SPOT_Z} in zone us-central1-a: needs 16 chips, 8 available (limit 8, 0 in use)",
            ),
            "us-east5-b/spot": (
                "rejected",
                f"zone quota {SPOT_Z} in zone us-east5-b: needs 16 chips, 8 available (limit 8, 0 in use)",
            ),
        },
        attempts=[("us-central1-a", "on-demand", AttemptOutcome.CREATED)],
    ),
    Case(
        id="zone-quota-fits-region-quota-does-not",
        world={
            "zones": {
                "us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}},
                "asia-northeast1-b": {"v5e": {"on_demand": 64, "preemptible": 64}},
            },
            "quotas": {
                "overrides": [
                    {"generation": "v5e", "capacity": "preemptible", "location": "us-central1", "limit": 8}
                ]
            },
        },
        flags={"zones": ["us-central1-a", "asia-northeast1-b"], "spot": True},
        placed=("asia-northeast1-b", "spot"),
        table={
            "asia-northeast1-b/spot": ("chosen", "the only feasible candidate (6.78 USD/h)"),
            "us-central1-a/spot": (
                "rejected",
                f"region quota {SPOT_R} in region us-central1: needs 16 chips, 8 available "
                "(limit 8, 0 in use)",
            ),
        },
        attempts=[("asia-northeast1-b", "spot", AttemptOutcome.CREATED)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decision_table(in_process_sim: Callable[..., InProcessEnv], case: Case) -> None:
    env = in_process_sim(**case.world)
    for zone in case.stockouts:
        env.admin.stockout(zone)
    allocator = env.allocator()
    request = env.request("v5e-16", **case.flags)
    plan = allocator.plan(request)
    assert plan.feasible
    got = {}
    for c in plan.candidates:
        data = plan.candidate_dict(c)
        got[f"{c.zone}/{c.capacity.value}"] = (data["status"], data["reason"])
    assert got == case.table

    placement = allocator.place(request, plan=plan)

    assert (placement.candidate.zone, placement.candidate.capacity.value) == case.placed
    ledger = env.session().ledger
    recorded = [
        (a.zone, a.capacity.value if a.capacity else None, a.outcome)
        for a in ledger.attempts(request.request_id)
    ]
    assert recorded == case.attempts
    nodes = env.session().cloud.list_nodes(None)
    assert [(n.name, n.zone, n.state) for n in nodes] == [(request.name, case.placed[0], "READY")]


def test_preempted_slices_holding_quota_are_reported(in_process_sim: Callable[..., InProcessEnv]) -> None:
    env = in_process_sim(
        zones={
            "us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}},
            "us-west4-a": {"v5e": {"on_demand": 64, "preemptible": 64}},
        },
        quotas={"default": {"preemptible": {"zone": 16, "region": 512}}},
    )
    allocator = env.allocator()
    first = allocator.place(env.request("v5e-16", zones=["us-central1-a"], spot=True, name="old"))
    assert first.candidate.zone == "us-central1-a"
    env.admin.preempt("us-central1-a", "old", notice=False)

    request = env.request("v5e-16", zones=["us-central1-a", "us-west4-a"], spot=True, name="new")
    plan = allocator.plan(request)

    reasons = {f"{c.zone}/{c.capacity.value}": plan.candidate_dict(c)["reason"] for c in plan.candidates}
    assert reasons["us-central1-a/spot"] == (
        f"zone quota {SPOT_Z} in zone us-central1-a: needs 16 chips, 0 available (limit 16, 16 in use), "
        "16 of them held by preempted/failed slices that `tpuctl pod gc` frees"
    )
    assert plan.chosen is not None and plan.chosen.zone == "us-west4-a"
    check = next(q for q in plan.candidates[-1].quota if q.scope == "zone")
    assert (check.preempted_holding, check.reclaimable, check.reclaimable_holders) == (
        16,
        16,
        ("slice old (PREEMPTED, us-central1-a)",),
    )
    assert plan.warnings == [
        f"preempted or failed slices hold 16 chips of zone quota {SPOT_Z} in us-central1-a, which this "
        "request needs (16 chips, 0 available): slice old (PREEMPTED, us-central1-a); deleting them "
        "(`tpuctl pod gc`) would make room"
    ]


def test_quota_race_at_create_fails_over(in_process_sim: Callable[..., InProcessEnv]) -> None:
    """The plan saw room; by the time of the create something else took the quota: the 429 is an attempt
    with outcome quota, and the next candidate takes the request."""
    env = in_process_sim(quotas={"default": {"preemptible": {"zone": 16, "region": 512}}})
    session = env.session()
    allocator = env.allocator(session)
    request = env.request("v5e-16", session=session, zones=["us-central1-a", "us-west4-a"], spot=True)
    plan = allocator.plan(request)
    assert [c.zone for c in plan.order] == ["us-central1-a", "us-west4-a"]
    # Someone else takes the zone's whole spot quota between the plan and the create.
    thief = env.request("v5e-16", session=session, zones=["us-central1-a"], spot=True, name="thief")
    allocator.place(thief)

    placement = allocator.place(request, plan=plan)

    assert placement.candidate.zone == "us-west4-a"
    first, second = placement.attempts
    assert (first.zone, first.outcome) == ("us-central1-a", AttemptOutcome.QUOTA)
    assert f"Quota limit '{SPOT_Z}' has been exceeded" in first.message
    assert (second.zone, second.outcome) == ("us-west4-a", AttemptOutcome.CREATED)
    names = sorted((n.name, n.zone) for n in session.cloud.list_nodes(None))
    assert names == sorted([("thief", "us-central1-a"), (request.name, "us-west4-a")])
