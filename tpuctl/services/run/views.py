"""What the ``Runs`` service answers (``service``): frozen values the CLI renders as tables, each with the
JSON form ``-o json`` prints (``to_dict``, whose keys are the command's documented output).

The run's record in the ledger keeps a free-form ``detail`` and a ``recovery`` record that the supervisor
writes; they are read here into typed fields for people, and passed through as stored for ``-o json``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.store.queue import WAITED_FOR
from tpuctl.store.records import LOCAL_WORKSPACE, UNKNOWN_PRINCIPAL, PriorityBand
from tpuctl.timefmt import iso_or_none

if TYPE_CHECKING:
    from tpuctl.services.run.model import PreparedRun, RecoveryPolicy
    from tpuctl.store.records import LeaseHistoryRecord, RunRecord
    from tpuctl.store.records import LeaseHolder as Lease


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    # A whole number stays one: it is shown as recorded (``1``, not ``1.0``).
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _strs(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


@dataclass(frozen=True)
class RunView:
    """One run as ``runs list`` shows it (and ``runs describe`` starts with)."""

    run_id: str
    status: str
    program: str
    args: tuple[str, ...]
    pod: str | None
    zone: str | None
    accelerator_type: str | None
    capacity: str | None
    exit_code: int | None
    created_at: str | None
    ended_at: str | None
    duration_s: float | None  # None while it runs, and for a run that never started
    restarts: int
    preemptions: int
    labels: Mapping[str, str]
    #: What the run's detail says of it, for people (None: not recorded).
    hosts: int | None
    executor: str | None
    checkpoint_dir: str | None
    log_dir: str | None
    error: str | None
    #: The ledger's free-form detail of the run, as stored (``-o json`` passes it through).
    detail: Mapping[str, Any]
    #: Whose share it uses and who submitted it (a run from before workspaces: the local workspace and
    #: ``UNKNOWN_PRINCIPAL``).
    workspace: str = LOCAL_WORKSPACE
    principal: str = UNKNOWN_PRINCIPAL

    @classmethod
    def of(cls, record: RunRecord) -> RunView:
        detail = dict(record.detail or {})
        return cls(
            run_id=record.run_id,
            status=str(record.status),
            program=record.script,
            args=tuple(record.args),
            pod=record.pod,
            zone=record.zone,
            accelerator_type=record.accelerator_type,
            capacity=None if record.capacity is None else record.capacity.value,
            exit_code=record.exit_code,
            created_at=iso_or_none(record.created_at),
            ended_at=iso_or_none(record.ended_at),
            duration_s=None
            if record.ended_at is None or detail.get("never_started")
            else round(record.ended_at - record.created_at, 3),
            restarts=record.restarts,
            preemptions=record.preemptions,
            labels=dict(record.labels or {}),
            hosts=_int(detail.get("hosts")),
            executor=_str(detail.get("executor")),
            checkpoint_dir=_str(detail.get("checkpoint_dir")),
            log_dir=_str(detail.get("log_dir")),
            error=_str(detail.get("error")),
            detail=detail,
            workspace=record.workspace or LOCAL_WORKSPACE,
            principal=record.principal or UNKNOWN_PRINCIPAL,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "program": self.program,
            "args": list(self.args),
            "pod": self.pod,
            "zone": self.zone,
            "accelerator_type": self.accelerator_type,
            "capacity": self.capacity,
            "exit_code": self.exit_code,
            "created_at": self.created_at,
            "ended_at": self.ended_at,
            "duration_s": self.duration_s,
            "restarts": self.restarts,
            "preemptions": self.preemptions,
            "workspace": self.workspace,
            "principal": self.principal,
            "labels": dict(self.labels),
            "detail": dict(self.detail),
        }


@dataclass(frozen=True)
class LeaseHolder:
    """Who supervises a run now: the owner of its live ledger lease (None fields: not recorded)."""

    pid: int | None
    host: str | None
    start_ticks: int | None  # the process's start time in clock ticks: tells a reused pid apart
    since: float | None  # when it took the lease (epoch seconds)
    owner_id: str | None = None  # the supervisor process's random id
    generation: int | None = None  # the lease's: one more with every claim
    expires_at: float | None = None  # by the ledger's clock, unless renewed
    expires_in_s: float | None = None  # from the read, by the ledger's clock

    @classmethod
    def of(cls, identity: Mapping[str, Any]) -> LeaseHolder:
        return cls(
            pid=_int(identity.get("pid")),
            host=_str(identity.get("host")),
            start_ticks=_int(identity.get("start_ticks")),
            since=_float(identity.get("since")),
        )

    @classmethod
    def of_lease(cls, lease: Lease) -> LeaseHolder:
        """The holder of a lease as the ledger records it."""
        owner = lease.owner
        return cls(
            pid=owner.pid,
            host=owner.host,
            start_ticks=owner.start_ticks,
            since=lease.claimed_at,
            owner_id=owner.owner_id,
            generation=lease.generation,
            expires_at=lease.expires_at,
            expires_in_s=round(lease.expires_in_s, 3),
        )

    def to_dict(self) -> dict[str, Any]:
        """The identity, and the lease when it is the ledger's (a field not recorded is left out)."""
        data = {
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "host": self.host,
            "since": self.since,
            "owner_id": self.owner_id,
            "generation": self.generation,
            "expires_at": iso_or_none(self.expires_at),
            "expires_in_s": self.expires_in_s,
        }
        return {k: v for k, v in data.items() if v is not None}


