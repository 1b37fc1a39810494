"""One attempt of a run: ship the bundle to every host of a slice, start the program on all of them at
once, and stream their output until every host has exited.

Failure semantics: the first host to exit non-zero (or to die: killed by a signal, connection lost) fails
the attempt. The others get SIGTERM to their process groups, SIGKILL after ``grace_s``. Ctrl-C stops
every host the same way. No wait is unbounded: the event loop polls, stops are bounded, and
``timeout_s`` caps the attempt when given. An attempt never raises for the program's own failure: it
returns an ``AttemptResult`` and the supervisor decides what it means.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpuctl.runtime.preemption import EVENT_PREFIX, parse_event
from tpuctl.services.run import hostsetup
from tpuctl.services.run.hostlog import HostLog, LedgerLog
from tpuctl.services.run.model import AttemptResult, LaunchObserver, PreparedRun, describe_exit
from tpuctl.store.records import RunStatus
from tpuctl.words import counted

if TYPE_CHECKING:
    from tpuctl.hosts.base import Executor, LaunchSpec, ShipResult
    from tpuctl.services.run.sliceset import SliceSet
    from tpuctl.services.session import Session

_POLL_S = 0.25
#: After the hosts were told to stop, how long to wait for their exit events before giving up on them.
_DRAIN_AFTER_STOP_S = 10.0


@dataclass
class _Streams:
    """What the event loop collects: each host's log file, exit status and the time it was seen."""

    logs: dict[int, HostLog] = field(default_factory=dict)
    ledger_log: LedgerLog | None = None  # the same lines on their way to the ledger (a supervised run)
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    exit_times: dict[int, float] = field(default_factory=dict)
    #: worker -> "ValueError: boom": the uncaught exception the runtime's hook reported on that host.
    exceptions: dict[int, str] = field(default_factory=dict)

    def close(self) -> None:
        for fh in self.logs.values():
            fh.close()
        if self.ledger_log is not None:
            self.ledger_log.flush()


def execute(
    session: Session,
    observer: LaunchObserver,
    executor: Executor,
    prepared: PreparedRun,
    slices: SliceSet,
    *,
    restart_count: int = 0,
    soft_exit_codes: frozenset[int] = frozenset(),
    soft_wait_s: float = 60.0,
    on_started: Callable[[Executor, float], None] | None = None,
    may_start: Callable[[], bool] | None = None,
    stopping: Callable[[], bool] | None = None,
) -> AttemptResult:
    """Ship and start on every host of ``slices``, stream until all exit (see the module docstring).

    ``soft_exit_codes``: statuses that end a host without failing the others (the runtime's
    "preempted, checkpoint saved"): the other hosts get ``soft_wait_s`` to reach the same end before
    they are stopped. ``on_started(executor, setup_s)`` is called once every host has started, with the
    seconds the hosts' setup took. ``may_start()`` is asked before the hosts' setup and again before the
    program starts: False (the run was stopped meanwhile, e.g. at its budget) ends the attempt there,
    with nothing started and no exit status. ``stopping()`` says whether the caller has asked the hosts to
    stop (a notice, a budget stop, a cancel): a host that then dies of a signal is that stop's doing,
    said by the caller, not a failure to announce."""
    spec = prepared.spec(restart_count)
    endpoints = sum(len(node.network_endpoints) for node in slices.nodes)
    if endpoints not in (0, spec.num_workers):
        observer.status(
            f"note: {slices.describe()} reports {counted(endpoints, 'endpoint')} for "
            f"{counted(spec.num_workers, 'host')}"
        )
    # Run logs hold the program's output: private like the rest of the state dir.
    prepared.run_dir.make()
    streams = _Streams()
    shipped: list[ShipResult] = []
    failed: tuple[int, int | None] | None = None
    interrupted = timed_out = False
    started_at = time.time()
    try:
        started = _ship_and_start(
            session, observer, executor, prepared, slices, spec, streams, may_start or (lambda: True)
        )
        if started is None:
            return _not_started(started_at)
        shipped, setup_s = started
        if on_started is not None:
            on_started(executor, setup_s)
        timeout_s = prepared.request.timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        loop = _EventLoop(observer, executor, prepared.request.grace_s, spec.num_workers, streams)
        if stopping is not None:
            loop.stopping = stopping
        try:
            failed, timed_out = loop.pump(deadline, soft_exit_codes, soft_wait_s)
        except KeyboardInterrupt:
            interrupted = True
            observer.status("interrupted: stopping every host")
            executor.stop(prepared.request.grace_s)
            loop.drain()
    finally:
        try:
            executor.close()
        finally:
            streams.close()
    return AttemptResult(
        exit_codes=streams.exit_codes,
        failed_worker=None if failed is None else failed[0],
        returncode=None if failed is None else failed[1],
        interrupted=interrupted,
        timed_out=timed_out,
        shipped=shipped,
        started_at=started_at,
        ended_at=time.time(),
        exit_times=streams.exit_times,
        exceptions=streams.exceptions,
    )


