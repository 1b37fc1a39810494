"""Host maintenance as a run sees it, without slices or hosts: which slices Google keeps through it, how an
attempt that met one is classified (a maintenance notice is no preemption), and the wait for a kept
slice to come back. Pure Python: the API's answers are scripted and time is a fake clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from attempt_results import attempt_ended

from tpuctl.catalog import CapacityType, Surface
from tpuctl.cloud.base import Node
from tpuctl.errors import NotFoundError, TransientError
from tpuctl.runtime.preemption import event_line, parse_event
from tpuctl.services.run.accounting import Progress, notice_source, preemption_kind
from tpuctl.services.run.maintenance import Return, SliceReturn, kept_through_maintenance
from tpuctl.services.run.model import AttemptResult, Outcome, RecoveryPolicy
from tpuctl.services.run.signals import SliceWatch, classify
from tpuctl.services.run.sliceset import SliceSet
from tpuctl.store.records import PreemptionKind
from tpuctl.testing.clock import FakeClock

NOTICE_AT = 1_000.0
TERMINATE = "TERMINATE_ON_HOST_MAINTENANCE"


def node(capacity: CapacityType = CapacityType.ON_DEMAND, surface: Surface = Surface.TPU_API) -> Node:
    return Node(name="m", zone="us-central1-a", accelerator_type="v5litepod-4", state="READY",
                capacity=capacity, surface=surface)  # fmt: skip


def maintenance(value: str = TERMINATE, reporter: str = "follower") -> dict[str, Any]:
    """The event line a host's follower writes, as the supervisor parses it."""
    event = parse_event(event_line("maintenance", worker=0, value=value, t=NOTICE_AT, reporter=reporter))
    assert event is not None
    return event


def progress(*events: dict[str, Any]) -> Progress:
    p = Progress()
    for event in events:
        p.on_event(event, NOTICE_AT + 0.1)
    return p


def ended(codes: dict[int, int | None]) -> AttemptResult:
    return attempt_ended(codes, started_at=NOTICE_AT - 60.0, ended_at=NOTICE_AT + 5.0)


@dataclass
class Scripted:
    """get_node answers from a script (a state, or (state, health), or an exception); the last repeats."""

    answers: list[Any]
    calls: int = 0

    def get_node(self, zone: str, name: str) -> Node:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, BaseException):
            raise answer
        state, health = answer if isinstance(answer, tuple) else (answer, None)
        return Node(name=name, zone=zone, accelerator_type="v5litepod-4", state=state,
                    capacity=CapacityType.ON_DEMAND, health=health)  # fmt: skip


def watched(answers: list[Any]) -> SliceWatch:
    return SliceWatch(Scripted(answers), SliceSet.single(node()), poll_s=0.001, confirm=2)


POLICY = RecoveryPolicy(confirm_timeout_s=0.05, poll_s=0.001)


# --- who keeps the VM -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "surface", "kept"),
    [
        (CapacityType.ON_DEMAND, Surface.TPU_API, True),
        (CapacityType.RESERVED, Surface.TPU_API, True),
        (CapacityType.SPOT, Surface.TPU_API, False),  # Spot VMs are never restarted
        (CapacityType.PREEMPTIBLE, Surface.TPU_API, False),
        (CapacityType.ON_DEMAND, Surface.COMPUTE, False),  # tpuctl's instances: automaticRestart false
    ],
)
def test_google_keeps_only_on_demand_and_reserved_tpu_api_vms(
    capacity: CapacityType, surface: Surface, kept: bool
) -> None:
    assert kept_through_maintenance(SliceSet.single(node(capacity, surface))) is kept


# --- classification -------------------------------------------------------------------------------


def test_a_maintenance_notice_is_its_own_outcome_not_a_preemption() -> None:
    seen = progress(maintenance())
    # Whatever the program did: stopped on it with a checkpoint (75), or killed when the VM stopped.
    endings: list[dict[int, int | None]] = [{0: 75}, {0: -9}, {0: None}]
    for codes in endings:
        outcome, source = classify(ended(codes), None, seen, watched(["READY"]), POLICY)
        assert (outcome, source) == (Outcome.MAINTENANCE, "follower-maintenance"), codes
    runtime = progress(maintenance(reporter="runtime"))
    assert classify(ended({0: 75}), None, runtime, watched(["READY"]), POLICY)[1] == "runtime-maintenance"
    # Lost anyway (Google did not keep the VM): a preemption of its own kind, not "hard".
    assert preemption_kind(ended({0: -9}), seen) is PreemptionKind.MAINTENANCE
    assert notice_source(seen) == "follower-maintenance"