@dataclass(frozen=True)
class SegmentView:
    """One segment of a run (provisioning, running, checkpointing, preempted, recovering)."""

    kind: str
    start: str | None
    end: str | None
    duration_s: float  # up to now while it is open
    open: bool
    pod: str | None
    zone: str | None
    capacity: str | None
    steps_completed: int | None
    steps_recomputed: int | None
    detail: Mapping[str, Any]  # the segment's free-form detail, times in ISO

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "start": self.start,
            "end": self.end,
            "duration_s": self.duration_s,
            "open": self.open,
            "pod": self.pod,
            "zone": self.zone,
            "capacity": self.capacity,
            "steps_completed": self.steps_completed,
            "steps_recomputed": self.steps_recomputed,
            "detail": dict(self.detail),
        }


@dataclass(frozen=True)
class TimelineBar:
    """A segment placed on the run's timeline: ``offset`` and ``width`` in columns."""

    kind: str
    offset: int
    width: int
    duration_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "offset": self.offset, "width": self.width, "duration_s": self.duration_s}


@dataclass(frozen=True)
class HostExit:
    """How one host ended in the run's last attempt."""

    worker: int
    exit_code: int | None
    how: str  # the status in words ("was killed by SIGKILL")
    failed: bool  # the host that failed first

    def to_dict(self) -> dict[str, Any]:
        return {"worker": self.worker, "exit_code": self.exit_code, "how": self.how, "failed": self.failed}


@dataclass(frozen=True)
class StepSeries:
    """Host 0's step times and losses, averaged down for a sparkline (empty: no steps reported)."""

    step_time_s: tuple[float, ...]
    loss: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s": list(self.step_time_s), "loss": list(self.loss)}


@dataclass(frozen=True)
class PreemptionView:
    """One preemption as the run's recovery record has it (``accounting.PreemptionRecord``)."""

    number: int | None
    kind: str | None
    pod: str | None
    zone: str | None
    checkpoint_step: int | None
    detection_latency_s: float | None
    recovery_s: float | None
    new_pod: str | None
    new_zone: str | None
    steps_recomputed: int | None
    lost_slices: tuple[str, ...]  # a multislice: the slices lost
    replaced_slices: tuple[str, ...]  # ... and the whole set placed again

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> PreemptionView:
        return cls(
            number=_int(data.get("number")),
            kind=_str(data.get("kind")),
            pod=_str(data.get("pod")),
            zone=_str(data.get("zone")),
            checkpoint_step=_int(data.get("checkpoint_step")),
            detection_latency_s=_float(data.get("detection_latency_s")),
            recovery_s=_float(data.get("recovery_s")),
            new_pod=_str(data.get("new_pod")),
            new_zone=_str(data.get("new_zone")),
            steps_recomputed=_int(data.get("steps_recomputed")),
            lost_slices=_strs(data.get("lost_slices")),
            replaced_slices=_strs(data.get("replaced_slices")),
        )


@dataclass(frozen=True)
class SkippedCheckpoint:
    step: int | None
    reason: str | None  # unreadable, incomplete...


