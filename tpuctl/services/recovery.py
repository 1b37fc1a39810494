"""The preemption supervisor: ``tpuctl run`` that survives preemptions and says what they cost.

A run is a sequence of attempts (starts of the program on a slice). The supervisor runs one attempt at a
time through the launcher and, while it runs, combines every sign of a preemption:

- the runtime's own words on host output (``TPUCTL_EVENT`` lines, ``tpuctl.runtime.preemption``): a
  ``notice`` (the metadata flag or SIGTERM seen on a host), then ``preempted`` with the step whose
  checkpoint every host saved, and exit status 75;
- the slice's state from the API, polled on a thread: PREEMPTED / TERMINATED / gone, or its queued
  resource SUSPENDING / SUSPENDED. A state counts only after ``confirm_polls`` polls in a row agree; a
  failed poll (a transient API error) neither counts nor resets the count;
- hosts dying: killed by a signal or lost, which is a preemption only when the API confirms it (within
  ``confirm_timeout_s``), otherwise a failure of the program.

Each attempt ends with exactly one outcome (SUCCEEDED, PREEMPTED, FAILED, CANCELLED, BUDGET), so a
preemption is acted on once. On PREEMPTED: delete the slice (it holds quota until deleted), place a new
one through the allocator (the same zone first, then the others, same price cap; backing off while no
zone has capacity), ship, and start again with ``TPUCTL_RESTART_COUNT`` + 1; the runtime restores the
newest checkpoint that verifies. A program failure restarts on the same slice at most ``max_restarts``
times; preemptions have their own cap, ``max_preemptions``.

Accounting goes to the ledger as it happens: segments (provisioning, running, checkpointing, preempted,
recovering) with their slice, zone, capacity and step counts, and in the run's detail a ``recovery``
record: every preemption with its detection latency and recovery time, steps completed and recomputed,
checkpoint fallbacks, and goodput (productive step time / wall time). ``describe_run`` reads it back.

Budget (``--budget``, the cost issue's ``BudgetGuard``): checked at every step boundary the runtime
reports and on the poll thread; when the next step would go over, every host is told to stop the way a
preemption notice does (they checkpoint at one step), the slice is deleted and the run ends with
``BudgetExceededError``.

Supervision is leased: the supervisor holds an exclusive ``flock`` on ``runs/<id>/supervisor.lock`` for
its lifetime and writes its pid and start time into the run. ``runs resume`` takes a run whose lease is
free (its supervisor died) and carries on from the last checkpoint; ``runs cancel`` signals a live one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tpuctl.errors import (
    BudgetExceededError,
    CloudError,
    InfeasibleError,
    InterruptedByUser,
    NotFoundError,
    RunFailedError,
    TpuctlError,
    UsageError,
)
from tpuctl.runtime.preemption import PREEMPTED_EXIT_CODE, parse_event
from tpuctl.services.launcher import (
    AttemptResult,
    Launcher,
    LaunchObserver,
    PreparedRun,
    RunRequest,
    RunResult,
    _describe_exit,
    _exit_status,
)
from tpuctl.store.paths import ensure_private_dir, private_file
from tpuctl.store.records import EventKind, RunStatus, SegmentKind

if TYPE_CHECKING:
    from tpuctl.cloud.base import Node, OperationProgress
    from tpuctl.services.budget import BudgetDecision, BudgetGuard
    from tpuctl.services.executors.base import Executor
    from tpuctl.services.session import Session

#: Slice states that mean the slice is lost to the run (a deleted slice reads as GONE).
LOST_NODE_STATES = frozenset({"PREEMPTED", "TERMINATED", "GONE"})
#: Queued-resource states of a preemption (SUSPENDING: with notice, the hosts still run).
PREEMPTED_QR_STATES = frozenset({"SUSPENDING", "SUSPENDED"})
#: What a --detach run's request is saved as, next to its logs (0600: --env values may be secrets).
REQUEST_FILE = "request.json"
LOCK_FILE = "supervisor.lock"
SUPERVISOR_LOG = "supervisor.log"


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BUDGET = "budget"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class RecoveryPolicy:
    """Limits and timings of a supervised run. ``None`` timings take the backend's default (the
    simulator's are short; Google's follow its 30 s spot notice and its API's pace)."""

    max_restarts: int = 0
    max_preemptions: int = 10
    poll_s: float | None = None
    confirm_polls: int = 2
    confirm_timeout_s: float | None = None
    checkpoint_wait_s: float = 60.0
    backoff_initial_s: float | None = None
    backoff_max_s: float | None = None
    capacity_timeout_s: float = 6 * 3600.0
    budget_margin_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_restarts", "max_preemptions"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.confirm_polls < 1:
            raise ValueError(f"confirm_polls must be >= 1, got {self.confirm_polls}")

    def resolved(self, sim: bool) -> RecoveryPolicy:
        return dataclasses.replace(
            self,
            poll_s=self.poll_s if self.poll_s is not None else (0.25 if sim else 10.0),
            confirm_timeout_s=self.confirm_timeout_s
            if self.confirm_timeout_s is not None
            else (5.0 if sim else 120.0),
            backoff_initial_s=self.backoff_initial_s
            if self.backoff_initial_s is not None
            else (0.2 if sim else 15.0),
            backoff_max_s=self.backoff_max_s if self.backoff_max_s is not None else (2.0 if sim else 300.0),
            budget_margin_s=self.budget_margin_s
            if self.budget_margin_s is not None
            else (3.0 if sim else 120.0),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------------
# Accounting


@dataclass
class PreemptionRecord:
    """One preemption, from the first sign of it to training running again."""

    number: int
    kind: str  # notice (the runtime checkpointed on the notice) | hard (no checkpoint on the way out)
    source: str  # what told the supervisor first: runtime-notice | runtime-exit | api | hosts+api
    pod: str
    zone: str
    capacity: str | None
    occurred_at: float | None  # the earliest evidence: the host's notice, else the first host death
    detected_at: float
    checkpoint_step: int | None = None
    last_step: int | None = None
    slice_deleted_at: float | None = None
    new_pod: str | None = None
    new_zone: str | None = None
    provisioning_s: float | None = None
    hosts_started_at: float | None = None
    resumed_at: float | None = None  # first step done on the new slice
    restored_step: int | None = None
    steps_recomputed: int | None = None

    @property
    def detection_latency_s(self) -> float | None:
        if self.occurred_at is None:
            return None
        return max(0.0, self.detected_at - self.occurred_at)

    @property
    def recovery_s(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.detected_at

    @property
    def startup_s(self) -> float | None:
        if self.resumed_at is None or self.hosts_started_at is None:
            return None
        return self.resumed_at - self.hosts_started_at

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(
            detection_latency_s=_round(self.detection_latency_s),
            recovery_s=_round(self.recovery_s),
            startup_s=_round(self.startup_s),
        )
        overhead = None
        if self.recovery_s is not None:
            overhead = self.recovery_s - (self.provisioning_s or 0.0) - (self.startup_s or 0.0)
        data["recovery_overhead_s"] = _round(overhead)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreemptionRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class Progress:
    """Steps as the runtime reports them (``start``/``step``/``preempted``/``done`` events of host 0).

    ``step_dt`` keeps the time of the LAST computation of each step: a step done again after a
    preemption replaces the lost one, so the sum over the final steps is the productive step time.
    """

    step_dt: dict[int, float] = field(default_factory=dict)
    computed_s: float = 0.0  # every step computed, recomputations included
    recomputed: int = 0
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    last_step: int | None = None  # the last step done, over all attempts
    # This attempt:
    first_step: int | None = None
    restored: int | None = None
    attempt_last: int | None = None
    attempt_recomputed: int = 0
    first_step_at: float | None = None
    notice: dict[str, Any] | None = None
    preempted: dict[str, Any] | None = None
    done: bool = False

    def new_attempt(self) -> None:
        self.first_step = self.restored = self.attempt_last = self.first_step_at = None
        self.attempt_recomputed = 0
        self.notice = self.preempted = None
        self.done = False

    def on_event(self, event: Mapping[str, Any], at: float) -> None:
        kind = event.get("event")
        if kind == "start":
            step = _int(event.get("step"))
            self.first_step = step
            self.restored = _int(event.get("restored"))
            if step is not None and self.last_step is not None and step < self.last_step:
                # Steps done before the preemption that the checkpoint did not keep: done again now.
                self.attempt_recomputed = self.last_step - step
                self.recomputed += self.attempt_recomputed
            skipped = event.get("skipped") or []
            if skipped:
                self.fallbacks.append(
                    {"at": at, "restored": self.restored, "skipped": list(skipped), "attempt_start": step}
                )
        elif kind == "step":
            step = _int(event.get("step"))
            dt = event.get("dt")
            if step is None:
                return
            if self.first_step_at is None:
                self.first_step_at = at
            if isinstance(dt, (int, float)):
                self.step_dt[step] = float(dt)
                self.computed_s += float(dt)
            self.attempt_last = step
            self.last_step = step
        elif kind == "notice":
            if self.notice is None:
                self.notice = dict(event)
        elif kind == "preempted":
            self.preempted = dict(event)
        elif kind == "done":
            self.done = True

    @property
    def attempt_steps(self) -> int | None:
        if self.attempt_last is None or self.first_step is None:
            return None
        return self.attempt_last - self.first_step

    def productive_s(self, final_step: int | None) -> float:
        last = final_step if final_step is not None else self.last_step
        if last is None:
            return 0.0
        return sum(dt for s, dt in self.step_dt.items() if s <= last)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --------------------------------------------------------------------------------------------------
# The supervisor's pieces


class _Observer:
    """Between the launcher and the user's observer: takes the runtime's event lines (they go to the
    hosts' log files, not the screen) and passes everything else on."""

    def __init__(self, inner: LaunchObserver, on_event: Callable[[int, dict[str, Any], float], None]) -> None:
        self._inner = inner
        self._on_event = on_event

    def line(self, worker: int, text: str) -> None:
        event = parse_event(text)
        if event is None:
            self._inner.line(worker, text)
            return
        self._on_event(worker, event, time.time())

    def status(self, text: str) -> None:
        self._inner.status(text)


class _Silent:
    def line(self, worker: int, text: str) -> None:
        pass

    def status(self, text: str) -> None:
        pass


@dataclass
class _SliceWatch:
    """Polls the slice's state on a thread while the hosts run; ``confirmed`` once ``confirm`` polls in
    a row saw it lost. Errors are counted, never taken for a preemption."""

    cloud: Any
    node: Node
    poll_s: float
    confirm: int
    on_poll: Callable[[], None] | None = None
    confirmed_state: str | None = None
    confirmed_at: float | None = None
    errors: int = 0
    polls: int = 0
    _streak: int = 0
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    confirmed: threading.Event = field(default_factory=threading.Event)

    def state(self) -> str | None:
        """The slice's state now (GONE when the API says it does not exist), or None if the API could
        not be asked. A queued resource's preemption state wins over its node's."""
        try:
            node = self.cloud.get_node(self.node.zone, self.node.name)
        except NotFoundError:
            return "GONE"
        except Exception:
            self.errors += 1
            return None
        state = str(node.state)
        qr = node.queued_resource or self.node.queued_resource
        if qr and state not in LOST_NODE_STATES:
            try:
                queued = self.cloud.get_queued_resource(self.node.zone, qr.rsplit("/", 1)[-1])
                if queued.state in PREEMPTED_QR_STATES:
                    return f"QR_{queued.state}"
            except Exception:
                self.errors += 1
                return None
        return state

    @staticmethod
    def is_lost(state: str | None) -> bool:
        return state is not None and (state in LOST_NODE_STATES or state.startswith("QR_"))

    def poll_once(self) -> bool:
        """One poll; True once confirmed."""
        state = self.state()
        self.polls += 1
        if state is None:
            return self.confirmed.is_set()  # a missed poll: no evidence either way
        if self.is_lost(state):
            self._streak += 1
            if self._streak >= self.confirm and not self.confirmed.is_set():
                self.confirmed_state = state
                self.confirmed_at = time.time()
                self.confirmed.set()
        else:
            self._streak = 0
        return self.confirmed.is_set()

    def confirm_now(self, timeout_s: float) -> str | None:
        """Poll until confirmed or ``timeout_s``; the confirmed state or None."""
        deadline = time.monotonic() + timeout_s
        while not self.poll_once() and time.monotonic() < deadline:
            time.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))
        return self.confirmed_state if self.confirmed.is_set() else None

    def _loop(self) -> None:
        while not self._halt.wait(self.poll_s):
            if not self.confirmed.is_set():
                self.poll_once()
            if self.on_poll is not None:
                with contextlib.suppress(Exception):  # the budget check must not end the watch
                    self.on_poll()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tpuctl-slice-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None


