"""Budgets: the guard's decisions on a fake clock (stop before the next step would go over, warn once at
80 %, time limits), the guard rebuilt from the ledger across a preemption, the watch that stops a run,
the monthly budget warning, and bad input."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.errors import BudgetExceededError, RunFailedError, UsageError
from tpuctl.services.budget import (
    LABEL_MAX_SECONDS,
    Action,
    BudgetGuard,
    RunBudgetWatch,
    expired_slices,
    max_hours_labels,
    monthly_budget_warning,
    parse_budget,
    parse_hours,
    watch_run_budget,
)
from tpuctl.services.prices import PriceSource
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, RunStatus, SegmentKind
from tpuctl.testing.clock import FakeClock

T0 = 1_800_000_000.0
Z = "us-central1-a"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(tmp_path / "state") as led:
        yield led


# --- the guard ---------------------------------------------------------------------------------------


def test_stops_before_the_step_that_would_go_over(clock: FakeClock) -> None:
    # 36 USD/h = 1 cent a second; budget 50 USD; steps of 10 s (10 cents each).
    guard = BudgetGuard(limit_usd=50.0, clock=clock)
    guard.slice_started("s", 36.0)
    decisions = []
    while True:
        clock.advance(10)
        guard.observe_step(10)
        decision = guard.check()
        decisions.append(decision.action)
        if decision.action is Action.STOP:
            break
    # 500 steps reach exactly 50.0 (allowed); the 501st would bring it to 50.1: stop there.
    assert round(decision.spent_usd, 6) == 50.0
    assert round(decision.projected_usd, 6) == 50.1
    assert decision.spent_usd <= 50.0 + 1e-9  # never over
    assert 50.0 - decision.spent_usd <= 0.1  # within one step's cost of the limit
    assert decisions.count(Action.WARN) == 1
    assert decisions.index(Action.WARN) == 399  # 40.0 USD = 80 % after 400 steps
    assert guard.check().action is Action.STOP  # stays stopped


def test_exactly_reaching_the_limit_is_allowed(clock: FakeClock) -> None:
    guard = BudgetGuard(limit_usd=1.0, clock=clock)
    guard.slice_started("s", 3600.0)  # 1 USD a second
    clock.advance(0.5)
    assert guard.check(next_step_s=0.5).action is not Action.STOP  # 0.5 + 0.5 = 1.0: not over
    assert guard.check(next_step_s=0.6).action is Action.STOP


def test_margin_keeps_time_in_hand_for_stopping(clock: FakeClock) -> None:
    guard = BudgetGuard(limit_usd=10.0, clock=clock, margin_s=60)
    guard.slice_started("s", 360.0)  # 0.1 USD a second: the margin is worth 6 USD
    clock.advance(30)  # spent 3
    assert guard.check(next_step_s=5).action is Action.CONTINUE  # 3 + 0.5 + 6 = 9.5
    clock.advance(6)  # spent 3.6
    decision = guard.check(next_step_s=5)
    assert decision.action is Action.STOP  # 3.6 + 0.5 + 6 = 10.1
    assert "to stop" in decision.message


def test_spend_counts_ended_slices_and_earlier_segments(clock: FakeClock) -> None:
    guard = BudgetGuard(limit_usd=100.0, clock=clock, spent_before_usd=12.5)
    guard.slice_started("a", 7.2, at=T0)
    guard.slice_ended("a", at=T0 + 1800)  # 3.6 USD
    guard.slice_started("b", 36.0, at=T0 + 2000)
    clock.advance_to(T0 + 2000 + 100)  # 1 USD
    assert round(guard.spent(), 6) == 17.1
    assert guard.rate() == 36.0


def test_deadline_stops_before_running_past_it(clock: FakeClock) -> None:
    guard = BudgetGuard(clock=clock, deadline=T0 + 3600)
    guard.slice_started("s", 10.0, at=T0)
    clock.advance_to(T0 + 2880)  # 80 % of the hour
    assert guard.check(next_step_s=60).action is Action.WARN
    clock.advance_to(T0 + 3530)
    assert guard.check(next_step_s=60).action is Action.CONTINUE  # ends at 3590 s
    clock.advance_to(T0 + 3550)
    assert guard.check(next_step_s=60).action is Action.STOP  # would end at 3610 s


def test_a_runs_own_deadline_caps_the_slices_and_the_earlier_one_wins(clock: FakeClock) -> None:
    """``run --max-hours``: the run's deadline, counted from the run's start, beside a slice's label."""
    guard = BudgetGuard(clock=clock, deadline=T0 + 7200, deadline_start=T0)
    guard.cap_deadline(T0 + 3600, T0 - 600)  # the run started before its slice was READY
    assert (guard.deadline, guard.deadline_start) == (T0 + 3600, T0 - 600)
    guard.cap_deadline(T0 + 9000, T0)  # a later one changes nothing
    assert guard.deadline == T0 + 3600
    clock.advance_to(T0 + 3550)
    assert guard.check(next_step_s=60).action is Action.STOP  # no USD limit: the time alone stops it


