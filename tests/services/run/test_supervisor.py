"""The supervisor without hosts: its hold on its run (the lease it takes and gives back, the cancel request
a resume finds), what it says of the hosts' events, and what it records of a run's end (the whole run,
slices and hosts, is the CLI tests')."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import Node
from tpuctl.errors import LeaseLostError
from tpuctl.services.run.accounting import PreemptionRecord
from tpuctl.services.run.lease import Lease
from tpuctl.services.run.model import Outcome, Silent
from tpuctl.services.run.rundir import RunDir
from tpuctl.services.run.sliceset import SliceSet
from tpuctl.services.run.supervisor import Supervisor, _Attempt, _Run
from tpuctl.services.session import Session, open_session
from tpuctl.settings import load_settings
from tpuctl.sim import SimServer
from tpuctl.sim.world import world_from_data
from tpuctl.store.records import EventKind, LeaseClaim, LeaseOwner, LedgerBusyError, PreemptionKind, RunStatus

if TYPE_CHECKING:
    from tpuctl.hosts.base import Executor
    from tpuctl.services.run.model import PreparedRun

RUN = "run-20260921-141320-ab16"
OWNER = LeaseOwner("owner-s1", "host-s", 4343, 88)
WORLD = {
    "project": "test-proj",
    "speed": 1000,
    "zones": {"us-central1-a": {"v5e": {"on_demand": 8, "preemptible": 8}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
}


@pytest.fixture
def session(state_dir: Path) -> Iterator[Session]:
    state_dir.mkdir(parents=True, exist_ok=True)
    server = SimServer(state_dir, world_from_data(WORLD, "test world"))
    url = server.start()
    sess = open_session(load_settings({"backend": "sim", "sim_url": url, "state_dir": state_dir}))
    sess.ledger.create_run(RUN, script="train.py")
    try:
        yield sess
    finally:
        sess.close()
        server.stop()


def prepared(session: Session) -> PreparedRun:
    """What taking the lease reads of a prepared run: its id and its directory."""
    run_dir = RunDir.of(session.state_dir, RUN)
    run_dir.root.mkdir(parents=True, exist_ok=True)
    return cast("PreparedRun", SimpleNamespace(run_id=RUN, run_dir=run_dir))


def test_a_resume_clears_the_cancel_an_earlier_owner_acted_on(session: Session) -> None:
    session.ledger.request_cancel(RUN, "bob@laptop")  # honoured by the owner before: the run ended
    cancelled: list[str] = []
    supervisor = Supervisor(session, owner=OWNER)
    supervisor.cancel = lambda: cancelled.append("cancel")  # type: ignore[method-assign]
    supervisor._take_lease(prepared(session), resume=True)
    try:
        assert session.ledger.cancel_requested(RUN) is None
        assert cancelled == []
    finally:
        supervisor._end_lease()
    late = session.ledger.request_cancel(RUN, "carol@ci")  # asked after the resume: it counts
    assert session.ledger.cancel_requested(RUN) == late


class StoppableHosts:
    """An executor that only records being told to stop."""

    def __init__(self) -> None:
        self.stopped: list[float] = []

    def stop(self, grace_s: float = 5.0) -> None:
        self.stopped.append(grace_s)


def test_a_cancel_during_host_setup_stops_the_hosts_once_they_start(session: Session) -> None:
    supervisor = Supervisor(session, owner=OWNER)
    attempt = _Attempt(slices=cast(SliceSet, None), restart_count=0)
    supervisor._attempt = attempt  # shipping and setting up: no executor yet
    supervisor.cancel()  # from another machine, through the lease's renewal
    hosts = StoppableHosts()
    attempt.executor = cast("Executor", hosts)
    supervisor._stop_hosts(Outcome.CANCELLED)  # what the attempt does once its hosts started
    supervisor._join_stopper()
    assert hosts.stopped == [supervisor.policy.checkpoint_wait_s]


def test_a_lease_taken_then_not_supervised_is_given_back_at_once(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_lock(path: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Lease, "acquire", staticmethod(no_lock))
    supervisor = Supervisor(session, owner=OWNER)
    with pytest.raises(OSError, match="No space"):
        supervisor._take_lease(prepared(session))
    assert session.ledger.lease_of(RUN) is None  # not held by nobody until its ttl runs out


def test_a_lease_the_ledger_is_too_busy_to_take_back_ends_the_run_with_a_warning(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    def busy(claim: LeaseClaim) -> bool:
        raise LedgerBusyError("the ledger is busy")

    warned: list[str] = []
    supervisor = Supervisor(session, owner=OWNER, warn=warned.append)
    run = prepared(session)
    supervisor._take_lease(run)
    monkeypatch.setattr(session.ledger, "release_lease", busy)
    supervisor._end_lease()  # raises nothing: the run's own result stands
    assert warned == ["the run's lease was not given back (the ledger is busy); it expires on its own"]
    local = Lease.acquire(run.run_dir.lock_file)  # the local lock was let go all the same
    assert local is not None
    local.release()


def test_a_loss_a_fenced_write_finds_is_the_supervisors_at_once(session: Session) -> None:
    supervisor = Supervisor(session, owner=OWNER)
    supervisor._take_lease(prepared(session))
    try:
        with sqlite3.connect(session.ledger.path) as raw:  # another owner's claim, as far as we can tell
            raw.execute("UPDATE run_leases SET token = 'stolen' WHERE run_id = ?", (RUN,))
        with pytest.raises(LeaseLostError) as raised:
            supervisor._session.ledger.update_run(RUN, status=RunStatus.RUNNING)  # long before a renewal
        assert supervisor._lost() is raised.value  # so its executor lets the hosts go unsignalled
    finally:
        supervisor._end_lease()


def test_a_budget_stop_just_before_the_start_stops_the_program_as_it_starts(session: Session) -> None:
    """The poll's stop lands after the attempt's last check and before the start: once the hosts run
    the program they are stopped at once, and only once however many polls follow."""
    supervisor = Supervisor(session, owner=OWNER, budget_usd=1.0)
    supervisor._run_id = RUN
    supervisor._grace_s = 2.0
    attempt = _Attempt(slices=cast("SliceSet", None), restart_count=0)
    supervisor._attempt = attempt  # setting up: no executor yet
    supervisor._stop_hosts(Outcome.BUDGET)  # the poll
    assert supervisor._may_start() is False
    hosts = StoppableHosts()
    supervisor._on_started(attempt, cast("Executor", hosts), 0.5)  # it had passed its last check
    supervisor._join_stopper()
    supervisor._stop_hosts(Outcome.BUDGET)  # the polls after it
    supervisor._join_stopper()
    assert hosts.stopped == [2.0]  # the run's --grace


class Said(Silent):
    """An observer that keeps the supervisor's statuses and the hosts' lines."""

    def __init__(self) -> None:
        self.statuses: list[str] = []
        self.lines: list[str] = []

    def line(self, worker: int, text: str) -> None:
        self.lines.append(text)

    def status(self, text: str) -> None:
        self.statuses.append(text)


def test_a_budget_reached_during_host_setup_is_said_once_and_starts_nothing(
    session: Session, tmp_path: Path
) -> None:
    """The budget is spent (v5e-8 on demand, 9.60 USD/h, against 0.001 USD and the stop's margin) while
    the hosts are shipped to and set up: the stop is said once, however many polls see it, the program
    never starts, and the run ends at its budget with its slice deleted."""
    from tpuctl.errors import BudgetExceededError
    from tpuctl.services.run.model import RecoveryPolicy, RunRequest
    from tpuctl.services.run.service import Runs

    work = tmp_path / "proj"
    work.mkdir()
    (work / "prog.py").write_text("print('the program started', flush=True)\n")
    request = RunRequest(
        script=str(work / "prog.py"),
        accelerator_type="v5e-8",
        runtime_deps=False,
        setup=("sleep 3",),  # a dozen budget polls while the hosts set up
        grace_s=1.0,
    )
    said = Said()
    runs = Runs(session)
    with pytest.raises(BudgetExceededError):
        runs.start(runs.prepare(request), observer=said, policy=RecoveryPolicy.off(), budget_usd=0.001)
    stops = [s for s in said.statuses if s.startswith("budget:")]
    assert len(stops) == 1, said.statuses
    assert not any("the program started" in line for line in said.lines)
    assert not any(s.startswith("started ") for s in said.statuses)
    (record,) = [r for r in session.ledger.list_runs() if r.run_id != RUN]
    assert record.status == RunStatus.BUDGET_EXCEEDED and record.exit_code == 7
    assert session.cloud.list_nodes(None) == []  # the slice it made is gone


def test_what_every_host_says_of_its_stop_is_said_once_and_only_what_it_said(session: Session) -> None:
    said = Said()
    supervisor = Supervisor(session, owner=OWNER, observer=said)
    notice = {"event": "notice", "source": "metadata", "t": 100.0, "reporter": "follower"}
    for worker in range(4):  # the follower of every host, then the runtime, report the same notice
        supervisor._on_event(worker, {**notice, "worker": worker}, 100.1)
    supervisor._on_event(0, {"event": "notice", "source": "sigterm", "t": 100.2, "worker": 0}, 100.3)
    for worker in range(4):  # a program of your own may say "preempted" on every host, without a save time
        supervisor._on_event(worker, {"event": "preempted", "step": 9, "checkpoint": "saved"}, 101.0)
    assert said.statuses == [
        "host 0: preemption notice (metadata)",
        "every host saved checkpoint step 9 and stopped",
    ]
    assert supervisor.progress.notice is not None and supervisor.progress.notice["t"] == 100.0


def test_a_ctrl_c_before_any_program_ran_says_so_and_not_that_hosts_were_stopped(session: Session) -> None:
    supervisor = Supervisor(session, owner=OWNER)
    assert supervisor._interrupted_message() == "interrupted before the program started on any host"
    attempt = _Attempt(slices=cast(SliceSet, None), restart_count=0)
    supervisor._attempt = attempt  # placing the slice, shipping, setting up
    assert supervisor._interrupted_message() == "interrupted before the program started on any host"
    attempt.executor = cast("Executor", StoppableHosts())  # the program runs on every host
    assert supervisor._interrupted_message() == "interrupted: every host was stopped"


def test_a_run_that_succeeds_after_a_resume_keeps_no_reason_it_once_failed_for(session: Session) -> None:
    earlier = "run x failed: host 0 raised ValueError: bad lr; the other hosts were stopped"
    session.ledger.update_run(RUN, detail={"reason": earlier, "error": "lost the lease"})
    supervisor = Supervisor(session, owner=OWNER)
    supervisor._run_id = RUN
    run = _Run(started=0.0, wall_start=None, slices=None)
    run.end(RunStatus.SUCCEEDED, 0)
    supervisor._settle(prepared(session), run, None)
    record = session.ledger.get_run(RUN)
    assert record is not None and record.status is RunStatus.SUCCEEDED
    assert (record.detail or {}).get("reason") is None and (record.detail or {}).get("error") is None


def test_a_program_that_finished_inside_the_notices_grace_succeeds_with_the_preemption_on_record(
    session: Session,
) -> None:
    zone = "us-central1-a"
    for kind, at in ((EventKind.REQUESTED, 10.0), (EventKind.CREATED, 20.0), (EventKind.READY, 30.0)):
        session.ledger.record_event(kind, pod="p", zone=zone, capacity=CapacityType.SPOT, run_id=RUN, ts=at)
    node = Node(
        name="p", zone=zone, accelerator_type="v5litepod-4", state="READY", capacity=CapacityType.SPOT
    )
    attempt = _Attempt(slices=SliceSet.single(node), restart_count=0)
    attempt.preemption = PreemptionRecord(
        number=1, kind=PreemptionKind.NOTICE_FINISHED, source="follower-notice", pod="p", zone=zone,
        capacity="spot", occurred_at=100.0, detected_at=100.1,
    )  # fmt: skip
    said = Said()
    supervisor = Supervisor(session, owner=OWNER, observer=said)
    run = _Run(started=0.0, wall_start=None, slices=attempt.slices)
    assert supervisor._on_succeeded(prepared(session), run, attempt) is True
    assert run.status is RunStatus.SUCCEEDED and supervisor.preemptions == [attempt.preemption]
    record = session.ledger.get_run(RUN)
    assert record is not None and record.preemptions == 1
    pod = session.ledger.get_pod("p", zone)
    assert pod is not None and pod.end_reason == "preempted" and pod.ended_at == 100.0  # billed to the notice
    (event,) = [e for e in session.ledger.pod_events("p", zone) if e.kind == EventKind.PREEMPTED]
    assert (event.detail or {})["kind"] == "notice_finished"
    assert said.statuses == [
        "p (us-central1-a) was preempted [notice_finished]: the program finished inside the notice's grace"
    ]