class _Budget:
    """``BudgetGuard`` (tpuctl.services.budget) applied at step boundaries: rebuilt from the ledger when
    the run's slices change, asked at every reported step and every poll."""

    def __init__(
        self, session: Session, run_id: str, limit_usd: float, margin_s: float, warn: Callable[[str], None]
    ) -> None:
        self._session = session
        self._run_id = run_id
        self._limit = limit_usd
        self._margin_s = margin_s
        self._warn = warn
        self._guard: BudgetGuard | None = None
        self._lock = threading.Lock()
        self._step_s = 0.0
        self.warned = False
        self.decision: BudgetDecision | None = None

    def refresh(self) -> None:
        from tpuctl.services.budget import BudgetGuard

        guard = BudgetGuard.for_run(
            self._session.ledger,
            self._run_id,
            self._session.catalog,
            limit_usd=self._limit,
            margin_s=self._margin_s,
        )
        if self._step_s:
            guard.observe_step(self._step_s)
        with self._lock:
            self._guard = guard

    @property
    def step_s(self) -> float:
        """The longest step seen (the guard's guess for the next one)."""
        return self._step_s

    def observe_step(self, dt: float) -> None:
        self._step_s = max(self._step_s, dt)
        with self._lock:
            if self._guard is not None:
                self._guard.observe_step(dt)

    def check(self, *, next_step_s: float | None = None) -> BudgetDecision | None:
        """None while within budget; the STOP decision once (and from then on) it says stop."""
        from tpuctl.services.budget import Action

        with self._lock:
            if self.decision is not None:
                return self.decision
            if self._guard is None:
                return None
            decision = self._guard.check(next_step_s=next_step_s)
        if decision.action is Action.WARN and not self.warned:
            self.warned = True
            self._warn(decision.message)
        elif decision.action is Action.STOP:
            self.decision = decision
            return decision
        return None