def test_guard_refuses_a_bad_limit() -> None:
    with pytest.raises(ValueError):
        BudgetGuard(limit_usd=-1.0)


def test_decision_error_is_exit_7_with_the_figures(clock: FakeClock) -> None:
    guard = BudgetGuard(limit_usd=5.0, clock=clock)
    guard.slice_started("s", 3600.0)
    clock.advance(4.5)
    error = guard.check(next_step_s=1).error(run_id="r1")
    assert isinstance(error, BudgetExceededError)
    assert error.exit_code == 7
    assert "run r1" in error.message and "4.50 of 5.00 USD" in error.message


# --- from the ledger ---------------------------------------------------------------------------------


def _slice(ledger: Ledger, name: str, *, ready: float, run_id: str | None, end: float | None = None,
           labels: dict[str, str] | None = None) -> None:  # fmt: skip
    ledger.record_event(
        EventKind.REQUESTED, pod=name, zone=Z, accelerator_type="v5litepod-8", chips=8,
        capacity=CapacityType.SPOT, price_per_chip_hour=0.25, run_id=run_id, labels=labels, ts=ready - 60,
    )  # fmt: skip
    ledger.record_event(EventKind.READY, pod=name, zone=Z, ts=ready)
    if end is not None:
        ledger.record_event(EventKind.PREEMPTED, pod=name, zone=Z, ts=end)


def test_guard_for_a_run_sums_every_slice_across_preemptions(ledger: Ledger, clock: FakeClock) -> None:
    ledger.create_run("r", script="t.py", ts=T0 - 100)
    _slice(ledger, "r-0", ready=T0, run_id="r", end=T0 + 3600)  # 8 x 0.25 x 1 h = 2 USD
    _slice(ledger, "r-1", ready=T0 + 4000, run_id="r")  # 2 USD/h, running
    _slice(ledger, "other", ready=T0, run_id=None)
    clock.advance_to(T0 + 4000 + 1800)  # 1 USD so far on r-1

    guard = BudgetGuard.for_run(ledger, "r", Catalog.load(), limit_usd=3.5, clock=clock)

    assert round(guard.spent(), 6) == 3.0
    assert guard.rate() == 2.0
    assert guard.check(next_step_s=600).action is Action.WARN  # 3.0 >= 2.8, and 3.0 + 0.33 <= 3.5
    assert guard.check(next_step_s=1200).action is Action.STOP  # 3.0 + 0.67 > 3.5


def test_guard_for_a_run_on_an_existing_pod_bills_from_the_run_start(
    ledger: Ledger, clock: FakeClock
) -> None:
    _slice(ledger, "mine", ready=T0, run_id=None, labels={LABEL_MAX_SECONDS: "7200"})
    ledger.create_run("r", script="t.py", ts=T0 + 3600)
    ledger.add_segment("r", SegmentKind.RUNNING, start=T0 + 3600, pod="mine", zone=Z)
    clock.advance_to(T0 + 5400)

    guard = BudgetGuard.for_run(ledger, "r", Catalog.load(), limit_usd=None, clock=clock)

    assert round(guard.spent(), 6) == 1.0  # 30 min of the run at 2 USD/h, not the hour before it
    assert guard.deadline == T0 + 7200  # --max-hours 2 from READY
    assert guard.check(next_step_s=60).action is Action.CONTINUE  # 75 % of the slice's 2 h
    clock.advance_to(T0 + 5800)
    assert guard.check(next_step_s=60).action is Action.WARN
    clock.advance_to(T0 + 7190)
    assert guard.check(next_step_s=60).action is Action.STOP


def test_guard_for_a_run_on_an_existing_multislice_bills_every_slice_of_it(
    ledger: Ledger, clock: FakeClock
) -> None:
    # `pod create --slices 2 --name ms` made ms-0 and ms-1; the run's segments name the set, "ms".
    for name in ("ms-0", "ms-1"):
        _slice(ledger, name, ready=T0, run_id=None)
    _slice(ledger, "ms-other", ready=T0, run_id=None)  # not a slice of the set: no index
    ledger.create_run("r", script="t.py", ts=T0 + 3600)
    ledger.add_segment("r", SegmentKind.RUNNING, start=T0 + 3600, pod="ms", zone=Z)
    clock.advance_to(T0 + 5400)

    guard = BudgetGuard.for_run(ledger, "r", Catalog.load(), limit_usd=None, clock=clock)

    assert round(guard.spent(), 6) == 2.0  # 30 min of the run on each slice at 2 USD/h
    assert guard.rate() == 4.0


