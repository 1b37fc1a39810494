"""State: the ledger of pods, placement attempts, runs and lifecycle events, the runs' leases and what a
new owner of a run needs, and private files.

``Ledger.open(url)`` opens (creating and migrating) the ledger the ``database`` setting names;
``Ledger(state_dir)`` the state dir's ``ledger.db``; ``Ledger(database)`` a ``database.Database`` of either
engine. ``sql`` is the connection the ledger's SQL runs on and the engines' differences, ``tables`` the
one schema, ``migrations``/``migrate`` its history, ``derived`` the triggers per engine, ``leases`` the
lease protocol, ``runstate`` the run state a new owner reads, ``servers`` the servers using the ledger,
``secrets`` the key that encrypts a run's secrets, ``url`` the ledger's location; ``paths`` holds the
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
    BlobRecord,
    BlobTooLargeError,
    CancelRequest,
    EventKind,
    EventRecord,
    IntentAction,
    IntentRecord,
    LeaseAction,
    LeaseClaim,
    LeaseHistoryRecord,
    LeaseHolder,
    LeaseOwner,
    LedgerBusyError,
    LedgerError,
    LogLine,
    NewEvent,
    PodRecord,
    PodState,
    PreemptionKind,
    RunRecord,
    RunState,
    RunStatus,
    SegmentKind,
    SegmentRecord,
    SliceRef,
)
from tpuctl.store.schema import SCHEMA_VERSION
from tpuctl.store.secrets import SecretKey, load_secret_key
from tpuctl.store.url import DatabaseUrl, default_database_url, parse_database_url

__all__ = [
    "SCHEMA_VERSION",
    "UNSET",
    "AmbiguousPodError",
    "AttemptOutcome",
    "AttemptRecord",
    "BlobRecord",
    "BlobTooLargeError",
    "CancelRequest",
    "DatabaseUrl",
    "EventKind",
    "EventRecord",
    "IntentAction",
    "IntentRecord",
    "LeaseAction",
    "LeaseClaim",
    "LeaseHistoryRecord",
    "LeaseHolder",
    "LeaseOwner",
    "Ledger",
    "LedgerBusyError",
    "LedgerError",
    "LogLine",
    "NewEvent",
    "PodRecord",
    "PodState",
    "PreemptionKind",
    "RunRecord",
    "RunState",
    "RunStatus",
    "SecretKey",
    "SegmentKind",
    "SegmentRecord",
    "SliceRef",
    "StatePermissionError",
    "atomic_write_json",
    "atomic_write_text",
    "default_database_url",
    "ensure_private_dir",
    "load_secret_key",
    "parse_database_url",
    "private_file",
    "resolve_ledger_path",
]
