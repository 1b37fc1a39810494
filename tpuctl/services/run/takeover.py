"""Taking over a run whose supervisor died (``runs resume``): stop what it left running, end its open
segments, decide what becomes of its slices, and read its progress back, so the supervisor carries on
from the last checkpoint."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.errors import CloudError, NotFoundError
from tpuctl.runtime.preemption import parse_event
from tpuctl.services.run import hosts
from tpuctl.services.run.accounting import PreemptionRecord, Progress
from tpuctl.services.run.hostlog import host_lines
from tpuctl.services.run.model import LaunchObserver, PreparedRun
from tpuctl.services.run.sliceset import SliceSet
from tpuctl.store.records import EventKind

if TYPE_CHECKING:
    from tpuctl.cloud.base import Node
    from tpuctl.services.session import Session

#: Deletes a slice for a reason; False when it could not (reported already).
DeleteSlice = Callable[["Node", str], bool]


@dataclass
class TakenOver:
    """Where the resumed run goes on from."""

    slices: SliceSet | None  # the slices to run on again; None: place new ones
    restart_count: int
    prefer_zone: str | None
    restarts: int
    preemptions: list[PreemptionRecord]


def take_over(
    session: Session,
    observer: LaunchObserver,
    prepared: PreparedRun,
    record: Any,
    progress: Progress,
    delete_slice: DeleteSlice,
) -> TakenOver:
    """Continue a run whose supervisor died: stop what it left running, end its open segment, and
    start again from the last checkpoint (the old slice is replaced: its hosts' state is unknown)."""
    ledger = session.ledger
    detail = dict(record.detail or {})
    restarts = int(record.restarts or 0)
    recovery = detail.get("recovery") or {}
    preemptions = [PreemptionRecord.from_dict(p) for p in recovery.get("preemptions", [])]
    seed_progress(session, progress, prepared)
    for seg in ledger.segments(prepared.run_id):
        if seg.end is None:
            ledger.close_segment(
                seg.id, end=time.time(), detail={**(seg.detail or {}), "closed_by": "resume"}
            )
    given = prepared.target.existing
    if given is not None:  # the user's own slices stay: stop what the run left on them
        key = hosts.run_key(session, prepared)
        access = hosts.HostAccess(prepared.request.ssh_remote_root, prepared.request.ssh_proxy_command)
        hosts.stop_left_hosts(session, given, prepared.run_id, access, key)
    restart_count = int(detail.get("restart_count", restarts + len(preemptions))) + 1
    observer.status(f"taking over run {prepared.run_id} (restart {restart_count})")
    if given is not None:
        return TakenOver(given, restart_count, None, restarts, preemptions)
    # Every old slice goes: the run moves on fresh.
    adopt_slices(session, prepared.run_id, record, delete_slice, by="runs resume")
    return TakenOver(None, restart_count, record.zone, restarts, preemptions)


def adopt_slices(
    session: Session, run_id: str, record: Any, delete_slice: DeleteSlice, *, by: str
) -> list[str]:
    """What becomes of the dead supervisor's slices: the one the run record names (it ran there; it may
    be preempted) and every other the ledger still has alive for the run: a placement or a recovery
    that was still making one when the supervisor died (the run record names a slice only once it is
    placed, and names no zone at all while the allocator chooses). Every one is deleted (what ran on
    its hosts is in an unknown state; the run restarts from its bucket on a fresh slice), and one the
    API no longer has (a delete that landed before the kill could record it) is recorded gone: no slice
    is left that the run forgot, and no ledger entry outlives its slice. A multislice's run record names
    the set, not a node: its slices are the ledger's. ``by``: the command taking the slices over
    (``runs resume``, ``runs cancel``). Returns the names of the slices deleted."""
    ledger = session.ledger
    slices: list[tuple[str, str]] = []
    deleted: list[str] = []
    if record.pod and record.zone:
        slices.append((record.zone, record.pod))
    for pod in ledger.list_pods(run_id=run_id, alive=True):
        if (pod.zone, pod.name) not in slices:
            slices.append((pod.zone, pod.name))
    for zone, name in slices:
        try:
            node = session.cloud.get_node(zone, name)
        except NotFoundError:
            known = ledger.get_pod(name, zone=zone)
            if known is not None and known.alive:
                ledger.record_event(
                    EventKind.GONE,
                    pod=name,
                    zone=zone,
                    run_id=run_id,
                    detail={"seen_by": by, "why": "not found when the run was taken over"},
                )
            continue
        except CloudError:
            continue  # cannot tell now; the ledger still has it, so `tpuctl pod gc` will
        if delete_slice(node, f"{by} of run {run_id}"):
            deleted.append(name)
    return deleted


def seed_progress(session: Session, progress: Progress, prepared: PreparedRun) -> None:
    """Read the steps done so far back from host 0's lines (the killed supervisor kept them in memory):
    the ledger's, written on whatever machine supervised the run, else this machine's log file."""
    for text in host_lines(session.ledger, prepared.run_id, 0, prepared.run_dir.host_log(0)):
        event = parse_event(text)
        if event is not None:
            progress.on_event(event, time.time())
    progress.new_attempt()
