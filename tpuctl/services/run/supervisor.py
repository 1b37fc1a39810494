"""The supervisor: the one lifecycle of every run. A run is a sequence of attempts (starts of the program
on a slice); a run without recovery is this lifecycle with a policy that allows none
(``RecoveryPolicy.off``).

While an attempt runs, the supervisor combines every sign of a preemption (``signals``):

- event lines on host output (``TPUCTL_EVENT``, ``tpuctl.runtime.preemption``): a ``notice`` (the metadata
  flag seen by tpuctl's follower on a host, for every program; or the flag or SIGTERM seen by the
  runtime), then the runtime's ``preempted`` with the step whose checkpoint every host saved, and exit
  status 75;
- the slice's state from the API, polled on a thread: PREEMPTED / TERMINATED / gone, or its queued
  resource SUSPENDING / SUSPENDED. A state counts only after ``confirm_polls`` polls in a row agree; a
  failed poll (a transient API error) neither counts nor resets the count;
- hosts dying: killed by a signal or lost, which is a preemption only when the API confirms it (within
  ``confirm_timeout_s``), otherwise a failure of the program.

Each attempt ends with exactly one ``Outcome`` (SUCCEEDED, PREEMPTED, MAINTENANCE, FAILED, CANCELLED,
BUDGET, TIMED_OUT) and one handler per outcome acts on it, once. A preemption's record says what the
program did with the notice (``PreemptionKind``); one that came with notice while the program finished
inside the grace is recorded with a SUCCEEDED attempt (``notice_finished``). On PREEMPTED: delete the
slice (it holds quota until deleted), place a new one through the allocator (the same zone first, then the
others, same price cap; backing off while no zone has capacity), ship, and start again with
``TPUCTL_RESTART_COUNT`` + 1; the runtime restores the newest checkpoint that verifies. A program failure
restarts on the same slice at most ``max_restarts`` times; preemptions have their own cap,
``max_preemptions``. On MAINTENANCE (a host taken for maintenance: the runtime checkpoints on its
notice, as on a preemption's): where Google keeps the VMs (``maintenance``), wait for the slice to be
READY again and start the program again on it, with ``TPUCTL_RESTART_COUNT`` + 1, recorded as a
maintenance, not a preemption; where it does not, or the slice does not come back within
``maintenance_wait_s``, it is a preemption of kind ``maintenance``.

Accounting goes to the ledger as it happens: segments (``segments``: provisioning, running,
checkpointing, preempted, recovering) with their slice, zone, capacity and step counts, and in the run's
detail a ``recovery`` record (``accounting``). Budget (``--budget``): checked at every step boundary the
runtime reports and on the poll thread; when the next step would go over, every host is told to stop the
way a preemption notice does (they checkpoint at one step), the slice is deleted and the run ends with
``BudgetExceededError``.

Supervision is leased in the ledger (``fencing``): the supervisor claims the run's lease before it acts,
renews it on a thread, and runs everything (placement, hosts, segments, deletions) over a session whose
ledger writes are fenced by the claim and whose cloud records a fenced intent before every create and
delete. The moment the lease is lost (a renewal or any write finds it gone) the supervisor stops acting on
the run: no cloud request, no ledger write, no signal to the hosts; it ends with ``LeaseLostError``
(exit 9). A cancel request in the ledger (``runs cancel`` from any machine) stops the run as SIGTERM does.
``runs resume`` takes a run whose lease is free or expired (``takeover``). The kernel lock on the run's
directory (``lease``) stays as a local shortcut; the ledger decides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpuctl.errors import (
    BudgetExceededError,
    InfeasibleError,
    InterruptedByUser,
    LeaseLostError,
    NotFoundError,
    RunFailedError,
    SliceDeletedError,
    TpuctlError,
)
from tpuctl.runtime.preemption import PREEMPTED_EXIT_CODE
from tpuctl.services.run import backstop, hosts
from tpuctl.services.run.accounting import (
    PreemptionRecord,
    Progress,
    notice_source,
    preemption_record,
    recovery_summary,
)
from tpuctl.services.run.control import record_bundle
from tpuctl.services.run.fencing import LeaseBoundExecutor, LeaseKeeper, fenced_session
from tpuctl.services.run.launcher import Launcher
from tpuctl.services.run.lease import Lease, supervisor_identity
from tpuctl.services.run.maintenance import MaintenanceRecord, Return, SliceReturn, kept_through_maintenance
from tpuctl.services.run.model import (
    AttemptResult,
    LaunchObserver,
    Outcome,
    PreparedRun,
    RecoveryPolicy,
    RunResult,
    Silent,
    SupervisedResult,
    describe_exit,
    exit_status,
)
from tpuctl.services.run.occupancy import deletion_of
from tpuctl.services.run.prepare import with_budget
from tpuctl.services.run.provision import placed_as, placed_type_line, renamed
from tpuctl.services.run.runkey import load_run_key, secret_key, store_run_key
from tpuctl.services.run.saved import record_request
from tpuctl.services.run.secretenv import store_secrets
from tpuctl.services.run.segments import Segments
from tpuctl.services.run.signals import EventTap, SliceWatch, StepBudget, classify
from tpuctl.services.run.takeover import take_over
from tpuctl.store.records import (
    EventKind,
    LeaseClaim,
    LeaseOwner,
    LedgerError,
    LedgerUnavailableError,
    PreemptionKind,
    RunStatus,
    SegmentKind,
)

if TYPE_CHECKING:
    from tpuctl.cloud.base import Node, OperationProgress
    from tpuctl.hosts.base import Executor
    from tpuctl.services.run.sliceset import SliceSet
    from tpuctl.services.session import Session
    from tpuctl.store.queue import QueueEntry


@dataclass
class _Attempt:
    """One start of the program, and how it ended."""

    slices: SliceSet
    restart_count: int
    result: AttemptResult | None = None
    outcome: Outcome | None = None
    preemption: PreemptionRecord | None = None
    started_at: float | None = None
    setup_s: float | None = None  # the hosts' setup before the program started
    executor: Executor | None = None
    maintenance_state: str | None = None  # the maintenance state the API showed while its hosts ran


@dataclass
class _Run:
    """Where a supervised run stands between attempts."""

    started: float  # monotonic, for the result's duration
    wall_start: float | None  # when the run was recorded (goodput's wall time)
    slices: SliceSet | None  # the slices the next attempt runs on; None: place them
    current: SliceSet | None = None  # the slices of the attempt in progress (or the last one)
    created: list[SliceSet] = field(default_factory=list)  # slices this run made (and so deletes)
    restart_count: int = 0
    prefer_zone: str | None = None
    status: RunStatus = RunStatus.FAILED
    exit_code: int | None = None
    deleted: bool = False

    def end(self, status: RunStatus, exit_code: int) -> None:
        self.status, self.exit_code = status, exit_code


#: A handler of one outcome: True when the run is done (succeeded), False to start the next attempt;
#: raises to end the run otherwise.
_Handler = Callable[[PreparedRun, "_Run", _Attempt], bool]


def _stopped_line(event: Mapping[str, Any]) -> str:
    """What the runtime's ``preempted`` event says, in words (only what it said: no "None s")."""
    step, save_s = event.get("step"), event.get("save_s")
    if event.get("checkpoint") != "saved":
        return f"every host stopped at step {step} without a checkpoint"
    took = f" ({save_s} s to save)" if isinstance(save_s, (int, float)) else ""
    return f"every host saved checkpoint step {step} and stopped{took}"


