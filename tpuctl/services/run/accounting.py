"""What a supervised run accounts for: its preemptions (detection latency, recovery time) and its steps
(done, recomputed, productive time), read from the runtime's event lines and summed into the run's
``recovery`` record."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpuctl.runtime.preemption import PREEMPTED_EXIT_CODE, ends_the_vm
from tpuctl.store.records import PreemptionKind
from tpuctl.words import counted

if TYPE_CHECKING:
    from tpuctl.services.run.model import AttemptResult
    from tpuctl.services.run.sliceset import SliceSet


@dataclass
class PreemptionRecord:
    """One preemption, from the first sign of it to training running again."""

    number: int
    kind: PreemptionKind  # what the program did with it (``preemption_kind``)
    #: What told the supervisor first: runtime-notice (the program's runtime) | follower-notice (tpuctl's
    #: follower on the host, for any program) | runtime-exit (exit 75) | api | hosts+api; for a maintenance
    #: Google does not come back from, follower-maintenance | runtime-maintenance.
    source: str
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
    setup_s: float | None = None  # the new slice's hosts set up (venv, runtime, --setup)
    hosts_started_at: float | None = None
    resumed_at: float | None = None  # first step done on the new slice
    restored_step: int | None = None
    steps_recomputed: int | None = None
    #: A multislice: the slices that were lost (by name), and every slice deleted and placed again (the
    #: whole set: a queued resource is re-placed whole). Empty for one slice.
    lost_slices: list[str] = field(default_factory=list)
    replaced_slices: list[str] = field(default_factory=list)

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
            overhead = (
                self.recovery_s
                - (self.provisioning_s or 0.0)
                - (self.setup_s or 0.0)
                - (self.startup_s or 0.0)
            )
        data["recovery_overhead_s"] = _round(overhead)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreemptionRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        fields["kind"] = PreemptionKind(fields.get("kind") or PreemptionKind.HARD)
        return cls(**fields)


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
    saved_step: int | None = None  # the last checkpoint a host reported saved ("preempted" event)
    #: Restarts that restored less than the checkpoint reported saved before them: {saved, restored, at}.
    lost_restores: list[dict[str, Any]] = field(default_factory=list)
    # This attempt:
    first_step: int | None = None
    restored: int | None = None
    attempt_last: int | None = None
    attempt_recomputed: int = 0
    first_step_at: float | None = None
    notice: dict[str, Any] | None = None
    #: The first maintenance notice that ends the VM (``maintenance`` event, TERMINATE_ON_HOST_MAINTENANCE).
    maintenance: dict[str, Any] | None = None
    preempted: dict[str, Any] | None = None
    done: bool = False

    def new_attempt(self) -> None:
        self.first_step = self.restored = self.attempt_last = self.first_step_at = None
        self.attempt_recomputed = 0
        self.notice = self.maintenance = self.preempted = None
        self.done = False

    def on_event(self, event: Mapping[str, Any], at: float) -> None:
        kind = event.get("event")
        if kind == "start":
            step = int_or_none(event.get("step"))
            self.first_step = step
            self.restored = int_or_none(event.get("restored"))
            if self.saved_step is not None and (self.restored or 0) < self.saved_step:
                self.lost_restores.append({"saved": self.saved_step, "restored": self.restored, "at": at})
            if step is not None and self.last_step is not None and step < self.last_step:
                # Steps done before the preemption that the checkpoint did not keep: done again now.
                self.attempt_recomputed = self.last_step - step
                self.recomputed += self.attempt_recomputed
            if step and (self.last_step is None or step > self.last_step):
                # It restored further than any step seen: the steps a killed supervisor never heard of
                # (a `runs resume` takeover) were done all the same.
                self.last_step = step
            skipped = event.get("skipped") or []
            if skipped:
                self.fallbacks.append(
                    {"at": at, "restored": self.restored, "skipped": list(skipped), "attempt_start": step}
                )
        elif kind == "step":
            step = int_or_none(event.get("step"))
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
        elif kind == "maintenance":
            if self.maintenance is None and ends_the_vm(str(event.get("value") or "")):
                self.maintenance = dict(event)
        elif kind == "preempted":
            self.preempted = dict(event)
            saved = int_or_none(event.get("step")) if event.get("checkpoint") == "saved" else None
            if saved is not None:
                self.saved_step = max(saved, self.saved_step or 0)
        elif kind == "done":
            self.done = True

    @property
    def reports_steps(self) -> bool:
        """Whether the program reports steps at all (step events); if not, recomputed work is unknown,
        not zero."""
        return self.last_step is not None

    @property
    def attempt_recomputed_known(self) -> int | None:
        """This attempt's recomputed steps; None (unknown) for a program that reports no steps."""
        return self.attempt_recomputed if self.reports_steps else None

    def checkpoint_note(self, checkpoint_step: int | None, checkpoint_every: int | None) -> str:
        """What a preempted attempt leaves to resume from, saying only what is known to exist."""
        if checkpoint_step is not None:
            return f"checkpoint at step {checkpoint_step}"
        fallback = "no checkpoint on the way out; the newest periodic one"
        if self.restored is not None:
            return f"{fallback} (step {self.restored} or later) will do"
        if checkpoint_every is not None and (self.last_step or 0) >= checkpoint_every:
            return f"{fallback} (every {counted(checkpoint_every, 'step')}) will do"
        return "no checkpoint on the way out, and none known: the program starts over"

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


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def recovery_summary(
    progress: Progress,
    preemptions: list[PreemptionRecord],
    restarts: int,
    *,
    final_step: int | None,
    end: float | None,
    wall_start: float | None,
    maintenance: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The run's ``recovery`` record; ``maintenance``: the host maintenances it lived through on its slice
    (``tpuctl.services.run.maintenance.MaintenanceRecord``), none of them a preemption."""
    productive = progress.productive_s(final_step)
    wall = None if end is None or wall_start is None else max(0.0, end - wall_start)
    return {
        "preemptions": [p.to_dict() for p in preemptions],
        "preemption_count": len(preemptions),
        "maintenance": [dict(m) for m in maintenance],
        "restarts": restarts,
        # Unknown (None), not 0, for a program that reports no steps (no step events).
        "steps_reported": progress.reports_steps,
        "steps_completed": final_step,
        "steps_recomputed": progress.recomputed if progress.reports_steps else None,
        "checkpoint_fallbacks": progress.fallbacks,
        "productive_step_s": round(productive, 4) if progress.step_dt else None,
        "computed_step_s": round(progress.computed_s, 4),
        "wall_s": _round(wall),
        # Unknown (None) for a program that reports no steps: there is nothing to call productive.
        "goodput": None if not wall or not progress.step_dt else round(productive / wall, 4),
    }


def preemption_record(
    number: int,
    slices: SliceSet,
    source: str,
    result: AttemptResult,
    progress: Progress,
    *,
    detected_at: float,
    lost: Sequence[str] = (),
) -> PreemptionRecord:
    """The record of the preemption that ended an attempt on ``slices`` (``lost``: which of a
    multislice's were lost): occurred at the earliest evidence (the host's notice time, else the first
    host's death), of the kind ``preemption_kind`` says."""
    notice, preempted = progress.notice or progress.maintenance, progress.preempted
    occurred: float | None = None
    if notice is not None and isinstance(notice.get("t"), (int, float)):
        occurred = float(notice["t"])
    elif result.exit_times:
        occurred = min(result.exit_times.values())
    saved = preempted is not None and preempted.get("checkpoint") == "saved"
    checkpoint_step = int_or_none(preempted.get("step")) if saved and preempted is not None else None
    return PreemptionRecord(
        number=number,
        kind=preemption_kind(result, progress),
        source=source,
        pod=slices.name,
        zone=slices.zone,
        capacity=slices.capacity.value,
        occurred_at=occurred,
        detected_at=detected_at,
        checkpoint_step=checkpoint_step,
        last_step=progress.attempt_last,
        lost_slices=list(lost) if slices.is_multislice else [],
        replaced_slices=slices.names if slices.is_multislice else [],
    )


def preemption_kind(result: AttemptResult, progress: Progress) -> PreemptionKind:
    """What the program did with a preemption, from how its attempt ended:

    - ``notice``: it stopped on the notice (it said it saved a checkpoint, or exited 75, or ended by
      itself inside the grace, the SIGTERM's default death included);
    - ``notice_finished``: a host saw the notice and every host then exited 0;
    - ``notice_ignored``: a host saw the notice, and the program was still running when the grace ended
      (the first host to go was killed with SIGKILL, or lost with its VM);
    - ``maintenance``: no preemption notice, but a host was told of its maintenance (a VM Google does not
      bring back, lost as to a preemption);
    - ``hard``: no host saw a notice.
    """
    if progress.notice is None and progress.maintenance is not None:
        return PreemptionKind.MAINTENANCE
    preempted = progress.preempted
    saved = preempted is not None and preempted.get("checkpoint") == "saved"
    if saved or PREEMPTED_EXIT_CODE in result.exit_codes.values():
        return PreemptionKind.NOTICE
    if progress.notice is None:
        return PreemptionKind.HARD
    if result.succeeded:
        return PreemptionKind.NOTICE_FINISHED
    killed = result.failed_worker is not None and result.returncode in (None, -signal.SIGKILL)
    return PreemptionKind.NOTICE_IGNORED if killed else PreemptionKind.NOTICE


def notice_source(progress: Progress) -> str | None:
    """Who reported this attempt's notice first (``PreemptionRecord.source``), None without one: a
    preemption notice, else a maintenance notice."""
    if progress.notice is not None:
        return "follower-notice" if progress.notice.get("reporter") == "follower" else "runtime-notice"
    if progress.maintenance is not None:
        return (
            "follower-maintenance"
            if progress.maintenance.get("reporter") == "follower"
            else "runtime-maintenance"
        )
    return None
