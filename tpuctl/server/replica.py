"""The replica: the part of `tpuctl server` that supervises runs. Every tick it renews this server's place
among the ledger's servers (``membership``) and looks for runs that are not finished and that nobody
holds: no lease (a submitted run starts PENDING with none) or an expired one (its supervisor died, or was
cut off from the ledger past its lease). It claims each and supervises it in a worker thread of its own,
with this replica's lease owner identity: a fresh run from its first attempt, an orphan through the path
`runs resume` takes (``Runs.resume``, then ``takeover``). At most ``max_runs`` at once.

Who may act is the ledger's lease, not this loop: two replicas that pick the same run both try to claim
it and one gets ``LeaseHeldError``; a worker whose lease is lost (a renewal or a fenced write finds it
gone) stops acting on the run at once, sends the cloud nothing more and ends with ``LeaseLostError``
(``fencing``), and the run is the new owner's.

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
from tpuctl.services.run.model import Silent
from tpuctl.store.records import LedgerBusyError

if TYPE_CHECKING:
    from tpuctl.services.run.supervisor import Supervisor
    from tpuctl.services.session import Session
    from tpuctl.store.records import LeaseOwner

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
    ) -> None:
        self.owner = owner
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
        """One pass: renew this server's place, then take up every run nobody holds, up to ``max_runs``."""
        ledger = self._session.ledger
        if not ledger.renew_replica(self.owner.owner_id, self._session.settings.lease_duration):
            # Our place expired (the ledger was out of reach past it): another server may have taken
            # it. Take it again if there is room; until then adopt nothing.
            self._member = False
            membership.join(ledger, self.owner, self._listen, self._session.settings.lease_duration)
            self._member = True
        self._last_tick = time.monotonic()
        for run_id in self._unheld():
            with self._lock:
                if len(self._workers) >= self._max_runs or self._stop.is_set():
                    return
                worker = threading.Thread(
                    target=self._supervise, args=(run_id,), name=f"tpuctl-run-{run_id}", daemon=True
                )
                self._workers[run_id] = worker
            worker.start()

    def _unheld(self) -> list[str]:
        """Runs nobody holds (``Ledger.orphans``), oldest first, that no worker here has and that are not
        being backed off from."""
        # Asked outside the lock: the ledger may be waiting out a database restart, and the API (readyz,
        # cancel) must not wait behind it.
        orphans = self._session.ledger.orphans()
        now = time.monotonic()
        with self._lock:
            return [
                run_id
                for run_id in orphans
                if run_id not in self._workers and self._not_before.get(run_id, 0.0) <= now
            ]

    # --- a worker -------------------------------------------------------------------------------

    def _supervise(self, run_id: str) -> None:
        try:
            self._take_up(run_id)
        except LeaseHeldError:
            pass  # another supervisor claimed it first: it is theirs
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

    def _take_up(self, run_id: str) -> None:
        """Supervise one run to its end: a never-claimed one from its first attempt; an orphan as `runs
        resume` takes it over; an orphan someone asked to cancel is cleaned up instead (a resume would
        forget the request)."""
        from tpuctl.services.run.service import Runs
        from tpuctl.services.run.supervisor import Supervisor

        session = self._session
        runs = Runs(session)
        fresh = not session.ledger.lease_history(run_id)
        if not fresh and session.ledger.cancel_requested(run_id) is not None:
            runs.cancel(run_id)
            _say(f"run {run_id}: cancelled, as asked while nobody supervised it")
            return
        ready = runs.reload(run_id) if fresh else runs.resume(run_id)
        supervisor = Supervisor(
            session,
            observer=_StatusLog(run_id),
            policy=ready.policy,
            budget_usd=ready.budget_usd,
            owner=self.owner,
            warn=lambda text: _say(f"run {run_id}: {text}"),
        )
        with self._lock:
            self._supervisors[run_id] = supervisor
        _say(f"run {run_id}: {'supervising' if fresh else 'taking over'}")
        supervisor.supervise(ready.prepared, resume=not fresh)
        _say(f"run {run_id}: succeeded")


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
