"""What a preemption's record says, from how its attempt ended and what the hosts reported: its kind
(what the program did with the notice), who told first, and when it happened. Pure Python: the times
are made up, no clock is read."""

from __future__ import annotations

import signal

import pytest
from attempt_results import attempt_ended

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import Node
from tpuctl.services.run.accounting import Progress, notice_source, preemption_kind, preemption_record
from tpuctl.services.run.model import AttemptResult
from tpuctl.services.run.sliceset import SliceSet
from tpuctl.store.records import PreemptionKind

SLICE = SliceSet.single(
    Node(
        name="p",
        zone="us-central1-a",
        accelerator_type="v5litepod-4",
        state="READY",
        capacity=CapacityType.SPOT,
    )
)
NOTICE_AT = 1_000.0
FOLLOWER_NOTICE = {
    "event": "notice",
    "worker": 0,
    "source": "metadata",
    "t": NOTICE_AT,
    "reporter": "follower",
}
RUNTIME_NOTICE = {"event": "notice", "worker": 1, "source": "sigterm", "t": NOTICE_AT + 0.2}


def ended(codes: dict[int, int | None], *, at: float = NOTICE_AT + 5.0) -> AttemptResult:
    """An attempt whose hosts ended with ``codes`` (the first non-0, non-75 one is its failure)."""
    return attempt_ended(codes, started_at=NOTICE_AT - 60.0, ended_at=at)


def progress(*events: dict[str, object]) -> Progress:
    p = Progress()
    for event in events:
        p.on_event(event, NOTICE_AT + 0.1)
    return p


@pytest.mark.parametrize(
    ("events", "codes", "kind"),
    [
        # The runtime saved a checkpoint on the notice and exited 75 (the others stopped by tpuctl after).
        (
            [RUNTIME_NOTICE, {"event": "preempted", "step": 7, "checkpoint": "saved"}],
            {0: 75, 1: -signal.SIGKILL},
            PreemptionKind.NOTICE,
        ),
        # An unmodified program that SIGTERM's default ended inside the grace: it stopped on the notice.
        ([FOLLOWER_NOTICE], {0: -signal.SIGTERM}, PreemptionKind.NOTICE),
        # JAX's notifier caught SIGTERM and the program went on: killed at the grace's end, or lost with
        # its VM (no exit status at all).
        ([FOLLOWER_NOTICE], {0: -signal.SIGKILL}, PreemptionKind.NOTICE_IGNORED),
        ([FOLLOWER_NOTICE], {0: None, 1: None}, PreemptionKind.NOTICE_IGNORED),
        # ... or it finished its work inside the grace.
        ([FOLLOWER_NOTICE], {0: 0, 1: 0}, PreemptionKind.NOTICE_FINISHED),
        # No host saw a notice: killed at once.
        ([], {0: None}, PreemptionKind.HARD),
        ([], {0: -signal.SIGKILL}, PreemptionKind.HARD),
    ],
)
def test_the_kind_says_what_the_program_did_with_the_notice(
    events: list[dict[str, object]], codes: dict[int, int | None], kind: PreemptionKind
) -> None:
    assert preemption_kind(ended(codes), progress(*events)) is kind


def test_the_notice_is_when_it_happened_and_who_said_it_first_is_the_source() -> None:
    p = progress(FOLLOWER_NOTICE, RUNTIME_NOTICE)  # the follower's line came first: it is the notice
    assert notice_source(p) == "follower-notice"
    assert notice_source(progress(RUNTIME_NOTICE)) == "runtime-notice"
    assert notice_source(progress()) is None
    # Killed at the end of a 30 s grace: it happened at the notice, and was detected when it was read.
    record = preemption_record(
        1, SLICE, "follower-notice", ended({0: None}, at=NOTICE_AT + 30.0), p, detected_at=NOTICE_AT + 0.1
    )
    assert record.kind is PreemptionKind.NOTICE_IGNORED
    assert record.occurred_at == NOTICE_AT and record.detection_latency_s == pytest.approx(0.1)
    assert record.checkpoint_step is None and record.pod == "p" and record.capacity == "spot"
    # The record round-trips through the run's detail with its kind.
    data = record.to_dict()
    assert data["kind"] == "notice_ignored"
    assert type(record).from_dict(data) == record


def test_without_a_notice_it_happened_when_the_first_host_died() -> None:
    record = preemption_record(
        1, SLICE, "hosts+api", ended({0: None}, at=NOTICE_AT + 3.0), progress(), detected_at=NOTICE_AT + 4.0
    )
    assert record.kind is PreemptionKind.HARD
    assert record.occurred_at == NOTICE_AT + 3.0 and record.detection_latency_s == pytest.approx(1.0)