@dataclass
class Lease:
    """The exclusive right to supervise one run: a held ``flock`` (released by the kernel whatever way
    the holder dies) plus, in the run's detail, who holds it."""

    path: Path
    fh: IO[str]

    @staticmethod
    def acquire(path: Path) -> Lease | None:
        ensure_private_dir(path.parent.parent)
        ensure_private_dir(path.parent)
        fh = private_file(path).open("a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            return None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(supervisor_identity()))
        fh.flush()
        return Lease(path, fh)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
        self.fh.close()


def supervisor_identity() -> dict[str, Any]:
    from tpuctl.processes import process_start_ticks

    pid = os.getpid()
    return {
        "pid": pid,
        "start_ticks": process_start_ticks(pid),
        "host": os.uname().nodename,
        "since": time.time(),
    }


def lease_holder(run_dir: Path) -> dict[str, Any] | None:
    """Who supervises the run now: the lease file's identity while its lock is held, else None."""
    path = run_dir / LOCK_FILE
    if not path.exists():
        return None
    lease = Lease.acquire(path)
    if lease is not None:  # nobody holds it (and we just took it: give it back)
        lease.release()
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        data = {}
    return data if isinstance(data, dict) else {}


@dataclass
class SupervisedResult:
    run: RunResult
    preemptions: list[PreemptionRecord]
    restarts: int
    summary: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {**self.run.to_dict(), "restarts": self.restarts, "recovery": self.summary}


@dataclass
class _Attempt:
    """One start of the program, and how it ended."""

    node: Node
    restart_count: int
    result: AttemptResult | None = None
    outcome: Outcome | None = None
    preemption: PreemptionRecord | None = None
    started_at: float | None = None
    executor: Executor | None = None


# --------------------------------------------------------------------------------------------------
# The supervisor


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
        launcher_factory: Callable[[LaunchObserver], Launcher] | None = None,
    ) -> None:
        self._session = session
        self._inner: LaunchObserver = observer or _Silent()
        sim = session.backend.name == "sim"
        self._sim = sim
        chosen = policy or RecoveryPolicy()
        if sim and chosen.confirm_timeout_s is None:
            # A killed host is confirmed preempted only once the node is PREEMPTED, which the simulator
            # makes it at the end of its (scaled) notice grace: wait at least that long.
            chosen = dataclasses.replace(chosen, confirm_timeout_s=max(5.0, _sim_grace_s(session) + 2.0))
        self.policy = chosen.resolved(sim)
        self._budget_usd = budget_usd
        self._warn = warn or self._inner.status
        self._observer = _Observer(self._inner, self._on_event)
        factory = launcher_factory or (lambda obs: Launcher(session, observer=obs))
        self.launcher = factory(self._observer)
        self.progress = Progress()
        self.preemptions: list[PreemptionRecord] = []
        self.restarts = 0
        self._run_id: str | None = None
        self._attempt: _Attempt | None = None
        self._segment: int | None = None
        self._lock = threading.Lock()
        self._stop_reason: Outcome | None = None  # set when we stop the hosts ourselves
        self._stopper: threading.Thread | None = None
        self._budget: _Budget | None = None
        self._lease: Lease | None = None
        self._cancel = threading.Event()
        self._running_segment: int | None = None
        self._notice_seen_at: float | None = None  # when the supervisor read this attempt's notice
        self._preempted_seen_at: float | None = None  # ... and its "preempted, checkpoint saved"

    # --- public ---------------------------------------------------------------------------------

    def run(self, prepared: PreparedRun, *, progress: OperationProgress | None = None) -> SupervisedResult:
        """A new run: recorded, leased, run to its end. Raises like ``Launcher.run_prepared``, plus
        ``BudgetExceededError`` (exit 7) when the budget stopped it."""
        self.create_record(prepared)
        return self.supervise(prepared, progress=progress)

    def create_record(self, prepared: PreparedRun) -> None:
        target = prepared.target
        self._session.ledger.create_run(
            prepared.run_id,
            script=prepared.display,
            args=list(prepared.program),
            status=RunStatus.PROVISIONING if target.creates else RunStatus.PENDING,
            pod=target.name,
            zone=target.zone,
            accelerator_type=target.accelerator.api_name,
            capacity=target.capacity,
            detail={
                "hosts": target.accelerator.hosts,
                "bundle_sha256": prepared.bundle.digest,
                "bundle_bytes": prepared.bundle.total_bytes,
                "executor": prepared.executor_kind,
                "log_dir": str(prepared.log_dir),
                "checkpoint_dir": prepared.checkpoint_dir,
                "created_pod": target.creates,
                "env_keys": sorted(prepared.user_env),
                "supervised": True,
                "policy": self.policy.to_dict(),
                "budget_usd": self._budget_usd,
            },
        )
        save_request(prepared.log_dir, prepared.request, run_id=prepared.run_id, budget_usd=self._budget_usd,
                     policy=self.policy)  # fmt: skip

    def cancel(self) -> None:
        """Stop the run from another thread: the hosts are told to stop as on a preemption notice (they
        checkpoint), then the run ends CANCELLED."""
        self._cancel.set()
        self._stop_hosts(Outcome.CANCELLED)

    def supervise(
        self, prepared: PreparedRun, *, progress: OperationProgress | None = None, resume: bool = False
    ) -> SupervisedResult:
        """Run (or, with ``resume``, take over and continue) a run already in the ledger."""
        ledger = self._session.ledger
        run_id = prepared.run_id
        self._run_id = run_id
        self._lease = Lease.acquire(prepared.log_dir / LOCK_FILE)
        if self._lease is None:
            holder = lease_holder(prepared.log_dir) or {}
            raise UsageError(
                f"run {run_id} is supervised by another live process (pid {holder.get('pid', '?')})",
                field="RUN",
                value=run_id,
                fix=f"wait for it, or stop it with `tpuctl runs cancel {run_id}`",
            )
        started = time.monotonic()
        node: Node | None = prepared.target.node
        created_nodes: list[Node] = []
        current: Node | None = None
        restart_count = 0
        status = RunStatus.FAILED
        exit_code: int | None = None
        failure: BaseException | None = None
        deleted = False
        prefer_zone: str | None = None
        record = ledger.get_run(run_id)
        assert record is not None
        wall_start = record.created_at
        if self._budget_usd is not None:
            self._budget = _Budget(
                self._session, run_id, self._budget_usd, self.policy.budget_margin_s or 0.0, self._warn
            )
        try:
            self._update_detail(supervisor=supervisor_identity())
            if resume:
                node, restart_count, prefer_zone = self._take_over(prepared, record)
                if node is not None and node.name != (
                    prepared.target.node.name if prepared.target.node else ""
                ):
                    created_nodes.append(node)
            while True:
                if self._cancel.is_set():
                    raise InterruptedByUser("cancelled: the run was stopped")
                if node is None:
                    node = self._provision(prepared, prefer_zone, progress, restart_count)
                    created_nodes.append(node)
                current = node
                attempt = self._run_attempt(prepared, node, restart_count)
                outcome = attempt.outcome
                if outcome is Outcome.SUCCEEDED:
                    status, exit_code = RunStatus.SUCCEEDED, 0
                    break
                if outcome is Outcome.CANCELLED:
                    status, exit_code = RunStatus.CANCELLED, 130
                    raise InterruptedByUser("interrupted: every host was stopped")
                if outcome is Outcome.TIMED_OUT:
                    status, exit_code = RunStatus.FAILED, 124
                    raise RunFailedError(
                        f"run {run_id} exceeded --timeout {prepared.request.timeout_s:g} s; every host was "
                        "stopped",
                        fix=f"raise --timeout, or check the logs with `tpuctl runs logs {run_id}`",
                        returncode=124,
                    )
                if outcome is Outcome.BUDGET:
                    assert self._budget is not None and self._budget.decision is not None
                    status, exit_code = RunStatus.BUDGET_EXCEEDED, 7
                    raise self._budget.decision.error(run_id=run_id)
                if outcome is Outcome.FAILED:
                    result = attempt.result
                    assert result is not None
                    if self.restarts >= self.policy.max_restarts:
                        worker, rc = result.failed_worker, result.returncode
                        if worker is None:  # every host ended, none 0 nor "preempted": the first non-0
                            worker, rc = next(
                                ((w, c) for w, c in sorted(result.exit_codes.items()) if c != 0), (0, None)
                            )
                        status, exit_code = RunStatus.FAILED, _exit_status(rc)
                        after = (
                            f" (after {self.restarts} restart{'s' if self.restarts != 1 else ''}, "
                            f"--max-restarts {self.policy.max_restarts})"
                            if self.policy.max_restarts
                            else ""
                        )
                        raise RunFailedError(
                            f"run {run_id} failed: host {worker} {_describe_exit(rc)}; the other hosts were "
                            f"stopped{after}",
                            worker=worker,
                            returncode=rc,
                            fix=f"see its output: `tpuctl runs logs {run_id} --worker {worker}`",
                        )
                    self.restarts += 1
                    restart_count += 1
                    ledger.update_run(run_id, restarts=self.restarts, status=RunStatus.RECOVERING)
                    self._inner.status(
                        f"the program failed; restarting it on {node.name} "
                        f"(restart {self.restarts} of --max-restarts {self.policy.max_restarts})"
                    )
                    continue
                # PREEMPTED
                assert attempt.preemption is not None
                record_p = attempt.preemption
                self.preemptions.append(record_p)
                ledger.update_run(run_id, preemptions=len(self.preemptions), status=RunStatus.RECOVERING)
                if len(self.preemptions) > self.policy.max_preemptions:
                    status, exit_code = RunStatus.FAILED, 8
                    self._free_slice(prepared, node, record_p, created=node in created_nodes)
                    deleted = True
                    raise RunFailedError(
                        f"run {run_id} was preempted {len(self.preemptions)} times, more than "
                        f"--max-preemptions {self.policy.max_preemptions}; stopped",
                        fix="raise --max-preemptions, use on-demand capacity, or resume it later with "
                        f"`tpuctl runs resume {run_id}`",
                    )
                if prepared.target.node is not None:
                    status, exit_code = RunStatus.FAILED, 8
                    raise RunFailedError(
                        f"run {run_id}: slice {node.name} (given with --pod) was preempted; tpuctl does not "
                        "replace a slice it did not create",
                        fix=f"run with --type {prepared.target.accelerator.friendly_name} (and --spot) so "
                        "tpuctl places and replaces the slice itself",
                    )
                self._free_slice(prepared, node, record_p, created=True)
                prefer_zone = node.zone
                node = None
                current = None
                restart_count += 1
                self._save_recovery(final_step=None)
                if self._budget is not None:
                    self._budget.refresh()
                    if self._budget.check(next_step_s=0.0) is not None:
                        status, exit_code = RunStatus.BUDGET_EXCEEDED, 7
                        assert self._budget.decision is not None
                        raise self._budget.decision.error(run_id=run_id)
        except KeyboardInterrupt:
            status, exit_code = RunStatus.CANCELLED, 130
            failure = InterruptedByUser("interrupted: every host was stopped")
        except BaseException as exc:
            failure = exc
            if isinstance(exc, InterruptedByUser):
                status, exit_code = RunStatus.CANCELLED, 130
        finally:
            try:
                self._close_segment()
                if current is not None and current in created_nodes and not prepared.request.keep_pod:
                    deleted = self._delete_slice(prepared, current, reason=f"end of run {run_id}")
                elif status is RunStatus.BUDGET_EXCEEDED and current is not None and current in created_nodes:
                    deleted = self._delete_slice(prepared, current, reason=f"run {run_id} at its budget")
                final_step = self.progress.last_step
                detail: dict[str, Any] = {"deleted_pod": deleted or current is None}
                last = self._attempt.result if self._attempt is not None else None
                if last is not None:
                    detail.update(
                        exit_codes={str(k): v for k, v in last.exit_codes.items()},
                        failed_worker=last.failed_worker,
                        shipped_hosts=sum(1 for s in last.shipped if s.shipped),
                    )
                if status is RunStatus.BUDGET_EXCEEDED and self._budget and self._budget.decision:
                    detail["budget"] = self._budget.decision.to_dict()
                if failure is not None and not isinstance(
                    failure, (RunFailedError, InterruptedByUser, BudgetExceededError)
                ):
                    detail["error"] = str(failure)
                    if isinstance(failure, TpuctlError) and failure.exit_code:
                        exit_code = failure.exit_code
                summary = self._save_recovery(final_step=final_step, end=time.time(), wall_start=wall_start)
                detail["supervisor"] = None
                self._update_detail(**detail)
                ledger.update_run(
                    run_id,
                    status=status,
                    exit_code=exit_code,
                    steps=final_step or 0,
                    restarts=self.restarts,
                    preemptions=len(self.preemptions),
                )
            finally:
                if self._lease is not None:
                    self._lease.release()
                    self._lease = None
        if failure is not None:
            raise failure
        assert current is not None and self._attempt is not None and self._attempt.result is not None
        result = self._attempt.result
        return SupervisedResult(
            run=RunResult(
                run_id=run_id,
                pod=current.name,
                zone=current.zone,
                hosts=prepared.target.accelerator.hosts,
                exit_code=0,
                duration_s=time.monotonic() - started,
                log_dir=prepared.log_dir,
                bundle_sha256=prepared.bundle.digest,
                shipped_hosts=sum(1 for s in result.shipped if s.shipped),
                deleted_pod=deleted,
            ),
            preemptions=self.preemptions,
            restarts=self.restarts,
            summary=summary,
        )

    # --- one attempt ----------------------------------------------------------------------------

    def _run_attempt(self, prepared: PreparedRun, node: Node, restart_count: int) -> _Attempt:
        attempt = _Attempt(node=node, restart_count=restart_count)
        with self._lock:
            self._attempt = attempt
            self._stop_reason = None
        self.progress.new_attempt()
        self._open_segment(SegmentKind.RUNNING, node, detail={"restart_count": restart_count})
        if self._budget is not None:
            self._budget.refresh()
        watch = _SliceWatch(
            self._session.cloud,
            node,
            poll_s=self.policy.poll_s or 1.0,
            confirm=self.policy.confirm_polls,
            on_poll=lambda: self._poll_tick(watch),
        )
        watch.start()

        def started(executor: Executor) -> None:
            attempt.started_at = time.time()
            attempt.executor = executor
            self._record_hosts(executor)
            if self._cancel.is_set():
                self._stop_hosts(Outcome.CANCELLED)

        try:
            result = self.launcher.execute(
                prepared,
                node,
                restart_count=restart_count,
                record_segment=False,
                soft_exit_codes=frozenset({PREEMPTED_EXIT_CODE}),
                soft_wait_s=self.policy.checkpoint_wait_s,
                on_started=started,
            )
        finally:
            watch.close()
            self._join_stopper()
        if self._running_segment is not None:
            # How the slice looked from the API meanwhile (failed polls are counted, never acted on).
            self._session.ledger.update_segment(
                self._running_segment,
                detail={
                    "restart_count": restart_count,
                    "api_polls": watch.polls,
                    "api_poll_errors": watch.errors,
                },
            )
        attempt.result = result
        attempt.outcome = self._classify(attempt, watch)
        self._after_attempt(attempt)
        return attempt

    def _poll_tick(self, watch: _SliceWatch) -> None:
        """Every poll while hosts run: act on a confirmed lost slice, and check the budget."""
        if watch.confirmed.is_set() and watch.confirmed_state != "QR_SUSPENDING":
            # The slice is gone from under the hosts: do not wait for their connections to time out.
            # (SUSPENDING is the notice: the hosts are checkpointing, let them.)
            self._stop_hosts(Outcome.PREEMPTED, grace_s=1.0)
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
                self._inner.status(
                    f"host {event.get('worker', worker)}: preemption notice ({event.get('source')}); every "
                    "host checkpoints at the next common step"
                )
                attempt = self._attempt
                if attempt is not None and self._stop_reason is None:
                    self._open_segment(
                        SegmentKind.CHECKPOINTING, attempt.node, detail={"notice": event, "seen_at": at}
                    )
            return
        if worker != 0 and kind != "preempted":
            return
        self.progress.on_event(event, at)
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
            self._preempted_seen_at = at
            self._inner.status(
                f"every host saved checkpoint step {event.get('step')} and stopped "
                f"({event.get('save_s')} s to save)"
            )
            if event.get("checkpoint") == "saved":
                # Host 0 says so only once the step is committed (orbax finalizes after every host
                # wrote): nothing the hosts still do matters, and jax's shutdown at exit takes seconds.
                self._stop_hosts(Outcome.PREEMPTED, grace_s=1.0)

    def _budget_stop(self) -> None:
        assert self._budget is not None and self._budget.decision is not None
        if self._stop_reason is None:
            self._inner.status(f"budget: {self._budget.decision.message}; checkpointing and stopping")
        self._stop_hosts(Outcome.BUDGET)

    def _stop_hosts(self, reason: Outcome, grace_s: float | None = None) -> None:
        """Tell every host to stop (SIGTERM: the runtime checkpoints at the next common step; SIGKILL after
        the grace). Once per attempt, on a thread (``Executor.stop`` blocks for the grace)."""
        with self._lock:
            if self._stop_reason is not None:
                return
            attempt = self._attempt
            if attempt is None or attempt.executor is None:
                if reason is Outcome.CANCELLED:
                    self._stop_reason = reason
                return
            self._stop_reason = reason
            executor = attempt.executor
            wait = grace_s if grace_s is not None else self.policy.checkpoint_wait_s
            self._stopper = threading.Thread(
                target=executor.stop, args=(wait,), name="tpuctl-stop-hosts", daemon=True
            )
            self._stopper.start()

    def _join_stopper(self) -> None:
        stopper = self._stopper
        if stopper is not None:
            stopper.join(timeout=self.policy.checkpoint_wait_s + 30.0)
            self._stopper = None

    def _classify(self, attempt: _Attempt, watch: _SliceWatch) -> Outcome:
        result = attempt.result
        assert result is not None
        reason = self._stop_reason
        if result.interrupted:
            return Outcome.CANCELLED
        if reason in (Outcome.CANCELLED, Outcome.BUDGET):
            return reason
        if result.timed_out:
            return Outcome.TIMED_OUT
        if result.succeeded:
            return Outcome.SUCCEEDED
        codes = result.exit_codes
        preempted_exit = any(c == PREEMPTED_EXIT_CODE for c in codes.values())
        notice = self.progress.notice
        if preempted_exit or notice is not None or self.progress.preempted is not None:
            source = "runtime-notice" if notice is not None else "runtime-exit"
            attempt.preemption = self._preemption(attempt, source, watch)
            return Outcome.PREEMPTED
        if watch.confirmed.is_set():
            attempt.preemption = self._preemption(attempt, "api", watch)
            return Outcome.PREEMPTED
        # Hosts died: ask the API whether the slice went with them. A signal or a lost host is what a
        # preemption looks like from here, so wait for the API to catch up; a plain exit status gets the
        # confirming polls only.
        died = any(c is None or c < 0 for c in codes.values())
        timeout = (self.policy.confirm_timeout_s or 5.0) if died else (self.policy.poll_s or 1.0)
        if watch.confirm_now(timeout) is not None:
            attempt.preemption = self._preemption(attempt, "hosts+api", watch)
            return Outcome.PREEMPTED
        return Outcome.FAILED

    def _preemption(self, attempt: _Attempt, source: str, watch: _SliceWatch) -> PreemptionRecord:
        """The record of the preemption that ended ``attempt``: detected when the supervisor first knew
        (the notice line, the runtime's "preempted", or the API's confirmation), occurred at the earliest
        evidence (the host's notice time, else the first host's death)."""
        result = attempt.result
        assert result is not None
        notice = self.progress.notice
        preempted = self.progress.preempted
        candidates = [self._notice_seen_at, self._preempted_seen_at, watch.confirmed_at]
        detected_at = min((c for c in candidates if c is not None), default=time.time())
        occurred: float | None = None
        if notice is not None and isinstance(notice.get("t"), (int, float)):
            occurred = float(notice["t"])
        elif result.exit_times:
            occurred = min(result.exit_times.values())
        saved = preempted is not None and preempted.get("checkpoint") == "saved"
        checkpoint_step = _int(preempted.get("step")) if saved and preempted is not None else None
        node = attempt.node
        return PreemptionRecord(
            number=len(self.preemptions) + 1,
            kind="notice" if checkpoint_step is not None else "hard",
            source=source,
            pod=node.name,
            zone=node.zone,
            capacity=node.capacity.value,
            occurred_at=occurred,
            detected_at=detected_at,
            checkpoint_step=checkpoint_step,
            last_step=self.progress.attempt_last,
        )

    def _after_attempt(self, attempt: _Attempt) -> None:
        """Close the attempt's last segment with its step counts; note where a recovery resumed."""
        steps = self.progress.attempt_steps
        recomputed = self.progress.attempt_recomputed
        # The running segment of this attempt carries its step counts.
        if self._running_segment is not None:
            self._session.ledger.update_segment(
                self._running_segment, steps_completed=steps, steps_recomputed=recomputed
            )
        previous = self.preemptions[-1] if self.preemptions else None
        if previous is not None and previous.resumed_at is None and self.progress.first_step_at is not None:
            previous.resumed_at = self.progress.first_step_at
            previous.hosts_started_at = attempt.started_at
            previous.restored_step = self.progress.restored
            previous.steps_recomputed = recomputed
        self._close_segment()

    # --- segments -------------------------------------------------------------------------------

    def _open_segment(
        self, kind: SegmentKind, node: Node | None, *, detail: Mapping[str, Any] | None = None
    ) -> int:
        assert self._run_id is not None
        at = time.time()
        if kind is SegmentKind.CHECKPOINTING:
            self._notice_seen_at = at
            if self._running_segment is not None:
                self._session.ledger.update_segment(
                    self._running_segment,
                    steps_completed=self.progress.attempt_steps,
                    steps_recomputed=self.progress.attempt_recomputed,
                )
        segment = self._session.ledger.add_segment(
            self._run_id,
            kind,
            start=at,
            pod=None if node is None else node.name,
            zone=None if node is None else node.zone,
            capacity=None if node is None else node.capacity,
            detail=detail,
        )
        self._segment = segment
        if kind is SegmentKind.RUNNING:
            self._running_segment = segment
            self._notice_seen_at = self._preempted_seen_at = None
        return segment

    def _close_segment(self) -> None:
        segment, self._segment = self._segment, None
        if segment is None:
            return
        with contextlib.suppress(TpuctlError):  # already closed by the next one's start
            self._session.ledger.close_segment(segment, end=time.time())

    # --- recovery -------------------------------------------------------------------------------

    def _free_slice(
        self, prepared: PreparedRun, node: Node, record: PreemptionRecord, *, created: bool
    ) -> None:
        """The PREEMPTED segment: note the preemption on the slice, delete it (frees its quota)."""
        self._open_segment(
            SegmentKind.PREEMPTED,
            node,
            detail={"preemption": record.number, "kind": record.kind, "source": record.source},
        )
        what = (
            f"checkpoint at step {record.checkpoint_step}"
            if record.checkpoint_step is not None
            else "no checkpoint on the way out (the last periodic one will do)"
        )
        self._inner.status(f"{node.name} ({node.zone}) was preempted [{record.kind}, {what}]; deleting it")
        with contextlib.suppress(Exception):  # the ledger view must not block the recovery
            self._session.ledger.record_event(
                EventKind.PREEMPTED,
                pod=node.name,
                zone=node.zone,
                run_id=prepared.run_id,
                ts=record.occurred_at or record.detected_at,
                detail={"seen_by": "run supervisor", "kind": record.kind, "source": record.source},
            )
        if created:
            self._delete_slice(prepared, node, reason=f"preempted during run {prepared.run_id}")
        record.slice_deleted_at = time.time()
        self._close_segment()

    def _delete_slice(self, prepared: PreparedRun, node: Node, *, reason: str) -> bool:
        from tpuctl.services.pods import PodService

        self._inner.status(f"deleting {node.name} ({node.zone})")
        try:
            PodService(self._session).delete(node.name, zone=node.zone, wait=True, reason=reason)
        except NotFoundError:
            pass  # already gone: what we wanted
        except Exception as exc:  # reported; it must not mask how the run itself ended
            message = exc.message if isinstance(exc, TpuctlError) else f"{type(exc).__name__}: {exc}"
            self._inner.status(
                f"could not delete {node.name}: {message}; delete it with `tpuctl pod delete {node.name}`"
            )
            return False
        if prepared.executor_kind == "sim":
            shutil.rmtree(self._session.state_dir / "sim-hosts" / node.zone / node.name, ignore_errors=True)
        return True

    def _provision(
        self, prepared: PreparedRun, prefer_zone: str | None, progress: OperationProgress | None, restart: int
    ) -> Node:
        """Place the run's slice (a recovery: a fresh name and request, the old zone first), backing off
        while no allowed zone has capacity; every wait is a RECOVERING segment."""
        from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

        target = prepared.target
        recovering = prefer_zone is not None or restart > 0
        tries = 0

        def one() -> Node:
            nonlocal tries
            tries += 1
            if self._cancel.is_set():
                raise InterruptedByUser("cancelled: the run was stopped")
            again = prepared if not recovering else _renamed(prepared, restart, tries)
            self._segment = None  # provision() keeps its own segment
            return self.launcher.provision(
                again,
                progress=progress,
                prefer_zone=prefer_zone,
                detail={"recovery": recovering, "try": tries} if recovering else None,
            )

        def retryable(exc: BaseException) -> bool:
            # No room now (stockouts everywhere, or quota a preempted slice still holds): wait and retry.
            # Anything else (over the price cap, bad input) will not change by waiting.
            from tpuctl.errors import NoCapacityError, NoQuotaError, StockoutError

            if not recovering:
                return False
            return isinstance(exc, (NoCapacityError, NoQuotaError, StockoutError)) or (
                isinstance(exc, InfeasibleError) and "no capacity" in exc.message.lower()
            )

        def before_sleep(state: Any) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            self._inner.status(
                f"no capacity for {target.accelerator.friendly_name} yet (try {state.attempt_number}: "
                f"{getattr(exc, 'message', exc)}); retrying in {wait:.1f} s"
            )
            if progress is not None:
                progress.update(f"waiting for capacity (try {state.attempt_number})", elapsed_s=0.0)
            self._open_segment(
                SegmentKind.RECOVERING, None, detail={"waiting_for": "capacity", "try": state.attempt_number}
            )

        if recovering:
            self._open_segment(
                SegmentKind.RECOVERING, None, detail={"after_preemption": len(self.preemptions)}
            )
        started = time.time()
        retrying = Retrying(
            retry=retry_if_exception(retryable),
            wait=wait_exponential(
                multiplier=self.policy.backoff_initial_s or 1.0,
                min=self.policy.backoff_initial_s or 1.0,
                max=self.policy.backoff_max_s or 60.0,
            ),
            stop=stop_after_delay(self.policy.capacity_timeout_s),
            before_sleep=before_sleep,
            reraise=True,
        )
        node: Node = retrying(one)
        if self.preemptions and self.preemptions[-1].new_pod is None:
            record = self.preemptions[-1]
            record.new_pod, record.new_zone = node.name, node.zone
            record.provisioning_s = round(time.time() - started, 3)
            if record.new_zone != record.zone:
                self._inner.status(f"recovered in another zone: {record.zone} -> {record.new_zone}")
        self._session.ledger.update_run(prepared.run_id, pod=node.name, zone=node.zone)
        return node

    # --- takeover (runs resume) -----------------------------------------------------------------

    def _take_over(self, prepared: PreparedRun, record: Any) -> tuple[Node | None, int, str | None]:
        """Continue a run whose supervisor died: stop what it left running, end its open segment, and
        start again from the last checkpoint (the old slice is replaced: its hosts' state is unknown)."""
        ledger = self._session.ledger
        detail = dict(record.detail or {})
        self.restarts = int(record.restarts or 0)
        recovery = detail.get("recovery") or {}
        self.preemptions = [PreemptionRecord.from_dict(p) for p in recovery.get("preemptions", [])]
        self._seed_progress(prepared)
        for seg in ledger.segments(prepared.run_id):
            if seg.end is None:
                ledger.close_segment(
                    seg.id, end=time.time(), detail={**(seg.detail or {}), "closed_by": "resume"}
                )
        kill_left_hosts(
            self._session.state_dir,
            prepared.run_id,
            detail.get("host_pids"),
            local=prepared.executor_kind == "sim",
        )
        restart_count = int(detail.get("restart_count", self.restarts + len(self.preemptions))) + 1
        self._inner.status(f"taking over run {prepared.run_id} (restart {restart_count})")
        if prepared.target.node is not None:
            return prepared.target.node, restart_count, None
        node = self._adopt_slices(prepared, record)
        return node, restart_count, node.zone if node is not None else record.zone

    def _adopt_slices(self, prepared: PreparedRun, record: Any) -> Node | None:
        """What becomes of the dead supervisor's slices: the one the run record names (it ran there; it may
        be preempted) and every other the ledger still has alive for the run: a placement or a recovery
        that was still making one when the supervisor died (the run record names a slice only once it is
        placed, and names no zone at all while the allocator chooses). The first READY one is used again on
        the simulator (its hosts were killed above; the slice itself is fine), the others are deleted, and
        one the API no longer has (a delete that landed before the kill could record it) is recorded gone:
        no slice is left that the run forgot, and no ledger entry outlives its slice."""
        ledger = self._session.ledger
        run_id = prepared.run_id
        slices: list[tuple[str, str]] = []
        if record.pod and record.zone:
            slices.append((record.zone, record.pod))
        for pod in ledger.list_pods(run_id=run_id, alive=True):
            if (pod.zone, pod.name) not in slices:
                slices.append((pod.zone, pod.name))
        keep: Node | None = None
        for zone, name in slices:
            try:
                node = self._session.cloud.get_node(zone, name)
            except NotFoundError:
                known = ledger.get_pod(name, zone=zone)
                if known is not None and known.alive:
                    ledger.record_event(
                        EventKind.GONE,
                        pod=name,
                        zone=zone,
                        run_id=run_id,
                        detail={"seen_by": "runs resume", "why": "not found when the run was taken over"},
                    )
                continue
            except CloudError:
                continue  # cannot tell now; the ledger still has it, so `tpuctl pod gc` will
            if keep is None and node.state == "READY" and prepared.executor_kind == "sim":
                keep = node
                continue
            self._delete_slice(prepared, node, reason=f"replaced by resume of run {run_id}")
        return keep

    def _seed_progress(self, prepared: PreparedRun) -> None:
        """Read the steps done so far back from host 0's log (the killed supervisor kept them in memory)."""
        path = prepared.log_dir / "worker-0.log"
        if not path.exists():
            return
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                event = parse_event(line.rstrip("\n"))
                if event is not None:
                    self.progress.on_event(event, time.time())
        self.progress.new_attempt()

    # --- ledger detail --------------------------------------------------------------------------

    def _update_detail(self, **changes: Any) -> None:
        assert self._run_id is not None
        ledger = self._session.ledger
        record = ledger.get_run(self._run_id)
        merged = dict(record.detail or {}) if record is not None else {}
        merged.update(changes)
        ledger.update_run(self._run_id, detail=merged)

    def _record_hosts(self, executor: Executor) -> None:
        pids = getattr(executor, "pids", None)
        attempt = self._attempt
        changes: dict[str, Any] = {"restart_count": attempt.restart_count if attempt else 0}
        if callable(pids):
            from tpuctl.processes import process_start_ticks

            changes["host_pids"] = {str(w): [p, process_start_ticks(p)] for w, p in pids().items()}
        self._update_detail(**changes)

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
        )
        self._update_detail(recovery=summary)
        return summary


