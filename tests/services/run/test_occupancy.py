"""Which live runs use a slice: a run on it under a live lease does, a multislice run uses each of its
``<prefix>-<i>`` slices, and a run whose lease expired or that finished does not."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest

from tpuctl.errors import UsageError
from tpuctl.services.run.occupancy import guard_deletion, live_runs_on
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LeaseOwner, RunStatus

if TYPE_CHECKING:
    from tpuctl.services.session import Session

ZONE = "us-central2-b"
OWNER = LeaseOwner("owner-1", "host-a", 4242, 7)


@pytest.fixture
def session(tmp_path: Path) -> Session:
    ledger = Ledger(tmp_path)
    runs = {"run-multi": ("ms", 2), "run-single": ("solo", 1), "run-done": ("ms-old", 2)}
    for run_id, (pod, slices) in runs.items():
        ledger.create_run(run_id, script="train.py", pod=pod, zone=ZONE, detail={"slices": slices})
        ledger.update_run(run_id, status=RunStatus.RUNNING)
        ledger.claim_lease(run_id, OWNER, 300.0)
    ledger.update_run("run-done", status=RunStatus.SUCCEEDED)
    return cast("Session", SimpleNamespace(ledger=ledger))


def ids(session: Session, pod: str) -> list[str]:
    return [r.run_id for r in live_runs_on(session, pod, ZONE)]


def test_a_multislice_run_uses_each_of_its_slices_and_nothing_else(session: Session) -> None:
    assert ids(session, "ms") == ["run-multi"]
    assert ids(session, "ms-0") == ["run-multi"] and ids(session, "ms-1") == ["run-multi"]
    assert ids(session, "ms-x") == [] and ids(session, "other-1") == []
    # A single slice's run does not claim slices that merely share its name's start.
    assert ids(session, "solo") == ["run-single"] and ids(session, "solo-0") == []
    assert ids(session, "ms-old-0") == []  # finished
    assert live_runs_on(session, "ms-1", "europe-west4-a") == []  # another zone


def test_deleting_a_member_of_a_live_multislice_run_is_refused_without_force(session: Session) -> None:
    with pytest.raises(UsageError, match=r"pod ms-1 \(us-central2-b\) is in use by run run-multi"):
        guard_deletion(session, "ms-1", ZONE, force=False)
    assert guard_deletion(session, "ms-1", ZONE, force=True) == ["run-multi"]
    record = session.ledger.get_run("run-multi")
    assert record is not None and record.detail is not None and "slice_deleted" in record.detail
