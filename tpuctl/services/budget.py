"""Budgets: a run's USD limit (``tpuctl run --budget``), a slice's time limit (``pod create --max-hours``),
and a profile's monthly budget (a warning on every create once exceeded).

``BudgetGuard`` is the decision, pure and clock-driven so it can be tested exactly: it knows the slices a
run is billed for (each with its USD/hour and when billing started and ended), what was spent before it
was built, and the steps it has seen; ``check()`` answers CONTINUE, WARN (once, when 80 % is reached) or
STOP (the next step would go over the limit or past the deadline). The caller acts on STOP: checkpoint
at the step boundary, delete the slice, end the run with ``BudgetExceededError`` (exit 7).

``RunBudgetWatch`` applies a guard to a running ``tpuctl run`` from outside the program: it polls the
ledger (the run's slices as the launcher records them) and, when the guard says STOP, calls the stop
callback it was given. Without step boundaries from the runtime it keeps a safety margin instead of one
step's cost (see the class).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from tpuctl import params
from tpuctl.catalog import AcceleratorType, CapacityType, Catalog, region_of_zone
from tpuctl.errors import BudgetExceededError, UsageError
from tpuctl.timefmt import iso

if TYPE_CHECKING:
    from tpuctl.services.prices import PriceSource
    from tpuctl.services.session import Session
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.records import PodRecord
    from tpuctl.store.url import DatabaseUrl

#: The label ``pod create --max-hours`` puts on a slice: its billed-time limit in whole seconds (label
#: values allow only lowercase letters, digits, - and _, so no decimal point).
LABEL_MAX_SECONDS: Final = "tpuctl-max-seconds"
WARN_FRACTION: Final = 0.8


class Action(StrEnum):
    CONTINUE = "continue"
    WARN = "warn"  # the 80 % mark was just passed (said once)
    STOP = "stop"  # the next step would go over: checkpoint, delete the slice, end the run


def parse_budget(value: str | float | None, *, field_name: str = "budget") -> float | None:
    """A budget in USD: a finite number > 0, or None when not given."""
    return None if value is None else params.usd(value, field_name)


def parse_hours(value: str | float | None, *, field_name: str) -> float | None:
    """Hours: a finite number > 0 (fractions allowed: 1.5 is 90 minutes), or None when not given."""
    return None if value is None else params.hours(value, field_name)


def max_hours_labels(max_hours: str | float | None) -> dict[str, str]:
    """The labels ``pod create --max-hours H`` adds (empty without the flag); validates H (exit 2)."""
    hours = parse_hours(max_hours, field_name="max_hours")
    if hours is None:
        return {}
    return {LABEL_MAX_SECONDS: str(max(1, round(hours * 3600)))}


def max_seconds_of(labels: Mapping[str, str]) -> float | None:
    raw = labels.get(LABEL_MAX_SECONDS)
    if raw is None or not raw.isdigit():
        return None
    return float(raw)


# --------------------------------------------------------------------------------------------------
# The guard


@dataclass(frozen=True)
class BudgetDecision:
    action: Action
    spent_usd: float
    projected_usd: float  # spent + the cost of the next step (and the margin) at the current rate
    limit_usd: float | None
    rate_usd_per_hour: float
    next_step_s: float
    deadline: float | None
    message: str

    @property
    def fraction(self) -> float | None:
        return None if not self.limit_usd else self.spent_usd / self.limit_usd

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "spent_usd": round(self.spent_usd, 6),
            "projected_usd": round(self.projected_usd, 6),
            "limit_usd": self.limit_usd,
            "fraction": None if self.fraction is None else round(self.fraction, 6),
            "rate_usd_per_hour": round(self.rate_usd_per_hour, 6),
            "next_step_s": round(self.next_step_s, 3),
            "deadline": self.deadline,
            "message": self.message,
        }

    def error(self, *, run_id: str | None = None) -> BudgetExceededError:
        what = f"run {run_id}" if run_id else "the run"
        return BudgetExceededError(
            f"{what} stopped at its budget: {self.message}",
            fix="raise --budget (or --max-hours), or resume from the last checkpoint with a new budget",
        )


@dataclass
class _Billed:
    usd_per_hour: float
    start: float
    end: float | None = None


@dataclass
class BudgetGuard:
    """Would the next step go over? Has 80 % been reached? For one run (or one slice's time limit).

    ``limit_usd``: the run's budget; ``deadline``: an epoch time not to run past (``--max-hours``);
    either may be None. ``spent_before_usd``: what earlier segments of the run cost (after a recovery
    the guard is rebuilt with it). ``margin_s``: time to keep in hand beyond the next step (stopping and
    deleting a slice takes a while, and the slice bills until it is gone).

    Spend is counted conservatively: a preemption within the first minute is still counted (GCP would not
    bill it), so a run never finds out later that it spent more than the guard thought.
    """

    limit_usd: float | None = None
    clock: Callable[[], float] = time.time
    spent_before_usd: float = 0.0
    deadline: float | None = None
    deadline_start: float | None = None  # when the time limit started counting (default: first slice)
    warn_fraction: float = WARN_FRACTION
    margin_s: float = 0.0
    #: USD/hour of one slice the run's ``--assume-price-per-hour`` gives, for a slice with no known price.
    assumed_usd_per_hour: float | None = None
    #: The billed slices it found no price for, so could not count (said to the user: never silent).
    unpriced: list[str] = field(default_factory=list)
    _slices: dict[str, _Billed] = field(default_factory=dict)
    _step_s: float | None = None
    _warned: bool = False
    _stopped: bool = False

    def __post_init__(self) -> None:
        if self.limit_usd is not None and not (math.isfinite(self.limit_usd) and self.limit_usd > 0):
            raise ValueError(f"limit_usd must be a positive number, got {self.limit_usd!r}")
        if not 0 < self.warn_fraction <= 1:
            raise ValueError(f"warn_fraction must be in (0, 1], got {self.warn_fraction!r}")

    # --- what is billed -------------------------------------------------------------------------------

    def slice_started(self, key: str, usd_per_hour: float, at: float | None = None) -> None:
        """Billing of ``key`` (a slice) starts at ``at`` (its READY) at ``usd_per_hour`` for the slice."""
        self._slices[key] = _Billed(float(usd_per_hour), self.clock() if at is None else float(at))

    def slice_ended(self, key: str, at: float | None = None) -> None:
        billed = self._slices.get(key)
        if billed is not None and billed.end is None:
            billed.end = self.clock() if at is None else float(at)

    def observe_step(self, duration_s: float) -> None:
        """A step took ``duration_s``; the next is assumed to take as long as the longest seen so far
        (a cautious guess: a checkpointing step is slower than the rest)."""
        if duration_s >= 0 and math.isfinite(duration_s):
            self._step_s = duration_s if self._step_s is None else max(self._step_s, duration_s)

    def spent(self, now: float | None = None) -> float:
        at = self.clock() if now is None else now
        total = self.spent_before_usd
        for billed in self._slices.values():
            end = at if billed.end is None else min(billed.end, at)
            if end > billed.start:
                total += billed.usd_per_hour * (end - billed.start) / 3600.0
        return total

    def rate(self, now: float | None = None) -> float:
        """USD/hour of the slices billing at ``now``."""
        at = self.clock() if now is None else now
        return sum(
            b.usd_per_hour for b in self._slices.values() if b.start <= at and (b.end is None or b.end > at)
        )

    def cap_deadline(self, deadline: float, start: float) -> None:
        """A time limit of the run's own (``run --max-hours``): the earlier of it and the slices' wins."""
        if self.deadline is None or deadline < self.deadline:
            self.deadline, self.deadline_start = deadline, start

    # --- the decision ---------------------------------------------------------------------------------

    def check(self, now: float | None = None, *, next_step_s: float | None = None) -> BudgetDecision:
        at = self.clock() if now is None else now
        step = next_step_s if next_step_s is not None else (self._step_s or 0.0)
        ahead = step + self.margin_s
        spent = self.spent(at)
        rate = self.rate(at)
        projected = spent + rate * ahead / 3600.0
        limit = self.limit_usd
        if self._stopped:
            return self._decision(Action.STOP, spent, projected, rate, step, "already stopped")
        if limit is not None and projected > limit + 1e-12:
            self._stopped = True
            return self._decision(
                Action.STOP,
                spent,
                projected,
                rate,
                step,
                f"spent {_usd(spent)} of {_usd(limit)} USD; the next step ({step:.1f} s + "
                f"{self.margin_s:.0f} s "
                f"to stop) at {rate:.2f} USD/h would bring it to {_usd(projected)} USD",
            )
        if self.deadline is not None and at + ahead > self.deadline:
            self._stopped = True
            return self._decision(
                Action.STOP,
                spent,
                projected,
                rate,
                step,
                f"the slice's time limit ends at {_iso(self.deadline)}; the next step would run past it",
            )
        if not self._warned and self._over_warn_mark(spent, at):
            self._warned = True
            return self._decision(Action.WARN, spent, projected, rate, step, self._warn_text(spent, at))
        return self._decision(Action.CONTINUE, spent, projected, rate, step, "within budget")

    def _over_warn_mark(self, spent: float, at: float) -> bool:
        if self.limit_usd is not None and spent >= self.warn_fraction * self.limit_usd:
            return True
        start = self.deadline_start
        if start is None:
            start = min((b.start for b in self._slices.values()), default=None)
        if self.deadline is not None and start is not None and self.deadline > start:
            return (at - start) >= self.warn_fraction * (self.deadline - start)
        return False

    def _warn_text(self, spent: float, at: float) -> str:
        pct = round(self.warn_fraction * 100)
        if self.limit_usd is not None and spent >= self.warn_fraction * self.limit_usd:
            return f"{pct}% of the budget reached: spent {_usd(spent)} of {_usd(self.limit_usd)} USD"
        return f"{pct}% of the slice's time limit reached (it ends at {_iso(self.deadline)})"

    def _decision(
        self, action: Action, spent: float, projected: float, rate: float, step: float, message: str
    ) -> BudgetDecision:
        return BudgetDecision(
            action=action,
            spent_usd=spent,
            projected_usd=projected,
            limit_usd=self.limit_usd,
            rate_usd_per_hour=rate,
            next_step_s=step,
            deadline=self.deadline,
            message=message,
        )

    # --- from the ledger ------------------------------------------------------------------------------

    @classmethod
    def for_run(
        cls,
        ledger: Ledger,
        run_id: str,
        catalog: Catalog,
        *,
        limit_usd: float | None,
        clock: Callable[[], float] = time.time,
        margin_s: float = 0.0,
        warn_fraction: float = WARN_FRACTION,
        assumed_usd_per_hour: float | None = None,
    ) -> BudgetGuard:
        """A guard for ``run_id`` from what the ledger knows: every slice created for the run (billed from
        READY), and slices it ran on that it did not create (billed from the run's first segment on them);
        the deadline is the earliest ``--max-hours`` limit among them. ``assumed_usd_per_hour``: the rate
        of a slice with no known price (``--assume-price-per-hour``)."""
        guard = cls(
            limit_usd=limit_usd,
            clock=clock,
            margin_s=margin_s,
            warn_fraction=warn_fraction,
            assumed_usd_per_hour=assumed_usd_per_hour,
        )
        own = ledger.list_pods(run_id=run_id)
        seen = {(p.zone, p.name, p.incarnation) for p in own}
        for pod in own:
            guard._add_pod(pod, catalog, start=pod.ready_at)
        # Slices the run did not create: billed to it from its first segment on them to its last one's end
        # (still open: until now).
        spans: dict[tuple[str, str], tuple[float, float | None]] = {}
        for seg in ledger.segments(run_id):
            if seg.pod is None or seg.zone is None:
                continue
            key = (seg.zone, seg.pod)
            first, last = spans.get(key, (seg.start, seg.end))
            open_end = last is None or seg.end is None
            spans[key] = (min(first, seg.start), None if open_end else max(last or 0.0, seg.end or 0.0))
        for (zone, name), (first, last) in spans.items():
            for used in _slices_named(ledger, name, zone):
                if (used.zone, used.name, used.incarnation) in seen:
                    continue
                begin = max(first, used.ready_at) if used.ready_at is not None else None
                guard._add_pod(used, catalog, start=begin, end=last)
        return guard

    def _add_pod(
        self, pod: PodRecord, catalog: Catalog, *, start: float | None, end: float | None = None
    ) -> None:
        if start is None:
            return  # never READY: nothing billed yet
        rate = usd_per_hour_of(pod, catalog, assumed_usd_per_hour=self.assumed_usd_per_hour)
        if rate is not None:
            key = f"{pod.zone}/{pod.name}#{pod.incarnation}"
            self._slices[key] = _Billed(rate, start, _earliest(pod.ended_at, end))
        else:
            self.unpriced.append(f"{pod.name} ({pod.accelerator_type}, {pod.zone})")
        limit_s = max_seconds_of(pod.labels)
        if limit_s is not None and pod.ended_at is None:
            counted_from = pod.ready_at or start
            deadline = counted_from + limit_s
            if self.deadline is None or deadline < self.deadline:
                self.deadline, self.deadline_start = deadline, counted_from


def usd_per_hour_of(
    pod: PodRecord, catalog: Catalog, *, assumed_usd_per_hour: float | None = None
) -> float | None:
    """The slice's rate: chips x the price the ledger recorded (placement's, for the slice's own kind of
    capacity); else ``assumed_usd_per_hour`` (the run's ``--assume-price-per-hour``, for a slice placed
    without a price: flex-start's is not the catalog's spot price); else the catalog's list price."""
    if pod.chips is not None and pod.price_per_chip_hour is not None:
        return pod.price_per_chip_hour * pod.chips
    if assumed_usd_per_hour is not None:
        return assumed_usd_per_hour
    if pod.chips is None or not pod.accelerator_type or pod.capacity is None:
        return None
    try:
        accel = catalog.resolve(pod.accelerator_type)
    except UsageError:
        return None
    per_chip = catalog.price_per_chip_hour(accel, pod.zone, pod.capacity)
    return None if per_chip is None else per_chip * pod.chips


def refuse_unpriced_budget(
    catalog: Catalog,
    accel: AcceleratorType,
    places: Sequence[tuple[str, CapacityType]],
    *,
    flex_start: bool,
    budget_usd: float | None,
    assumed_usd_per_hour: float | None,
) -> None:
    """Exit 2, before anything is made, when ``--budget`` could not count what the run spends: no zone
    and capacity the run may be placed on (``places``) has a price, and no ``--assume-price-per-hour``
    says what to count instead; or an assumed price without a budget to use it. Where only some places
    are priced the run goes to those (placement's ``priced_only``)."""
    if budget_usd is None:
        if assumed_usd_per_hour is not None:
            raise UsageError(
                "--assume-price-per-hour is the price --budget counts a slice at; there is no --budget",
                field="assume_price_per_hour",
                value=assumed_usd_per_hour,
                fix="add --budget USD, or drop --assume-price-per-hour",
            )
        return
    if assumed_usd_per_hour is not None or not places:
        return
    if any(catalog.price_per_chip_hour(accel, z, c, flex_start=flex_start) is not None for z, c in places):
        return
    kind = "flex-start" if flex_start else "/".join(sorted({c.value for _, c in places}))
    regions = ", ".join(sorted({region_of_zone(z) for z, _ in places}))
    upper = next(
        (
            (p, z)
            for z, _ in places
            if (p := catalog.price_per_hour(accel, z, CapacityType.ON_DEMAND)) is not None
        ),
        None,
    )
    # Spot and flex-start cost less than on-demand (docs/google-facts.md#prices-for-budgets): where the
    # on-demand price is known it is an upper bound, which makes the budget stop early, never late.
    hint = f" (the on-demand price, {upper[0]:.2f} USD/h in {upper[1]}, is an upper bound)" if upper else ""
    raise UsageError(
        f"--budget {budget_usd:g} USD cannot be enforced: tpuctl has no price for {accel.friendly_name} "
        f"{kind} in {regions} (prices: {catalog.prices.source}), so it could not tell when the budget is "
        "spent",
        field="budget",
        value=budget_usd,
        fix="give the price of one slice per hour for the budget to count: --assume-price-per-hour "
        f"USD{hint}; or choose a capacity and zone tpuctl has a price for (`tpuctl cost estimate "
        f"{accel.friendly_name}`), or refresh prices with `tpuctl catalog prices --refresh`",
    )


def _usd(value: float) -> str:
    # Cents hide what a small budget is doing: show four decimals below one dollar.
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.4f}"


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return iso(ts)


