"""The simulator's state: one SQLite file, ``<state_dir>/sim/sim.db``.

Several processes may open it at once (every tpuctl command runs its own in-process simulator), so:
WAL (readers never block the writer), a generous busy timeout, and every mutation inside
``BEGIN IMMEDIATE`` so two writers serialize on the database lock instead of losing an update between a
read and a write. Within one process, one connection is shared by the server's threads behind a lock
(sqlite3 connections are not safe to use from two threads at once).

Timestamps are REAL epoch seconds (the injected clock's time); durations from the world are converted
with its speed factor when a deadline is stored, so the stored state means the same to every process.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tpuctl.sim.vms.layout import address_offset

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

-- One row per TPU node. A pending transition is (state -> next_state at due_at); next_state 'GONE'
-- deletes the row. op_name is the operation that completes with the transition.
CREATE TABLE IF NOT EXISTS nodes (
    project TEXT NOT NULL,
    zone TEXT NOT NULL,
    node_id TEXT NOT NULL,
    uid TEXT NOT NULL,
    generation TEXT NOT NULL,
    accelerator_type TEXT NOT NULL,
    topology TEXT NOT NULL,
    chips INTEGER NOT NULL,
    hosts INTEGER NOT NULL,
    quota_units INTEGER NOT NULL,
    capacity_class TEXT NOT NULL,          -- on_demand | preemptible | reserved
    reservation TEXT,
    state TEXT NOT NULL,
    next_state TEXT,
    due_at REAL,
    op_name TEXT,
    create_time REAL NOT NULL,
    ready_time REAL,
    spec TEXT NOT NULL,                    -- JSON: the request fields kept as given
    endpoints TEXT,                        -- JSON override of networkEndpoints (admin API)
    queued_resource TEXT,                  -- the QR id that made it
    multislice INTEGER NOT NULL DEFAULT 0,
    preempt_at REAL,                       -- when a preemption starts
    preempt_notice INTEGER NOT NULL DEFAULT 1,
    preempt_entry INTEGER,                 -- the schedule entry that set preempt_at, if any
    preempted_flag INTEGER NOT NULL DEFAULT 0,  -- metadata instance/preempted
    kill_at REAL,                          -- end of the preemption grace period
    host_base INTEGER,                     -- host N's address is layout.host_address(host_base + N)
    surface TEXT NOT NULL DEFAULT 'tpu',   -- 'tpu': a TPU API node; 'compute': a Compute Engine slice
    maintenance_event TEXT,                -- metadata instance/maintenance-event (NULL: NONE)
    maintenance_at REAL,                   -- when a noticed host maintenance stops the VMs
    maintenance_until REAL,                -- when a maintained (REPAIRING) node's VMs are back
    PRIMARY KEY (project, zone, node_id)
);

CREATE TABLE IF NOT EXISTS operations (
    project TEXT NOT NULL,
    zone TEXT NOT NULL,
    op_id TEXT NOT NULL,
    target TEXT NOT NULL,
    verb TEXT NOT NULL,
    create_time REAL NOT NULL,
    end_time REAL,
    done INTEGER NOT NULL DEFAULT 0,
    due_at REAL,                           -- completes on its own at this time (stockouts)
    error TEXT,                            -- JSON google.rpc.Status once done (or pending, with due_at)
    response TEXT,                         -- JSON resource (with @type) once done
    PRIMARY KEY (project, zone, op_id)
);

CREATE TABLE IF NOT EXISTS queued_resources (
    project TEXT NOT NULL,
    zone TEXT NOT NULL,
    qr_id TEXT NOT NULL,
    spec TEXT NOT NULL,                    -- JSON: the request body as given (normalized)
    plan TEXT NOT NULL,                    -- JSON: the nodes it makes [{node_id, accelerator_type, ...}]
    capacity_class TEXT NOT NULL,
    reservation TEXT,
    state TEXT NOT NULL,
    state_initiator TEXT NOT NULL,
    create_time REAL NOT NULL,
    valid_after REAL,
    valid_until REAL,
    error TEXT,                            -- JSON google.rpc.Status when FAILED
    op_name TEXT,                          -- the delete operation while DELETING
    PRIMARY KEY (project, zone, qr_id)
);

CREATE TABLE IF NOT EXISTS request_ids (
    project TEXT NOT NULL,
    request_id TEXT NOT NULL,
    op_name TEXT NOT NULL,
    PRIMARY KEY (project, request_id)
);

-- OS Login: the SSH keys imported for a user (oslogin v1 users.importSshPublicKey).
CREATE TABLE IF NOT EXISTS oslogin_keys (
    email TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    key TEXT NOT NULL,
    expires_usec INTEGER,                  -- expirationTimeUsec; NULL: never expires
    PRIMARY KEY (email, fingerprint)
);

CREATE TABLE IF NOT EXISTS stockouts (zone TEXT PRIMARY KEY, since REAL NOT NULL);

-- Every slice deletion and how it came (tpuctl.sim.deletions): 'api' (principal: the caller or a host's
-- service account) or 'scheduled termination' (Compute Engine's terminationTime / maxRunDuration).
CREATE TABLE IF NOT EXISTS deletions (
    at REAL NOT NULL,
    project TEXT NOT NULL,
    zone TEXT NOT NULL,
    name TEXT NOT NULL,
    resource TEXT NOT NULL,
    path TEXT NOT NULL,
    principal TEXT,
    reason TEXT
);

CREATE TABLE IF NOT EXISTS schedule_fired (entry INTEGER PRIMARY KEY, fired INTEGER NOT NULL);

-- Compute Engine operations (zonal, regional or global: location is 'zones/Z', 'regions/R' or
-- 'global'). One is DONE once end_time is set; with done_at it completes on its own then (with error).
CREATE TABLE IF NOT EXISTS compute_operations (
    project TEXT NOT NULL,
    location TEXT NOT NULL,
    name TEXT NOT NULL,
    id TEXT NOT NULL,
    operation_type TEXT NOT NULL,
    target_link TEXT NOT NULL,
    target_id TEXT,
    insert_time REAL NOT NULL,
    done_at REAL,
    end_time REAL,
    error TEXT,                            -- JSON {"http": [code, message], "errors": [...]}
    status_message TEXT,
    PRIMARY KEY (project, location, name)
);

-- Compute Engine resources: instances, instanceGroupManagers (zonal), resourcePolicies (regional),
-- instanceTemplates (global). A VM's instance points at the node row of its slice (node_id, worker).
CREATE TABLE IF NOT EXISTS compute_resources (
    project TEXT NOT NULL,
    location TEXT NOT NULL,
    collection TEXT NOT NULL,
    name TEXT NOT NULL,
    id TEXT NOT NULL,
    creation_time REAL NOT NULL,
    body TEXT NOT NULL,                    -- JSON: the resource as the request gave it (normalized)
    node_id TEXT,                          -- the slice's node row (instances and MIGs), once placed
    worker INTEGER,                        -- an instance's host in its slice
    status TEXT,                           -- an instance's status when not derived from its node row
    op_name TEXT,                          -- the operation that completes with this resource's work
    deadline REAL,                         -- flex-start: when waiting for capacity gives up
    extra TEXT NOT NULL DEFAULT '{}',      -- JSON: per-collection state (a MIG's names, last error)
    PRIMARY KEY (project, location, collection, name)
);
"""

