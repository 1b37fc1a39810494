"""Reading a run back: its segments and timeline, its recovery record and who supervises it now
(``runs describe``), and its hosts' log files (``runs logs``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.errors import UsageError
from tpuctl.services.run.lease import lease_holder
from tpuctl.store.records import RunStatus

if TYPE_CHECKING:
    from tpuctl.services.session import Session

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


def log_paths(session: Session, run_id: str, worker: int | None = None) -> list[tuple[int, Path]]:
    """(worker, log file) of a run, all workers or one; raises UsageError for an unknown one."""
    record = session.ledger.get_run(run_id)
    if record is None:
        raise UsageError(
            f"no run {run_id!r}", field="RUN", value=run_id, fix="`tpuctl runs list` shows the runs"
        )
    hosts = int((record.detail or {}).get("hosts", 0))
    log_dir = Path((record.detail or {}).get("log_dir") or session.state_dir / "runs" / run_id)
    if worker is not None and not 0 <= worker < max(hosts, 1):
        raise UsageError(
            f"run {run_id} has workers 0..{hosts - 1}, not {worker}",
            field="worker",
            value=worker,
            fix=f"pass --worker between 0 and {hosts - 1}",
        )
    workers = [worker] if worker is not None else list(range(hosts))
    return [(w, log_dir / f"worker-{w}.log") for w in workers]