def _waits_for_capacity(exc: BaseException) -> bool:
    """No room now (stockouts everywhere, or quota a preempted slice still holds): wait and retry.
    Anything else (over the price cap, bad input) will not change by waiting."""
    from tpuctl.errors import NoCapacityError, NoQuotaError, StockoutError

    return isinstance(exc, (NoCapacityError, NoQuotaError, StockoutError)) or (
        isinstance(exc, InfeasibleError) and "no capacity" in exc.message.lower()
    )


class BackInQueueError(TpuctlError):
    """A server's run went back to its queue: its first placement found no quota or capacity anywhere
    (``requeue_when_no_room``). Not a failure: the server admits it again after a back-off."""

    kind = "back_in_queue"

    def __init__(self, run_id: str, cause: BaseException) -> None:
        why = cause.message if isinstance(cause, TpuctlError) else str(cause)
        super().__init__(f"run {run_id} went back to the queue: no room at Google: {why}")
        self.run_id = run_id


class Supervisor:
    """Runs a prepared run to its end through preemptions (see the module docstring)."""

    def __init__(
        self,
        session: Session,
        *,
        observer: LaunchObserver | None = None,
        policy: RecoveryPolicy | None = None,
        budget_usd: float | None = None,
        warn: Callable[[str], None] | None = None,
        owner: LeaseOwner | None = None,
        requeue_when_no_room: bool = False,
    ) -> None:
        self._session = session
        # A server's admitted run whose first placement finds no quota or capacity goes back to the queue
        # (``BackInQueueError``) instead of failing for being early.
        self._requeue_when_no_room = requeue_when_no_room
        self._owner = owner or LeaseOwner.of_this_process()
        self._inner: LaunchObserver = observer or Silent()
        chosen = policy or RecoveryPolicy()
        if chosen.confirm_timeout_s is None:
            grace = hosts.notice_grace_s(session)
            if grace:
                # A killed host is confirmed preempted only once the node is PREEMPTED, which the backend
                # makes it at the end of its notice grace: wait at least that long.
                chosen = dataclasses.replace(chosen, confirm_timeout_s=max(5.0, grace + 2.0))
        self.policy = chosen.resolved(session.backend.tuning.recovery)
        # How long before a maintenance the metadata server warns (Google's 60 s where it says nothing).
        self._maintenance_notice_s = hosts.maintenance_notice_s(session)
        self._budget_usd = budget_usd
        self._warn = warn or self._inner.status
        self._observer = EventTap(self._inner, self._on_event)
        self.progress = Progress()
        self.preemptions: list[PreemptionRecord] = []
        self.maintenances: list[MaintenanceRecord] = []
        self.restarts = 0
        self._run_id: str | None = None
        self._attempt: _Attempt | None = None
        self._bind(session)
        self._lock = threading.Lock()
        self._detail_lock = threading.Lock()
        self._stop_reason: Outcome | None = None  # set when we stop the hosts ourselves
        self._budget_said = False  # the budget stop was told to the user (once per run)
        self._stop_pending = False  # a budget stop came before the attempt's hosts could be stopped
        self._stopper: threading.Thread | None = None
        self._budget: StepBudget | None = None
        self._grace_s: float | None = None  # the run's --grace: how long a budget stop waits for SIGTERM
        self._lease: Lease | None = None  # the local shortcut: the kernel lock on the run's directory
        self._keeper: LeaseKeeper | None = None  # the ledger lease: the authority
        self._cancel = threading.Event()
        self._notice_seen_at: float | None = None  # when the supervisor read this attempt's notice
        self._preempted_seen_at: float | None = None  # ... and its "preempted, checkpoint saved"
        self._handlers: dict[Outcome, _Handler] = {
            Outcome.SUCCEEDED: self._on_succeeded,
            Outcome.CANCELLED: self._on_cancelled,
            Outcome.TIMED_OUT: self._on_timed_out,
            Outcome.BUDGET: self._on_budget,
            Outcome.FAILED: self._on_failed,
            Outcome.PREEMPTED: self._on_preempted,
            Outcome.MAINTENANCE: self._on_maintenance,
        }

    # --- public ---------------------------------------------------------------------------------

    def run(self, prepared: PreparedRun, *, progress: OperationProgress | None = None) -> SupervisedResult:
        """A new run: recorded, leased, run to its end. Raises ``RunFailedError`` (a host failed, the
        timeout, too many preemptions), ``InterruptedByUser`` (Ctrl-C, cancel) or ``BudgetExceededError``
        (exit 7) when the budget stopped it."""
        self.create_record(prepared)
        return self.supervise(prepared, progress=progress)

    def create_record(self, prepared: PreparedRun, *, queue: QueueEntry | None = None) -> None:
        """Record the run; with ``queue``, QUEUED in the server's queue (a replica admits it)."""
        # A budget that could not be enforced is refused before the run exists (exit 2).
        with_budget(self._session, prepared, self._budget_usd)
        target = prepared.target
        status = RunStatus.PROVISIONING if target.creates else RunStatus.PENDING
        # Whose run it is and whose share it uses: everything later done for it (its slices, attempts
        # and cost) is attributed to these, whoever supervises it. A workspace the actor may not start
        # runs in is exit 2 here, before anything exists (the queue's entry has resolved it already).
        actor = self._session.actor
        workspace = actor.submit_workspace(prepared.request.workspace) if queue is None else queue.workspace
        self._session.ledger.create_run(
            prepared.run_id,
            script=prepared.display,
            args=list(prepared.program),
            status=status if queue is None else RunStatus.QUEUED,
            priority=None if queue is None else queue.priority,
            queue_reason=None if queue is None else queue.reason,
            pod=target.name,
            zone=target.zone,
            accelerator_type=target.accelerator.api_name,
            capacity=target.capacity,
            labels=prepared.request.labels,
            principal=actor.principal,
            workspace=workspace,
            detail={
                "hosts": target.accelerator.hosts,
                "slices": target.slices,
                "bundle_sha256": prepared.bundle.digest,
                "bundle_bytes": prepared.bundle.total_bytes,
                "executor": prepared.executor_kind,
                "log_dir": str(prepared.run_dir.root),
                "checkpoint_dir": prepared.checkpoint_dir,
                "created_pod": target.creates,
                "env_keys": sorted(prepared.user_env),
                "secret_names": sorted(prepared.secrets),
                "supervised": True,
                "policy": self.policy.to_dict(),
                "budget_usd": self._budget_usd,
            },
        )
        # Everything another machine needs to supervise the run: its request and its program's files.
        record_request(
            self._session.ledger,
            prepared.run_dir,
            prepared.request,
            run_id=prepared.run_id,
            budget_usd=self._budget_usd,
            policy=self.policy,
            key=secret_key(self._session.settings),
            script_in_bundle=None if prepared.request.script is None else prepared.display,
            requirements_text=prepared.setup.requirements,
        )
        record_bundle(self._session.ledger, prepared.run_id, prepared.bundle)
        store_secrets(
            self._session.ledger, prepared.run_id, prepared.secrets, secret_key(self._session.settings)
        )
        store_run_key(self._session, prepared)

    def cancel(self) -> None:
        """Stop the run from another thread: the hosts are told to stop as on a preemption notice (they
        checkpoint), then the run ends CANCELLED."""
        self._cancel.set()
        self._stop_hosts(Outcome.CANCELLED)

    def supervise(
        self,
        prepared: PreparedRun,
        *,
        progress: OperationProgress | None = None,
        resume: bool = False,
        claim: LeaseClaim | None = None,
    ) -> SupervisedResult:
        """Run (or, with ``resume``, take over and continue) a run already in the ledger; under ``claim``
        when the caller already holds the run's lease for this supervisor's owner (a server claims the
        runs it takes up), else under a claim of its own."""
        # The run's SSH key, from the ledger whoever recorded the run: held in memory, never in a file.
        prepared = dataclasses.replace(prepared, ssh_key=load_run_key(self._session, prepared.run_id))
        # Under a budget, every slice it places (recoveries too) is one the budget can price.
        prepared = with_budget(self._session, prepared, self._budget_usd)
        self._run_id = prepared.run_id
        self._grace_s = prepared.request.grace_s
        self._take_lease(prepared, resume=resume, claim=claim)
        try:
            return self._supervise_leased(prepared, progress=progress, resume=resume)
        finally:
            self._end_lease()

    def _supervise_leased(
        self, prepared: PreparedRun, *, progress: OperationProgress | None, resume: bool
    ) -> SupervisedResult:
        record = self._session.ledger.get_run(prepared.run_id)
        assert record is not None
        run = _Run(started=time.monotonic(), wall_start=record.created_at, slices=prepared.target.existing)
        deadline_at = prepared.request.deadline_at
        if self._budget_usd is not None or deadline_at is not None:
            # Stopping takes up to --grace (SIGTERM, then SIGKILL) before the slice is deleted.
            margin_s = (self.policy.budget_margin_s or 0.0) + prepared.request.grace_s
            started = run.wall_start if run.wall_start is not None else time.time()
            self._budget = StepBudget(
                self._session,
                prepared.run_id,
                self._budget_usd,
                margin_s,
                self._warn,
                assumed_usd_per_hour=prepared.request.assumed_price_per_hour,
                deadline=None if deadline_at is None else (deadline_at, started),
            )
        failure: BaseException | None = None
        try:
            self._update_detail(supervisor=supervisor_identity())
            if resume:
                self._resume(prepared, record, run)
            while not self._next_attempt(prepared, run, progress):
                pass
        except KeyboardInterrupt:
            run.end(RunStatus.CANCELLED, 130)
            failure = InterruptedByUser(self._interrupted_message())
        except BaseException as exc:
            failure = exc
            if isinstance(exc, InterruptedByUser):
                run.end(RunStatus.CANCELLED, 130)
        if isinstance(failure, LedgerUnavailableError) and self._keeper is not None:
            # The database out of reach mid-run ends this supervision, not the run: a settle would record
            # a failure the run never had (if it could record anything). Left as a lost lease leaves it.
            self._keeper.give_up(failure)
        # Not ours any more: nothing is deleted or recorded; the new owner settles the run.
        if (lost := self._lost()) is not None:
            raise lost
        if isinstance(failure, LeaseLostError):
            raise failure
        if self._back_in_queue(prepared, run, failure, resume=resume):
            assert failure is not None
            raise BackInQueueError(prepared.run_id, failure)
        summary = self._settle(prepared, run, failure)
        if isinstance(failure, BudgetExceededError) and self._budget is not None and self._budget.decision:
            failure = self._budget.final_error(run_id=prepared.run_id)
            final = {"spent_usd": self._budget.spent_usd, "stopped_at": self._budget.stopped_at}
            self._update_detail(budget={**self._budget.decision.to_dict(), **final})
        if failure is not None:
            raise failure
        return self._result(prepared, run, summary)

    def _back_in_queue(
        self, prepared: PreparedRun, run: _Run, failure: BaseException | None, *, resume: bool
    ) -> bool:
        """Send a fresh run that placed nothing back to the server's queue when its placement found no
        quota or capacity anywhere (under its lease: the write is fenced); True when it went back."""
        if not self._requeue_when_no_room or resume or run.created or failure is None:
            return False
        if not _waits_for_capacity(failure):
            return False
        self._segments.close()
        why = failure.message if isinstance(failure, TpuctlError) else str(failure)
        return self._session.ledger.requeue_run(prepared.run_id, f"no room at Google: {why}")

    # --- the lifecycle --------------------------------------------------------------------------

    def _take_lease(
        self, prepared: PreparedRun, *, resume: bool = False, claim: LeaseClaim | None = None
    ) -> None:
        """Claim the run's ledger lease unless ``claim`` is given (``LeaseHeldError``, exit 9, while
        another owner's is live), then
        act through a session fenced by it, renewed on a thread from now on. A resume first clears the
        run's cancel request: an earlier owner already ended the run on it, and it would otherwise cancel
        every later resume at once."""
        session = self._session
        settings = session.settings
        claimed_at = time.monotonic()  # the ledger's expiry counts from this moment or later
        if claim is None:
            claim = session.ledger.claim_lease(prepared.run_id, self._owner, settings.lease_duration)
        else:  # renewed first: its holder spent part of its ttl before handing it over
            claim = session.ledger.renew_lease(claim, settings.lease_duration)
        self._keeper = keeper = LeaseKeeper(
            session.ledger,
            claim,
            ttl_s=settings.lease_duration,
            renew_every_s=settings.lease_renew_every,
            on_lost=self._on_lease_lost,
            on_cancel=lambda request: self.cancel(),
            claimed_at=claimed_at,
        )
        try:
            if resume and claim.cancel is not None:
                session.ledger.clear_cancel(claim)
                keeper.claim = claim = dataclasses.replace(claim, cancel=None)
            # The kernel lock stays a local shortcut (a second supervisor on this machine sees it at
            # once); failing to take it changes nothing: the ledger lease decides.
            self._lease = Lease.acquire(prepared.run_dir.lock_file)
            self._bind(fenced_session(session, claim, on_lost=keeper.note_lost, lost=lambda: keeper.lost))
            keeper.start()
        except BaseException:
            # Not supervising after all (an OSError from the local lock, Ctrl-C): give the lease back now
            # rather than leave the run held by nobody until its ttl runs out.
            self._end_lease()
            raise

    def _end_lease(self) -> None:
        """Stop renewing and give the lease back (unless it was lost: then nothing is written)."""
        keeper, self._keeper = self._keeper, None
        try:
            if keeper is not None:
                keeper.release()
        except LedgerError as exc:
            # The run's result (or the error it ended with) matters more than an early release: the
            # lease expires on its own at the end of its ttl.
            self._warn(f"the run's lease was not given back ({exc.message}); it expires on its own")
        finally:
            if self._lease is not None:
                self._lease.release()
                self._lease = None

    def _lost(self) -> LeaseLostError | None:
        """The loss of the run's lease, once a renewal or a fenced write saw it (None while it holds)."""
        return None if self._keeper is None else self._keeper.lost

    def _on_lease_lost(self, lost: LeaseLostError) -> None:
        """On the renewal thread: the run is no longer ours. Say so; the attempt's executor stops
        answering (``LeaseBoundExecutor``) and every fenced write or cloud mutation fails from now on."""
        self._inner.status(f"lease lost: {lost.message}")

    def _bind(self, session: Session) -> None:
        """Act through ``session`` from now on (the fenced one once the lease is claimed)."""
        self._session = session
        self.launcher = Launcher(session, observer=self._observer, executor_factory=self._executor)
        self._segments = Segments(session, self.progress)

    def _executor(self, prepared: PreparedRun, slices: SliceSet) -> Executor:
        """The attempt's executor, bound to the lease: it lets the hosts go, unsignalled, once lost. Host 0
        of a slice the run made carries the run's backstop, checked in while the executor is open."""
        inner: Executor = hosts.build_executor(self._session, prepared, slices, for_plan=False)
        plan = backstop.plan_for(self._session, prepared, slices)
        if plan is not None:
            inner = backstop.Backstopped(
                inner,
                plan,
                status=self._inner.status,
                on_armed=lambda armed: self._update_detail(
                    backstop={**armed.to_dict(), "armed_at": time.time()}
                ),
            )
        return LeaseBoundExecutor(inner, self._lost)

    def _resume(self, prepared: PreparedRun, record: Any, run: _Run) -> None:
        """Take over from a dead supervisor: its counts, its progress, and what becomes of its slices."""
        taken = take_over(
            self._session,
            self._inner,
            prepared,
            record,
            self.progress,
            lambda node, reason: self._delete_node(node, reason=reason),
        )
        self.restarts, self.preemptions = taken.restarts, taken.preemptions
        recovery = (record.detail or {}).get("recovery") or {}
        self.maintenances = [MaintenanceRecord.from_dict(m) for m in recovery.get("maintenance") or []]
        run.slices, run.restart_count, run.prefer_zone = taken.slices, taken.restart_count, taken.prefer_zone
        if run.slices is not None and run.slices != prepared.target.existing:
            run.created.append(run.slices)

    def _next_attempt(self, prepared: PreparedRun, run: _Run, progress: OperationProgress | None) -> bool:
        """Place the slice if there is none, run one attempt, act on its outcome. True once done."""
        if (lost := self._lost()) is not None:
            raise lost
        if self._cancel.is_set():
            raise InterruptedByUser("cancelled: the run was stopped")
        if run.slices is None:
            run.slices = self._provision(prepared, run.prefer_zone, progress, run.restart_count)
            run.created.append(run.slices)
            if self._cancel.is_set():  # asked while the slice was being placed: start nothing on it
                raise InterruptedByUser("cancelled: the run was stopped")
        run.current = run.slices
        # Of several slice types, the run is of the one it was placed on (hosts, topology, launch spec).
        prepared = placed_as(self._session.catalog, prepared, run.slices)
        attempt = self._run_attempt(prepared, run.slices, run.restart_count)
        assert attempt.outcome is not None
        return self._handlers[attempt.outcome](prepared, run, attempt)

    def _on_succeeded(self, prepared: PreparedRun, run: _Run, attempt: _Attempt) -> bool:
        record = attempt.preemption
        if record is not None:  # the notice came, and the program finished inside its grace
            self.preemptions.append(record)
            self._session.ledger.update_run(prepared.run_id, preemptions=len(self.preemptions))
            self._inner.status(
                f"{self._which_lost(attempt.slices, record)} ({attempt.slices.zone}) was preempted "
                f"[{record.kind}]: the program finished inside the notice's grace"
            )
            self._record_preempted(prepared, attempt.slices, record)
        run.end(RunStatus.SUCCEEDED, 0)
        return True

    def _on_cancelled(self, prepared: PreparedRun, run: _Run, attempt: _Attempt) -> bool:
        run.end(RunStatus.CANCELLED, 130)
        raise InterruptedByUser("interrupted: every host was stopped")

    def _interrupted_message(self) -> str:
        """What a Ctrl-C outside an attempt's run stopped: the program on the hosts, or only what comes
        before it (placing a slice, setting its hosts up), where there was no program to stop."""
        attempt = self._attempt
        if attempt is not None and attempt.executor is not None and attempt.result is None:
            return "interrupted: every host was stopped"
        return "interrupted before the program started on any host"

    def _on_timed_out(self, prepared: PreparedRun, run: _Run, attempt: _Attempt) -> bool:
        run.end(RunStatus.FAILED, 124)
        run_id = prepared.run_id
        raise RunFailedError(
            f"run {run_id} exceeded --timeout {prepared.request.timeout_s:g} s; every host was stopped",
            fix=f"raise --timeout, or check the logs with `tpuctl runs logs {run_id}`",
            returncode=124,
        )

    def _on_budget(self, prepared: PreparedRun, run: _Run, attempt: _Attempt) -> bool:
        assert self._budget is not None and self._budget.decision is not None
        run.end(RunStatus.BUDGET_EXCEEDED, 7)
        raise self._budget.decision.error(run_id=prepared.run_id)

    def _on_failed(self, prepared: PreparedRun, run: _Run, attempt: _Attempt) -> bool:
        """The program failed: restart it on the same slice while ``max_restarts`` allows, else end."""
        result = attempt.result
        assert result is not None and run.slices is not None
        run_id, limit = prepared.run_id, self.policy.max_restarts
        if self.restarts >= limit:
            worker, rc = result.failed_worker, result.returncode
            if worker is None:  # every host ended, none 0 nor "preempted": the first non-0
                worker, rc = next(((w, c) for w, c in sorted(result.exit_codes.items()) if c != 0), (0, None))
            run.end(RunStatus.FAILED, exit_status(rc))
            plural = "s" if self.restarts != 1 else ""
            after = f" (after {self.restarts} restart{plural}, --max-restarts {limit})" if limit else ""
            raised = result.exceptions.get(worker)
            how = f"raised {raised}" if raised else describe_exit(rc)
            raise RunFailedError(
                f"run {run_id} failed: host {worker} {how}; the other hosts were stopped{after}",
                worker=worker,
                returncode=rc,
                fix=f"see its output: `tpuctl runs logs {run_id} --worker {worker}`",
            )
        self.restarts += 1
        run.restart_count += 1
        self._session.ledger.update_run(run_id, restarts=self.restarts, status=RunStatus.RECOVERING)
        self._inner.status(
            f"the program failed; restarting it on {run.slices.name} "
            f"(restart {self.restarts} of --max-restarts {limit})"
        )
        return False

    def _on_preempted(self, prepared: PreparedRun, run: _Run, attempt: _Attempt) -> bool:
        """The slice (or a slice of the set) was preempted: free them all and go on on new ones, while
        ``max_preemptions`` allows. A multislice is re-placed whole: Google suspends the whole queued
        resource when one of its slices is preempted, and a queued resource's nodes cannot be replaced
        one by one (docs/multislice-facts.md, section 3)."""
        assert attempt.preemption is not None and run.slices is not None
        record, slices, run_id = attempt.preemption, run.slices, prepared.run_id
        deleted = deletion_of(self._session.ledger, run_id)
        if deleted is not None:  # the user deleted the slice: the run stops, nothing to recover from
            run.end(RunStatus.CANCELLED, SliceDeletedError.exit_code)
            raise SliceDeletedError(
                f"run {run_id}: slice {slices.describe()} ({slices.zone}) was deleted "
                f"({deleted.get('by')}) while the run was on it; stopped",
                fix=f"resume it on a new slice with `tpuctl runs resume {run_id}`",
            )
        self.preemptions.append(record)
        self._session.ledger.update_run(
            run_id, preemptions=len(self.preemptions), status=RunStatus.RECOVERING
        )
        if len(self.preemptions) > self.policy.max_preemptions:
            run.end(RunStatus.FAILED, 8)
            self._free_slice(prepared, slices, record, created=slices in run.created)
            run.deleted = True
            raise RunFailedError(
                f"run {run_id} was preempted {len(self.preemptions)} times, more than "
                f"--max-preemptions {self.policy.max_preemptions}; stopped",
                fix="raise --max-preemptions, use on-demand capacity, or resume it later with "
                f"`tpuctl runs resume {run_id}`",
            )
        if prepared.target.existing is not None:
            run.end(RunStatus.FAILED, 8)
            flag = f" --slices {slices.count}" if slices.is_multislice else ""
            raise RunFailedError(
                f"run {run_id}: slice {slices.describe()} (given with --pod) was preempted; tpuctl does not "
                "replace a slice it did not create",
                fix=f"run with --type {prepared.target.accelerator.friendly_name}{flag} (and --spot) so "
                "tpuctl places and replaces the slice itself",
            )
        self._free_slice(prepared, slices, record, created=True)
        run.prefer_zone = slices.zone
        run.slices = run.current = None
        run.restart_count += 1
        self._save_recovery(final_step=None)
        if self._budget is not None:
            self._budget.refresh()
            if self._budget.check(next_step_s=0.0) is not None:
                return self._on_budget(prepared, run, attempt)
        return False

    def _on_maintenance(self, prepared: PreparedRun, run: _Run, attempt: _Attempt) -> bool:
        """Its host was taken for maintenance: where Google keeps the slice, wait until it is READY again
        and start the program again on it; else (or when it does not come back) a preemption
        (``tpuctl.services.run.maintenance``)."""
        assert attempt.preemption is not None and attempt.result is not None and run.slices is not None
        slices, preemption = run.slices, attempt.preemption
        if not kept_through_maintenance(slices):
            self._inner.status(
                f"{slices.describe()} ({slices.zone}): its host was taken for maintenance, and Google does "
                f"not restart {slices.capacity.value} {slices.surface.value} VMs; replacing it"
            )
            return self._on_preempted(prepared, run, attempt)
        if len(self.maintenances) >= self.policy.max_preemptions:
            self._inner.status(
                f"{slices.describe()}: host maintenance number {len(self.maintenances) + 1}, more than "
                f"--max-preemptions {self.policy.max_preemptions}; replacing the slice"
            )
            return self._on_preempted(prepared, run, attempt)
        notice = self.progress.maintenance or {}
        record = MaintenanceRecord(
            number=len(self.maintenances) + 1,
            pod=slices.name,
            zone=slices.zone,
            value=str(notice.get("value") or ""),
            source=preemption.source,
            occurred_at=preemption.occurred_at,
            detected_at=preemption.detected_at,
            checkpoint_step=preemption.checkpoint_step,
        )
        # Down already: the API showed the maintenance, or the hosts died with their VMs. Not when the
        # program stopped on the notice (it said so, or exited 75), nor when the supervisor stopped the
        # hosts itself: a host that then dies of that stop (SIGTERM once the runtime gave SIGTERM back)
        # says nothing of the VM.
        codes = attempt.result.exit_codes.values()
        stopped = self.progress.preempted is not None or PREEMPTED_EXIT_CODE in codes or self._stop_reason
        died = not stopped and any(c is None or c < 0 for c in codes)
        what = self.progress.checkpoint_note(record.checkpoint_step, prepared.request.checkpoint_every)
        self._inner.status(
            f"{slices.describe()} ({slices.zone}): its host is being maintained [{what}]; waiting for "
            "Google to bring it back"
        )
        self._session.ledger.update_run(prepared.run_id, status=RunStatus.RECOVERING)
        self._open_segment(SegmentKind.RECOVERING, slices, detail={"maintenance": record.number})
        waited = SliceReturn(
            get_node=self._session.cloud.get_node,
            poll_s=self.policy.poll_s or 1.0,
            timeout_s=self.policy.maintenance_wait_s,
            notice_s=self._maintenance_notice_s,
            settle_s=self.policy.confirm_timeout_s or 5.0,
            sleep=self._session.sleep,
            monotonic=self._session.monotonic,
            clock=self._session.clock,
        ).wait(slices, noticed_at=record.occurred_at, went_down=died or attempt.maintenance_state is not None)
        self._segments.close()
        record.waited_s, record.went_down = waited.waited_s, waited.went_down
        if waited.how is not Return.BACK:
            why = "it is gone" if waited.how is Return.LOST else f"not READY after {waited.waited_s:.0f} s"
            self._inner.status(
                f"{slices.describe()} did not come back from maintenance ({why}); replacing it"
            )
            return self._on_preempted(prepared, run, attempt)
        record.back_at = time.time()
        self.maintenances.append(record)
        self._save_recovery(final_step=None)
        run.restart_count += 1
        self._inner.status(
            f"{slices.describe()} is back after its maintenance ({waited.waited_s:.0f} s); starting the "
            "program again on it"
        )
        return False

    def _settle(self, prepared: PreparedRun, run: _Run, failure: BaseException | None) -> dict[str, Any]:
        """However the run ended: delete the slice it made (unless kept), record the end and the recovery
        summary in the ledger, and give up supervision in the run's detail."""
        self._segments.close()
        run_id, current = prepared.run_id, run.current
        ours = current is not None and current in run.created
        if ours and current is not None and not prepared.request.keep_pod:
            run.deleted = self._delete_slices(current, reason=f"end of run {run_id}")
        elif run.status is RunStatus.BUDGET_EXCEEDED and ours and current is not None:
            run.deleted = self._delete_slices(current, reason=f"run {run_id} at its budget")
        final_step = self.progress.last_step
        detail: dict[str, Any] = {"deleted_pod": run.deleted or current is None}
        last = self._attempt.result if self._attempt is not None else None
        if last is not None:
            detail.update(
                exit_codes={str(k): v for k, v in last.exit_codes.items()},
                failed_worker=last.failed_worker,
                shipped_hosts=sum(1 for s in last.shipped if s.shipped),
            )
        if run.status is RunStatus.BUDGET_EXCEEDED and self._budget and self._budget.decision:
            detail["budget"] = self._budget.decision.to_dict()
        # Why it ended, for `runs describe` (the message the user saw); None once it succeeded: a reason
        # an earlier supervisor recorded must not outlive a `runs resume` that finished the run.
        detail["reason"] = detail["error"] = None
        if failure is not None:
            detail["reason"] = failure.message if isinstance(failure, TpuctlError) else str(failure)
        if failure is not None and not isinstance(
            failure, (RunFailedError, InterruptedByUser, BudgetExceededError)
        ):
            detail["error"] = str(failure)
            if isinstance(failure, TpuctlError) and failure.exit_code:
                run.exit_code = failure.exit_code
        summary = self._save_recovery(final_step=final_step, end=time.time(), wall_start=run.wall_start)
        detail["supervisor"] = None
        self._update_detail(**detail)
        self._session.ledger.update_run(
            run_id,
            status=run.status,
            exit_code=run.exit_code,
            steps=final_step or 0,
            restarts=self.restarts,
            preemptions=len(self.preemptions),
        )
        return summary

    def _price_per_hour(self, prepared: PreparedRun, slices: SliceSet) -> float | None:
        """What the run's slices cost per hour together (None: unknown)."""
        one = self._session.catalog.price_per_hour(prepared.target.accelerator, slices.zone, slices.capacity)
        return None if one is None else one * slices.count

    def _result(self, prepared: PreparedRun, run: _Run, summary: dict[str, Any]) -> SupervisedResult:
        assert run.current is not None and self._attempt is not None and self._attempt.result is not None
        result = self._attempt.result
        prepared = placed_as(self._session.catalog, prepared, run.current)  # of the type it ended on
        return SupervisedResult(
            run=RunResult(
                run_id=prepared.run_id,
                pod=run.current.name,
                zone=run.current.zone,
                hosts=prepared.target.hosts,
                exit_code=0,
                duration_s=time.monotonic() - run.started,
                log_dir=prepared.run_dir.root,
                bundle_sha256=prepared.bundle.digest,
                shipped_hosts=sum(1 for s in result.shipped if s.shipped),
                deleted_pod=run.deleted,
                capacity=run.current.capacity.value,
                price_per_hour=self._price_per_hour(prepared, run.current),
            ),
            preemptions=self.preemptions,
            restarts=self.restarts,
            summary=summary,
        )

    # --- one attempt ----------------------------------------------------------------------------

    def _run_attempt(self, prepared: PreparedRun, slices: SliceSet, restart_count: int) -> _Attempt:
        attempt = _Attempt(slices=slices, restart_count=restart_count)
        with self._lock:
            self._attempt = attempt
            self._stop_reason = None
            self._stop_pending = False
        self.progress.new_attempt()
        self._open_segment(SegmentKind.RUNNING, slices, detail={"restart_count": restart_count})
        if self._budget is not None:
            self._budget.refresh()
        watch = SliceWatch(
            self._session.cloud,
            slices,
            poll_s=self.policy.poll_s or 1.0,
            confirm=self.policy.confirm_polls,
            on_poll=lambda: self._poll_tick(watch),
        )
        watch.start()

        try:
            result = self.launcher.execute(
                prepared,
                slices,
                restart_count=restart_count,
                soft_exit_codes=frozenset({PREEMPTED_EXIT_CODE}),
                soft_wait_s=self.policy.checkpoint_wait_s,
                on_started=lambda executor, setup_s: self._on_started(attempt, executor, setup_s),
                may_start=self._may_start,
                stopping=self._stopping,
            )
        finally:
            watch.close()
            self._join_stopper()
        # How the slice looked from the API meanwhile (failed polls are counted, never acted on), and how
        # long its hosts' setup took (None: they never got that far).
        self._segments.describe_running(
            {
                "restart_count": restart_count,
                "api_polls": watch.polls,
                "api_poll_errors": watch.errors,
                "setup_s": None if attempt.setup_s is None else round(attempt.setup_s, 3),
            }
        )
        attempt.result = result
        attempt.outcome = self._classify(attempt, watch, prepared.target.accelerator.hosts)
        self._after_attempt(attempt)
        return attempt

    def _on_started(self, attempt: _Attempt, executor: Executor, setup_s: float) -> None:
        """Every host runs the program: the attempt's hosts can be stopped from now on."""
        attempt.started_at = time.time()
        attempt.setup_s = setup_s
        with self._lock:
            attempt.executor = executor
            if self._stop_pending:
                # The budget stopped the run after the attempt's last ``_may_start`` and before the start:
                # the program has just started; stop it now (a moment's spend, not a run's).
                self._stop_pending = False
                self._launch_stopper(executor, self._grace_s)
        self._record_hosts(executor)
        if self._cancel.is_set():
            self._stop_hosts(Outcome.CANCELLED)

    def _poll_tick(self, watch: SliceWatch) -> None:
        """Every poll while hosts run: act on a confirmed lost slice, and check the budget."""
        if watch.confirmed.is_set() and watch.confirmed_state != "QR_SUSPENDING":
            # The slice is gone from under the hosts: do not wait for their connections to time out.
            # (SUSPENDING is the notice: the hosts are checkpointing, let them.)
            self._stop_hosts(Outcome.PREEMPTED, grace_s=1.0)
        elif watch.maintenance_state is not None:
            # The hosts are being maintained: their connections may hang rather than drop.
            self._stop_hosts(Outcome.MAINTENANCE, grace_s=1.0)
        if self._budget is not None:
            poll = self.policy.poll_s or 1.0
            if self._budget.check(next_step_s=max(poll, self._budget.step_s)) is not None:
                self._budget_stop()

    def _on_event(self, worker: int, event: dict[str, Any], at: float) -> None:
        """A runtime event line from a host (called on the launcher's thread, in order)."""
        kind = event.get("event")
        if kind == "notice":
            first = self.progress.notice is None
            self.progress.on_event(event, at)
            if first:
                # Said once, whoever reported it (the follower and the runtime may both): what the
                # program does with it shows when the attempt ends.
                self._inner.status(
                    f"host {event.get('worker', worker)}: preemption notice ({event.get('source')})"
                )
                attempt = self._attempt
                if attempt is not None and self._stop_reason is None:
                    self._open_segment(
                        SegmentKind.CHECKPOINTING, attempt.slices, detail={"notice": event, "seen_at": at}
                    )
            return
        if kind == "maintenance":
            self._on_maintenance_notice(worker, event, at)
            return
        if worker != 0 and kind != "preempted":
            return
        lost = len(self.progress.lost_restores)
        self.progress.on_event(event, at)
        if kind == "start" and len(self.progress.lost_restores) > lost:
            self._lost_restore(self.progress.lost_restores[-1])
        if kind == "start":
            if event.get("skipped"):
                skipped = ", ".join(f"step {s.get('step')} ({s.get('reason')})" for s in event["skipped"])
                restored = event.get("restored")
                self._inner.status(
                    f"checkpoint fallback: {skipped} unreadable; restored "
                    + (f"step {restored}" if restored is not None else "nothing (starting fresh)")
                )
            elif event.get("restored") is not None:
                self._inner.status(f"restored checkpoint step {event.get('restored')}")
        elif kind == "step":
            dt = event.get("dt")
            if self._budget is not None and isinstance(dt, (int, float)):
                self._budget.observe_step(float(dt))
                if self._budget.check() is not None:
                    self._budget_stop()
        elif kind == "preempted":
            if self._preempted_seen_at is not None:
                return  # a program may say it on every host: once is the news
            self._preempted_seen_at = at
            self._inner.status(_stopped_line(event))
            if event.get("checkpoint") == "saved":
                # Host 0 says so only once the step is committed (orbax finalizes after every host
                # wrote): nothing the hosts still do matters, and jax's shutdown at exit takes seconds.
                self._stop_hosts(Outcome.PREEMPTED, grace_s=1.0)

    def _on_maintenance_notice(self, worker: int, event: dict[str, Any], at: float) -> None:
        """A host's maintenance notice: said once per value; one that ends the VM opens the attempt's
        checkpointing segment, as a preemption notice does (the runtime stops on it and checkpoints)."""
        first = self.progress.maintenance is None
        self.progress.on_event(event, at)
        value = str(event.get("value") or "")
        if self.progress.maintenance is None:
            self._inner.status(
                f"host {event.get('worker', worker)}: host maintenance notice ({value}); a TPU VM cannot "
                "live-migrate, so nothing is done"
            )
            return
        if not first:
            return
        self._inner.status(f"host {event.get('worker', worker)}: host maintenance notice ({value})")
        attempt = self._attempt
        if attempt is not None and self._stop_reason is None and self.progress.notice is None:
            self._open_segment(
                SegmentKind.CHECKPOINTING, attempt.slices, detail={"maintenance": event, "seen_at": at}
            )

    def _lost_restore(self, lost: dict[str, Any]) -> None:
        """The program reported a checkpoint, and its restart restored less: say so, and keep it in the
        run record (``runs describe``), never silence."""
        restored = lost.get("restored")
        self._inner.status(
            f"error: the program reported a checkpoint at step {lost.get('saved')}, and its restart restored "
            + (f"only step {restored}" if restored is not None else "nothing (it starts again from step 0)")
            + "; check that --checkpoint-dir is a bucket every host reads and that the program restores from "
            "TPUCTL_CHECKPOINT_DIR"
        )
        self._update_detail(lost_restores=list(self.progress.lost_restores))

    def _budget_stop(self) -> None:
        """Stop at the budget: said once, however many polls and steps see the decision after it."""
        assert self._budget is not None and self._budget.decision is not None
        with self._lock:
            say = not self._budget_said and self._stop_reason is None
            self._budget_said = True
        if say:
            self._inner.status(f"budget: {self._budget.decision.message}; checkpointing and stopping")
        # SIGKILL at the end of --grace, then the slice goes: a program that ignores SIGTERM must not
        # keep spending past the budget for the minute a preemption's checkpoint may take.
        self._stop_hosts(Outcome.BUDGET, grace_s=self._grace_s)

    def _stop_hosts(self, reason: Outcome, grace_s: float | None = None) -> None:
        """Tell every host to stop (SIGTERM: the runtime checkpoints at the next common step; SIGKILL after
        the grace). Once per attempt, on a thread (``Executor.stop`` blocks for the grace)."""
        with self._lock:
            if self._stop_reason is not None:
                return
            attempt = self._attempt
            if attempt is None or attempt.executor is None:
                # Nothing to stop yet. A cancel is kept in ``self._cancel`` alone: ``started()`` stops the
                # hosts once they exist, which a stop reason set now would make it skip. A budget stop is
                # kept as the stop reason: the attempt then starts nothing (``_may_start``) and ends at
                # the budget.
                if reason is Outcome.BUDGET:
                    self._stop_reason = reason
                    self._stop_pending = True  # acted on by ``started()`` if the program starts anyway
                return
            self._stop_reason = reason
            self._launch_stopper(attempt.executor, grace_s)

    def _launch_stopper(self, executor: Executor, grace_s: float | None) -> None:
        """``executor.stop`` on a thread (it blocks for the grace). Called with ``self._lock`` held."""
        wait = grace_s if grace_s is not None else self.policy.checkpoint_wait_s
        self._stopper = threading.Thread(
            target=executor.stop, args=(wait,), name="tpuctl-stop-hosts", daemon=True
        )
        self._stopper.start()

    def _may_start(self) -> bool:
        """Whether the attempt may still start the program (asked before its hosts' setup and before the
        start): not once the budget stopped it while the hosts were being set up."""
        with self._lock:
            return self._stop_reason is not Outcome.BUDGET

    def _stopping(self) -> bool:
        """Whether this attempt's hosts were told to stop (the attempt loop then announces no host's
        death by that stop as a failure)."""
        with self._lock:
            return self._stop_reason is not None

    def _join_stopper(self) -> None:
        stopper = self._stopper
        if stopper is not None:
            stopper.join(timeout=self.policy.checkpoint_wait_s + 30.0)
            self._stopper = None

    def _classify(self, attempt: _Attempt, watch: SliceWatch, hosts_per_slice: int) -> Outcome:
        assert attempt.result is not None
        outcome, source = classify(attempt.result, self._stop_reason, self.progress, watch, self.policy)
        if outcome is Outcome.SUCCEEDED:
            # A notice, and the program finished inside its grace: the run is done, and the preemption
            # tpuctl's world dealt it is on the record all the same (kind notice_finished).
            source = notice_source(self.progress)
        attempt.maintenance_state = watch.maintenance_state
        if source is not None:
            seen = [self._notice_seen_at, self._preempted_seen_at, watch.confirmed_at]
            attempt.preemption = preemption_record(
                len(self.preemptions) + 1,
                attempt.slices,
                source,
                attempt.result,
                self.progress,
                # Detected when the supervisor first knew: the notice line, the runtime's "preempted", or
                # the API's confirmation.
                detected_at=min((t for t in seen if t is not None), default=time.time()),
                lost=self._lost_slices(attempt, watch, hosts_per_slice),
            )
            if outcome is Outcome.MAINTENANCE:
                # Lost, if Google does not bring the slice back, to its host's maintenance, whatever
                # the program did with the notice (or with none: the API showed the maintenance).
                attempt.preemption.kind = PreemptionKind.MAINTENANCE
        return outcome

    def _lost_slices(self, attempt: _Attempt, watch: SliceWatch, hosts_per_slice: int) -> list[str]:
        """Which slices of a multislice were preempted, by the first evidence that names one: the host
        that read the notice, the slice the API saw lost, else the first host that died."""
        slices = attempt.slices
        if not slices.is_multislice:
            return []
        noticed = (self.progress.notice or {}).get("worker")
        if isinstance(noticed, int) and (name := slices.slice_of(noticed, hosts_per_slice)) is not None:
            return [name]
        if watch.lost and len(watch.lost) < slices.count:
            return list(watch.lost)
        failed = attempt.result.failed_worker if attempt.result is not None else None
        if failed is not None and (name := slices.slice_of(failed, hosts_per_slice)) is not None:
            return [name]
        return list(watch.lost)

    def _after_attempt(self, attempt: _Attempt) -> None:
        """Close the attempt's last segment with its step counts; note where a recovery resumed."""
        recomputed = self.progress.attempt_recomputed_known
        self._segments.record_steps()  # the running segment of this attempt carries its step counts
        previous = self.preemptions[-1] if self.preemptions else None
        if previous is not None and previous.resumed_at is None and self.progress.first_step_at is not None:
            previous.resumed_at = self.progress.first_step_at
            previous.hosts_started_at = attempt.started_at
            previous.setup_s = None if attempt.setup_s is None else round(attempt.setup_s, 3)
            previous.restored_step = self.progress.restored
            previous.steps_recomputed = recomputed
        self._segments.close()

    # --- segments -------------------------------------------------------------------------------

    def _open_segment(
        self, kind: SegmentKind, slices: SliceSet | None, *, detail: Mapping[str, Any] | None = None
    ) -> int:
        """A new segment (``Segments.open``), noting when this attempt's notice was seen."""
        assert self._run_id is not None
        at = time.time()
        if kind is SegmentKind.CHECKPOINTING:
            self._notice_seen_at = at
        segment = self._segments.open(self._run_id, kind, slices, at=at, detail=detail)
        if kind is SegmentKind.RUNNING:
            self._notice_seen_at = self._preempted_seen_at = None
        return segment

    # --- slices ---------------------------------------------------------------------------------

    def _free_slice(
        self, prepared: PreparedRun, slices: SliceSet, record: PreemptionRecord, *, created: bool
    ) -> None:
        """The PREEMPTED segment: note the preemption on the slices that were lost, delete every slice of
        the set (frees its quota; a multislice is re-placed whole)."""
        self._open_segment(
            SegmentKind.PREEMPTED,
            slices,
            detail={"preemption": record.number, "kind": record.kind, "source": record.source},
        )
        what = self.progress.checkpoint_note(record.checkpoint_step, prepared.request.checkpoint_every)
        which = self._which_lost(slices, record)
        rest = "; deleting every slice of the set" if slices.is_multislice else "; deleting it"
        self._inner.status(f"{which} ({slices.zone}) was preempted [{record.kind}, {what}]{rest}")
        self._record_preempted(prepared, slices, record)
        if created:
            self._delete_slices(slices, reason=f"preempted during run {prepared.run_id}")
        record.slice_deleted_at = time.time()
        self._segments.close()

    @staticmethod
    def _which_lost(slices: SliceSet, record: PreemptionRecord) -> str:
        lost = record.lost_slices or slices.names
        return f"{', '.join(lost)} of {slices.name}" if slices.is_multislice else slices.name

    def _record_preempted(self, prepared: PreparedRun, slices: SliceSet, record: PreemptionRecord) -> None:
        """A ``preempted`` event on each lost slice, at the preemption's first evidence (the notice's
        time): billing ends there, and ``cost report`` counts it with its kind."""
        with contextlib.suppress(Exception):  # the ledger view must not block the recovery
            for name in record.lost_slices or slices.names:
                self._session.ledger.record_event(
                    EventKind.PREEMPTED,
                    pod=name,
                    zone=slices.zone,
                    run_id=prepared.run_id,
                    ts=record.occurred_at or record.detected_at,
                    detail={"seen_by": "run supervisor", "kind": record.kind, "source": record.source},
                )

    def _delete_slices(self, slices: SliceSet, *, reason: str) -> bool:
        """Delete every slice of the set, at once (each delete waits for its operation); True when all
        went."""
        if not slices.is_multislice:
            return self._delete_node(slices.nodes[0], reason=reason)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=slices.count, thread_name_prefix="tpuctl-delete") as pool:
            done = list(pool.map(lambda node: self._delete_node(node, reason=reason), slices.nodes))
        return all(done)

    def _delete_node(self, node: Node, *, reason: str) -> bool:
        from tpuctl.services.pods import PodService

        self._inner.detail(None, f"deleting {node.name} ({node.zone})")  # the outcome says it went
        try:
            PodService(self._session).delete(node.name, zone=node.zone, wait=True, reason=reason)
        except NotFoundError:
            pass  # already gone: what we wanted
        except LeaseLostError:
            raise  # not ours to delete any more: the supervisor stops here
        except Exception as exc:  # reported; it must not mask how the run itself ended
            message = exc.message if isinstance(exc, TpuctlError) else f"{type(exc).__name__}: {exc}"
            self._inner.status(
                f"could not delete {node.name}: {message}; delete it with `tpuctl pod delete {node.name}`"
            )
            return False
        return True

    def _provision(
        self, prepared: PreparedRun, prefer_zone: str | None, progress: OperationProgress | None, restart: int
    ) -> SliceSet:
        """Place the run's slice (a recovery: a fresh name and request, the old zone first), backing off
        while no allowed zone has capacity; every wait is a RECOVERING segment."""
        from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

        recovering = prefer_zone is not None or restart > 0
        tries = 0

        def one() -> SliceSet:
            nonlocal tries
            tries += 1
            if (lost := self._lost()) is not None:
                raise lost
            if self._cancel.is_set():
                raise InterruptedByUser("cancelled: the run was stopped")
            again = prepared if not recovering else renamed(prepared, restart, tries)
            self._segments.forget()  # provision() keeps its own segment
            return self.launcher.provision(
                again,
                progress=progress,
                prefer_zone=prefer_zone,
                detail={"recovery": recovering, "try": tries} if recovering else None,
            )

        if recovering:
            self._open_segment(
                SegmentKind.RECOVERING, None, detail={"after_preemption": len(self.preemptions)}
            )
        started = time.time()
        initial_s = self.policy.backoff_initial_s or 1.0
        retrying = Retrying(
            retry=retry_if_exception(lambda exc: recovering and _waits_for_capacity(exc)),
            wait=wait_exponential(multiplier=initial_s, min=initial_s, max=self.policy.backoff_max_s or 60.0),
            stop=stop_after_delay(self.policy.capacity_timeout_s),
            before_sleep=lambda state: self._waiting_for_capacity(prepared, progress, state),
            reraise=True,
        )
        slices: SliceSet = retrying(one)
        if self.preemptions and self.preemptions[-1].new_pod is None:
            record = self.preemptions[-1]
            record.new_pod, record.new_zone = slices.name, slices.zone
            record.provisioning_s = round(time.time() - started, 3)
            if record.new_zone != record.zone:
                self._inner.status(f"recovered in another zone: {record.zone} -> {record.new_zone}")
        self._session.ledger.update_run(prepared.run_id, pod=slices.name, zone=slices.zone)
        self._record_type(prepared, slices, recovering=recovering)
        return slices

    def _record_type(self, prepared: PreparedRun, slices: SliceSet, *, recovering: bool) -> None:
        """A run of several slice types records the type it was placed on, and says which: at first, and
        when a recovery lands on another one than it ran on."""
        record = self._session.ledger.get_run(prepared.run_id)
        before = None if record is None else record.accelerator_type
        line = placed_type_line(prepared, slices, before, recovering=recovering)
        if line is None:
            return
        self._inner.status(line)
        placed = placed_as(self._session.catalog, prepared, slices).target.accelerator
        self._session.ledger.update_run(prepared.run_id, accelerator_type=placed.api_name)
        types = [
            *((record.detail or {}).get("placed_types") or [] if record is not None else []),
            placed.api_name,
        ]
        self._update_detail(hosts=placed.hosts, placed_types=types)

    def _waiting_for_capacity(
        self, prepared: PreparedRun, progress: OperationProgress | None, state: Any
    ) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        self._inner.status(
            f"no capacity for {prepared.target.accelerator.friendly_name} yet (try {state.attempt_number}: "
            f"{getattr(exc, 'message', exc)}); retrying in {wait:.1f} s"
        )
        if progress is not None:
            progress.update(f"waiting for capacity (try {state.attempt_number})", elapsed_s=0.0)
        self._open_segment(
            SegmentKind.RECOVERING, None, detail={"waiting_for": "capacity", "try": state.attempt_number}
        )

    # --- ledger detail --------------------------------------------------------------------------

    def _update_detail(self, **changes: Any) -> None:
        assert self._run_id is not None
        ledger = self._session.ledger
        # Read, merge, write under one lock: the backstop's thread records its arming while the attempt
        # records its own, and one must not drop the other's keys.
        with self._detail_lock:
            record = ledger.get_run(self._run_id)
            merged = dict(record.detail or {}) if record is not None else {}
            merged.update(changes)
            ledger.update_run(self._run_id, detail=merged)

    def _record_hosts(self, executor: Executor) -> None:
        attempt = self._attempt
        self._update_detail(restart_count=attempt.restart_count if attempt else 0)

    def _save_recovery(
        self, *, final_step: int | None, end: float | None = None, wall_start: float | None = None
    ) -> dict[str, Any]:
        summary = recovery_summary(
            self.progress,
            self.preemptions,
            self.restarts,
            final_step=final_step,
            end=end,
            wall_start=wall_start,
            maintenance=[m.to_dict() for m in self.maintenances],
        )
        self._update_detail(recovery=summary)
        return summary
