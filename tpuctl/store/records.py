"""What the ledger stores and hands out: kinds, states, and immutable records.

Records are frozen dataclasses built from rows; callers never see ``sqlite3.Row``. ``NewEvent`` is the
one input type, a NamedTuple rather than a dataclass because the bulk path takes them by the million and
tuple construction is several times cheaper.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, NamedTuple

from tpuctl.catalog import CapacityType
from tpuctl.errors import TpuctlError, UsageError
from tpuctl.processes import process_start_ticks


class LedgerError(TpuctlError):
    """The ledger cannot be opened, read or written (corrupt file, newer schema, lock held too long)."""

    kind = "ledger"


class LedgerBusyError(LedgerError):
    """Another tpuctl held the ledger's write lock for longer than the busy timeout."""

    kind = "ledger_busy"


class LedgerUnavailableError(LedgerBusyError):
    """The ledger's database could not be reached (down, restarting, the connection cut mid-transaction):
    busy in the sense that matters, worth trying again later; the transaction wrote nothing it did not
    roll back, unless the cut came during its commit."""

    kind = "ledger_unavailable"


class AmbiguousPodError(UsageError):
    """A pod name given without a zone matches slices in more than one zone."""

    kind = "ambiguous_pod"

    def __init__(self, name: str, zones: list[str]) -> None:
        super().__init__(
            f"pod name {name!r} is ambiguous: it exists in zones {', '.join(zones)}",
            field="name",
            value=name,
            fix=f"pass --zone with one of: {', '.join(zones)}",
        )
        self.zones = zones

    def details(self) -> dict[str, Any]:
        out = super().details()
        out["zones"] = self.zones
        return out


class EventKind(StrEnum):
    """Lifecycle events. The first group changes the ``pods`` view; the rest are log-only.

    The column is TEXT, so adding a kind needs no schema migration: add it here and, if it should move
    the pods view, in ``tpuctl.store.view``.
    """

    REQUESTED = "requested"  # tpuctl decided to create it (zone chosen); opens an incarnation
    QUEUED = "queued"  # a queued resource was accepted and waits for capacity
    CREATED = "created"  # the create call was accepted; the slice exists (CREATING)
    READY = "ready"  # READY: billing starts here on GCP
    PREEMPTED = "preempted"  # billing stops; the slice still holds quota until deleted
    DELETED = "deleted"  # gone, by tpuctl
    GONE = "gone"  # seen missing from the cloud listing (deleted behind tpuctl's back)
    FAILED = "failed"  # creation or the slice failed
    PRICE_CHANGE = "price_change"  # the price per chip-hour in force changes from this moment
    ATTEMPT = "attempt"  # one placement attempt (also a row in ``attempts``)
    GC = "gc"  # pod gc found or removed something


class PodState(StrEnum):
    """The ledger's view of a slice (not the API's state enum: that lives in tpuctl.cloud)."""

    REQUESTED = "REQUESTED"
    QUEUED = "QUEUED"
    CREATING = "CREATING"
    READY = "READY"
    PREEMPTED = "PREEMPTED"
    FAILED = "FAILED"
    DELETED = "DELETED"


class AttemptOutcome(StrEnum):
    CREATED = "created"
    QUEUED = "queued"
    STOCKOUT = "stockout"
    QUOTA = "quota"
    RATE_LIMITED = "rate_limited"
    TRANSIENT = "transient"
    AMBIGUOUS = "ambiguous"
    OVER_CAP = "over_cap"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    FAILED = "failed"


#: The one workspace of a ledger used without a workspace file, and of rows written before workspaces.
LOCAL_WORKSPACE: Final = "default"
#: Who wrote a row from before workspaces (its principal NULL), as lists and reports show it.
UNKNOWN_PRINCIPAL: Final = "(unknown)"


class RunStatus(StrEnum):
    #: Waiting in the server's queue for room in its workspace (or for Google quota or capacity): not
    #: admitted yet, so nobody supervises it and it holds no chips (``tpuctl.server.admission``).
    QUEUED = "queued"
    PENDING = "pending"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    RECOVERING = "recovering"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BUDGET_EXCEEDED = "budget_exceeded"

    @property
    def finished(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXCEEDED)


class PriorityBand(StrEnum):
    """A run's band in the server's queue: every production run is admitted before any interactive one,
    and those before any batch one (``tpuctl.server.admission``). A run that names none is batch."""

    PRODUCTION = "production"
    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """Its place in the order: 0 first."""
        return tuple(PriorityBand).index(self)


class PreemptionKind(StrEnum):
    """What the program did with a preemption, as a run's record and its slice's ``preempted`` event
    (``detail.kind``) say: from the notice a host saw to how the program ended."""

    NOTICE = "notice"  # it stopped on the notice, inside the grace (checkpointed, when it could)
    NOTICE_IGNORED = "notice_ignored"  # it went on after the notice and was killed at the grace's end
    NOTICE_FINISHED = "notice_finished"  # it finished its work inside the grace: the run succeeded
    HARD = "hard"  # no notice reached any host: killed at once
    #: Its host was taken for maintenance and Google does not bring the VM back (a spot VM, or a
    #: Compute Engine VM without automatic restart): lost as to a preemption.
    MAINTENANCE = "maintenance"


