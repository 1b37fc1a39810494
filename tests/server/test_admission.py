"""Admission decisions: the queue's order (band, month spend, age), the exact reasons a run waits, no
back-filling past a blocked run, and the runs refused at submission because they can never fit."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.errors import EXIT_INFEASIBLE
from tpuctl.server.admission import Admission, Demand, never_fits, order_key
from tpuctl.services.cost.monthly_spend import MonthSpend, Spend
from tpuctl.store.queue import QueueSnapshot
from tpuctl.store.records import RunRecord, RunStatus
from tpuctl.teams.workspaces import Workspaces

WORKSPACES = Workspaces.model_validate(
    {
        "workspaces": {
            "team-a": {"chips": {"v5e": 32}, "usd_per_month": 50, "zones": ["us-west4-a"]},
            "team-b": {"chips": {"v5e": {"total": 16, "on-demand": 0}}, "usd_per_month": 100},
        }
    }
)
CATALOG = Catalog.load()
NOVEMBER = MonthSpend("2026-11")


def run(
    run_id: str,
    *,
    status: RunStatus = RunStatus.QUEUED,
    workspace: str = "team-a",
    principal: str = "a1@example.com",
    accelerator_type: str = "v5litepod-16",
    capacity: CapacityType = CapacityType.SPOT,
    priority: str | None = None,
    queued_at: float = 1000.0,
) -> RunRecord:
    return RunRecord(
        run_id=run_id, script="train.py", args=(), status=status, pod=None, zone=None,
        accelerator_type=accelerator_type, capacity=capacity, created_at=queued_at, ended_at=None,
        exit_code=None, restarts=0, preemptions=0, steps=0, labels={}, detail={"slices": 1},
        updated_at=queued_at, principal=principal, workspace=workspace, priority=priority,
        queued_at=queued_at if status is RunStatus.QUEUED else None, admitted_at=None,
        queue_reason="submitted" if status is RunStatus.QUEUED else None,
    )  # fmt: skip


def decide(
    waiting: list[RunRecord], holding: Sequence[RunRecord] = (), spend: MonthSpend = NOVEMBER, room: int = 10
) -> tuple[tuple[str, ...], dict[str, str]]:
    decision = Admission(WORKSPACES, CATALOG, spend, room=room).decide(
        QueueSnapshot(tuple(waiting), tuple(holding), now=2000.0)
    )
    return decision.admit, decision.reasons


def test_the_cheaper_spender_goes_first_when_room_appears() -> None:
    """Two batch runs of a user who spent more this month, one of a user who spent less (submitted
    last): room for one, and it is the cheaper spender's."""
    spend = MonthSpend(
        "2026-11",
        by_principal={
            ("team-a", "big@example.com"): Spend(12.0),
            ("team-a", "small@example.com"): Spend(3.0),
        },
    )
    waiting = [
        run("big-1", principal="big@example.com", queued_at=1.0),
        run("big-2", principal="big@example.com", queued_at=2.0),
        run("small-1", principal="small@example.com", queued_at=3.0),
    ]
    admit, reasons = decide(waiting, holding=[run("held", status=RunStatus.RUNNING)], spend=spend)
    assert admit == ("small-1",)
    assert reasons["big-1"] == "workspace team-a: 32 of 32 v5e chips in use"
    assert reasons["big-2"] == "workspace team-a: 32 of 32 v5e chips in use"


def test_order_is_band_then_workspace_share_then_user_spend_then_age() -> None:
    spend = MonthSpend(
        "2026-11",
        by_workspace={
            "team-a": Spend(25.0),
            "team-b": Spend(25.0),
        },  # half of team-a's 50, a quarter of team-b's 100
        by_principal={("team-a", "rich@example.com"): Spend(20.0)},
    )
    runs = [
        run("a-old", queued_at=1.0),
        run("a-rich", principal="rich@example.com", queued_at=0.5),
        run("a-new", queued_at=2.0),
        run("b", workspace="team-b", principal="b1@example.com", queued_at=3.0),
        run("a-prod", priority="production", queued_at=9.0),
        run("a-inter", priority="interactive", queued_at=8.0),
    ]
    ordered = sorted(runs, key=lambda r: order_key(r, WORKSPACES, spend))
    assert [r.run_id for r in ordered] == ["a-prod", "a-inter", "b", "a-old", "a-new", "a-rich"]