def _not_started(started_at: float) -> AttemptResult:
    """An attempt stopped before its program started: no host ran it, so none has an exit status."""
    return AttemptResult(
        exit_codes={},
        failed_worker=None,
        returncode=None,
        interrupted=False,
        timed_out=False,
        shipped=[],
        started_at=started_at,
        ended_at=time.time(),
        started=False,
    )


def _ship_and_start(
    session: Session,
    observer: LaunchObserver,
    executor: Executor,
    prepared: PreparedRun,
    slices: SliceSet,
    spec: LaunchSpec,
    streams: _Streams,
    may_start: Callable[[], bool],
) -> tuple[list[ShipResult], float] | None:
    """Ship, set up and start every host: what was shipped and how long setup took, or None when
    ``may_start`` said no before the setup or before the start (nothing was started)."""
    claim = session.ledger.fence  # a supervised run's (its lines go to the ledger too, fenced)
    if claim is not None:
        streams.ledger_log = LedgerLog(session.ledger, claim, range(spec.num_workers))
    for worker in range(spec.num_workers):
        sink = None if streams.ledger_log is None else functools.partial(streams.ledger_log.add, worker)
        streams.logs[worker] = HostLog(prepared.run_dir.host_log(worker), sink=sink)
        streams.logs[worker].mark_attempt(spec.restart_count + 1, slices.name, slices.zone)
    bundle = prepared.bundle
    # Shipping and starting are quick and always the same: details (-v); setup is the phase people wait on.
    observer.detail(
        None,
        f"shipping bundle {bundle.short_digest} ({len(bundle.files)} files, {bundle.total_bytes} bytes) "
        f"to {counted(spec.num_workers, 'host')}",
    )
    shipped = executor.ship(bundle)
    copied = sum(1 for s in shipped if s.shipped)
    observer.detail(
        None,
        f"bundle on {counted(spec.num_workers, 'host')} "
        f"({copied} copied, {len(shipped) - copied} already had it)",
    )
    if not may_start():
        return None
    wheels = session.backend.host_wheelhouse or session.settings.sim_wheelhouse
    setup_s = hostsetup.run_setup(
        observer,
        executor,
        prepared,
        streams.logs,
        uv_wheelhouse=wheels,
        uv_download_dir=session.state_dir / "wheels",
    )
    hostsetup.check_imports(observer, executor, prepared)
    if not may_start():
        return None
    session.ledger.update_run(prepared.run_id, status=RunStatus.RUNNING, pod=slices.name, zone=slices.zone)
    executor.start(spec)
    observer.detail(None, f"started {' '.join(prepared.program)} on {counted(spec.num_workers, 'host')}")
    return shipped, setup_s


