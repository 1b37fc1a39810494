"""The ``Runs`` service: everything done to a run from outside its program, over one session. It finds runs
(``get``, with the one "no such run" error), reads them back (``list_runs``, ``describe``, ``logs``),
starts them (``start``, ``start_detached``) and controls them (``resume``, ``supervise``, ``detach``,
``cancel``). The CLI parses, calls one of these and renders what it returns.

Who may act on a run is the ledger's lease (``store.leases``), asked in one place: ``holder`` (the owner of
the run's live lease, on any machine). ``resume`` refuses while one lives (``LeaseHeldError``, exit 9) and
its supervisor claims the lease; ``cancel`` asks a live owner through the ledger (``_stop_supervisor``) or,
with none, claims the lease and cleans up itself (``control.clean_up``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from tpuctl.errors import LeaseHeldError, UsageError
from tpuctl.services.run import backstopped, control, describe, hostlog, prepare, saved
from tpuctl.services.run.fencing import LeaseKeeper, fenced_session
from tpuctl.services.run.lookup import RunNotFoundError, resolve_run_id
from tpuctl.services.run.rundir import RunDir
from tpuctl.services.run.runkey import secret_key
from tpuctl.services.run.views import (
    Cancellation,
    CancelOutcome,
    Detached,
    LeaseHolder,
    Resumption,
    RunDescription,
    RunLogs,
    RunView,
)
from tpuctl.store.records import LeaseClaim, LeaseOwner, RunStatus

if TYPE_CHECKING:
    from tpuctl.cloud.base import OperationProgress
    from tpuctl.services.run.import_check import ImportCheck
    from tpuctl.services.run.model import (
        LaunchObserver,
        PreparedRun,
        RecoveryPolicy,
        RunRequest,
        SupervisedResult,
    )
    from tpuctl.services.run.supervisor import Supervisor
    from tpuctl.services.session import Session
    from tpuctl.store.records import RunRecord

#: Says something to the user while a run is supervised (a budget warning, a changed bundle).
Warn = Callable[[str], None]


class Runs:
    """The runs of one session's ledger and state dir."""

    def __init__(self, session: Session) -> None:
        self._session = session

    # --- finding and reading runs ---------------------------------------------------------------

    def get(self, ref: str | None) -> RunRecord:
        """The run ``ref`` names: a whole id, a unique start or end of one, ``latest`` or None (the newest).
        Exit 11 (``RunNotFoundError``) when none matches; several matches are listed (``lookup``). A run
        whose backstop deleted its slices behind a silent supervisor has that recorded first
        (``backstopped``)."""
        run_id = resolve_run_id(self._session.ledger, ref, self._session.actor.visible)
        record = self._session.ledger.get_run(run_id)
        if record is None:  # gone between the lookup and now
            raise RunNotFoundError(run_id)
        return backstopped.settle(self._session, record)

    def dir_of(self, record: RunRecord) -> RunDir:
        """The run's directory on this machine: the one its record names when it is under this state dir,
        else this state dir's (the run was started on another machine, or from another state dir)."""
        recorded = RunDir.recorded(self._session.state_dir, record)
        if recorded.root.is_relative_to(self._session.state_dir):
            return recorded
        return RunDir.of(self._session.state_dir, record.run_id)

    def holder(self, run_id: str) -> LeaseHolder | None:
        """Who supervises the run now, on whatever machine: the owner of its live ledger lease, else None
        (never claimed, released, or expired: whoever held it is gone or cut off)."""
        lease = self._session.ledger.lease_of(run_id)
        return None if lease is None or lease.expired else LeaseHolder.of_lease(lease)

    def list_runs(
        self, *, limit: int, workspace: str | None = None, principal: str | None = None
    ) -> list[RunView]:
        """At most ``limit`` runs the actor may see, newest first; only ``workspace``'s and
        ``principal``'s when given."""
        workspaces = self._session.actor.visible
        if workspace is not None:
            workspaces = frozenset({workspace} if workspaces is None or workspace in workspaces else ())
        listed = self._session.ledger.list_runs(limit=limit, workspaces=workspaces, principal=principal)
        records = backstopped.settle_all(self._session, listed)
        return [RunView.of(r) for r in records]

    def describe(self, ref: str | None) -> RunDescription:
        record = self.get(ref)
        run_dir = self.dir_of(record)
        return describe.describe_run(self._session, record, run_dir, self.holder(record.run_id))

    def logs(self, ref: str | None, *, worker: int | None = None) -> RunLogs:
        """The hosts' log files of a run, every host's or ``worker``'s (exit 2 for one it does not have).
        A file may not exist yet: the host has said nothing."""
        record = self.get(ref)
        hosts = int((record.detail or {}).get("hosts", 0))
        if worker is not None and not 0 <= worker < max(hosts, 1):
            raise UsageError(
                f"run {record.run_id} has workers 0..{hosts - 1}, not {worker}",
                field="worker",
                value=worker,
                fix=f"pass --worker between 0 and {hosts - 1}",
            )
        workers = [worker] if worker is not None else list(range(hosts))
        return RunLogs(record.run_id, worker, tuple(self.dir_of(record).host_logs(workers)))

    def read_logs(self, logs: RunLogs, *, follow: bool = False) -> Iterator[hostlog.LogLine]:
        """The lines of ``logs`` in arrival order; with ``follow``, new ones too until the run ends."""
        live = (lambda: self.is_live(logs.run_id)) if follow else None
        ledger = self._session.ledger
        if ledger.run_request(logs.run_id) is not None:  # a run that keeps its lines in the ledger
            workers = [worker for worker, _path in logs.files]
            return hostlog.read_ledger_logs(ledger, logs.run_id, workers, follow=live)
        return hostlog.read_logs(list(logs.files), follow=live)

    def is_live(self, run_id: str) -> bool:
        """Whether a run may still write to its logs: not finished, or a supervisor still holds it."""
        record = self._session.ledger.get_run(run_id)
        if record is None:
            return False
        known = record.status in RunStatus._value2member_map_
        return self.holder(run_id) is not None or (known and not RunStatus(record.status).finished)

    # --- starting runs --------------------------------------------------------------------------

    def prepare(self, request: RunRequest, *, secrets: Mapping[str, str] | None = None) -> PreparedRun:
        """Validate the request and build the bundle; raises UsageError for any bad input.

        ``secrets`` hands over the run's secret values: the value of every name in
        ``request.secret_names``, by name, and nothing else (a name without a value, or a value the
        request does not name, is exit 2, naming the variable, never the value). The caller reads them
        from wherever the user gave them (``secretenv.parse_secret_flags`` and ``resolve_secrets``:
        ``--secret NAME=VALUE``, or ``NAME`` alone for the submitting environment's value; a job file's
        ``secrets:`` the same way); the request itself never carries a value (it is saved in plain
        text). The values ride on the ``PreparedRun`` in memory (``PreparedRun.secrets``, never
        serialised); starting the run stores them in the ledger only encrypted, and every attempt,
        recovery and ``runs resume`` on any machine with the ledger and its secret key gives them to
        the program's environment on the hosts again. A plan shows each as ``<secret>``."""
        return prepare.prepare(self._session, request, secrets=secrets)

    def check_imports(self, prepared: PreparedRun) -> ImportCheck:
        """Whether the hosts' environment will hold every module the program imports at start-up, and
        whether their package index has every distribution the run names (``import_check``): call
        ``refuse()`` on the result before anything is created, and say its ``warnings()``. A bundled
        example's imports are tpuctl's own, checked by its tests."""
        from tpuctl.services.run.import_check import check_imports

        backend = self._session.backend
        wheelhouse = backend.host_wheelhouse
        return check_imports(
            prepared.bundle,
            # A shell command's imports are its own business: only a script's source can be read.
            None
            if prepared.program[0] == "-m" or prepared.request.command is not None
            else prepared.program[0],
            prepared.setup,
            python=prepared.request.python,
            wheelhouse=wheelhouse,
            wheelhouse_only=None if wheelhouse is None else backend.host_index_limit(self._session.cloud),
        )

    def plan(self, prepared: PreparedRun, *, budget_usd: float | None = None) -> dict[str, Any]:
        """What the run would ship and run where (``--dry-run``), refused as the run would be where its
        ``budget_usd`` could not be enforced. Changes nothing."""
        return prepare.plan(self._session, prepared, budget_usd=budget_usd)

    def start(
        self,
        prepared: PreparedRun,
        *,
        observer: LaunchObserver,
        policy: RecoveryPolicy,
        budget_usd: float | None = None,
        warn: Warn | None = None,
        progress: OperationProgress | None = None,
    ) -> SupervisedResult:
        """Record, lease and supervise a new run to its end in this process (``Supervisor.run``)."""
        supervisor = self._supervisor(observer=observer, policy=policy, budget_usd=budget_usd, warn=warn)
        return supervisor.run(prepared, progress=progress)

    def start_detached(
        self, prepared: PreparedRun, *, policy: RecoveryPolicy, budget_usd: float | None
    ) -> Detached:
        """Record a new run and hand it to a background supervisor (``--detach``)."""
        self._supervisor(policy=policy, budget_usd=budget_usd).create_record(prepared)
        return self.detach(prepared.run_id)

    def _supervisor(
        self,
        *,
        policy: RecoveryPolicy,
        budget_usd: float | None,
        observer: LaunchObserver | None = None,
        warn: Warn | None = None,
    ) -> Supervisor:
        # Imported here: the supervisor and all it runs (placement, hosts, signals) are loaded only by the
        # commands that supervise, not by `runs list` or `runs describe`.
        from tpuctl.services.run.supervisor import Supervisor

        return Supervisor(self._session, observer=observer, policy=policy, budget_usd=budget_usd, warn=warn)

    # --- controlling runs -----------------------------------------------------------------------

    def resume(
        self,
        ref: str | None,
        *,
        budget_usd: float | None = None,
        max_preemptions: int | None = None,
        claim: LeaseClaim | None = None,
    ) -> Resumption:
        """Make a run whose supervisor is gone (or that stopped: budget, cancel, failure) ready to carry
        on: refused when it succeeded or is still supervised; prepared again from its saved request, with
        a new budget or preemption cap saved when given; recorded RECOVERING. ``supervise`` (here) or
        ``detach(resume=True)`` (in the background) then carries it on. With ``claim`` (the run's lease,
        held by the caller: a server's), the run is written under it and it stays held."""
        record = self.get(ref)
        self._session.actor.check_change(record.workspace, "resume its runs")
        run_dir = self.dir_of(record)
        self._refuse_unresumable(record, run_dir, held=claim)
        ready = control.prepare_again(self._session, record, run_dir)
        policy = ready.policy
        if max_preemptions is not None:
            policy = dataclasses.replace(policy, max_preemptions=max_preemptions)
        budget = budget_usd if budget_usd is not None else ready.budget_usd
        prepare.with_budget(self._session, ready.prepared, budget)  # exit 2 before anything changes
        # Written under the run's lease, claimed here and given back before the supervisor claims it: a
        # supervisor that took the run since the check above makes this exit 9 having written nothing.
        ledger, settings = self._session.ledger, self._session.settings
        under = claim or ledger.claim_lease(
            record.run_id, LeaseOwner.of_this_process(), settings.lease_duration
        )
        try:
            fenced = ledger.fenced(under)
            fresh = fenced.get_run(record.run_id)
            if fresh is None:
                raise RunNotFoundError(record.run_id)
            _refuse_succeeded(fresh)  # it may have ended meanwhile
            if budget_usd is not None or max_preemptions is not None:
                saved.record_request(
                    fenced,
                    run_dir,
                    ready.prepared.request,
                    run_id=record.run_id,
                    budget_usd=budget,
                    policy=policy,
                    key=secret_key(settings),
                )
            if fresh.status != RunStatus.RUNNING:
                fenced.update_run(record.run_id, status=RunStatus.RECOVERING, ended_at=None, exit_code=None)
            if claim is None and under.cancel is not None:
                # Asked to carry on: the cancel it ended by is answered, and whoever takes the run up
                # next (a server's replica, which cleans up a run asked to be cancelled) must not redo it.
                ledger.clear_cancel(under)
        finally:
            if claim is None:
                ledger.release_lease(under)
        return dataclasses.replace(ready, policy=policy, budget_usd=budget)

    def _refuse_unresumable(
        self, record: RunRecord, run_dir: RunDir, *, held: LeaseClaim | None = None
    ) -> None:
        """Exit 2 when the run succeeded; exit 9 (``LeaseHeldError``, naming the owner and when its lease
        expires) while another supervisor's lease on it lives (``held``: the caller's own). Nothing is
        written either way."""
        run_id = record.run_id
        _refuse_succeeded(record)
        lease = self._session.ledger.lease_of(run_id)
        ours = held is not None and lease is not None and lease.generation == held.generation
        if lease is not None and not lease.expired and not ours:
            owner = lease.owner
            raise LeaseHeldError(
                run_id=run_id,
                owner_id=owner.owner_id,
                host=owner.host,
                pid=owner.pid,
                generation=lease.generation,
                expires_at=lease.expires_at,
                now=lease.now,
            )

    def reload(self, run_id: str) -> Resumption:
        """Run ``run_id`` prepared again from its saved request, checking and changing nothing (what a
        background supervisor starts from)."""
        record = self._session.ledger.get_run(run_id)
        if record is None:
            raise RunNotFoundError(run_id)
        return control.prepare_again(self._session, record, self.dir_of(record))

    def supervise(
        self,
        ready: Resumption,
        *,
        observer: LaunchObserver,
        warn: Warn | None = None,
        progress: OperationProgress | None = None,
        resume: bool = True,
    ) -> SupervisedResult:
        """Supervise a recorded run in this process to its end: with ``resume``, take it over first
        (``takeover``); without, its first attempt (a ``--detach`` run's background supervisor)."""
        supervisor = self._supervisor(
            observer=observer, policy=ready.policy, budget_usd=ready.budget_usd, warn=warn
        )
        return supervisor.supervise(ready.prepared, progress=progress, resume=resume)

    def detach(self, run_id: str, *, resume: bool = False) -> Detached:
        """Start a background supervisor for recorded run ``run_id`` (``runs supervise``) and wait until it
        holds the run."""
        run_dir = RunDir.of(self._session.state_dir, run_id)
        return control.start_detached(
            self._session, run_dir, holder=lambda: self.holder(run_id), resume=resume
        )

    def cancel(self, ref: str | None, *, wait_s: float = 120.0, progress: Warn | None = None) -> Cancellation:
        """Stop a run, from any machine: its live owner is asked through the ledger (it stops the hosts,
        which checkpoint, deletes the slices it made and records CANCELLED); without one (it was killed,
        or its lease expired while we waited), tpuctl claims the lease and cleans up itself."""
        record = self.get(ref)
        self._session.actor.check_change(record.workspace, "cancel its runs")
        status = RunStatus(record.status)
        if status.finished:
            return Cancellation(record.run_id, CancelOutcome.ALREADY_ENDED, status=status.value)
        holder = self.holder(record.run_id)
        if holder is not None:
            stopped = self._stop_supervisor(record.run_id, holder, wait_s, progress)
            after = self._session.ledger.get_run(record.run_id)
            if after is None or RunStatus(after.status).finished or self.holder(record.run_id) is not None:
                return stopped
            record = after  # its owner died before it could end the run: clean up after it
        return self._clean_up(record, self.dir_of(record))

    def _stop_supervisor(
        self, run_id: str, holder: LeaseHolder, wait_s: float, progress: Warn | None
    ) -> Cancellation:
        """Record a cancel request the owner sees at its next renewal, and wait, at most ``wait_s``, until
        it has let the run go. A supervisor on this machine is also sent SIGTERM: a shortcut, not the
        authority."""
        from tpuctl.processes import is_same_process

        here = os.uname().nodename
        self._session.ledger.request_cancel(run_id, f"runs cancel (host {here}, pid {os.getpid()})")
        pid = holder.pid
        # Never this process: a server supervises its runs in threads, and SIGTERM would stop the server.
        ours = pid == os.getpid()
        if holder.host == here and pid is not None and not ours and is_same_process(pid, holder.start_ticks):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        started = time.monotonic()
        said = 0.0
        while time.monotonic() - started < wait_s and self.holder(run_id) is not None:
            waited = time.monotonic() - started
            if progress is not None and waited - said >= 5.0:
                said = waited
                progress(f"waiting for the supervisor of run {run_id} to stop it ({waited:.0f} s)")
            time.sleep(0.1)
        after = self._session.ledger.get_run(run_id)
        where = "" if holder.host in (None, here) else f" on {holder.host}"
        return Cancellation(
            run_id,
            CancelOutcome.BY_SUPERVISOR,
            status=None if after is None else str(after.status),
            by=f"its supervisor (pid {pid}{where})",
        )

    def _clean_up(self, record: RunRecord, run_dir: RunDir) -> Cancellation:
        """Claim the lease of a run nobody supervises and clean up after it, fenced (``control.clean_up``);
        ``LeaseHeldError`` when another supervisor took it meanwhile."""
        ledger, settings = self._session.ledger, self._session.settings
        claimed_at = time.monotonic()  # the lease's expiry counts from this moment or later
        claim = ledger.claim_lease(record.run_id, LeaseOwner.of_this_process(), settings.lease_duration)
        # Read again under the lease: the run may have ended between the first read and the claim (its
        # supervisor finished and released it), and a cleanup from the old record would undo that end.
        fresh = ledger.get_run(record.run_id)
        if fresh is None or RunStatus(fresh.status).finished:
            ledger.release_lease(claim)
            status = None if fresh is None else str(fresh.status)
            return Cancellation(record.run_id, CancelOutcome.ALREADY_ENDED, status=status)
        record = fresh
        keeper = LeaseKeeper(
            ledger,
            claim,
            ttl_s=settings.lease_duration,
            renew_every_s=settings.lease_renew_every,
            on_lost=lambda lost: None,  # the next fenced write raises it
            on_cancel=lambda request: None,  # we are the cancel
            claimed_at=claimed_at,
        )
        keeper.start()
        try:
            return control.clean_up(fenced_session(self._session, claim), record, run_dir)
        finally:
            keeper.release()


def _refuse_succeeded(record: RunRecord) -> None:
    """Exit 2 when the run succeeded: there is nothing to resume."""
    if record.status == RunStatus.SUCCEEDED:
        raise UsageError(
            f"run {record.run_id} already succeeded; there is nothing to resume",
            field="RUN",
            value=record.run_id,
            fix="start a new run with `tpuctl run`",
        )