#: Tables cleared by a reset (meta keeps the world).
STATE_TABLES = (
    "nodes",
    "operations",
    "queued_resources",
    "request_ids",
    "oslogin_keys",
    "stockouts",
    "schedule_fired",
    "compute_operations",
    "compute_resources",
)


def db_path_for(state_dir: Path) -> Path:
    return Path(state_dir) / "sim" / "sim.db"


class SimDatabase:
    """The SQLite file and the one connection this process uses to reach it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # The state dir may hold a user's pods and runs: owner-only, as the ledger's.
        os.chmod(path.parent, 0o700)
        if not path.exists():
            # Create the file ourselves so it is 0600 from the start (sqlite would honour the umask).
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        os.chmod(path, 0o600)
        # isolation_level=None: we issue BEGIN ourselves, so the transaction kind is ours to choose.
        self._conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._conn.execute("PRAGMA busy_timeout = 30000")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._create_schema()

    def _create_schema(self) -> None:
        with self._lock:
            # executescript commits any open transaction itself; the statements are idempotent, so
            # two processes creating the schema at once is harmless.
            self._conn.executescript(_SCHEMA)
            columns = {r["name"] for r in self._conn.execute("PRAGMA table_info(nodes)").fetchall()}
            if "host_base" not in columns:
                # A state made before hosts had addresses of their own: its nodes keep 127.0.0.1.
                with contextlib.suppress(sqlite3.OperationalError):  # another process added it first
                    self._conn.execute("ALTER TABLE nodes ADD COLUMN host_base INTEGER")
            if "surface" not in columns:
                # A state made before Compute Engine slices: every node is a TPU API node.
                with contextlib.suppress(sqlite3.OperationalError):
                    self._conn.execute("ALTER TABLE nodes ADD COLUMN surface TEXT NOT NULL DEFAULT 'tpu'")
            for column in ("maintenance_event TEXT", "maintenance_at REAL", "maintenance_until REAL"):
                if column.split()[0] not in columns:
                    # A state made before host maintenance was simulated: no node is being maintained.
                    with contextlib.suppress(sqlite3.OperationalError):
                        self._conn.execute(f"ALTER TABLE nodes ADD COLUMN {column}")
            keys = {r["name"] for r in self._conn.execute("PRAGMA table_info(oslogin_keys)").fetchall()}
            if "expires_usec" not in keys:
                # A state made before imported keys could expire: its keys never do.
                with contextlib.suppress(sqlite3.OperationalError):
                    self._conn.execute("ALTER TABLE oslogin_keys ADD COLUMN expires_usec INTEGER")
            with self.write() as conn:
                conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
                conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('host_address_offset', ?)",
                    (str(address_offset(self.path.parent.parent)),),
                )

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: BEGIN IMMEDIATE takes the database's write lock up front."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: one consistent snapshot for several queries. Inside a write transaction
        (same thread, lock held) it simply joins that transaction."""
        with self._lock:
            if self._conn.in_transaction:
                yield self._conn
                return
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                self._conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