def _sim_grace_s(session: Session) -> float:
    """The simulator's preemption grace in real seconds (0 when it cannot be asked)."""
    from tpuctl.sim import SimAdminClient

    try:
        admin = SimAdminClient(session.cloud.endpoint, timeout_s=5.0)
        try:
            world = admin.status().get("world") or {}
        finally:
            admin.close()
        grace = float((world.get("durations") or {}).get("preemption_grace_s", 0.0))
        return grace / float(world.get("speed") or 1.0)
    except Exception:  # an older or foreign simulator: the default timeout stands
        return 0.0


def recovery_summary(
    progress: Progress,
    preemptions: list[PreemptionRecord],
    restarts: int,
    *,
    final_step: int | None,
    end: float | None,
    wall_start: float | None,
) -> dict[str, Any]:
    productive = progress.productive_s(final_step)
    wall = None if end is None or wall_start is None else max(0.0, end - wall_start)
    return {
        "preemptions": [p.to_dict() for p in preemptions],
        "preemption_count": len(preemptions),
        "restarts": restarts,
        "steps_completed": final_step,
        "steps_recomputed": progress.recomputed,
        "checkpoint_fallbacks": progress.fallbacks,
        "productive_step_s": round(productive, 4),
        "computed_step_s": round(progress.computed_s, 4),
        "wall_s": _round(wall),
        # Unknown (None) for a program that reports no steps: there is nothing to call productive.
        "goodput": None if not wall or not progress.step_dt else round(productive / wall, 4),
    }