@dataclass(frozen=True)
class CheckpointFallback:
    """A restore that skipped checkpoints (unreadable, incomplete...) and the step it restored instead."""

    skipped: tuple[SkippedCheckpoint, ...]
    restored: int | None

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> CheckpointFallback:
        skipped = data.get("skipped")
        return cls(
            skipped=tuple(
                SkippedCheckpoint(_int(s.get("step")), _str(s.get("reason")))
                for s in (skipped if isinstance(skipped, list) else [])
                if isinstance(s, Mapping)
            ),
            restored=_int(data.get("restored")),
        )


@dataclass(frozen=True)
class RecoveryView:
    """The supervisor's recovery record of a run (``accounting.recovery_summary``): steps, goodput,
    preemptions, checkpoint fallbacks."""

    steps_reported: bool | None  # False: the program reports no steps, so step figures are unknown
    steps_completed: int | None
    steps_recomputed: int | None
    goodput: float | None
    productive_step_s: float | None
    wall_s: float | None
    preemptions: tuple[PreemptionView, ...]
    checkpoint_fallbacks: tuple[CheckpointFallback, ...]
    #: The record as stored, every time in it ISO (``-o json``).
    record: Mapping[str, Any]

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> RecoveryView:
        reported = record.get("steps_reported")
        preemptions = record.get("preemptions")
        fallbacks = record.get("checkpoint_fallbacks")
        return cls(
            steps_reported=reported if isinstance(reported, bool) else None,
            steps_completed=_int(record.get("steps_completed")),
            steps_recomputed=_int(record.get("steps_recomputed")),
            goodput=_float(record.get("goodput")),
            productive_step_s=_float(record.get("productive_step_s")),
            wall_s=_float(record.get("wall_s")),
            preemptions=tuple(
                PreemptionView.of(p)
                for p in (preemptions if isinstance(preemptions, list) else [])
                if isinstance(p, Mapping)
            ),
            checkpoint_fallbacks=tuple(
                CheckpointFallback.of(f)
                for f in (fallbacks if isinstance(fallbacks, list) else [])
                if isinstance(f, Mapping)
            ),
            record=dict(record),
        )


@dataclass(frozen=True)
class LeaseEvent:
    """One step of a run's lease: a claim, takeover, renewal, loss or release, by the ledger's clock."""

    at: str | None
    action: str
    generation: int
    owner_id: str
    host: str
    pid: int
    expires_at: str | None
    detail: Mapping[str, Any] | None

    @classmethod
    def of(cls, record: LeaseHistoryRecord) -> LeaseEvent:
        owner = record.owner
        return cls(
            at=iso_or_none(record.at),
            action=str(record.action),
            generation=record.generation,
            owner_id=owner.owner_id,
            host=owner.host,
            pid=owner.pid,
            expires_at=iso_or_none(record.expires_at),
            detail=record.detail,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "action": self.action,
            "generation": self.generation,
            "owner_id": self.owner_id,
            "host": self.host,
            "pid": self.pid,
            "expires_at": self.expires_at,
            "detail": None if self.detail is None else dict(self.detail),
        }


