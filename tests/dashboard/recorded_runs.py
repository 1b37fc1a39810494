"""Runs as their supervisors record them, written to a ledger through the ledger's own API: the slices'
events (ready at a price, preempted with the kind the supervisor classified, deleted), the run's
segments and its recovery record (``PreemptionRecord``s). Seconds of work for what a real preempted run
on simulated VMs takes minutes to leave behind. (A module of its own: tests/ has several conftest.py.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuctl.catalog import CapacityType
from tpuctl.services.run.accounting import PreemptionRecord
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, PreemptionKind, RunStatus, SegmentKind

ZONE = "us-central2-b"
TYPE = "v4-8"
CHIPS = 4
PRICE = 0.9  # USD per chip-hour (spot)


#: The runs the dashboard's default tests draw: RUN preempted twice (a notice, then a hard one), then
#: finished; LIVE still running (``recorded``).
RUN = "run-20261101-120000-aa01"
LIVE = "run-20261101-130000-bb02"


@dataclass(frozen=True)
class Attempt:
    """One slice of a run: ready at ``start``, running until ``end``, then preempted with ``kind`` (None:
    the run finished on it)."""

    pod: str
    start: float
    end: float
    steps: int
    kind: PreemptionKind | None


def record_run(
    ledger: Ledger,
    run_id: str,
    attempts: list[Attempt],
    *,
    finished: bool = True,
    workspace: str | None = None,
) -> None:
    """The run over ``attempts``, each slice's events and segments, and its recovery record; ``workspace``:
    whose it is (None: from before workspaces)."""
    first = attempts[0].start
    ledger.create_run(run_id, script="train.py", status=RunStatus.RUNNING, zone=ZONE, accelerator_type=TYPE,
                      capacity=CapacityType.SPOT, detail={"hosts": 1}, ts=first - 60,
                      workspace=workspace)  # fmt: skip
    preemptions: list[dict[str, Any]] = []
    for i, a in enumerate(attempts):
        _slice(ledger, run_id, a, ended=a.kind is not None or finished)
        ledger.close_segment(
            ledger.add_segment(run_id, SegmentKind.PROVISIONING, start=a.start - 60, pod=a.pod, zone=ZONE),
            end=a.start,
        )
        running = ledger.add_segment(run_id, SegmentKind.RUNNING, start=a.start, pod=a.pod, zone=ZONE)
        if a.kind is None and not finished:
            continue  # still running: its segment stays open
        ledger.close_segment(running, end=a.end, steps_completed=a.steps)
        if a.kind is None:
            continue
        ledger.close_segment(
            ledger.add_segment(run_id, SegmentKind.PREEMPTED, start=a.end, pod=a.pod, zone=ZONE),
            end=a.end + 5,
        )
        following = attempts[i + 1] if i + 1 < len(attempts) else None
        preemptions.append(
            PreemptionRecord(
                number=len(preemptions) + 1, kind=a.kind, source="api", pod=a.pod, zone=ZONE, capacity="spot",
                occurred_at=a.end, detected_at=a.end + 2, checkpoint_step=a.steps, last_step=a.steps,
                new_pod=None if following is None else following.pod,
                resumed_at=None if following is None else following.start + 30,
            ).to_dict()
        )  # fmt: skip
    recovery = {"preemptions": preemptions, "preemption_count": len(preemptions), "steps_reported": True,
                "steps_completed": attempts[-1].steps, "steps_recomputed": 0, "goodput": 0.8}  # fmt: skip
    ledger.update_run(
        run_id,
        status=RunStatus.SUCCEEDED if finished else RunStatus.RUNNING,
        preemptions=len(preemptions),
        restarts=len(preemptions),
        ended_at=attempts[-1].end if finished else None,
        exit_code=0 if finished else None,
        detail={"hosts": 1, "recovery": recovery},
    )


def _slice(ledger: Ledger, run_id: str, a: Attempt, *, ended: bool) -> None:
    facts: dict[str, Any] = {"pod": a.pod, "zone": ZONE, "run_id": run_id}
    ledger.record_event(
        EventKind.CREATED,
        accelerator_type=TYPE,
        chips=CHIPS,
        hosts=1,
        capacity=CapacityType.SPOT,
        price_per_chip_hour=PRICE,
        ts=a.start - 60,
        **facts,
    )
    ledger.record_event(EventKind.READY, ts=a.start, **facts)
    if a.kind is not None:
        ledger.record_event(EventKind.PREEMPTED, detail={"kind": str(a.kind)}, ts=a.end, **facts)
        ledger.record_event(EventKind.DELETED, ts=a.end + 10, **facts)
    elif ended:
        ledger.record_event(EventKind.DELETED, ts=a.end, **facts)


def record_both(ledger: Ledger, now: float) -> None:
    """RUN and LIVE, as the default tests draw them."""
    record_run(ledger, RUN, [
        Attempt("p-1", now - 7200, now - 6000, 40, PreemptionKind.NOTICE),
        Attempt("p-2", now - 5900, now - 4000, 80, PreemptionKind.HARD),
        Attempt("p-3", now - 3900, now - 3000, 120, None),
    ])  # fmt: skip
    record_run(ledger, LIVE, [Attempt("q-1", now - 600, now, 5, None)], finished=False)
