"""The replica: the part of `tpuctl server` that supervises runs. Every tick it renews this server's place
among the ledger's servers (``membership``) and looks for runs that are not finished and that nobody
holds: no lease (a submitted run starts PENDING with none) or an expired one (its supervisor died, or was
cut off from the ledger past its lease). It claims them all in one transaction (``Ledger.claim_orphans``)
and supervises each in a worker thread of its own, under that claim, with this replica's lease owner
identity: a fresh run from its first attempt, an orphan through the path `runs resume` takes
(``Runs.resume``, then ``takeover``). At most ``max_runs`` at once.

A submitted run waits QUEUED until there is room for it in its workspace (``admission``): with the room
left after the orphans, each tick admits the waiting runs that fit, in the queue's order, and claims them
in the same transaction (``Ledger.admit_queued``); a run admitted is taken up as a fresh one. The spend
the order reads is recomputed at most every ``SPEND_MAX_AGE_S`` (a cost report is not a per-tick read).

Who may act is the ledger's lease, not this loop. The claim skips the leases another replica is claiming
at the same moment (on PostgreSQL, ``SKIP LOCKED``), so replicas that tick together take disjoint runs
and the lease is held from the pick on, never free between the pick and the supervisor. A worker whose
lease is lost (a renewal or a fenced write finds it gone) stops acting on the run at once, sends the cloud
nothing more and ends with ``LeaseLostError`` (``fencing``), and the run is the new owner's.

Threads: the supervisor installs no signal handler itself (the CLI's ``run_signals`` does, and skips a
thread that is not the main one), so it supervises in a worker thread as it does in a process; only
Ctrl-C never reaches it there, which is what a server wants. Its ways to stop are the ledger's: a cancel
request (seen at the next renewal, or at once through ``cancel`` here) and the loss of its lease.

On ``stop`` (the server's SIGTERM or SIGINT) the replica adopts nothing more and gives its place back;
its workers are daemon threads that end with the process, their leases left to expire rather than
released: a worker may have a cloud request in flight (a create or a delete already past its fence), and
the lease's length is the margin every adopter already waits for after a crash. A stop is a crash the
replica chose, no more dangerous and no faster to recover from.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TYPE_CHECKING, Final

from tpuctl.errors import LeaseHeldError, LeaseLostError, TpuctlError
from tpuctl.server import membership
from tpuctl.server.admission import Admission
from tpuctl.services.run.model import Silent
from tpuctl.store.records import LedgerBusyError, RunStatus

if TYPE_CHECKING:
    from tpuctl.services.cost.monthly_spend import MonthSpend
    from tpuctl.services.run.fencing import LeaseKeeper
    from tpuctl.services.run.supervisor import Supervisor
    from tpuctl.services.session import Session
    from tpuctl.store.records import LeaseClaim, LeaseOwner
    from tpuctl.teams.workspaces import Workspaces

#: How old the month's spend the queue is ordered by may be: it moves by cents a minute, and reading it
#: is a cost report over the month.
SPEND_MAX_AGE_S: Final = 30.0

#: How long a run that could not be taken up (its saved request unreadable, a bug) is left alone before
#: the replica tries again: it must not spin on it every tick.
RETRY_AFTER_S: Final = 60.0


class Replica:
    """Supervises every run nobody holds (see the module docstring). ``session`` is shared by the loop,
    the workers and the API: its ledger is one connection under a lock, as a command's threads share it."""

    def __init__(
        self,
        session: Session,
        owner: LeaseOwner,
        *,
        listen: str,
        max_runs: int,
        tick_s: float,
        workspaces: Workspaces | None = None,
    ) -> None:
        from tpuctl.teams.workspaces import Workspaces

        self.owner = owner
        #: The server's workspaces: whose limits the queue's admissions keep.
        self.workspaces = workspaces or Workspaces.implicit()
        self._spend: tuple[float, MonthSpend] | None = None  # (monotonic time read, the spend)
        self._session = session
        self._listen = listen
        self._max_runs = max_runs
        self._tick_s = tick_s
        self._lock = threading.Lock()
        self._workers: dict[str, threading.Thread] = {}
        self._supervisors: dict[str, Supervisor] = {}
        self._not_before: dict[str, float] = {}  # run -> monotonic time of the next try
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._member = False
        self._last_tick: float | None = None
        self._loop = threading.Thread(target=self._run, name="tpuctl-replica", daemon=True)

    # --- life -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Take this server's place in the ledger (``ReplicaLimitError``, exit 2, when it has no room),
        then tick on a thread."""
        settings = self._session.settings
        membership.join(self._session.ledger, self.owner, self._listen, settings.lease_duration)
        self._member = True
        self._loop.start()

    def stop(self) -> None:
        """Adopt nothing more and give the place back; running workers are left to end with the process
        (their leases expire: the module docstring says why)."""
        self._stop.set()
        self._wake.set()
        if self._loop.is_alive() and self._loop is not threading.current_thread():
            self._loop.join(timeout=self._tick_s + 10.0)
        if self._member:
            self._member = False
            with contextlib.suppress(TpuctlError):
                self._session.ledger.release_replica(self.owner.owner_id)

    def wake(self) -> None:
        """Tick now (a run was just submitted)."""
        self._wake.set()

    @property
    def ready(self) -> bool:
        """Whether the replica does its work: its loop ticks and it holds its place in the ledger."""
        last = self._last_tick
        recent = last is not None and time.monotonic() - last < 3 * self._tick_s + 5.0
        return self._member and self._loop.is_alive() and recent and not self._stop.is_set()

    def supervising(self) -> list[str]:
        with self._lock:
            return sorted(self._workers)

    def cancel(self, run_id: str) -> bool:
        """Tell this replica's supervisor of ``run_id`` to stop it now (the ledger's cancel request is the
        authority; this saves waiting for the next renewal). False when it supervises no such run."""
        with self._lock:
            supervisor = self._supervisors.get(run_id)
        if supervisor is None:
            return False
        supervisor.cancel()
        return True

    # --- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # the ledger busy or gone: said, and tried again at the next tick
                # (the loop must outlive any outage: it is what adopts the runs once the database is back)
                _say(f"replica tick failed: {exc}")
            self._wake.wait(self._tick_s)
            self._wake.clear()

    def tick(self) -> None:
        """One pass: renew this server's place, then claim and take up every run nobody holds, up to
        ``max_runs``."""
        ledger = self._session.ledger
        if not ledger.renew_replica(self.owner.owner_id, self._session.settings.lease_duration):
            # Our place expired (the ledger was out of reach past it): another server may have taken
            # it. Take it again if there is room; until then adopt nothing.
            self._member = False
            membership.join(ledger, self.owner, self._listen, self._session.settings.lease_duration)
            self._member = True
        self._last_tick = time.monotonic()
        room, busy = self._room()
        asked_at = time.monotonic()  # the claims' expiry counts from this moment or later
        ttl = self._session.settings.lease_duration
        # Read before anything is claimed: a failure here must not leave claims nobody takes up.
        waiting = room > 0 and bool(ledger.list_runs(status=RunStatus.QUEUED, limit=1))
        spend = self._month_spend() if waiting else None
        claims = ledger.claim_orphans(self.owner, ttl, limit=room, excluding=busy)
        admitted: list[LeaseClaim] = []
        if spend is not None and len(claims) < room:
            left = room - len(claims)
            admission = Admission(self.workspaces, self._session.catalog, spend, room=left)
            try:
                admitted = ledger.admit_queued(self.owner, ttl, decide=admission.decide, limit=left)
            except TpuctlError as exc:  # the orphans claimed above are still taken up
                _say(f"admitting queued runs failed: {exc.message}")
        claims += admitted
        for index, claim in enumerate(claims):
            # An admitted run starts afresh, also one whose first placement sent it back to the queue
            # before (its claim's generation is then above 1).
            if not self._start_worker(claim, asked_at, fresh=claim in admitted or claim.generation == 1):
                for unused in claims[index:]:  # stopping: claimed but not taken up, so given back now
                    with contextlib.suppress(TpuctlError):
                        ledger.release_lease(unused)
                return

    def _month_spend(self) -> MonthSpend:
        """This month's spend per workspace and principal, read again once ``SPEND_MAX_AGE_S`` old."""
        from tpuctl.services.cost.monthly_spend import this_month_spend

        now = time.monotonic()
        if self._spend is None or now - self._spend[0] >= SPEND_MAX_AGE_S:
            self._spend = (now, this_month_spend(self._session, now=self._session.clock()))
        return self._spend[1]

    def _start_worker(self, claim: LeaseClaim, claimed_at: float, *, fresh: bool) -> bool:
        """Supervise the claimed run on a thread of its own; False (nothing started) once stopping."""
        with self._lock:
            if self._stop.is_set():
                return False
            worker = threading.Thread(
                target=self._supervise,
                args=(claim, claimed_at, fresh),
                name=f"tpuctl-run-{claim.run_id}",
                daemon=True,
            )
            self._workers[claim.run_id] = worker
        worker.start()
        return True

    def _room(self) -> tuple[int, set[str]]:
        """How many more runs this replica may take up, and the runs it must not claim: those its workers
        have (a worker still winding down after its lease was lost among them) and those it is backing
        off from."""
        now = time.monotonic()
        with self._lock:
            self._not_before = {run_id: t for run_id, t in self._not_before.items() if t > now}
            room = 0 if self._stop.is_set() else self._max_runs - len(self._workers)
            return room, set(self._workers) | set(self._not_before)

    # --- a worker -------------------------------------------------------------------------------

    def _supervise(self, claim: LeaseClaim, claimed_at: float, fresh: bool) -> None:
        from tpuctl.services.run.supervisor import BackInQueueError

        run_id = claim.run_id
        try:
            self._take_up(claim, claimed_at, fresh=fresh)
        except BackInQueueError as exc:  # admitted again by a tick once its back-off ends
            _say(exc.message)
        except LeaseHeldError:
            pass  # another supervisor claimed it first (after a cancelled orphan was given back): theirs
        except LeaseLostError as exc:
            _say(f"run {run_id}: lease lost, no longer supervised here: {exc.message}")
        except LedgerBusyError as exc:
            # The ledger busy or out of reach before supervision began (a restart, an outage): no fault
            # of the run's, so it is not backed off from; whoever finds it unheld next takes it up.
            _say(f"run {run_id}: not taken up, the ledger did not answer: {exc.message}")
        except Exception as exc:
            # The run's own end (its supervisor recorded it), or a failure before supervision began (its
            # saved request unreadable, a bug): said, and the run left alone for a while either way, so
            # that one that stays unfinished is not tried again at every tick.
            if not self._stop.is_set():  # once stopping, the session closing under a worker is expected
                what = exc.message if isinstance(exc, TpuctlError) else f"{type(exc).__name__}: {exc}"
                _say(f"run {run_id}: ended here: {what}")
            with self._lock:
                self._not_before[run_id] = time.monotonic() + RETRY_AFTER_S
        finally:
            with self._lock:
                self._workers.pop(run_id, None)
                self._supervisors.pop(run_id, None)
            self._wake.set()  # its chips are free: admit the next waiting run now, not at the next tick

    def _take_up(self, claim: LeaseClaim, claimed_at: float, *, fresh: bool) -> None:
        """Supervise one claimed run to its end: a never-claimed one (its first claim, generation 1)
        from its first attempt; an orphan as `runs resume` takes it over; an orphan someone asked to
        cancel (the claim read the request) is cleaned up instead (a resume would forget the request)."""
        from tpuctl.services.run.service import Runs
        from tpuctl.services.run.supervisor import Supervisor

        session = self._session
        runs = Runs(session)
        run_id = claim.run_id
        # Renewed from the claim on, not from the supervisor's start: preparing the run (its saved
        # request read back, a resume recorded) takes part of the lease, seconds on a busy machine.
        keeper = self._keeper(claim, claimed_at)
        try:
            if claim.cancel is not None:  # also a queued run cancelled while it waited
                keeper.release()  # the clean-up claims the run itself
                runs.cancel(run_id)
                _say(f"run {run_id}: cancelled, as asked while nobody supervised it")
                return
            ready = runs.reload(run_id) if fresh else runs.resume(run_id, claim=claim)
        except BaseException:
            with contextlib.suppress(TpuctlError):
                keeper.release()  # not supervised after all: free for the next tick, not left to expire
            raise
        keeper.stop()
        if keeper.lost is not None:
            raise keeper.lost
        supervisor = Supervisor(
            session,
            observer=_StatusLog(run_id),
            policy=ready.policy,
            budget_usd=ready.budget_usd,
            owner=self.owner,
            warn=lambda text: _say(f"run {run_id}: {text}"),
            requeue_when_no_room=fresh,
        )
        with self._lock:
            self._supervisors[run_id] = supervisor
        _say(f"run {run_id}: {'supervising' if fresh else 'taking over'}")
        supervisor.supervise(ready.prepared, resume=not fresh, claim=keeper.claim)
        _say(f"run {run_id}: succeeded")

    def _keeper(self, claim: LeaseClaim, claimed_at: float) -> LeaseKeeper:
        """The claim kept renewed until its supervisor takes it over (a loss or a cancel request it sees
        is the preparation's fenced writes' and the supervisor's to act on)."""
        from tpuctl.services.run.fencing import LeaseKeeper

        settings = self._session.settings
        keeper = LeaseKeeper(
            self._session.ledger,
            claim,
            ttl_s=settings.lease_duration,
            renew_every_s=settings.lease_renew_every,
            on_lost=lambda lost: None,
            on_cancel=lambda request: None,
            claimed_at=claimed_at,  # its local deadline: from the claim request, not from now
        )
        keeper.start()
        return keeper


class _StatusLog(Silent):
    """A supervised run as the server's log tells it: the supervisor's steps (placed, preempted,
    recovering), not the hosts' lines (those are the ledger's, for `runs logs`)."""

    def __init__(self, run_id: str) -> None:
        self._run_id = run_id

    def status(self, text: str) -> None:
        _say(f"run {self._run_id}: {text}")


def _say(text: str) -> None:
    """The server's log is its stderr (a service manager keeps it)."""
    print(f"tpuctl server: {text}", file=sys.stderr, flush=True)