def _renamed(prepared: PreparedRun, restart: int, tries: int) -> PreparedRun:
    """The prepared run with a fresh slice name and request id for a recovery (the old name may still
    be deleting, and a new request must not be mistaken for the old one's retry)."""
    from tpuctl.services.pods import new_request_id

    target = prepared.target
    suffix = f"-r{restart}" + (f"-{tries}" if tries > 1 else "")
    if target.placement is not None:
        base = target.placement.name
        name = base[: 63 - len(suffix)] + suffix
        placement = dataclasses.replace(target.placement, name=name, request_id=new_request_id())
        return dataclasses.replace(prepared, target=dataclasses.replace(target, placement=placement))
    if target.create is not None:
        base = target.create.name
        name = base[: 63 - len(suffix)] + suffix
        create = dataclasses.replace(target.create, name=name, request_id=new_request_id())
        return dataclasses.replace(prepared, target=dataclasses.replace(target, create=create))
    return prepared


def kill_recorded_hosts(host_pids: Any) -> int:
    """SIGKILL the process groups of simulated hosts a dead supervisor left (only while each pid is
    still the process that was recorded). Returns how many were signalled."""
    from tpuctl.processes import is_same_process

    if not isinstance(host_pids, dict):
        return 0
    killed = 0
    for value in host_pids.values():
        if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], int):
            continue
        pid, ticks = value
        if is_same_process(pid, ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # each host leads its own group (start_new_session)
                killed += 1
    return killed


def kill_left_hosts(state_dir: Path, run_id: str, host_pids: Any, *, local: bool) -> int:
    """SIGKILL the hosts a dead supervisor left: those recorded in the run (``host_pids``) and, for
    simulated hosts (``local``), every other process of the run still running on this machine: a
    supervisor killed between starting a host and recording the hosts' pids leaves one that nobody knows
    of (host 0 then waits for its peers for minutes and never writes to its closed pipe). Only for a run
    nobody supervises. Returns how many were signalled."""
    from tpuctl.services.executors.sim import local_hosts

    killed = kill_recorded_hosts(host_pids)
    if not local:
        return killed
    recorded = (
        {v[0] for v in host_pids.values() if isinstance(v, list) and v}
        if isinstance(host_pids, dict)
        else set()
    )
    for pid in local_hosts(state_dir / "sim-hosts", run_id):
        if pid in recorded:
            continue  # signalled above, if still the recorded process
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # A host leads its own group (whatever it started goes with it); a leftover child of a
            # host that is gone is signalled alone.
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


# --------------------------------------------------------------------------------------------------
# The saved request (detach, resume)


def save_request(
    log_dir: Path, request: RunRequest, *, run_id: str, budget_usd: float | None, policy: RecoveryPolicy
) -> Path:
    """Write what ``runs resume`` / a detached supervisor needs to prepare the run again (0600)."""
    from tpuctl.store.paths import ensure_private_dir

    ensure_private_dir(log_dir)
    data = dataclasses.asdict(request)
    data["capacity"] = request.capacity.value
    data["run_id"] = run_id
    payload = {"request": data, "budget_usd": budget_usd, "policy": policy.to_dict()}
    path = log_dir / REQUEST_FILE
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(payload, fh)
    tmp.replace(path)
    return path


def load_request(log_dir: Path) -> tuple[RunRequest, float | None, RecoveryPolicy]:
    from tpuctl.catalog import CapacityType

    path = log_dir / REQUEST_FILE
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"cannot read the saved request of this run ({path}: {exc})",
            field="RUN",
            value=log_dir.name,
            fix="only runs started by a tpuctl that saves requests can be resumed; start it again with "
            "`tpuctl run`",
        ) from None
    raw = dict(payload["request"])
    raw["capacity"] = CapacityType(raw["capacity"])
    for key in ("args", "env"):
        raw[key] = tuple(raw.get(key) or ())
    names = {f.name for f in dataclasses.fields(RunRequest)}
    request = RunRequest(**{k: v for k, v in raw.items() if k in names})
    policy_raw = payload.get("policy") or {}
    policy_names = {f.name for f in dataclasses.fields(RecoveryPolicy)}
    policy = RecoveryPolicy(**{k: v for k, v in policy_raw.items() if k in policy_names})
    budget = payload.get("budget_usd")
    return request, (float(budget) if budget is not None else None), policy