def test_watch_stops_the_run_once_and_turns_the_failure_into_a_budget_error(
    ledger: Ledger, clock: FakeClock
) -> None:
    ledger.create_run("r", script="t.py", ts=T0)
    _slice(ledger, "r-0", ready=T0, run_id="r")  # 2 USD/h
    stops: list[float] = []
    warnings: list[str] = []
    able = [False, True]  # the first stop finds no hosts yet; the second can act

    def stop() -> bool:
        stops.append(clock.now())
        return able.pop(0)

    catalog = Catalog.load()
    budget = watch_run_budget(
        ledger, "r", catalog, limit_usd=1.0, stop=stop, warn=warnings.append, poll_s=1, stop_margin_s=59,
        clock=clock, poll_thread=False,
    )  # fmt: skip
    with pytest.raises(BudgetExceededError) as err, budget as watch:
        assert isinstance(watch, RunBudgetWatch)
        clock.advance_to(T0 + 1440)  # 0.80 USD: the 80 % warning (and 0.8 + 2 USD/h x 60 s is not over)
        assert watch.check_once().action is Action.WARN
        clock.advance_to(T0 + 1450)
        assert watch.check_once().action is Action.CONTINUE  # warned once only
        clock.advance_to(T0 + 1750)  # 0.972 + 2 USD/h x 60 s = 1.006 > 1: stop
        assert watch.check_once().action is Action.STOP
        assert watch.check_once().action is Action.STOP
        assert watch.check_once().action is Action.STOP  # stop already acted: not called again
        raise RunFailedError("host 0 was killed by SIGTERM")
    assert len(stops) == 2
    assert len(warnings) == 1 and "80%" in warnings[0]
    assert err.value.exit_code == 7
    record = ledger.get_run("r")
    assert record is not None and record.status is RunStatus.BUDGET_EXCEEDED
    assert record.detail is not None and record.detail["budget"]["action"] == "stop"


def test_without_a_budget_the_watch_does_nothing(ledger: Ledger) -> None:
    with watch_run_budget(ledger, "r", Catalog.load(), limit_usd=None, stop=lambda: True, warn=print) as w:
        assert w is None


def test_a_failure_not_caused_by_the_budget_is_left_alone(ledger: Ledger) -> None:
    ledger.create_run("r", script="t.py", ts=T0)
    with (
        pytest.raises(RunFailedError),
        watch_run_budget(
            ledger, "r", Catalog.load(), limit_usd=100.0, stop=lambda: True, warn=print, poll_s=3600
        ),
    ):
        raise RunFailedError("the program crashed")


# --- monthly budget and time limits ------------------------------------------------------------------


def test_monthly_budget_warns_once_the_month_is_over_it(ledger: Ledger) -> None:
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    month_start = 1_798_761_600.0  # 2027-01-01T00:00Z; T0 is 2027-01-15
    _slice(ledger, "last-month", ready=month_start - 10 * 3600, run_id=None, end=month_start - 3600)
    _slice(ledger, "this-month", ready=T0, run_id=None, end=T0 + 5 * 3600)  # 10 USD

    def warn(budget: float) -> str | None:
        return monthly_budget_warning(ledger.url, catalog, source, monthly_budget=budget, now=T0 + 6 * 3600)

    assert warn(10.0) is None  # not over
    text = warn(9.99)
    assert text is not None
    assert "10.00 USD" in text and "9.99 USD" in text and "2027-01" in text
    assert monthly_budget_warning(ledger.url, catalog, source, monthly_budget=None) is None


def test_max_hours_labels_and_expired_slices(ledger: Ledger) -> None:
    assert max_hours_labels(None) == {}
    assert max_hours_labels("1.5") == {LABEL_MAX_SECONDS: "5400"}
    _slice(ledger, "limited", ready=T0, run_id=None, labels=max_hours_labels(2))
    _slice(ledger, "free", ready=T0, run_id=None)
    assert expired_slices(ledger, now=T0 + 7199) == []
    (warning,) = expired_slices(ledger, now=T0 + 7201)
    assert "limited" in warning and "tpuctl pod delete limited" in warning