class SegmentKind(StrEnum):
    PROVISIONING = "provisioning"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    PREEMPTED = "preempted"
    RECOVERING = "recovering"


class NewEvent(NamedTuple):
    """An event to record; the same fields as ``Ledger.record_event``'s arguments."""

    kind: EventKind
    pod: str | None = None
    zone: str | None = None
    accelerator_type: str | None = None
    chips: int | None = None
    capacity: CapacityType | None = None
    price_per_chip_hour: float | None = None
    labels: Mapping[str, str] | None = None
    run_id: str | None = None
    request_id: str | None = None
    detail: Mapping[str, Any] | None = None
    ts: float | None = None
    hosts: int | None = None
    queued_resource: str | None = None
    slice_index: int | None = None
    backend: str | None = None
    project: str | None = None
    #: Who it is done for. Left out: the run's (``run_id``, or the slice's run), else the slice's own.
    principal: str | None = None
    workspace: str | None = None


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One row of the append-only event log.

    ``accelerator_type``, ``chips``, ``capacity``, ``price_per_chip_hour``, ``run_id`` and ``request_id``
    are those in force for the pod at that moment (filled from the pods view when the caller did not
    give them), so a single event answers "what was this slice and what did it cost per hour then".
    ``labels`` are only those given with the event (the pods view holds the slice's current labels);
    copying them onto every event would multiply the ledger's size for no query that needs it.
    ``kind`` is a plain ``str`` only for kinds written by a newer tpuctl.
    """

    id: int
    ts: float
    kind: EventKind | str
    pod: str | None
    zone: str | None
    pod_id: int | None
    accelerator_type: str | None
    chips: int | None
    capacity: CapacityType | None
    price_per_chip_hour: float | None
    labels: dict[str, str] | None
    run_id: str | None
    request_id: str | None
    detail: dict[str, Any] | None
    hosts: int | None
    queued_resource: str | None
    slice_index: int | None
    backend: str | None
    project: str | None
    #: Whose the event is (None: written before revision 0003).
    principal: str | None = None
    workspace: str | None = None


@dataclass(frozen=True, slots=True)
class PodRecord:
    """One incarnation of a slice (zone + name + incarnation is unique).

    A name can be reused after a slice is deleted; each life gets its own row (``incarnation`` 1, 2, ...)
    so the cost of the earlier one is not overwritten. At most one incarnation per zone+name is open.

    Times are epoch seconds. ``ended_at`` is when billing stopped (first of preempted / failed / deleted /
    gone) and ``end_reason`` the event kind that ended it; ``deleted_at`` is when the slice stopped
    existing (a preempted slice keeps holding quota until then).
    """

    id: int
    zone: str
    name: str
    incarnation: int
    state: PodState
    accelerator_type: str | None
    chips: int | None
    hosts: int | None
    capacity: CapacityType | None
    price_per_chip_hour: float | None
    labels: dict[str, str]
    request_id: str | None
    run_id: str | None
    queued_resource: str | None
    slice_index: int | None
    backend: str | None
    project: str | None
    requested_at: float | None
    created_at: float | None
    ready_at: float | None
    ended_at: float | None
    end_reason: str | None
    deleted_at: float | None
    updated_at: float
    last_event_id: int
    #: Whose slice it is: its run's owner, else who made it (None: from before revision 0003).
    principal: str | None = None
    workspace: str | None = None

    @property
    def alive(self) -> bool:
        """Not ended: requested, queued, creating or ready."""
        return self.ended_at is None


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    id: int
    request_id: str
    ts: float
    zone: str
    capacity: CapacityType | None
    outcome: AttemptOutcome | str
    message: str | None
    duration_s: float | None
    pod: str | None
    accelerator_type: str | None
    event_id: int
    detail: dict[str, Any] | None
    #: Whose placement it was: the run's owner, else who asked (None: from before revision 0003).
    principal: str | None = None
    workspace: str | None = None


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    script: str
    args: tuple[str, ...]
    status: RunStatus | str
    pod: str | None
    zone: str | None
    accelerator_type: str | None
    capacity: CapacityType | None
    created_at: float
    ended_at: float | None
    exit_code: int | None
    restarts: int
    preemptions: int
    steps: int
    labels: dict[str, str]
    detail: dict[str, Any] | None
    updated_at: float
    #: Who submitted it (an email; a local user's name) and whose share it uses; None: from before
    #: workspaces (an unknown principal, the implicit local workspace).
    principal: str | None = None
    workspace: str | None = None
    #: The server's queue: the priority band (None: batch), when it entered the queue and was admitted
    #: (the ledger's clock; None: never queued / not yet), and why it waits now (None once admitted).
    priority: str | None = None
    queued_at: float | None = None
    admitted_at: float | None = None
    queue_reason: str | None = None


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    id: int
    run_id: str
    kind: SegmentKind | str
    start: float
    end: float | None
    pod: str | None
    zone: str | None
    capacity: CapacityType | None
    steps_completed: int | None
    steps_recomputed: int | None
    detail: dict[str, Any] | None

    @property
    def duration_s(self) -> float | None:
        return None if self.end is None else self.end - self.start


# -- runs as leased records ------------------------------------------------------------------------


class LeaseAction(StrEnum):
    """What a row of a run's lease history records."""

    CLAIM = "claim"  # a free lease (never held, released, or this owner's own expired one) was taken
    TAKEOVER = "takeover"  # another owner's expired lease was taken (the row's detail names that owner)
    RENEW = "renew"
    RELEASE = "release"
    LOST = "lost"  # a renewal or a fenced write found the lease no longer this owner's


class IntentAction(StrEnum):
    """What a supervisor is about to do to a slice (recorded, fenced, before it asks the cloud)."""

    CREATE = "create"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class LeaseOwner:
    """Who holds (or held) a run's lease: one supervisor process.

    ``owner_id`` is random per supervisor process (``of_this_process``), so two processes that share a
    host name and a pid (containers, a pid reused after a reboot) are still two owners. ``start_ticks``
    is the process's start time in clock ticks after its host's boot (``tpuctl.processes``), which tells
    a live holder from a later process that got the same pid, on that host.
    """

    owner_id: str
    host: str
    pid: int
    start_ticks: int | None

    @classmethod
    def of_this_process(cls) -> LeaseOwner:
        """A new owner identity for this process: make it once per supervisor process, and keep it."""
        pid = os.getpid()
        return cls(secrets.token_hex(8), os.uname().nodename, pid, process_start_ticks(pid))

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid} (owner {self.owner_id})"


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """Someone asked for the run to stop (``runs cancel``, from any machine); its owner acts on it."""

    run_id: str
    requested_at: float  # the ledger's clock
    requested_by: str