# --------------------------------------------------------------------------------------------------
# Detached supervisors, takeover and cancel


def _settings_env(session: Session) -> dict[str, str]:
    """The settings a background supervisor must share with the command that started it."""
    settings = session.settings
    env = {"TPUCTL_STATE_DIR": str(session.state_dir)}
    for name, value in (
        ("TPUCTL_PROFILE", settings.profile),
        ("TPUCTL_PROJECT", settings.project),
        ("TPUCTL_BACKEND", None if settings.backend is None else settings.backend.value),
        # The resolved default path even when there is no file: pass it on only if it exists (named,
        # a missing file is an error).
        (
            "TPUCTL_CONFIG",
            settings.config_file if settings.config_file and settings.config_file.exists() else None,
        ),
        ("TPUCTL_SIM_URL", settings.sim_url),
        ("TPUCTL_SIM_WORLD", settings.sim_world),
    ):
        if value is not None:
            env[name] = str(value)
    return env


def start_detached(
    session: Session, run_id: str, *, resume: bool = False, wait_s: float = 30.0
) -> dict[str, Any]:
    """Start ``python -m tpuctl runs supervise RUN`` in a session of its own (it survives the terminal
    and this process) and wait until it holds the run's lease. Returns its pid and log file."""
    import subprocess
    import sys

    log_dir = session.state_dir / "runs" / run_id
    ensure_private_dir(log_dir.parent)
    ensure_private_dir(log_dir)
    log_path = private_file(log_dir / SUPERVISOR_LOG)
    env = {**os.environ, **_settings_env(session)}
    argv = [sys.executable, "-m", "tpuctl", "runs", "supervise", run_id] + (["--resume"] if resume else [])
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(log_dir),
            # A new session: no controlling terminal, so closing the terminal (SIGHUP) or Ctrl-C in it
            # does not reach the supervisor.
            start_new_session=True,
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        holder = lease_holder(log_dir)
        if holder is not None and holder.get("pid") == proc.pid:
            return {"pid": proc.pid, "log": str(log_path)}
        if proc.poll() is not None:
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise TpuctlError(
                f"the background supervisor of run {run_id} exited at once (status {proc.returncode}): "
                f"{tail.strip()}",
                fix=f"see {log_path}",
            )
        time.sleep(0.05)
    return {"pid": proc.pid, "log": str(log_path), "lease": "not yet taken"}


