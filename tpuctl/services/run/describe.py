"""Reading a run back: its segments and timeline, its recovery record and who supervises it now
(``runs describe``), and its hosts' log files (``runs logs``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.errors import UsageError
from tpuctl.services.run.hostlog import iso
from tpuctl.services.run.lease import lease_holder
from tpuctl.services.run.model import describe_exit
from tpuctl.store.records import RunStatus

if TYPE_CHECKING:
    from tpuctl.services.session import Session

TIMELINE_WIDTH = 60


def describe_run(session: Session, record: Any) -> dict[str, Any]:
    """Segments (with ISO times), a timeline scaled to ``TIMELINE_WIDTH`` columns, the recovery record
    and who supervises the run now. Plain data: the CLI renders it as a table or JSON."""
    now = time.time()
    segments = session.ledger.segments(record.run_id)
    segs = []
    for seg in segments:
        end = seg.end
        segs.append(
            {
                "kind": str(seg.kind),
                "start": _iso(seg.start),
                "end": _iso(end),
                "duration_s": round((end if end is not None else now) - seg.start, 3),
                "open": end is None,
                "pod": seg.pod,
                "zone": seg.zone,
                "capacity": None if seg.capacity is None else seg.capacity.value,
                "steps_completed": seg.steps_completed,
                "steps_recomputed": seg.steps_recomputed,
                "detail": iso_times(seg.detail or {}),
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
        "recovery": iso_times(detail.get("recovery") or {}),
        "supervisor_state": state,
        "supervisor": holder,
        "reason": detail.get("reason") or detail.get("error"),
        "host_exits": host_exits(detail),
        "series": step_series(log_dir / "worker-0.log"),
    }


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


def host_exits(detail: dict[str, Any]) -> list[dict[str, Any]]:
    """Each host's exit status in the last attempt, in words too (``describe_exit``)."""
    codes = detail.get("exit_codes") or {}
    failed = detail.get("failed_worker")
    exits = []
    for worker in sorted(codes, key=int):
        code = codes[worker]
        exits.append(
            {
                "worker": int(worker),
                "exit_code": code,
                "how": describe_exit(code),
                "failed": failed == int(worker),
            }
        )
    return exits


#: How many points a step series keeps (the widest sparkline `runs describe` draws).
SERIES_POINTS = 60


def step_series(log: Path) -> dict[str, list[float]]:
    """Step times (and losses, when the program reports them) from host 0's ``TPUCTL_EVENT`` step lines,
    averaged down to at most ``SERIES_POINTS`` points; empty lists when the program reports no steps."""
    from tpuctl.runtime.preemption import parse_event

    dts: dict[int, float] = {}
    losses: dict[int, float] = {}
    if log.exists():
        with log.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                event = parse_event(line.rstrip("\n"))
                if event is None or event.get("event") != "step" or not isinstance(event.get("step"), int):
                    continue
                for key, into in (("dt", dts), ("loss", losses)):
                    value = event.get(key)
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        into[event["step"]] = float(value)  # a recomputed step: its last time
    return {"step_time_s": _downsample(dts), "loss": _downsample(losses)}


def _downsample(by_step: dict[int, float]) -> list[float]:
    values = [by_step[s] for s in sorted(by_step)]
    if len(values) <= SERIES_POINTS:
        return [round(v, 6) for v in values]
    size = len(values) / SERIES_POINTS
    buckets = [values[round(i * size) : round((i + 1) * size)] for i in range(SERIES_POINTS)]
    return [round(sum(b) / len(b), 6) for b in buckets if b]


def is_live(session: Session, run_id: str) -> bool:
    """Whether a run may still write to its logs: not finished, or a supervisor still holds it."""
    record = session.ledger.get_run(run_id)
    if record is None:
        return False
    detail = record.detail or {}
    log_dir = Path(detail.get("log_dir") or session.state_dir / "runs" / run_id)
    known = record.status in RunStatus._value2member_map_
    return lease_holder(log_dir) is not None or (known and not RunStatus(record.status).finished)


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