def test_the_third_of_three_waits_with_the_exact_reason() -> None:
    admit, reasons = decide([run("r1", queued_at=1.0), run("r2", queued_at=2.0), run("r3", queued_at=3.0)])
    assert admit == ("r1", "r2")
    assert reasons == {"r3": "workspace team-a: 32 of 32 v5e chips in use"}


def test_a_run_behind_a_blocked_one_of_its_workspace_and_generation_waits_behind_it() -> None:
    """No back-filling: a v5e-4 that would fit waits behind the v5e-32 ahead of it."""
    admit, reasons = decide(
        [
            run("big", accelerator_type="v5litepod-32", queued_at=1.0),
            run("small", accelerator_type="v5litepod-4"),
        ],
        holding=[run("held", status=RunStatus.RUNNING, accelerator_type="v5litepod-8")],
    )
    assert admit == ()
    assert reasons == {
        "big": "workspace team-a: 8 of 32 v5e chips in use, the run needs 32",
        "small": "behind run big (ahead of it in the queue)",
    }


def test_a_workspace_over_its_monthly_budget_waits() -> None:
    spend = MonthSpend("2026-11", by_workspace={"team-a": Spend(50.0)})
    admit, reasons = decide([run("r1")], spend=spend)
    assert admit == ()
    assert reasons == {"r1": "workspace team-a: 50.00 of 50.00 USD spent this month (2026-11, UTC)"}


def test_a_capacity_type_limit_counts_only_that_type() -> None:
    workspaces = Workspaces.model_validate(
        {"workspaces": {"team-a": {"chips": {"v6e": {"total": 16, "spot": 8}}}}}
    )
    waiting = [
        run("spot", accelerator_type="v6e-8", queued_at=1.0),
        run("spot-2", accelerator_type="v6e-8", queued_at=2.0),
    ]
    decision = Admission(workspaces, CATALOG, NOVEMBER, room=10).decide(
        QueueSnapshot(tuple(waiting), (), 0.0)
    )
    assert decision.admit == ("spot",)
    assert decision.reasons == {"spot-2": "workspace team-a: 8 of 8 spot v6e chips in use"}


def test_a_workspace_not_in_the_file_waits_and_says_so() -> None:
    admit, reasons = decide([run("r1", workspace="gone")])
    assert admit == () and reasons == {"r1": "workspace gone is not in the server's workspace file"}


NEVER: dict[str, tuple[str, Demand]] = {
    "the run needs 64 v5e chips, more than workspace team-a may ever hold at once (32)": (
        "team-a", Demand("v5e", 64),
    ),
    "workspace team-a may not use v6e chips (its limit is 0)": ("team-a", Demand("v6e", 8)),
    "workspace team-b may not use on-demand v5e chips (its limit is 0)": (
        "team-b", Demand("v5e", 4, CapacityType.ON_DEMAND),
    ),
    "workspace team-a may not use zone us-central1-a (its zones: us-west4-a)": (
        "team-a", Demand("v5e", 4, zone="us-central1-a"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("message", sorted(NEVER))
def test_what_can_never_fit_is_refused_naming_the_limit(message: str) -> None:
    workspace, demand = NEVER[message]
    ws = WORKSPACES.get(workspace)
    assert ws is not None
    refusal = never_fits(ws, demand)
    assert refusal is not None
    assert (refusal.message, refusal.exit_code) == (message, EXIT_INFEASIBLE)
    assert refusal.fix is not None and "workspace file" in refusal.fix


def test_what_could_fit_some_day_is_not_refused() -> None:
    ws = WORKSPACES.get("team-a")
    assert ws is not None
    assert never_fits(ws, Demand("v5e", 32, CapacityType.SPOT, "us-west4-a")) is None
    assert never_fits(Workspaces.implicit().workspaces["default"], Demand("v5p", 4096)) is None