def resume_prepared(
    session: Session, run_id: str, launcher: Launcher
) -> tuple[PreparedRun, float | None, RecoveryPolicy, str | None]:
    """The saved request of ``run_id``, prepared again under the same run id; with a note when the
    program's files changed since (the new ones are shipped)."""
    record = session.ledger.get_run(run_id)
    if record is None:
        raise UsageError(
            f"no run {run_id!r}", field="RUN", value=run_id, fix="`tpuctl runs list` shows the runs"
        )
    log_dir = Path((record.detail or {}).get("log_dir") or session.state_dir / "runs" / run_id)
    request, budget, policy = load_request(log_dir)
    prepared = launcher.prepare(dataclasses.replace(request, run_id=run_id))
    note = None
    if prepared.bundle.digest != (record.detail or {}).get("bundle_sha256"):
        note = (
            f"the program's files changed since run {run_id} started (bundle now "
            f"{prepared.bundle.short_digest}); the new files are shipped"
        )
    return prepared, budget, policy, note


def cancel_run(session: Session, run_id: str, *, wait_s: float = 120.0) -> dict[str, Any]:
    """Stop a run: its live supervisor is sent SIGTERM (it stops the hosts, which checkpoint, deletes the
    slice and records CANCELLED); without one (it was killed), tpuctl cleans up itself."""
    from tpuctl.processes import is_same_process

    ledger = session.ledger
    record = ledger.get_run(run_id)
    if record is None:
        raise UsageError(
            f"no run {run_id!r}", field="RUN", value=run_id, fix="`tpuctl runs list` shows the runs"
        )
    status = RunStatus(record.status)
    if status.finished:
        return {
            "run_id": run_id,
            "status": status.value,
            "cancelled": False,
            "note": "the run had already ended",
        }
    detail = dict(record.detail or {})
    log_dir = Path(detail.get("log_dir") or session.state_dir / "runs" / run_id)
    holder = lease_holder(log_dir)
    if holder is not None:
        pid = holder.get("pid")
        if isinstance(pid, int) and is_same_process(pid, holder.get("start_ticks")):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and lease_holder(log_dir) is not None:
                time.sleep(0.1)
            after = ledger.get_run(run_id)
            return {
                "run_id": run_id,
                "status": None if after is None else str(after.status),
                "cancelled": True,
                "by": f"its supervisor (pid {pid})",
            }
    # Nobody supervises it: stop what it left and free the slice it made.
    lease = Lease.acquire(log_dir / LOCK_FILE)
    try:
        killed = kill_left_hosts(
            session.state_dir, run_id, detail.get("host_pids"), local=detail.get("executor") == "sim"
        )
        for seg in ledger.segments(run_id):
            if seg.end is None:
                ledger.close_segment(seg.id, end=time.time())
        deleted = None
        if detail.get("created_pod") and record.pod and record.zone:
            from tpuctl.services.pods import PodService

            with contextlib.suppress(NotFoundError):
                PodService(session).delete(
                    record.pod, zone=record.zone, wait=True, reason=f"cancel of run {run_id}"
                )
                deleted = record.pod
        detail.update(supervisor=None, cancelled_by="runs cancel (no live supervisor)")
        ledger.update_run(run_id, status=RunStatus.CANCELLED, exit_code=130, detail=detail)
        return {
            "run_id": run_id,
            "status": "cancelled",
            "cancelled": True,
            "hosts_killed": killed,
            "deleted": deleted,
        }
    finally:
        if lease is not None:
            lease.release()


