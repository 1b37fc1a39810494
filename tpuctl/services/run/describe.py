"""Reading a run back for ``runs describe``: its segments and timeline, its recovery record, who supervises
it now, why it ended and host 0's steps."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tpuctl.services.run.hostlog import host_lines, iso
from tpuctl.services.run.model import describe_exit
from tpuctl.services.run.views import (
    HostExit,
    LeaseEvent,
    LeaseHolder,
    QueueWait,
    RecoveryView,
    RunDescription,
    RunView,
    SegmentView,
    StepSeries,
    TimelineBar,
)
from tpuctl.store.records import RunStatus

if TYPE_CHECKING:
    from tpuctl.services.run.rundir import RunDir
    from tpuctl.services.session import Session
    from tpuctl.store.records import RunRecord, SegmentRecord

TIMELINE_WIDTH = 60


def describe_run(
    session: Session, record: RunRecord, run_dir: RunDir, holder: LeaseHolder | None
) -> RunDescription:
    """The run with its segments (ISO times), a timeline scaled to ``TIMELINE_WIDTH`` columns, its recovery
    record and who supervises it now (``holder``, the process holding its lease)."""
    now = time.time()
    segments = session.ledger.segments(record.run_id)
    detail = record.detail or {}
    return RunDescription(
        run=RunView.of(record),
        segments=tuple(_segment(seg, now) for seg in segments),
        timeline=_timeline(segments, now),
        recovery=RecoveryView.of(iso_times(detail.get("recovery") or {})),
        supervisor_state=_supervisor_state(record, holder),
        supervisor=holder,
        reason=detail.get("reason") or detail.get("error"),
        host_exits=host_exits(detail),
        series=step_series(host_lines(session.ledger, record.run_id, 0, run_dir.host_log(0))),
        lease_history=tuple(LeaseEvent.of(h) for h in session.ledger.lease_history(record.run_id)),
        queue=QueueWait.of(record, now),
    )


def _segment(seg: SegmentRecord, now: float) -> SegmentView:
    end = seg.end
    return SegmentView(
        kind=str(seg.kind),
        start=_iso(seg.start),
        end=_iso(end),
        duration_s=round((end if end is not None else now) - seg.start, 3),
        open=end is None,
        pod=seg.pod,
        zone=seg.zone,
        capacity=None if seg.capacity is None else seg.capacity.value,
        steps_completed=seg.steps_completed,
        steps_recomputed=seg.steps_recomputed,
        detail=iso_times(seg.detail or {}),
    )


def _timeline(segments: Sequence[SegmentRecord], now: float) -> tuple[TimelineBar, ...]:
    """One bar per segment, placed and sized by its share of the run's wall time."""
    if not segments:
        return ()
    first = segments[0].start
    last = max((s.end if s.end is not None else now) for s in segments)
    span = max(last - first, 1e-9)
    bars = []
    for seg in segments:
        duration = (seg.end if seg.end is not None else now) - seg.start
        offset = round((seg.start - first) / span * TIMELINE_WIDTH)
        bars.append(
            TimelineBar(
                kind=str(seg.kind),
                offset=min(offset, TIMELINE_WIDTH - 1),
                width=round(duration / span * TIMELINE_WIDTH),
                duration_s=round(duration, 3),
            )
        )
    return tuple(bars)


def _supervisor_state(record: RunRecord, holder: LeaseHolder | None) -> str:
    finished = RunStatus(record.status).finished if record.status in RunStatus._value2member_map_ else True
    if holder is not None:
        if holder.generation is None or holder.expires_in_s is None:
            return f"alive (pid {holder.pid})"
        return (
            f"alive (pid {holder.pid} on {holder.host}; lease generation {holder.generation} expires in "
            f"{holder.expires_in_s:.0f} s unless renewed)"
        )
    if finished:
        return "none (the run ended)"
    if record.status == RunStatus.QUEUED:
        return "none yet (waiting in the server's queue)"
    return f"gone: take over with `tpuctl runs resume {record.run_id}`"


def _iso(ts: float | None) -> str | None:
    return None if ts is None else iso(ts)


def iso_times(value: Any) -> Any:
    """``value`` with every time in it (a number under a key ``at``, ``t`` or ``*_at``: epoch seconds, as
    the supervisor records them) as an ISO string, so all of a run's JSON speaks one time format."""
    if isinstance(value, dict):
        return {
            k: _iso(v) if _is_time_key(k) and isinstance(v, (int, float)) and not isinstance(v, bool)
            else iso_times(v)
            for k, v in value.items()
        }  # fmt: skip
    if isinstance(value, list):
        return [iso_times(v) for v in value]
    return value


def _is_time_key(key: object) -> bool:
    return isinstance(key, str) and (key in ("at", "t") or key.endswith("_at"))


def host_exits(detail: Mapping[str, Any]) -> tuple[HostExit, ...]:
    """Each host's exit status in the last attempt, in words too (``describe_exit``)."""
    codes = detail.get("exit_codes") or {}
    failed = detail.get("failed_worker")
    return tuple(
        HostExit(
            worker=int(worker),
            exit_code=codes[worker],
            how=describe_exit(codes[worker]),
            failed=failed == int(worker),
        )
        for worker in sorted(codes, key=int)
    )


#: How many points a step series keeps (the widest sparkline `runs describe` draws).
SERIES_POINTS = 60


def step_series(lines: Iterable[str]) -> StepSeries:
    """Step times (and losses, when the program reports them) from host 0's ``TPUCTL_EVENT`` step
    ``lines``, averaged down to at most ``SERIES_POINTS`` points; empty lists when the program reports no
    steps."""
    from tpuctl.runtime.preemption import parse_event

    dts: dict[int, float] = {}
    losses: dict[int, float] = {}
    for line in lines:
        event = parse_event(line)
        if event is None or event.get("event") != "step" or not isinstance(event.get("step"), int):
            continue
        for key, into in (("dt", dts), ("loss", losses)):
            value = event.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                into[event["step"]] = float(value)  # a recomputed step: its last time
    return StepSeries(step_time_s=_downsample(dts), loss=_downsample(losses))


def _downsample(by_step: dict[int, float]) -> tuple[float, ...]:
    values = [by_step[s] for s in sorted(by_step)]
    if len(values) <= SERIES_POINTS:
        return tuple(round(v, 6) for v in values)
    size = len(values) / SERIES_POINTS
    buckets = [values[round(i * size) : round((i + 1) * size)] for i in range(SERIES_POINTS)]
    return tuple(round(sum(b) / len(b), 6) for b in buckets if b)
