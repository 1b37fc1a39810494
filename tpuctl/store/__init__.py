"""Local state: the ledger of pods, placement attempts, runs and lifecycle events, and private files.

``Ledger(state_dir)`` opens (creating and migrating) ``<state_dir>/ledger.db``; ``paths`` holds the
0700/0600 helpers and the atomic writes other modules use for durable files.
"""

from tpuctl.store.ledger import UNSET, Ledger, resolve_ledger_path
from tpuctl.store.paths import (
    StatePermissionError,
    atomic_write_json,
    atomic_write_text,
    ensure_private_dir,
    private_file,
)
from tpuctl.store.records import (
    AmbiguousPodError,
    AttemptOutcome,
    AttemptRecord,
    EventKind,
    EventRecord,
    LedgerBusyError,
    LedgerError,
    NewEvent,
    PodRecord,
    PodState,
    RunRecord,
    RunStatus,
    SegmentKind,
    SegmentRecord,
)
from tpuctl.store.schema import SCHEMA_VERSION

__all__ = [
    "SCHEMA_VERSION",
    "UNSET",
    "AmbiguousPodError",
    "AttemptOutcome",
    "AttemptRecord",
    "EventKind",
    "EventRecord",
    "Ledger",
    "LedgerBusyError",
    "LedgerError",
    "NewEvent",
    "PodRecord",
    "PodState",
    "RunRecord",
    "RunStatus",
    "SegmentKind",
    "SegmentRecord",
    "StatePermissionError",
    "atomic_write_json",
    "atomic_write_text",
    "ensure_private_dir",
    "private_file",
    "resolve_ledger_path",
]