# --------------------------------------------------------------------------------------------------
# Reading a run back (``runs describe``)

TIMELINE_WIDTH = 60


def describe_run(session: Session, record: Any) -> dict[str, Any]:
    """Segments (with ISO times), a timeline scaled to ``TIMELINE_WIDTH`` columns, the recovery record
    and who supervises the run now. Plain data: the CLI renders it as a table or JSON."""
    from datetime import UTC, datetime

    def iso(ts: float | None) -> str | None:
        if ts is None:
            return None
        return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

    now = time.time()
    segments = session.ledger.segments(record.run_id)
    segs = []
    for seg in segments:
        end = seg.end
        segs.append(
            {
                "kind": str(seg.kind),
                "start": seg.start,
                "end": end,
                "start_iso": iso(seg.start),
                "end_iso": iso(end),
                "duration_s": round((end if end is not None else now) - seg.start, 3),
                "open": end is None,
                "pod": seg.pod,
                "zone": seg.zone,
                "capacity": None if seg.capacity is None else seg.capacity.value,
                "steps_completed": seg.steps_completed,
                "steps_recomputed": seg.steps_recomputed,
                "detail": seg.detail or {},
            }
        )
    timeline = []
    if segments:
        first = segments[0].start
        last = max((s.end if s.end is not None else now) for s in segments)
        span = max(last - first, 1e-9)
        for seg in segments:
            duration = (seg.end if seg.end is not None else now) - seg.start
            offset = round((seg.start - first) / span * TIMELINE_WIDTH)
            timeline.append(
                {
                    "kind": str(seg.kind),
                    "offset": min(offset, TIMELINE_WIDTH - 1),
                    "width": round(duration / span * TIMELINE_WIDTH),
                    "duration_s": round(duration, 3),
                }
            )
    detail = record.detail or {}
    log_dir = Path(detail.get("log_dir") or session.state_dir / "runs" / record.run_id)
    holder = lease_holder(log_dir)
    finished = RunStatus(record.status).finished if record.status in RunStatus._value2member_map_ else True
    if holder is not None:
        state = f"alive (pid {holder.get('pid')})"
    elif finished:
        state = "none (the run ended)"
    else:
        state = f"gone: take over with `tpuctl runs resume {record.run_id}`"
    return {
        "segments": segs,
        "timeline": timeline,
        "recovery": detail.get("recovery") or {},
        "supervisor_state": state,
        "supervisor": holder,
    }
