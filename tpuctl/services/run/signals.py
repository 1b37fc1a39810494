"""The signs a run watches while its hosts run: the runtime's event lines on host output (``EventTap``),
the slice's state from the API (``SliceWatch``), and the budget at every step (``StepBudget``)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.base import DEAD_NODE_STATES
from tpuctl.errors import BudgetExceededError, NotFoundError
from tpuctl.runtime.preemption import PREEMPTED_EXIT_CODE, parse_event
from tpuctl.services.run.accounting import Progress, notice_source
from tpuctl.services.run.maintenance import in_maintenance
from tpuctl.services.run.model import AttemptResult, LaunchObserver, Outcome, PhaseUpdate, RecoveryPolicy
from tpuctl.services.run.sliceset import SliceSet

if TYPE_CHECKING:
    from tpuctl.services.budget import BudgetDecision, BudgetGuard
    from tpuctl.services.session import Session

#: What ``SliceWatch.state`` says of a slice the API no longer has.
GONE = "GONE"
#: Queued-resource states of a preemption (SUSPENDING: with notice, the hosts still run).
PREEMPTED_QR_STATES = frozenset({"SUSPENDING", "SUSPENDED"})


def is_lost(state: str | None) -> bool:
    """Whether a state ``SliceWatch.state`` read means the slice is lost to the run: dead, gone, or its
    queued resource preempted."""
    return state is not None and (state in DEAD_NODE_STATES or state == GONE or state.startswith("QR_"))


class EventTap:
    """Between the launcher and the user's observer: takes the runtime's event lines (they go to the
    hosts' log files, not the screen) and passes everything else on.

    The follower's notice line is written with a newline on each side (``tpuctl.hosts.follow``), which
    may leave a blank line just before or just after it: such a blank stays off the screen. A blank line
    is held back until the host's next line says whether it was one; a program's blank line at its very
    end is the one thing this loses, on the screen only (the host's log has every line)."""

    def __init__(self, inner: LaunchObserver, on_event: Callable[[int, dict[str, Any], float], None]) -> None:
        self._inner = inner
        self._on_event = on_event
        self._held_blank: set[int] = set()  # hosts whose last line was blank, not yet passed on
        self._after_notice: set[int] = set()  # hosts whose last line was the follower's notice

    def line(self, worker: int, text: str) -> None:
        event = parse_event(text)
        if event is not None:
            if event.get("reporter") == "follower":
                self._held_blank.discard(worker)
                self._after_notice.add(worker)
            else:
                self._release(worker)
            self._on_event(worker, event, time.time())
            return
        if not text:
            if worker in self._after_notice:
                self._after_notice.discard(worker)
                return
            if worker in self._held_blank:
                self._inner.line(worker, "")  # the first of two blank lines was the program's
            self._held_blank.add(worker)
            return
        self._release(worker)
        self._inner.line(worker, text)

    def _release(self, worker: int) -> None:
        """The host's next line came: a blank line held back was the program's."""
        self._after_notice.discard(worker)
        if worker in self._held_blank:
            self._held_blank.discard(worker)
            self._inner.line(worker, "")

    def status(self, text: str) -> None:
        self._inner.status(text)

    def phase(self, update: PhaseUpdate) -> None:
        self._inner.phase(update)

    def detail(self, worker: int | None, text: str) -> None:
        self._inner.detail(worker, text)


@dataclass
class SliceWatch:
    """Polls the state of the run's slices on a thread while the hosts run; ``confirmed`` once
    ``confirm`` polls in a row saw one lost (a multislice runs only whole); ``maintenance_state`` once as
    many saw one in maintenance (REPAIRING: its hosts are down and may come back). Errors are counted,
    never taken for a preemption."""

    cloud: Any
    slices: SliceSet
    poll_s: float
    confirm: int
    on_poll: Callable[[], None] | None = None
    confirmed_state: str | None = None
    confirmed_at: float | None = None
    #: The slices the last lost state was read on (by name); all of them for their queued resource's.
    lost: tuple[str, ...] = ()
    errors: int = 0
    polls: int = 0
    #: The maintenance state ``confirm`` polls in a row read on a slice (None: none seen).
    maintenance_state: str | None = None
    _streak: int = 0
    _maintenance_streak: int = 0
    _maintenance_now: str | None = None
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    confirmed: threading.Event = field(default_factory=threading.Event)

    def state(self) -> str | None:
        """The slices' state now: the first lost one's (GONE when the API says it does not exist), else
        their queued resource's preemption state (it wins over its nodes'), else the first slice's that
        is not READY, else READY; None if the API could not be asked."""
        qr: str | None = None
        states: list[str] = []
        for given in self.slices.nodes:
            try:
                node = self.cloud.get_node(given.zone, given.name)
            except NotFoundError:
                self.lost = (given.name,)
                return GONE
            except Exception:
                self.errors += 1
                return None
            if is_lost(str(node.state)):
                self.lost = (given.name,)
                return str(node.state)
            if in_maintenance(str(node.state), node.health):
                self._maintenance_now = str(node.state)
            states.append(str(node.state))
            qr = qr or node.queued_resource or given.queued_resource
        if qr:
            try:
                queued = self.cloud.get_queued_resource(self.slices.zone, qr.rsplit("/", 1)[-1])
            except Exception:
                self.errors += 1
                return None
            if queued.state in PREEMPTED_QR_STATES:
                self.lost = tuple(self.slices.names)
                return f"QR_{queued.state}"
        return next((s for s in states if s != "READY"), "READY")

    def poll_once(self) -> bool:
        """One poll; True once confirmed."""
        self._maintenance_now = None
        state = self.state()
        self.polls += 1
        if state is None:
            return self.confirmed.is_set()  # a missed poll: no evidence either way
        if self._maintenance_now is not None:
            self._maintenance_streak += 1
            if self._maintenance_streak >= self.confirm and self.maintenance_state is None:
                self.maintenance_state = self._maintenance_now
        else:
            self._maintenance_streak = 0
        if is_lost(state):
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
        # A slice in maintenance is not lost: no use waiting for a loss that may never be confirmed.
        while not self.poll_once() and self.maintenance_state is None and time.monotonic() < deadline:
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


class StepBudget:
    """``BudgetGuard`` (tpuctl.services.budget) applied at step boundaries: rebuilt from the ledger when
    the run's slices change, asked at every reported step and every poll."""

    def __init__(
        self,
        session: Session,
        run_id: str,
        limit_usd: float | None,
        margin_s: float,
        warn: Callable[[str], None],
        *,
        assumed_usd_per_hour: float | None = None,
        deadline: tuple[float, float] | None = None,
    ) -> None:
        """``limit_usd``: ``--budget``; ``deadline``: (when the run must end, when it started), from
        ``--max-hours``."""
        self._session = session
        self._run_id = run_id
        self._limit = limit_usd
        self._deadline = deadline
        self._margin_s = margin_s
        self._warn = warn
        self._assumed = assumed_usd_per_hour
        self._unpriced_said: set[str] = set()
        self._guard: BudgetGuard | None = None
        self._lock = threading.Lock()
        self._step_s = 0.0
        self.warned = False
        self.decision: BudgetDecision | None = None
        #: What the run spent in the end, from the ledger (``final_error``); None until it ended.
        self.spent_usd: float | None = None
        self.stopped_at: float | None = None  # when the guard said stop

    def refresh(self) -> None:
        from tpuctl.services.budget import BudgetGuard

        guard = BudgetGuard.for_run(
            self._session.ledger,
            self._run_id,
            self._session.catalog,
            limit_usd=self._limit,
            margin_s=self._margin_s,
            assumed_usd_per_hour=self._assumed,
        )
        if self._deadline is not None:
            guard.cap_deadline(*self._deadline)
        if self._step_s:
            guard.observe_step(self._step_s)
        with self._lock:
            self._guard = guard
        unsaid = [name for name in guard.unpriced if name not in self._unpriced_said]
        if unsaid:
            # Placement under a budget takes priced slices only; one it still cannot price (a price
            # table changed under it) is said, never counted at 0 in silence.
            self._unpriced_said.update(unsaid)
            self._warn(
                f"the budget cannot count {', '.join(unsaid)}: no price is known for it, so its spend is "
                f"left out; stop the run yourself if need be (`tpuctl runs cancel {self._run_id}`)"
            )

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
            self.stopped_at = time.time()
            return decision
        return None

    def final_error(self, *, run_id: str) -> BudgetExceededError:
        """The error that ends the run once its slice is gone, with what it actually spent: the ledger's
        figure (billed to the slice's deletion, a program that ignored the stop included), not the
        figure at the moment the guard said stop."""
        assert self.decision is not None
        self.refresh()
        with self._lock:
            assert self._guard is not None
            spent = self._guard.spent()
        self.spent_usd = spent
        limit = self.decision.limit_usd
        if limit is None:  # --max-hours alone
            return BudgetExceededError(
                f"run {run_id} stopped at its time limit ({self.decision.message}); it spent {spent:.4f} USD",
                fix="raise --max-hours, or resume from the last checkpoint with `tpuctl runs resume`",
            )
        return BudgetExceededError(
            f"run {run_id} stopped at its budget: spent {spent:.4f} of {limit or 0:.4f} USD "
            f"({self.decision.spent_usd:.4f} when it was stopped: {self.decision.message})",
            fix="raise --budget (or --max-hours), or resume from the last checkpoint with a new budget",
        )


def classify(
    result: AttemptResult,
    stop_reason: Outcome | None,
    progress: Progress,
    watch: SliceWatch,
    policy: RecoveryPolicy,
) -> tuple[Outcome, str | None]:
    """The one outcome of an attempt, from every sign at hand; for a preemption, also what told first
    (runtime-notice | follower-notice | runtime-exit | api | hosts+api). ``stop_reason``: why the
    supervisor itself stopped the hosts, if it did. A program that finished inside a notice's grace
    SUCCEEDED (its preemption is on the record all the same: ``notice_source``). A host maintenance (a
    maintenance notice and no preemption notice, or hosts that died while the API showed the slice in
    maintenance) is MAINTENANCE, whatever the program did with it: the supervisor decides whether the
    slice comes back (``tpuctl.services.run.maintenance``)."""
    if result.interrupted:
        return Outcome.CANCELLED, None
    if stop_reason in (Outcome.CANCELLED, Outcome.BUDGET):
        return stop_reason, None
    if result.timed_out:
        return Outcome.TIMED_OUT, None
    if result.succeeded:
        return Outcome.SUCCEEDED, None
    if progress.notice is None and progress.maintenance is not None:
        return Outcome.MAINTENANCE, notice_source(progress)
    codes = result.exit_codes
    preempted_exit = any(c == PREEMPTED_EXIT_CODE for c in codes.values())
    if preempted_exit or progress.notice is not None or progress.preempted is not None:
        return Outcome.PREEMPTED, notice_source(progress) or "runtime-exit"
    if watch.confirmed.is_set():
        return Outcome.PREEMPTED, "api"
    # Hosts died: ask the API whether the slice went with them. A signal or a lost host is what a
    # preemption looks like from here, so wait for the API to catch up; a plain exit status gets the
    # confirming polls only.
    # The first host to fail tells; the others were stopped by the supervisor after it (a SIGKILL of
    # ours is no sign of a preemption).
    first = codes.get(result.failed_worker) if result.failed_worker is not None else None
    died = (
        first is None or first < 0
        if result.failed_worker is not None
        else any(c is None or c < 0 for c in codes.values())
    )
    if died and watch.maintenance_state is not None:
        return Outcome.MAINTENANCE, "api"
    timeout = (policy.confirm_timeout_s or 5.0) if died else (policy.poll_s or 1.0)
    if watch.confirm_now(timeout) is not None:
        return Outcome.PREEMPTED, "hosts+api"
    if died and watch.maintenance_state is not None:
        return Outcome.MAINTENANCE, "api"
    return Outcome.FAILED, None
