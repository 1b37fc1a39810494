"""What the next command records after a run's backstop deleted its slices: nothing while a supervisor
holds the run, while any of its slices is still there, or while the cloud cannot say; once its silent
supervisor's slices are all gone, each is recorded deleted by the backstop, its open segments end, and
the run ends failed with why (how long its supervisor had been silent, and the grace)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from tpuctl.errors import CloudError, NotFoundError
from tpuctl.services.run import backstopped
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, LeaseOwner, PodState, RunStatus, SegmentKind
from tpuctl.testing.clock import wait_for
from tpuctl.timefmt import iso

if TYPE_CHECKING:
    from tpuctl.services.session import Session

ZONE = "us-central1-a"
RUN = "run-1"
GONE = NotFoundError("gone", code=5)
OWNER = LeaseOwner("owner-1", "laptop", 4242, 7)


class Cloud:
    """``get_node`` answers each slice from ``answers``: a node, or an error to raise."""

    def __init__(self) -> None:
        self.answers: dict[str, Exception | None] = {}

    def get_node(self, zone: str, name: str) -> object:
        answer = self.answers.get(name)
        if answer is not None:
            raise answer
        return SimpleNamespace(name=name, zone=zone)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path)
    ledger.create_run(RUN, script="prog.py", pod="s", zone=ZONE, detail={"backstop": {"grace_s": 4.0}})
    ledger.update_run(RUN, status=RunStatus.RUNNING)
    for kind in (EventKind.REQUESTED, EventKind.CREATED, EventKind.READY):
        ledger.record_event(kind, pod="s", zone=ZONE, run_id=RUN, accelerator_type="v5litepod-8", chips=8)
    ledger.add_segment(RUN, SegmentKind.RUNNING, start=1000.0, pod="s", zone=ZONE)
    return ledger


#: When the command looks (the ledger's own times are the database's real clock).
SEEN_AT = time.time() + 100.0


def _session(ledger: Ledger, cloud: Cloud) -> Session:
    settings = SimpleNamespace(lease_duration=60.0)
    return cast(
        "Session", SimpleNamespace(ledger=ledger, cloud=cloud, settings=settings, clock=lambda: SEEN_AT)
    )


def _silent(ledger: Ledger, ttl_s: float = 0.2) -> None:
    """A supervisor that renewed its lease and was killed: the lease expires on its own."""
    ledger.claim_lease(RUN, OWNER, ttl_s)
    wait_for(lambda: (lease := ledger.lease_of(RUN)) is not None and lease.expired, timeout=10.0)


def _settled(ledger: Ledger, cloud: Cloud) -> Any:
    record = ledger.get_run(RUN)
    assert record is not None
    return backstopped.settle(_session(ledger, cloud), record)


def test_a_live_supervisor_or_a_slice_still_there_leaves_the_run_as_it_is(ledger: Ledger) -> None:
    cloud = Cloud()
    ledger.claim_lease(RUN, OWNER, 300.0)
    cloud.answers["s"] = GONE
    assert _settled(ledger, cloud).status == RunStatus.RUNNING  # its supervisor speaks for it


@pytest.mark.parametrize("answer", [None, CloudError("unreachable", code=14)])
def test_a_slice_that_is_there_or_cannot_be_looked_up_is_not_taken_for_deleted(
    ledger: Ledger, answer: Exception | None
) -> None:
    _silent(ledger)
    cloud = Cloud()
    cloud.answers["s"] = answer
    assert _settled(ledger, cloud).status == RunStatus.RUNNING
    (pod,) = ledger.list_pods(run_id=RUN)
    assert pod.state is PodState.READY


def test_once_the_silent_supervisors_slices_are_gone_the_ledger_says_why(ledger: Ledger) -> None:
    _silent(ledger, 1.0)  # a second: what this command claims itself is told apart from the last word
    heard = max(h.at for h in ledger.lease_history(RUN))
    cloud = Cloud()
    cloud.answers["s"] = GONE
    after = _settled(ledger, cloud)
    assert after.status == RunStatus.FAILED
    why = after.detail["reason"]
    assert why == backstopped.reason(heard, SEEN_AT, 4.0)  # the killed one's last renewal
    assert why == (
        "deleted by its backstop after the run's supervisor was silent for its grace (4 s): last heard "
        f"from at {iso(heard)}, the slice seen gone {SEEN_AT - heard:.0f} s later, at {iso(SEEN_AT)}"
    )
    assert after.detail["backstop"] == {"grace_s": 4.0, "seen_deleted_at": SEEN_AT}
    (pod,) = ledger.list_pods(run_id=RUN)
    assert pod.state is PodState.DELETED and pod.deleted_at == SEEN_AT
    assert all(s.end is not None for s in ledger.segments(RUN))
    lease = ledger.lease_of(RUN)
    assert lease is None or lease.expired  # the lease it claimed to write is given back
    assert _settled(ledger, cloud).status == RunStatus.FAILED  # once: a finished run is left alone


def test_a_run_never_armed_is_not_looked_at(ledger: Ledger) -> None:
    ledger.update_run(RUN, detail={})
    _silent(ledger)
    cloud = Cloud()
    cloud.answers["s"] = GONE
    assert _settled(ledger, cloud).status == RunStatus.RUNNING