@pytest.mark.parametrize("value", ["-5", "0", "abc", "nan", "inf"])
def test_bad_budgets_and_hours_name_the_value_and_the_fix(value: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_budget(value)
    assert err.value.field == "budget" and err.value.value == value and err.value.fix
    with pytest.raises(UsageError) as err:
        parse_hours(value, field_name="--max-hours")
    assert err.value.field == "--max-hours" and err.value.value == value and err.value.fix
    with pytest.raises(UsageError):
        max_hours_labels(value)


def test_good_budgets_and_hours() -> None:
    assert parse_budget("50") == 50.0
    assert parse_budget(None) is None
    assert parse_hours("0.25", field_name="--hours") == 0.25


# --- slices with no known price ----------------------------------------------------------------------


def _unpriced_slice(ledger: Ledger, name: str, *, ready: float, capacity: CapacityType) -> None:
    """A TPU7x slice placed for run ``r`` with no price (none known for it: spot, or flex-start)."""
    ledger.record_event(
        EventKind.REQUESTED, pod=name, zone="us-central1-c", accelerator_type="tpu7x-8", chips=4,
        capacity=capacity, price_per_chip_hour=None, run_id="r", ts=ready - 60,
    )  # fmt: skip
    ledger.record_event(EventKind.READY, pod=name, zone="us-central1-c", ts=ready)


def test_a_slice_with_no_price_is_counted_at_the_assumed_price_never_at_another_capacitys(
    ledger: Ledger, clock: FakeClock
) -> None:
    """A flex-start slice reads as preemptible in the ledger: the catalog's spot price is not its price.
    With ``--assume-price-per-hour`` the guard counts the assumption; without, it counts nothing and
    names the slice (said to the user, never a silent 0)."""
    ledger.create_run("r", script="t.py", ts=T0 - 100)
    _unpriced_slice(ledger, "r-0", ready=T0, capacity=CapacityType.PREEMPTIBLE)
    clock.advance_to(T0 + 1800)

    assumed = BudgetGuard.for_run(
        ledger, "r", Catalog.load(), limit_usd=10, clock=clock, assumed_usd_per_hour=40
    )
    assert assumed.rate() == 40.0 and round(assumed.spent(), 6) == 20.0 and assumed.unpriced == []
    assert assumed.check().action is Action.STOP

    blind = BudgetGuard.for_run(ledger, "r", Catalog.load(), limit_usd=10, clock=clock)
    assert blind.rate() == 0.0 and blind.unpriced == ["r-0 (tpu7x-8, us-central1-c)"]


def test_a_priced_slice_keeps_its_recorded_price_whatever_is_assumed(
    ledger: Ledger, clock: FakeClock
) -> None:
    ledger.create_run("r", script="t.py", ts=T0 - 100)
    _slice(ledger, "r-0", ready=T0, run_id="r")  # 8 chips x 0.25
    clock.advance_to(T0 + 3600)
    guard = BudgetGuard.for_run(
        ledger, "r", Catalog.load(), limit_usd=10, clock=clock, assumed_usd_per_hour=99
    )
    assert guard.rate() == 2.0


def test_a_budget_no_place_of_the_run_can_price_is_refused_with_the_fix() -> None:
    from tpuctl.services.budget import refuse_unpriced_budget

    catalog = Catalog.load()
    tpu7x = catalog.resolve("tpu7x-8")
    places = [("us-central1-c", CapacityType.SPOT), ("us-central1-ai1a", CapacityType.SPOT)]
    with pytest.raises(UsageError) as refused:
        refuse_unpriced_budget(
            catalog, tpu7x, places, flex_start=False, budget_usd=0.01, assumed_usd_per_hour=None
        )
    error = refused.value
    assert error.exit_code == 2 and error.field == "budget"
    assert "no price for tpu7x-8 spot in us-central1" in error.message
    assert error.fix is not None and "--assume-price-per-hour" in error.fix
    assert "48.00 USD/h" in error.fix  # the on-demand price: an upper bound to assume
    # An assumption, no budget, or one priced place among them: nothing to refuse.
    refuse_unpriced_budget(catalog, tpu7x, places, flex_start=False, budget_usd=0.01, assumed_usd_per_hour=60)
    refuse_unpriced_budget(
        catalog, tpu7x, places, flex_start=False, budget_usd=None, assumed_usd_per_hour=None
    )
    mixed = [*places, ("us-central1-c", CapacityType.ON_DEMAND)]
    refuse_unpriced_budget(
        catalog, tpu7x, mixed, flex_start=False, budget_usd=0.01, assumed_usd_per_hour=None
    )
    # Flex-start is priced by its own SKU only: on-demand places do not make it priced.
    with pytest.raises(UsageError, match="flex-start"):
        refuse_unpriced_budget(
            catalog, tpu7x, mixed, flex_start=True, budget_usd=1, assumed_usd_per_hour=None
        )
    with pytest.raises(UsageError, match="there is no --budget"):
        refuse_unpriced_budget(
            catalog, tpu7x, places, flex_start=False, budget_usd=None, assumed_usd_per_hour=60
        )