def exception_summary(event: Mapping[str, Any]) -> str:
    """``ValueError: bad lr`` from the crash hook's ``exception`` event (its type, then its message's
    last line), as Python's own last traceback line says it."""
    kind = str(event.get("type") or "an exception")
    message = str(event.get("message") or "").strip()
    return f"{kind}: {message}" if message else kind


@dataclass
class _EventLoop:
    observer: LaunchObserver
    executor: Executor
    grace_s: float
    num_workers: int
    streams: _Streams
    stopping: Callable[[], bool] = lambda: False  # whether the caller told the hosts to stop

    def _stop_all(self) -> float:
        """Tell every host to stop; the deadline for their exit events."""
        self.executor.stop(self.grace_s)
        return time.monotonic() + _DRAIN_AFTER_STOP_S

    def pump(
        self, deadline: float | None, soft_exit_codes: frozenset[int], soft_wait_s: float
    ) -> tuple[tuple[int, int | None] | None, bool]:
        """Route events until every host exited; returns (first failure, timed out)."""
        exit_codes = self.streams.exit_codes
        failed: tuple[int, int | None] | None = None
        timed_out = False
        stop_deadline: float | None = None
        soft_deadline: float | None = None
        while len(exit_codes) < self.num_workers:
            now = time.monotonic()
            if stop_deadline is not None and now > stop_deadline:
                break  # the executor promised exits after stop(); don't wait on one that never comes
            if soft_deadline is not None and now > soft_deadline and stop_deadline is None:
                self.observer.status(
                    f"{self.num_workers - len(exit_codes)} host(s) did not stop within {soft_wait_s:g} s of "
                    "the others: stopping them"
                )
                stop_deadline = self._stop_all()
                continue
            if deadline is not None and now > deadline and stop_deadline is None:
                timed_out = True
                self.observer.status("--timeout reached: stopping every host")
                stop_deadline = self._stop_all()
                continue
            event = self.executor.next_event(_POLL_S)
            if event is None:
                if self.streams.ledger_log is not None:
                    self.streams.ledger_log.tick()
                continue
            if event.kind == "line":
                self.streams.logs[event.worker].write(event.text)
                self.observer.line(event.worker, event.text)
                self._note_exception(event.worker, event.text)
                continue
            exit_codes[event.worker] = event.returncode
            self.streams.exit_times[event.worker] = event.at
            if event.returncode == 0 or failed is not None or timed_out:
                continue
            if event.returncode in soft_exit_codes:
                # An agreed stop (every host stops at the same step): let the others get there too.
                if soft_deadline is None:
                    soft_deadline = time.monotonic() + soft_wait_s
                continue
            failed = (event.worker, event.returncode)
            raised = self.streams.exceptions.get(event.worker)
            how = f"raised {raised}" if raised else describe_exit(event.returncode)
            said = f"host {event.worker} {how}: stopping the other hosts"
            if soft_deadline is None and not self.stopping():
                self.observer.status(said)
            else:
                # The hosts were already stopping (an agreed step, or the caller asked them to): one
                # killed by that stop is its doing, said by the supervisor already.
                self.observer.detail(event.worker, said)
            stop_deadline = self._stop_all()
        return failed, timed_out

    def _note_exception(self, worker: int, text: str) -> None:
        """Remember the first uncaught exception a host's runtime hook reported (``exception`` event)."""
        event = parse_event(text) if text.startswith(EVENT_PREFIX) else None
        if event is not None and event.get("event") == "exception":
            self.streams.exceptions.setdefault(worker, exception_summary(event))

    def drain(self) -> None:
        """After a stop: collect exits (and log lines, not shown) for a bounded while."""
        deadline = time.monotonic() + _DRAIN_AFTER_STOP_S
        while len(self.streams.exit_codes) < self.num_workers and time.monotonic() < deadline:
            event = self.executor.next_event(_POLL_S)
            if event is None:
                continue
            if event.kind == "line":
                self.streams.logs[event.worker].write(event.text)
            else:
                self.streams.exit_codes[event.worker] = event.returncode