def test_a_migrate_value_is_news_but_no_maintenance_and_a_preemption_notice_wins() -> None:
    migrate = progress(maintenance("MIGRATE_ON_HOST_MAINTENANCE"))
    assert migrate.maintenance is None
    assert classify(ended({0: 0}), None, migrate, watched(["READY"]), POLICY)[0] is Outcome.SUCCEEDED
    assert classify(ended({0: 1}), None, migrate, watched(["READY"]), POLICY)[0] is Outcome.FAILED
    both = progress(maintenance(), {"event": "notice", "worker": 0, "source": "metadata", "t": NOTICE_AT})
    assert classify(ended({0: 75}), None, both, watched(["READY"]), POLICY)[0] is Outcome.PREEMPTED
    assert preemption_kind(ended({0: 75}), both) is PreemptionKind.NOTICE
    # Finished inside the window: the run is done, and nothing is lost.
    assert classify(ended({0: 0}), None, progress(maintenance()), watched(["READY"]), POLICY)[0] is (
        Outcome.SUCCEEDED
    )


def test_hosts_that_died_while_the_api_showed_maintenance_met_a_maintenance_without_notice() -> None:
    repairing = watched(["READY", ("REPAIRING", "UNHEALTHY_MAINTENANCE")])
    assert classify(ended({0: None}), None, Progress(), repairing, POLICY) == (Outcome.MAINTENANCE, "api")
    # The same death on a slice the API shows READY is the program's failure.
    assert classify(ended({0: None}), None, Progress(), watched(["READY"]), POLICY)[0] is Outcome.FAILED


def test_maintenance_is_seen_only_after_consecutive_polls_and_the_health_counts_too() -> None:
    w = watched(["REPAIRING", "READY", "REPAIRING", ("READY", "UNHEALTHY_MAINTENANCE")])
    w.poll_once()
    w.poll_once()
    assert w.maintenance_state is None  # a blip, not a maintenance
    w.poll_once()
    w.poll_once()
    assert w.maintenance_state == "READY" and not w.confirmed.is_set()  # never lost


# --- waiting for a kept slice ---------------------------------------------------------------------


def wait(answers: list[Any], *, went_down: bool = False, timeout_s: float = 600.0) -> tuple[Any, Scripted]:
    clock = FakeClock(start=NOTICE_AT + 10.0)
    cloud = Scripted(answers)
    waiter = SliceReturn(
        get_node=cloud.get_node,
        poll_s=1.0,
        timeout_s=timeout_s,
        notice_s=60.0,
        settle_s=5.0,
        sleep=clock.sleep,
        monotonic=clock.now,
        clock=clock.now,
    )
    return waiter.wait(SliceSet.single(node()), noticed_at=NOTICE_AT, went_down=went_down), cloud


def test_a_slice_that_goes_down_and_comes_back_is_back() -> None:
    waited, _ = wait(["READY", "READY", "REPAIRING", TransientError("503"), "REPAIRING", "READY"])
    assert waited.how is Return.BACK and waited.went_down and waited.waited_s == 5.0


def test_a_slice_still_ready_is_waited_on_until_the_notice_and_a_margin_have_passed() -> None:
    # The program stopped on the notice at once: the host is taken only when the 60 s run out.
    waited, cloud = wait(["READY"])
    assert waited.how is Return.BACK and not waited.went_down
    assert cloud.calls == 56  # polled each second from 10 s after the notice to 65 s after it
    # Its hosts died with the VM already: READY again means back, at once.
    waited, cloud = wait(["READY"], went_down=True)
    assert waited.how is Return.BACK and cloud.calls == 1


def test_a_slice_that_dies_vanishes_or_never_returns_is_not_back() -> None:
    assert wait(["REPAIRING", "TERMINATED"])[0].how is Return.LOST
    assert wait(["REPAIRING", NotFoundError("gone")])[0].how is Return.LOST
    waited, _ = wait(["REPAIRING"], timeout_s=30.0)
    assert waited.how is Return.TIMED_OUT and waited.waited_s == 30.0