@dataclass(frozen=True)
class QueueWait:
    """A run's time in the server's queue: its band, when it entered and was admitted (ISO; admitted None
    while it waits), how long it waited (so far), and why (the reason now, or the last one it waited
    for)."""

    priority: str
    queued_at: str | None
    admitted_at: str | None
    waited_s: float
    reason: str | None

    @classmethod
    def of(cls, record: RunRecord, now: float) -> QueueWait | None:
        """None for a run that never was in the queue (a run without a server)."""
        if record.queued_at is None:
            return None
        end = record.admitted_at if record.admitted_at is not None else (record.ended_at or now)
        reason = record.queue_reason or _str((record.detail or {}).get(WAITED_FOR))
        return cls(
            priority=record.priority or PriorityBand.BATCH.value,
            queued_at=iso_or_none(record.queued_at),
            admitted_at=iso_or_none(record.admitted_at),
            waited_s=round(max(end - record.queued_at, 0.0), 3),
            reason=reason,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def lines(self) -> dict[str, Any]:
        """What `runs describe` says of it, by line name: how long it waited (so far) and why."""
        waiting = self.admitted_at is None
        return {
            "priority": self.priority,
            "waiting_s" if waiting else "waited_s": self.waited_s,
            "waiting_for" if waiting else "waited_for": self.reason,
        }


@dataclass(frozen=True)
class RunDescription:
    """``runs describe``: the run, its segments and timeline, its recovery, who supervises it, why it
    ended and each host's exit, and host 0's steps."""

    run: RunView
    segments: tuple[SegmentView, ...]
    timeline: tuple[TimelineBar, ...]
    recovery: RecoveryView
    supervisor_state: str  # alive (pid N) | none (the run ended) | gone: take over with ...
    supervisor: LeaseHolder | None
    reason: str | None
    host_exits: tuple[HostExit, ...]
    series: StepSeries
    lease_history: tuple[LeaseEvent, ...] = ()  # claims, renewals (one per run of them), losses, releases
    queue: QueueWait | None = None  # its time in the server's queue (None: it never was in one)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.run.to_dict(),
            "segments": [s.to_dict() for s in self.segments],
            "timeline": [t.to_dict() for t in self.timeline],
            "recovery": dict(self.recovery.record),
            "supervisor_state": self.supervisor_state,
            "supervisor": None if self.supervisor is None else self.supervisor.to_dict(),
            "reason": self.reason,
            "host_exits": [e.to_dict() for e in self.host_exits],
            "series": self.series.to_dict(),
            "lease_history": [e.to_dict() for e in self.lease_history],
            "queue": None if self.queue is None else self.queue.to_dict(),
        }


@dataclass(frozen=True)
class RunLogs:
    """The hosts' log files of a run: every host's, or one's (``worker``)."""

    run_id: str
    worker: int | None
    files: tuple[tuple[int, Path], ...]  # (worker, log file)


@dataclass(frozen=True)
class Detached:
    """A background supervisor started for a run (``--detach``)."""

    run_id: str
    pid: int
    log: Path  # its own output
    leased: bool  # False: it had not taken the run's lease when tpuctl stopped waiting

    def to_dict(self) -> dict[str, Any]:
        """The ``supervisor`` object of ``run --detach -o json``."""
        data: dict[str, Any] = {"pid": self.pid, "log": str(self.log)}
        if not self.leased:
            data["lease"] = "not yet taken"
        return data


@dataclass(frozen=True)
class Resumption:
    """A run made ready to carry on (``Runs.resume``): prepared again under its id, with the policy and
    budget it goes on with."""

    run_id: str
    hosts: int  # as recorded when it started (the printer's prefix width)
    prepared: PreparedRun
    policy: RecoveryPolicy
    budget_usd: float | None
    note: str | None  # said to the user: the program's files changed since it started


class CancelOutcome(StrEnum):
    ALREADY_ENDED = "already_ended"  # nothing to do
    BY_SUPERVISOR = "by_supervisor"  # its live supervisor stopped it
    CLEANED_UP = "cleaned_up"  # nobody supervised it: tpuctl stopped what it left


@dataclass(frozen=True)
class Cancellation:
    """What ``runs cancel`` did."""

    run_id: str
    outcome: CancelOutcome
    status: str | None  # the run's status after (None: its record is gone)
    by: str | None = None  # BY_SUPERVISOR: which ("its supervisor (pid N)")
    hosts_killed: int = 0  # CLEANED_UP: programs stopped on the user's own slices
    deleted: str | None = None  # CLEANED_UP: the slices deleted, comma-separated

    @property
    def cancelled(self) -> bool:
        return self.outcome is not CancelOutcome.ALREADY_ENDED

    @property
    def note(self) -> str | None:
        """Why nothing was done (ALREADY_ENDED)."""
        return "the run had already ended" if self.outcome is CancelOutcome.ALREADY_ENDED else None

    def to_dict(self) -> dict[str, Any]:
        head: dict[str, Any] = {"run_id": self.run_id, "status": self.status, "cancelled": self.cancelled}
        if self.outcome is CancelOutcome.ALREADY_ENDED:
            return {**head, "note": self.note}
        if self.outcome is CancelOutcome.BY_SUPERVISOR:
            return {**head, "by": self.by}
        return {**head, "hosts_killed": self.hosts_killed, "deleted": self.deleted}