@dataclass(frozen=True, slots=True)
class LeaseClaim:
    """A held lease: the credential every fenced write presents. Times are the ledger's clock.

    ``token`` and ``generation`` are what a fenced write must still find in the lease row; the token is
    secret to its holder (never printed, never in the history), so nobody else's write can pass the fence.
    ``cancel`` is the run's cancel request as the claim or the latest renewal read it.
    """

    run_id: str
    owner: LeaseOwner
    token: str = field(repr=False)
    generation: int
    expires_at: float
    cancel: CancelRequest | None = None


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a run's lease, as anyone may read it. ``now`` is the ledger's clock at the read."""

    run_id: str
    owner: LeaseOwner
    generation: int
    claimed_at: float
    renewed_at: float
    expires_at: float
    now: float

    @property
    def expires_in_s(self) -> float:
        """Seconds until the lease expires (negative: it expired that long ago and nobody took it)."""
        return self.expires_at - self.now

    @property
    def expired(self) -> bool:
        return self.expires_at <= self.now


@dataclass(frozen=True, slots=True)
class LeaseHistoryRecord:
    """One row of a run's lease history. ``at`` and ``expires_at`` are the ledger's clock."""

    id: int
    run_id: str
    at: float
    action: LeaseAction | str
    owner: LeaseOwner
    generation: int
    expires_at: float | None
    detail: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class IntentRecord:
    """A slice create or delete a supervisor recorded (fenced) before asking the cloud for it: what a new
    owner reconciles against the cloud. ``pod`` is the slice's name (a multislice: one row per node)."""

    id: int
    run_id: str
    at: float
    action: IntentAction | str
    pod: str
    zone: str
    generation: int
    owner_id: str
    detail: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class SliceRef:
    """A slice by name and zone, as a run's state records it."""

    name: str
    zone: str


@dataclass(frozen=True, slots=True)
class RunState:
    """Where a supervised run stands, as its owner last wrote it (fenced): the supervisor's phase (its own
    vocabulary), the current attempt's number and the slices it runs on."""

    run_id: str
    phase: str | None
    attempt: int | None
    slices: tuple[SliceRef, ...]
    generation: int  # the lease generation of the owner that wrote it
    updated_at: float  # the ledger's clock


@dataclass(frozen=True, slots=True)
class BlobRecord:
    """A stored blob of a run (its saved request, its bundle): name, SHA-256, size, when saved."""

    run_id: str
    name: str
    sha256: str
    size: int
    saved_at: float  # the ledger's clock


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line a host printed: ``seq`` numbers a worker's lines from 0, ``at`` is when it arrived."""

    worker: int
    seq: int
    at: float
    text: str


class BlobTooLargeError(UsageError):
    """A run's blob (its bundle, its request) is larger than the ledger stores per item."""

    kind = "blob_too_large"