# --------------------------------------------------------------------------------------------------
# Watching a run from outside the program


class RunBudgetWatch:
    """Polls a run's spend on a background thread and calls ``stop()`` once the guard says STOP.

    Until the runtime reports step boundaries, the "next step" is the time the watch needs to react:
    one poll interval plus ``stop_margin_s`` (stopping the hosts and deleting the slice, which bills until
    it is gone). So the run stops with at least that much of the budget in hand. ``warn(text)`` is called
    once at 80 %. After the run, ``tripped`` says whether the budget stopped it and ``decision`` why.
    """

    def __init__(
        self,
        ledger: Ledger,
        run_id: str,
        catalog: Catalog,
        *,
        limit_usd: float,
        stop: Callable[[], bool],
        warn: Callable[[str], None] = lambda text: None,
        poll_s: float = 1.0,
        stop_margin_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ledger = ledger
        self._run_id = run_id
        self._catalog = catalog
        self._limit = limit_usd
        self._stop = stop
        self._warn = warn
        self._poll_s = poll_s
        self._margin_s = poll_s + stop_margin_s
        self._clock = clock
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self._stop_sent = False
        self.tripped = False
        self.decision: BudgetDecision | None = None
        self.error: BaseException | None = None

    def check_once(self) -> BudgetDecision:
        """One poll: rebuild the guard from the ledger, decide, act. Returns the decision."""
        guard = BudgetGuard.for_run(
            self._ledger,
            self._run_id,
            self._catalog,
            limit_usd=self._limit,
            clock=self._clock,
            margin_s=self._margin_s,
        )
        guard._warned = self._warned  # the 80 % warning is said once per run, not once per poll
        decision = guard.check()
        if decision.action is Action.WARN:
            self._warned = True
            self._warn(decision.message)
        elif decision.action is Action.STOP:
            self.tripped = True
            self.decision = decision
            # The stop callback says whether it could act (no hosts yet while the slice is created);
            # it is tried again on every poll until it can.
            if not self._stop_sent:
                self._stop_sent = bool(self._stop())
        return decision

    def _loop(self) -> None:
        while not self._halt.wait(self._poll_s):
            try:
                self.check_once()
            except Exception as exc:  # a watch must never kill the run it guards
                self.error = exc
            if self._stop_sent:
                return

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tpuctl-budget", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None


@contextmanager
def watch_run_budget(
    ledger: Ledger,
    run_id: str,
    catalog: Catalog,
    *,
    limit_usd: float | None,
    stop: Callable[[], bool],
    warn: Callable[[str], None],
    poll_s: float = 1.0,
    stop_margin_s: float = 60.0,
    clock: Callable[[], float] = time.time,
    poll_thread: bool = True,
) -> Iterator[RunBudgetWatch | None]:
    """``with watch_run_budget(...)`` around a run: nothing without a limit; with one, a running watch,
    and when the budget stopped the run, whatever the run raised becomes ``BudgetExceededError`` (exit 7)
    and the run is marked ``budget_exceeded`` in the ledger. ``poll_thread=False``: no thread, the caller
    calls ``check_once()`` itself (a supervisor does, at each step boundary)."""
    if limit_usd is None:
        yield None
        return
    from tpuctl.store.records import RunStatus

    watch = RunBudgetWatch(
        ledger, run_id, catalog, limit_usd=limit_usd, stop=stop, warn=warn, poll_s=poll_s,
        stop_margin_s=stop_margin_s, clock=clock,
    )  # fmt: skip
    if poll_thread:
        watch.start()
    try:
        yield watch
    except BaseException as exc:
        watch.close()
        if not watch.tripped or watch.decision is None:
            raise
        record = ledger.get_run(run_id)
        if record is not None:
            detail = dict(record.detail or {})
            detail["budget"] = watch.decision.to_dict()
            ledger.update_run(run_id, status=RunStatus.BUDGET_EXCEEDED, detail=detail)
        raise watch.decision.error(run_id=run_id) from exc
    finally:
        watch.close()


# --------------------------------------------------------------------------------------------------
# The monthly budget


def month_start(now: float) -> float:
    day = datetime.fromtimestamp(now, UTC)
    return datetime(day.year, day.month, 1, tzinfo=UTC).timestamp()


def monthly_budget_warning(
    database: DatabaseUrl,
    catalog: Catalog,
    prices: PriceSource,
    *,
    monthly_budget: float | None,
    now: float | None = None,
) -> str | None:
    """The warning every create prints once this calendar month's (UTC) spend exceeds the profile's
    ``monthly_budget``; None while under it, or without one."""
    if monthly_budget is None or (database.path is not None and not database.path.exists()):
        return None
    from tpuctl.services.cost import CostService

    at = time.time() if now is None else now
    start = month_start(at)
    spent = CostService(database, catalog, prices, clock=lambda: at).spend(since=start, until=at)
    if spent <= monthly_budget:
        return None
    month = datetime.fromtimestamp(start, UTC).strftime("%Y-%m")
    return (
        f"this month's TPU spend ({month}, UTC) is {spent:.2f} USD, over the profile's monthly_budget of "
        f"{monthly_budget:.2f} USD; see `tpuctl cost report --since month`"
    )


def expired_slices(ledger: Ledger, *, now: float) -> list[str]:
    """Warnings for live slices past their ``--max-hours`` limit (a run on them stops at the limit; an
    idle slice has nobody to stop it, so the report says so)."""
    out: list[str] = []
    for pod in ledger.list_pods(alive=True):
        limit_s = max_seconds_of(pod.labels)
        if limit_s is None or pod.ready_at is None or pod.ready_at + limit_s > now:
            continue
        out.append(
            f"slice {pod.name} ({pod.zone}) passed its --max-hours limit ({limit_s / 3600:g} h) at "
            f"{_iso(pod.ready_at + limit_s)} and is still billing; delete it: tpuctl pod delete {pod.name}"
        )
    return out


# --------------------------------------------------------------------------------------------------
# Hooks for the CLI commands that create slices and run programs (kept here so their edits stay small)


def warn_monthly_budget(session: Session, warn: Callable[[str], None], *, now: float | None = None) -> None:
    """Say ``monthly_budget_warning`` (if any) through ``warn``: every create calls this."""
    from tpuctl.services.prices import PriceSource

    prices = session.catalog.prices
    text = monthly_budget_warning(
        session.ledger.url,
        session.catalog,
        PriceSource(prices.source, prices.date, cached=False),
        monthly_budget=session.settings.monthly_budget,
        now=now,
    )
    if text is not None:
        warn(text)


def _interrupt_main() -> bool:
    # The run is stopped the way Ctrl-C stops it: the launcher's own, tested path stops every host
    # (SIGTERM, SIGKILL after --grace), deletes a slice it created, and records the run.
    import _thread

    _thread.interrupt_main()
    return True


def run_budget(
    session: Session,
    run_id: str,
    limit_usd: float | None,
    *,
    grace_s: float,
    creates_slice: bool,
    warn: Callable[[str], None],
) -> AbstractContextManager[RunBudgetWatch | None]:
    """What ``tpuctl run`` wraps the run in: the monthly-budget warning when it creates a slice, and with
    ``--budget`` a watch that stops the run before it spends the limit (exit 7, run status
    ``budget_exceeded``). Without a budget it is a no-op context."""
    if creates_slice:
        warn_monthly_budget(session, warn)
    tuning = session.backend.tuning
    return watch_run_budget(
        session.ledger,
        run_id,
        session.catalog,
        limit_usd=limit_usd,
        stop=_interrupt_main,
        warn=warn,
        poll_s=tuning.budget_poll_s,
        # Stopping the hosts takes up to --grace, then deleting the slice its time: it bills until gone.
        stop_margin_s=grace_s + tuning.delete_margin_s,
    )


def _slices_named(ledger: Ledger, name: str, zone: str) -> list[PodRecord]:
    """The pod a run's segment names, or every slice of the multislice it names (a ``--pod`` set made by
    ``pod create --slices N``: its nodes are ``name-0 .. name-(N-1)``)."""
    used = ledger.get_pod(name, zone=zone)
    if used is not None:
        return [used]
    from tpuctl.services.run.sliceset import multislice_prefix

    latest: dict[str, PodRecord] = {}
    for pod in ledger.list_pods(zone=zone):
        if multislice_prefix(pod.name) == name:
            latest[pod.name] = pod  # oldest first: the last incarnation wins, as get_pod's
    return list(latest.values())
