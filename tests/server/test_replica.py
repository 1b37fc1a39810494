"""The replica's loop over the in-process simulator, for what needs no host: it takes its place among the
ledger's servers and gives it back; it leaves a run whose lease lives alone; an orphan someone asked to
cancel while nobody held it is claimed by the tick and cleaned up, not resumed (a resume would forget the
request)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.server.bundles import BundleStore
from tpuctl.server.replica import Replica
from tpuctl.server.submit import submit
from tpuctl.server.wire import SubmitRun
from tpuctl.services.session import Session, open_session
from tpuctl.settings import load_settings
from tpuctl.store.records import LeaseAction, LeaseOwner, RunStatus
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.clock import wait_for

JOB = {
    "script": "prog.py",
    "resources": {"accelerators": "v5e-8", "zone": "us-central1-a"},
    "runtime_deps": False,
}


@pytest.fixture
def session(sim_cli: InProcessCli, state_dir: Path) -> Iterator[Session]:
    settings = load_settings({"backend": "sim", "state_dir": state_dir, "lease_duration": 30})
    with open_session(settings, backend=sim_cli.backend) as opened:
        yield opened


@pytest.fixture
def replica(session: Session) -> Iterator[Replica]:
    made = Replica(session, LeaseOwner.of_this_process(), listen="127.0.0.1:1", max_runs=4, tick_s=3600)
    yield made
    made.stop()


def submitted(session: Session, state_dir: Path) -> str:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("prog.py")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"pass\n\n"))
    data = raw.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    bundles = BundleStore(state_dir / "bundles")
    bundles.put(sha, data)
    body = SubmitRun(job=JOB, bundle_sha256=sha, script_in_bundle="prog.py")
    return submit(session, bundles, body, "replica-test-key").record.run_id


def test_a_replica_holds_its_place_while_it_runs_and_gives_it_back(
    session: Session, replica: Replica
) -> None:
    replica.start()
    wait_for(lambda: replica.ready, timeout=30.0, interval=0.05, what="the first tick")
    assert [r.owner for r in session.ledger.replicas()] == [replica.owner]
    replica.stop()
    assert session.ledger.replicas() == [] and not replica.ready


def test_a_run_whose_lease_lives_is_left_alone_and_a_cancelled_orphan_is_cleaned_up(
    session: Session, replica: Replica, state_dir: Path
) -> None:
    run_id = submitted(session, state_dir)
    other = dataclasses.replace(LeaseOwner.of_this_process(), owner_id="another-supervisor")
    claim = session.ledger.claim_lease(run_id, other, 30)
    # Ticked by hand alone (its loop not started): a loop's first tick landing between the release and
    # the cancel request below would rightly resume the run instead.
    replica.tick()
    assert replica.supervising() == []  # someone else's, alive

    session.ledger.release_lease(claim)  # its supervisor went away without ending the run ...
    session.ledger.request_cancel(run_id, "a test, while nobody held the run")  # ... and a cancel came
    replica.tick()

    def ended() -> RunStatus | None:
        record = session.ledger.get_run(run_id)
        assert record is not None
        return RunStatus(record.status) if RunStatus(record.status).finished else None

    assert wait_for(ended, timeout=60.0, interval=0.05, what="the clean-up") is RunStatus.CANCELLED
    record = session.ledger.get_run(run_id)
    assert record is not None and record.exit_code == 130
    history = session.ledger.lease_history(run_id)
    assert history[-1].owner.owner_id != "another-supervisor"
    # The tick claimed the orphan for the replica (one transaction for all it takes up), read the cancel
    # request with the claim, and gave the lease back for the clean-up, which claims the run itself.
    mine = [(h.action, h.generation) for h in history if h.owner == replica.owner]
    assert mine == [(LeaseAction.CLAIM, 2), (LeaseAction.RELEASE, 2)]
    assert [h.generation for h in history if h.action is LeaseAction.CLAIM][-1] == 3
