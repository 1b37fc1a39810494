"""The simulated TPU cloud's behaviour: nodes, queued resources, operations, quota, capacity and
preemption, over the SQLite state in ``state.py``.

Time-driven behaviour is computed lazily: every request first calls ``advance(now)``, which applies
every transition whose time has come (CREATING -> READY, DELETING -> gone, preemptions, queued
resources finding capacity...) from the timestamps stored in the database. So the state is right in
each separate CLI invocation with no daemon running; while a server is up, its ticker thread calls
``advance`` as well, so that preemption grace periods end (and SIGKILLs land) on time.

Each method that changes anything runs in one ``BEGIN IMMEDIATE`` transaction: checks (quota,
capacity, name clashes) and the write they guard are atomic even across processes. Signals to host
processes are sent after the transaction commits.
"""

from __future__ import annotations

import fnmatch
import json
import random
import secrets
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from tpuctl import processes
from tpuctl.catalog import AcceleratorType, CapacityType, Catalog, Generation
from tpuctl.errors import TpuctlError
from tpuctl.sim.api_errors import (
    ApiError,
    already_exists,
    eid,
    failed_precondition,
    invalid_argument,
    not_found,
    rpc_status,
)
from tpuctl.sim.shapes import (
    accelerator_type_json,
    location_json,
    node_name,
    node_uid,
    qr_name,
    quota_error,
    quota_info_json,
    size_for_topology,
    split_op_name,
    validity_window,
)
from tpuctl.sim.state import STATE_TABLES, SimDatabase
from tpuctl.sim.wire import (
    ACCELERATOR_TYPE_ENUM,
    EMPTY_TYPE,
    NODE_OPERATION_METADATA_TYPE,
    NODE_TYPE,
    QUEUED_RESOURCE_TYPE,
    check_labels,
    check_resource_id,
    check_zone,
    paginate,
    rfc3339,
)
from tpuctl.sim.world import CapacityClass, Faults, PoolClass, World, region_of

Clock = Callable[[], float]

#: The node fields kept as the request gave them and echoed back.
_KEPT_NODE_FIELDS = (
    "description",
    "runtimeVersion",
    "networkConfig",
    "networkConfigs",
    "cidrBlock",
    "serviceAccount",
    "schedulingConfig",
    "labels",
    "metadata",
    "tags",
    "dataDisks",
    "shieldedInstanceConfig",
)
_UPDATABLE_NODE_FIELDS = {"description", "labels", "metadata", "tags"}

#: Queued-resource states in which the service still has work to do for it.
_QR_PENDING_STATES = ("ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "SUSPENDING", "DELETING")
#: Queued-resource states whose quota stays consumed until the QR is deleted (GCP behaviour).
_QR_QUOTA_HOLDING_STATES = ("SUSPENDED", "FAILED")

#: Runtime versions offered in every zone besides each generation's default (GCP lists many more).
_COMMON_RUNTIME_VERSIONS = ("tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-tf-2.16.1-pjrt")

# Old private name, still probed by a workaround in tests/cloud/test_cloud_tpu_api_sim.py for the int64
# overflow fixed in shapes.node_uid; remove once that workaround is gone.
_node_uid = node_uid

DEFAULT_ENDPOINT_PORT = 8470
DEFAULT_ENDPOINT_IP = "127.0.0.1"


@dataclass(frozen=True)
class SignalOrder:
    """A signal to send to a registered host process once the transaction that decided it commits."""

    pid: int
    start_ticks: int | None
    sig: signal.Signals


@dataclass(frozen=True)
class NodePlan:
    """A node to create, parsed and validated from a request."""

    node_id: str
    accel: AcceleratorType
    capacity_class: CapacityClass
    reservation: str | None  # a named reservation (queued resources); None = any (reserved nodes)
    spec: dict[str, Any]
    multislice: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "accelerator_type": self.accel.api_name,
            "capacity_class": self.capacity_class,
            "reservation": self.reservation,
            "spec": self.spec,
            "multislice": self.multislice,
        }


@dataclass
class _Demand:
    """Chips and quota units one request needs, per (generation, capacity class)."""

    chips: dict[tuple[str, CapacityClass], int] = field(default_factory=dict)
    units: dict[tuple[str, CapacityClass], int] = field(default_factory=dict)

    def add(self, accel: AcceleratorType, capacity_class: CapacityClass) -> None:
        key = (accel.generation.name, capacity_class)
        self.chips[key] = self.chips.get(key, 0) + accel.chips
        self.units[key] = self.units.get(key, 0) + accel.quota_units


class SimEngine:
    """Everything the simulated cloud does. Thread-safe; several engines may share one database file."""

    def __init__(self, db: SimDatabase, *, clock: Clock = time.time, catalog: Catalog | None = None) -> None:
        self.db = db
        self.clock = clock
        self.catalog = catalog or Catalog.load()
        self._world: World | None = None
        self._world_version = -1
        self._world_lock = threading.Lock()

    # =============================================================================================
    # World and faults
    # =============================================================================================

    def install_world(self, world: World | None) -> World:
        """Make ``world`` the one in force (persisted in the state), or with None keep the persisted one
        (the default world on first start). A different world replaces the old one; state is kept."""
        from tpuctl.sim.world import default_world

        now = self.clock()
        with self.db.write() as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'world'").fetchone()
            if world is None:
                world = World.model_validate_json(row["value"]) if row is not None else default_world()
            encoded = world.model_dump_json()
            if row is None or row["value"] != encoded:
                self._store_world(conn, encoded)
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('epoch', ?)", (repr(now),))
            version = self._meta_int(conn, "world_version")
        with self._world_lock:
            self._world = world
            self._world_version = version
        return world

    def _store_world(self, conn: sqlite3.Connection, encoded: str) -> None:
        version = self._meta_int(conn, "world_version") + 1
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('world', ?)", (encoded,))
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('world_version', ?)", (str(version),))
        # Runtime fault overrides and schedule counts belonged to the old world.
        conn.execute("DELETE FROM meta WHERE key = 'faults'")
        conn.execute("DELETE FROM schedule_fired")

    @staticmethod
    def _meta_int(conn: sqlite3.Connection, key: str) -> int:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return int(row["value"]) if row is not None else 0

    @property
    def world(self) -> World:
        """The world in force; re-read when another process replaced it (sim reset with a new world)."""
        with self.db.read() as conn:
            version = self._meta_int(conn, "world_version")
            if version != self._world_version or self._world is None:
                row = conn.execute("SELECT value FROM meta WHERE key = 'world'").fetchone()
                if row is None:
                    raise TpuctlError("the simulator's state has no world; start it with SimServer")
                with self._world_lock:
                    self._world = World.model_validate_json(row["value"])
                    self._world_version = version
        assert self._world is not None
        return self._world

    def faults(self) -> Faults:
        """The fault rates in force: the world's, unless changed at runtime (admin API)."""
        world = self.world
        with self.db.read() as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'faults'").fetchone()
        return Faults.model_validate_json(row["value"]) if row is not None else world.faults

    def set_faults(
        self, *, transient_error_rate: float | None = None, ambiguous_error_rate: float | None = None
    ) -> Faults:
        current = self.faults()
        updated = Faults(
            transient_error_rate=current.transient_error_rate
            if transient_error_rate is None
            else transient_error_rate,
            ambiguous_error_rate=current.ambiguous_error_rate
            if ambiguous_error_rate is None
            else ambiguous_error_rate,
        )
        with self.db.write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('faults', ?)", (updated.model_dump_json(),)
            )
        return updated

    # =============================================================================================
    # Time
    # =============================================================================================

    def advance(self, now: float | None = None) -> None:
        """Apply every transition due by ``now`` (default: the clock). Cheap when nothing is due."""
        now = self.clock() if now is None else now
        if not self._anything_due(now):
            return
        world = self.world
        orders: list[SignalOrder] = []
        with self.db.write() as conn:
            self._advance_in(conn, world, now, orders)
        self._send(orders)

    def _anything_due(self, now: float) -> bool:
        with self.db.read() as conn:
            row = conn.execute(
                """
                SELECT
                  EXISTS(SELECT 1 FROM nodes WHERE due_at <= :now OR preempt_at <= :now OR kill_at <= :now)
                  OR EXISTS(SELECT 1 FROM operations WHERE done = 0 AND due_at <= :now)
                  OR EXISTS(SELECT 1 FROM queued_resources WHERE state IN
                            ('ACCEPTED', 'WAITING_FOR_RESOURCES', 'PROVISIONING', 'SUSPENDING', 'DELETING'))
                """,
                {"now": now},
            ).fetchone()
        return bool(row[0])

    def _advance_in(
        self, conn: sqlite3.Connection, world: World, now: float, orders: list[SignalOrder]
    ) -> None:
        # 1. Operations that fail on their own (stockouts).
        conn.execute(
            "UPDATE operations SET done = 1, end_time = due_at, due_at = NULL WHERE done = 0 AND due_at <= ?",
            (now,),
        )
        # 2. Node transitions, in the order they fell due.
        for row in conn.execute("SELECT * FROM nodes WHERE due_at <= ? ORDER BY due_at", (now,)).fetchall():
            self._finish_transition(conn, world, row, orders)
        # 3. Preemptions that start, then 4. grace periods that end. A long gap between requests can
        # make both due in one pass; the order keeps them in time order.
        for row in conn.execute(
            "SELECT * FROM nodes WHERE preempt_at <= ? ORDER BY preempt_at", (now,)
        ).fetchall():
            self._start_preemption(conn, world, row, orders)
        for row in conn.execute("SELECT * FROM nodes WHERE kill_at <= ? ORDER BY kill_at", (now,)).fetchall():
            self._finish_preemption(conn, row, orders)
        # 5. Queued resources, oldest first (first come, first served for freed capacity).
        for row in conn.execute(
            f"SELECT * FROM queued_resources WHERE state IN ({_placeholders(_QR_PENDING_STATES)}) "
            "ORDER BY create_time",
            _QR_PENDING_STATES,
        ).fetchall():
            self._advance_queued_resource(conn, world, row, now)

    def _finish_transition(
        self, conn: sqlite3.Connection, world: World, row: sqlite3.Row, orders: list[SignalOrder]
    ) -> None:
        key = (row["project"], row["zone"], row["node_id"])
        at = float(row["due_at"])
        next_state = row["next_state"]
        if next_state == "GONE":
            orders.extend(self._host_signals(conn, *key, signal.SIGKILL))
            conn.execute("DELETE FROM hosts WHERE project = ? AND zone = ? AND node_id = ?", key)
            conn.execute("DELETE FROM nodes WHERE project = ? AND zone = ? AND node_id = ?", key)
            if row["op_name"]:
                self._complete_op(conn, row["op_name"], at, response={"@type": EMPTY_TYPE})
            return
        updates: dict[str, Any] = {"state": next_state, "next_state": None, "due_at": None, "op_name": None}
        if next_state == "READY":
            updates["ready_time"] = at
            updates.update(self._preemption_plan(conn, world, row, at))
        if next_state == "STOPPED":
            # A stopped VM's processes are gone, as on GCP.
            orders.extend(self._host_signals(conn, *key, signal.SIGKILL))
        self._update_node(conn, key, updates)
        if row["op_name"]:
            node = self._node_json(self._existing_node_row(conn, *key))
            self._complete_op(conn, row["op_name"], at, response={"@type": NODE_TYPE, **node})

    def _preemption_plan(
        self, conn: sqlite3.Connection, world: World, row: sqlite3.Row, ready_at: float
    ) -> dict[str, Any]:
        """When (if ever) a node that becomes READY at ``ready_at`` will be preempted: the earliest of a
        random draw (spot/preemptible nodes, world rate) and the schedule entries that match it."""
        candidates: list[tuple[float, bool, int | None]] = []
        model = world.preemption
        if row["capacity_class"] == "preemptible" and model.rate_per_hour > 0:
            # Seeded by the world seed and the node's unique id (and when it became READY, so a
            # restarted node draws afresh): replayable, yet independent between nodes.
            rng = random.Random(f"{world.seed}:{row['uid']}:{ready_at!r}")
            delay_sim_s = rng.expovariate(model.rate_per_hour / 3600.0)
            candidates.append((ready_at + world.real_seconds(delay_sim_s), model.notice, None))
        for index, entry in enumerate(model.schedule):
            if entry.zone is not None and entry.zone != row["zone"]:
                continue
            if not fnmatch.fnmatchcase(row["node_id"], entry.node):
                continue
            if self._schedule_fired(conn, index) >= entry.count:
                continue
            candidates.append((ready_at + world.real_seconds(entry.after_s), entry.notice, index))
        if not candidates:
            return {"preempt_at": None, "preempt_entry": None}
        at, notice, entry_index = min(candidates, key=lambda c: c[0])
        return {"preempt_at": at, "preempt_notice": int(notice), "preempt_entry": entry_index}

    @staticmethod
    def _schedule_fired(conn: sqlite3.Connection, index: int) -> int:
        row = conn.execute("SELECT fired FROM schedule_fired WHERE entry = ?", (index,)).fetchone()
        return int(row["fired"]) if row is not None else 0

    def _start_preemption(
        self, conn: sqlite3.Connection, world: World, row: sqlite3.Row, orders: list[SignalOrder]
    ) -> None:
        key = (row["project"], row["zone"], row["node_id"])
        at = float(row["preempt_at"])
        if row["state"] != "READY":
            self._update_node(conn, key, {"preempt_at": None, "preempt_entry": None})
            return
        entry = row["preempt_entry"]
        if entry is not None:
            if entry >= len(world.preemption.schedule) or self._schedule_fired(conn, entry) >= (
                world.preemption.schedule[entry].count
            ):
                # Another node used up this entry first.
                self._update_node(conn, key, {"preempt_at": None, "preempt_entry": None})
                return
            conn.execute(
                "INSERT INTO schedule_fired (entry, fired) VALUES (?, 1) "
                "ON CONFLICT(entry) DO UPDATE SET fired = fired + 1",
                (entry,),
            )
        grace = world.real_seconds(world.durations.preemption_grace_s)
        if row["preempt_notice"] and grace > 0:
            # Notice: the metadata flag turns TRUE and the hosts get SIGTERM; the node stays READY until
            # the grace period ends (Compute Engine's ACPI soft-off, then hard-off).
            orders.extend(self._host_signals(conn, *key, signal.SIGTERM))
            self._update_node(
                conn,
                key,
                {"preempt_at": None, "preempt_entry": None, "preempted_flag": 1, "kill_at": at + grace},
            )
            self._suspend_queued_resource(conn, row, "SUSPENDING")
        else:
            self._update_node(conn, key, {"preempt_at": None, "preempt_entry": None, "preempted_flag": 1})
            self._finish_preemption(conn, self._existing_node_row(conn, *key), orders)

    def _finish_preemption(
        self, conn: sqlite3.Connection, row: sqlite3.Row, orders: list[SignalOrder]
    ) -> None:
        key = (row["project"], row["zone"], row["node_id"])
        orders.extend(self._host_signals(conn, *key, signal.SIGKILL))
        updates: dict[str, Any] = {"kill_at": None, "preempted_flag": 1}
        if row["state"] == "READY":
            updates["state"] = "PREEMPTED"
        self._update_node(conn, key, updates)
        self._suspend_queued_resource(conn, row, "SUSPENDED")

    def _suspend_queued_resource(self, conn: sqlite3.Connection, node: sqlite3.Row, state: str) -> None:
        if not node["queued_resource"]:
            return
        qr_key = (node["project"], node["zone"], node["queued_resource"])
        qr = conn.execute(
            "SELECT state FROM queued_resources WHERE project = ? AND zone = ? AND qr_id = ?", qr_key
        ).fetchone()
        if qr is None or qr["state"] in ("DELETING", "SUSPENDED"):
            return
        if state == "SUSPENDED":
            # Still SUSPENDING while another of its nodes is in its grace period.
            busy = conn.execute(
                "SELECT 1 FROM nodes WHERE project = ? AND zone = ? AND queued_resource = ? "
                "AND kill_at IS NOT NULL",
                qr_key,
            ).fetchone()
            if busy is not None:
                state = "SUSPENDING"
        conn.execute(
            "UPDATE queued_resources SET state = ?, state_initiator = 'SERVICE' "
            "WHERE project = ? AND zone = ? AND qr_id = ?",
            (state, *qr_key),
        )

    def _advance_queued_resource(
        self, conn: sqlite3.Connection, world: World, row: sqlite3.Row, now: float
    ) -> None:
        key = (row["project"], row["zone"], row["qr_id"])
        state = row["state"]
        nodes = conn.execute(
            "SELECT * FROM nodes WHERE project = ? AND zone = ? AND queued_resource = ?", key
        ).fetchall()
        if state == "DELETING":
            if not nodes:
                conn.execute("DELETE FROM queued_resources WHERE project = ? AND zone = ? AND qr_id = ?", key)
                if row["op_name"]:
                    self._complete_op(conn, row["op_name"], now, response={"@type": EMPTY_TYPE})
            return
        if state == "SUSPENDING":
            if not any(n["kill_at"] is not None for n in nodes):
                self._set_qr_state(conn, key, "SUSPENDED", "SERVICE")
            return
        if state == "PROVISIONING":
            plan = json.loads(row["plan"])
            if len(nodes) < len(plan):
                # Someone deleted one of its nodes before it was ready: it can never become ACTIVE.
                message = "A node of the queued resource was deleted while it was being provisioned."
                self._fail_queued_resource(conn, key, rpc_status("ABORTED", message))
            elif all(n["state"] == "READY" for n in nodes):
                self._set_qr_state(conn, key, "ACTIVE", "SERVICE")
            return
        # ACCEPTED or WAITING_FOR_RESOURCES.
        if row["valid_until"] is not None and now >= float(row["valid_until"]):
            message = (
                f"The queued resource could not be provisioned before its validUntil time "
                f"({rfc3339(float(row['valid_until']))}): there is no more capacity in the zone "
                f'"{row["zone"]}" for it. {eid()}'
            )
            self._fail_queued_resource(conn, key, rpc_status("RESOURCE_EXHAUSTED", message))
            return
        if row["valid_after"] is not None and now < float(row["valid_after"]):
            return
        plans = [self._plan_from_json(p) for p in json.loads(row["plan"])]
        try:
            self._check_quota(conn, world, row["project"], row["zone"], plans)
        except ApiError as exc:
            self._fail_queued_resource(conn, key, rpc_status("RESOURCE_EXHAUSTED", exc.message))
            return
        for plan in plans:
            if self._node_row(conn, row["project"], row["zone"], plan.node_id) is not None:
                name = node_name(row["project"], row["zone"], plan.node_id)
                self._fail_queued_resource(
                    conn, key, rpc_status("ALREADY_EXISTS", f"Resource '{name}' already exists")
                )
                return
        placement = self._place(conn, world, row["zone"], plans)
        if placement is None:
            if state != "WAITING_FOR_RESOURCES":
                self._set_qr_state(conn, key, "WAITING_FOR_RESOURCES", "SERVICE")
            return
        due = now + world.real_seconds(world.durations.queued_provision_s)
        for plan, reservation in zip(plans, placement, strict=True):
            self._insert_node(
                conn,
                row["project"],
                row["zone"],
                plan,
                reservation,
                now,
                due,
                op_name=None,
                queued_resource=row["qr_id"],
            )
        self._set_qr_state(conn, key, "PROVISIONING", "SERVICE")

    def _fail_queued_resource(
        self, conn: sqlite3.Connection, key: tuple[str, str, str], error: dict[str, Any]
    ) -> None:
        conn.execute(
            "UPDATE queued_resources SET state = 'FAILED', state_initiator = 'SERVICE', error = ? "
            "WHERE project = ? AND zone = ? AND qr_id = ?",
            (json.dumps(error), *key),
        )

    @staticmethod
    def _set_qr_state(
        conn: sqlite3.Connection, key: tuple[str, str, str], state: str, initiator: str
    ) -> None:
        conn.execute(
            "UPDATE queued_resources SET state = ?, state_initiator = ? "
            "WHERE project = ? AND zone = ? AND qr_id = ?",
            (state, initiator, *key),
        )

    def _host_signals(
        self, conn: sqlite3.Connection, project: str, zone: str, node_id: str, sig: signal.Signals
    ) -> list[SignalOrder]:
        rows = conn.execute(
            "SELECT pid, start_ticks FROM hosts WHERE project = ? AND zone = ? AND node_id = ? "
            "ORDER BY worker",
            (project, zone, node_id),
        ).fetchall()
        return [SignalOrder(int(r["pid"]), r["start_ticks"], sig) for r in rows]

    @staticmethod
    def _send(orders: Iterable[SignalOrder]) -> None:
        for order in orders:
            processes.signal_registered(order.pid, order.start_ticks, order.sig)

    # =============================================================================================
    # Quota and capacity
    # =============================================================================================

    def _quota_usage(
        self, conn: sqlite3.Connection, project: str, generation: str, capacity_class: str, location: str
    ) -> int:
        is_zone = location.count("-") >= 2
        where = "n.zone = ?" if is_zone else "n.zone LIKE ?"
        pattern = location if is_zone else f"{location}-%"
        holding = _placeholders(_QR_QUOTA_HOLDING_STATES)
        # Nodes in any state count; nodes of a SUSPENDED/FAILED queued resource are counted through
        # their queued resource (its whole request) instead, so nothing counts twice.
        row = conn.execute(
            f"""
            SELECT COALESCE(SUM(n.quota_units), 0) FROM nodes n
            WHERE n.project = ? AND n.generation = ? AND n.capacity_class = ? AND {where}
              AND NOT EXISTS (SELECT 1 FROM queued_resources q
                              WHERE q.project = n.project AND q.zone = n.zone AND q.qr_id = n.queued_resource
                                AND q.state IN ({holding}))
            """,
            (project, generation, capacity_class, pattern, *_QR_QUOTA_HOLDING_STATES),
        ).fetchone()
        used = int(row[0])
        qr_where = "zone = ?" if is_zone else "zone LIKE ?"
        for qr in conn.execute(
            f"SELECT plan FROM queued_resources WHERE project = ? AND {qr_where} AND state IN ({holding})",
            (project, pattern, *_QR_QUOTA_HOLDING_STATES),
        ).fetchall():
            for item in json.loads(qr["plan"]):
                plan = self._plan_from_json(item)
                if plan.accel.generation.name == generation and plan.capacity_class == capacity_class:
                    used += plan.accel.quota_units
        return used

    def _check_quota(
        self, conn: sqlite3.Connection, world: World, project: str, zone: str, plans: list[NodePlan]
    ) -> None:
        """Raise the 429 RESOURCE_EXHAUSTED GCP answers when ``plans`` would exceed a zone or region quota."""
        demand = _Demand()
        for plan in plans:
            demand.add(plan.accel, plan.capacity_class)
        violations: list[tuple[str, int, str, str, int]] = []  # quota id, limit, scope, location, usage
        for (gen_name, capacity_class), units in sorted(demand.units.items()):
            if capacity_class == "reserved":
                continue  # reserved capacity draws on its reservation, not on a quota
            gen = self.catalog.generations[gen_name]
            capacity = CapacityType.ON_DEMAND if capacity_class == "on_demand" else CapacityType.PREEMPTIBLE
            for scope, location in (("region", region_of(zone)), ("zone", zone)):
                limit = world.quota_limit(gen_name, capacity_class, location)  # type: ignore[arg-type]
                if limit < 0:
                    continue
                used = self._quota_usage(conn, project, gen_name, capacity_class, location)
                if used + units > limit:
                    quota_id = gen.quota_id(capacity, scope) or ""
                    violations.append((quota_id, limit, scope, location, used))
        if violations:
            raise quota_error(project, violations)

    def _pool_in_use(self, conn: sqlite3.Connection, zone: str, generation: str, capacity_class: str) -> int:
        row = conn.execute(
            "SELECT COALESCE(SUM(chips), 0) FROM nodes WHERE zone = ? AND generation = ? "
            "AND capacity_class = ? AND state != 'PREEMPTED'",
            (zone, generation, capacity_class),
        ).fetchone()
        return int(row[0])

    def _reservation_in_use(self, conn: sqlite3.Connection, name: str) -> int:
        row = conn.execute(
            "SELECT COALESCE(SUM(chips), 0) FROM nodes WHERE reservation = ? AND state != 'PREEMPTED'",
            (name,),
        ).fetchone()
        return int(row[0])

    def _is_stocked_out(self, conn: sqlite3.Connection, zone: str) -> bool:
        return conn.execute("SELECT 1 FROM stockouts WHERE zone = ?", (zone,)).fetchone() is not None

    def _place(
        self, conn: sqlite3.Connection, world: World, zone: str, plans: list[NodePlan]
    ) -> list[str | None] | None:
        """Room for all of ``plans`` at once? Returns each plan's reservation (None for pool capacity), or
        None when they do not all fit (all or nothing, as a multislice request)."""
        pool_need: dict[tuple[str, PoolClass], int] = {}
        reserved_need: dict[tuple[str | None, str], int] = {}  # (named reservation or None, generation)
        for plan in plans:
            gen = plan.accel.generation.name
            if plan.capacity_class == "reserved":
                rkey = (plan.reservation, gen)
                reserved_need[rkey] = reserved_need.get(rkey, 0) + plan.accel.chips
            else:
                pkey: tuple[str, PoolClass] = (gen, plan.capacity_class)
                pool_need[pkey] = pool_need.get(pkey, 0) + plan.accel.chips
        stocked_out = self._is_stocked_out(conn, zone)
        for (gen, pool), chips in pool_need.items():
            free = (
                0
                if stocked_out
                else world.pool_chips(zone, gen, pool) - self._pool_in_use(conn, zone, gen, pool)
            )
            if chips > free:
                return None
        chosen: dict[tuple[str | None, str], str] = {}
        for (named, gen), chips in reserved_need.items():
            candidates = (
                [r for r in world.reservations if r.name == named]
                if named is not None
                else [r for r in world.reservations if r.zone == zone and r.generation == gen]
            )
            fit = next(
                (r for r in candidates if r.chips - self._reservation_in_use(conn, r.name) >= chips), None
            )
            if fit is None:
                return None
            chosen[(named, gen)] = fit.name
        return [
            chosen[(p.reservation, p.accel.generation.name)] if p.capacity_class == "reserved" else None
            for p in plans
        ]

    # =============================================================================================
    # Nodes
    # =============================================================================================

    def create_node(self, project: str, zone: str, node_id: str, body: dict[str, Any]) -> dict[str, Any]:
        check_zone(zone)
        check_resource_id(node_id, "nodeId")
        now = self.clock()
        self.advance(now)
        world = self.world
        plan = self._parse_node(project, zone, node_id, body, field_prefix="node", world=world)
        with self.db.write() as conn:
            if self._node_row(conn, project, zone, node_id) is not None:
                raise already_exists(node_name(project, zone, node_id))
            self._check_quota(conn, world, project, zone, [plan])
            placement = self._place(conn, world, zone, [plan])
            target = node_name(project, zone, node_id)
            if placement is None:
                if plan.capacity_class == "reserved":
                    message = (
                        "Insufficient reserved capacity. Contact customer support to increase your "
                        f"reservation. {eid()}"
                    )
                else:
                    message = (
                        f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
                        "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) "
                        f"{eid()}"
                    )
                due = now + world.real_seconds(world.durations.stockout_s)
                op_name = self._insert_op(
                    conn,
                    project,
                    zone,
                    target,
                    "create",
                    now,
                    due_at=due,
                    error=rpc_status("RESOURCE_EXHAUSTED", message),
                )
            else:
                op_name = self._insert_op(conn, project, zone, target, "create", now)
                due = now + world.real_seconds(world.durations.node_create_s)
                self._insert_node(conn, project, zone, plan, placement[0], now, due, op_name=op_name)
            op = self._op_json(self._op_row(conn, op_name))
        self.advance()  # zero durations complete at once
        return op

    def _insert_node(
        self,
        conn: sqlite3.Connection,
        project: str,
        zone: str,
        plan: NodePlan,
        reservation: str | None,
        now: float,
        due: float,
        *,
        op_name: str | None,
        queued_resource: str | None = None,
    ) -> None:
        accel = plan.accel
        conn.execute(
            """
            INSERT INTO nodes (project, zone, node_id, uid, generation, accelerator_type, topology, chips,
                               hosts, quota_units, capacity_class, reservation, state, next_state, due_at,
                               op_name, create_time, spec, queued_resource, multislice)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'CREATING', 'READY', ?, ?, ?, ?, ?, ?)
            """,
            (
                project,
                zone,
                plan.node_id,
                node_uid(self.world.seed, project, zone, plan.node_id, now),
                accel.generation.name,
                accel.api_name,
                accel.topology,
                accel.chips,
                accel.hosts,
                accel.quota_units,
                plan.capacity_class,
                reservation,
                due,
                op_name,
                now,
                json.dumps(plan.spec),
                queued_resource,
                int(plan.multislice),
            ),
        )

    def get_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        check_zone(zone)
        self.advance()
        with self.db.read() as conn:
            row = self._node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(node_name(project, zone, node_id))
            return self._node_json(row)

    def list_nodes(self, project: str, zone: str, page_size: int = 0, page_token: str = "") -> dict[str, Any]:
        check_zone(zone, allow_all=True)
        self.advance()
        with self.db.read() as conn:
            rows = self._rows_in(conn, "nodes", project, zone, "node_id")
            nodes = [self._node_json(r) for r in rows]
        page, token = paginate(nodes, page_size, page_token)
        out: dict[str, Any] = {"nodes": page, "unreachable": []}
        if token:
            out["nextPageToken"] = token
        return out

    def delete_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        check_zone(zone)
        now = self.clock()
        self.advance(now)
        world = self.world
        with self.db.write() as conn:
            row = self._node_row(conn, project, zone, node_id)
            name = node_name(project, zone, node_id)
            if row is None:
                raise not_found(name)
            if row["state"] == "DELETING" and row["op_name"]:
                # Deleting again while a delete runs: the same operation (so a retried delete is harmless).
                return self._op_json(self._op_row(conn, row["op_name"]))
            op_name = self._start_node_delete(conn, world, row, now)
            op = self._op_json(self._op_row(conn, op_name))
        self.advance()
        return op

    def _start_node_delete(self, conn: sqlite3.Connection, world: World, row: sqlite3.Row, now: float) -> str:
        key = (row["project"], row["zone"], row["node_id"])
        if row["op_name"]:
            # The create (or stop/start) it interrupts ends with an error, as on GCP.
            self._complete_op(
                conn,
                row["op_name"],
                now,
                error=rpc_status("ABORTED", "The operation was aborted: the node is being deleted."),
            )
        op_name = self._insert_op(conn, key[0], key[1], node_name(*key), "delete", now)
        self._update_node(
            conn,
            key,
            {
                "state": "DELETING",
                "next_state": "GONE",
                "op_name": op_name,
                "due_at": now + world.real_seconds(world.durations.node_delete_s),
                "preempt_at": None,
                "preempt_entry": None,
                "kill_at": None,
            },
        )
        return op_name

    def stop_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        return self._stop_or_start(project, zone, node_id, stop=True)

    def start_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        return self._stop_or_start(project, zone, node_id, stop=False)

    def _stop_or_start(self, project: str, zone: str, node_id: str, *, stop: bool) -> dict[str, Any]:
        check_zone(zone)
        now = self.clock()
        self.advance(now)
        world = self.world
        with self.db.write() as conn:
            row = self._node_row(conn, project, zone, node_id)
            name = node_name(project, zone, node_id)
            if row is None:
                raise not_found(name)
            if stop and int(row["hosts"]) > 1:
                raise invalid_argument(
                    f"Node '{name}' is a multi-host TPU slice ({row['hosts']} hosts); only single-host "
                    "nodes can be stopped. Delete it instead.",
                    "name",
                )
            needed = "READY" if stop else "STOPPED"
            if row["state"] != needed:
                verb = "stopped" if stop else "started"
                raise failed_precondition(
                    f"Node '{name}' is {row['state']}; it can be {verb} only when it is {needed}."
                )
            verb = "stop" if stop else "start"
            op_name = self._insert_op(conn, project, zone, name, verb, now)
            duration = world.durations.node_stop_s if stop else world.durations.node_start_s
            self._update_node(
                conn,
                (project, zone, node_id),
                {
                    "state": "STOPPING" if stop else "STARTING",
                    "next_state": "STOPPED" if stop else "READY",
                    "due_at": now + world.real_seconds(duration),
                    "op_name": op_name,
                    "preempt_at": None,
                    "preempt_entry": None,
                },
            )
            op = self._op_json(self._op_row(conn, op_name))
        self.advance()
        return op

    def update_node(
        self, project: str, zone: str, node_id: str, body: dict[str, Any], update_mask: str
    ) -> dict[str, Any]:
        """PATCH: only description, labels, metadata and tags here (GCP also allows network fields)."""
        check_zone(zone)
        now = self.clock()
        self.advance(now)
        paths = [p.strip() for p in update_mask.split(",") if p.strip()]
        if not paths:
            raise invalid_argument("Field 'updateMask' is required.", "updateMask")
        for path in paths:
            if path not in _UPDATABLE_NODE_FIELDS:
                raise invalid_argument(
                    f"Invalid value for field 'updateMask': {path!r} cannot be updated here; use one of "
                    + ", ".join(sorted(_UPDATABLE_NODE_FIELDS)),
                    "updateMask",
                )
        if "labels" in paths:
            check_labels(body.get("labels"), "node.labels")
        with self.db.write() as conn:
            row = self._node_row(conn, project, zone, node_id)
            name = node_name(project, zone, node_id)
            if row is None:
                raise not_found(name)
            spec = json.loads(row["spec"])
            for path in paths:
                if path in body:
                    spec[path] = body[path]
                else:
                    spec.pop(path, None)
            self._update_node(conn, (project, zone, node_id), {"spec": json.dumps(spec)})
            op_name = self._insert_op(conn, project, zone, name, "update", now)
            node = self._node_json(self._existing_node_row(conn, project, zone, node_id))
            self._complete_op(conn, op_name, now, response={"@type": NODE_TYPE, **node})
            return self._op_json(self._op_row(conn, op_name))

    def _parse_node(
        self,
        project: str,
        zone: str,
        node_id: str,
        body: Any,
        *,
        field_prefix: str,
        world: World,
        tier_class: CapacityClass | None = None,
        reservation: str | None = None,
        multislice: bool = False,
    ) -> NodePlan:
        if not isinstance(body, dict):
            raise invalid_argument(f"Field '{field_prefix}' is required.", field_prefix)
        accel = self._accelerator_for(body, field_prefix)
        if not world.offers(zone, accel.generation.name):
            offered = sorted(self.catalog.generations[g].api_prefix for g in world.zones.get(zone, {})) or [
                "none"
            ]
            raise invalid_argument(
                f"Accelerator type '{accel.api_name}' is not available in zone '{zone}'. Generations "
                f"offered there: {', '.join(offered)}.",
                f"{field_prefix}.acceleratorType",
            )
        if not body.get("runtimeVersion"):
            raise invalid_argument(
                f"Field '{field_prefix}.runtimeVersion' is required.", f"{field_prefix}.runtimeVersion"
            )
        if "networkConfig" in body and body.get("networkConfigs"):
            raise invalid_argument(
                "Fields 'networkConfig' and 'networkConfigs' cannot both be set.",
                f"{field_prefix}.networkConfigs",
            )
        description = body.get("description", "")
        if not isinstance(description, str) or len(description) > 512:
            raise invalid_argument(
                f"Field '{field_prefix}.description' must be a string of at most 512 characters.",
                f"{field_prefix}.description",
            )
        check_labels(body.get("labels"), f"{field_prefix}.labels")
        metadata = body.get("metadata")
        if metadata is not None and (
            not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())
        ):
            raise invalid_argument(
                f"Field '{field_prefix}.metadata' must be a map of strings.", f"{field_prefix}.metadata"
            )
        scheduling = body.get("schedulingConfig") or {}
        if not isinstance(scheduling, dict):
            raise invalid_argument(
                "Field 'schedulingConfig' must be an object.", f"{field_prefix}.schedulingConfig"
            )
        preemptible = bool(scheduling.get("preemptible")) or bool(scheduling.get("spot"))
        reserved = bool(scheduling.get("reserved"))
        if reserved and preemptible:
            raise invalid_argument(
                "schedulingConfig.reserved cannot be combined with spot or preemptible.",
                f"{field_prefix}.schedulingConfig",
            )
        capacity_class: CapacityClass = (
            "reserved" if reserved else ("preemptible" if preemptible else "on_demand")
        )
        if reservation is not None:
            capacity_class = "reserved"
        elif tier_class is not None and not reserved:
            capacity_class = tier_class
        spec = {k: body[k] for k in _KEPT_NODE_FIELDS if k in body}
        if capacity_class == "preemptible" and not preemptible:
            spec["schedulingConfig"] = {**scheduling, "spot": True}
        elif capacity_class == "reserved" and not reserved:
            spec["schedulingConfig"] = {**scheduling, "reserved": True}
        return NodePlan(
            node_id=node_id,
            accel=accel,
            capacity_class=capacity_class,
            reservation=reservation,
            spec=spec,
            multislice=multislice,
        )

    def _accelerator_for(self, body: dict[str, Any], field_prefix: str) -> AcceleratorType:
        type_name = body.get("acceleratorType")
        config = body.get("acceleratorConfig")
        if type_name:
            accel = self._accelerator_by_api_name(str(type_name))
            if accel is None:
                raise invalid_argument(
                    f"Invalid value for field '{field_prefix}.acceleratorType': {type_name!r} is not a TPU "
                    "accelerator type (e.g. v5litepod-8, v6e-8, v5p-32, v4-32).",
                    f"{field_prefix}.acceleratorType",
                )
            return accel
        if isinstance(config, dict) and config.get("type") is not None:
            raw_type = config["type"]
            enum_name = ACCELERATOR_TYPE_ENUM.get(raw_type) if isinstance(raw_type, int) else str(raw_type)
            gen = self.catalog.generation_for_api_enum(enum_name or "")
            topology = str(config.get("topology", ""))
            size = size_for_topology(gen, topology) if gen is not None else None
            if gen is None or size is None:
                raise invalid_argument(
                    f"Invalid value for field '{field_prefix}.acceleratorConfig': type {raw_type!r} with "
                    f"topology {topology!r} is not a TPU slice shape.",
                    f"{field_prefix}.acceleratorConfig",
                )
            return AcceleratorType(generation=gen, size=size)
        raise invalid_argument(
            f"One of '{field_prefix}.acceleratorType' or '{field_prefix}.acceleratorConfig' is required.",
            f"{field_prefix}.acceleratorType",
        )

    def _accelerator_by_api_name(self, name: str) -> AcceleratorType | None:
        prefix, _, size_text = name.rpartition("-")
        if not size_text.isdigit():
            return None
        for gen in self.catalog.generations.values():
            if gen.api_prefix == prefix and int(size_text) in dict(gen.sizes):
                return AcceleratorType(generation=gen, size=int(size_text))
        return None

    def _plan_from_json(self, item: dict[str, Any]) -> NodePlan:
        accel = self._accelerator_by_api_name(item["accelerator_type"])
        assert accel is not None, item
        return NodePlan(
            node_id=item["node_id"],
            accel=accel,
            capacity_class=item["capacity_class"],
            reservation=item.get("reservation"),
            spec=item["spec"],
            multislice=bool(item.get("multislice")),
        )

    # =============================================================================================
    # Queued resources
    # =============================================================================================

    def create_queued_resource(
        self, project: str, zone: str, qr_id: str, body: dict[str, Any], request_id: str = ""
    ) -> dict[str, Any]:
        check_zone(zone)
        check_resource_id(qr_id, "queuedResourceId")
        now = self.clock()
        self.advance(now)
        if request_id:
            replay = self._operation_for_request(project, request_id)
            if replay is not None:
                return replay
        world = self.world
        spec, plans, capacity_class, reservation = self._parse_queued_resource(
            project, zone, qr_id, body, world
        )
        valid_after, valid_until = validity_window(spec.get("queueingPolicy"), now, world)
        name = qr_name(project, zone, qr_id)
        with self.db.write() as conn:
            if request_id:
                row = conn.execute(
                    "SELECT op_name FROM request_ids WHERE project = ? AND request_id = ?",
                    (project, request_id),
                ).fetchone()
                if row is not None:
                    return self._op_json(self._op_row(conn, row["op_name"]))
            if self._qr_row(conn, project, zone, qr_id) is not None:
                raise already_exists(name)
            for plan in plans:
                if self._node_row(conn, project, zone, plan.node_id) is not None:
                    raise already_exists(node_name(project, zone, plan.node_id))
            conn.execute(
                """
                INSERT INTO queued_resources (project, zone, qr_id, spec, plan, capacity_class, reservation,
                                              state, state_initiator, create_time, valid_after, valid_until)
                VALUES (?, ?, ?, ?, ?, ?, ?, 'ACCEPTED', 'USER', ?, ?, ?)
                """,
                (
                    project,
                    zone,
                    qr_id,
                    json.dumps(spec),
                    json.dumps([p.to_json() for p in plans]),
                    capacity_class,
                    reservation,
                    now,
                    valid_after,
                    valid_until,
                ),
            )
            op_name = self._insert_op(conn, project, zone, name, "create", now)
            qr = self._qr_json(conn, self._existing_qr_row(conn, project, zone, qr_id))
            # The create itself completes at once; provisioning is the queued resource's own state.
            self._complete_op(conn, op_name, now, response={"@type": QUEUED_RESOURCE_TYPE, **qr})
            if request_id:
                conn.execute(
                    "INSERT INTO request_ids (project, request_id, op_name) VALUES (?, ?, ?)",
                    (project, request_id, op_name),
                )
            self._queue_now(conn, world, project, zone, qr_id, now)
            return self._op_json(self._op_row(conn, op_name))

    def _queue_now(
        self, conn: sqlite3.Connection, world: World, project: str, zone: str, qr_id: str, now: float
    ) -> None:
        """The service looks at a queued resource the moment it is queued (created or reset): with
        capacity there it starts provisioning at ``now``. Left to the next ``advance``, it would be looked
        at first whenever the next request (or tick) comes, and fail if that is after its validUntil
        (``--valid-for 30s`` is 30 ms at speed 1000), though capacity was there all along."""
        self._advance_queued_resource(conn, world, self._existing_qr_row(conn, project, zone, qr_id), now)

    def _operation_for_request(self, project: str, request_id: str) -> dict[str, Any] | None:
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT op_name FROM request_ids WHERE project = ? AND request_id = ?", (project, request_id)
            ).fetchone()
            if row is None:
                return None
            op = self._op_row(conn, row["op_name"])
            return self._op_json(op) if op is not None else None

    def _parse_queued_resource(
        self, project: str, zone: str, qr_id: str, body: Any, world: World
    ) -> tuple[dict[str, Any], list[NodePlan], CapacityClass, str | None]:
        if not isinstance(body, dict):
            raise invalid_argument("Field 'queuedResource' is required.", "queuedResource")
        if "spot" in body and "guaranteed" in body:
            raise invalid_argument("Only one of 'spot' and 'guaranteed' may be set.", "queuedResource.tier")
        reservation: str | None = None
        raw_reservation = body.get("reservationName")
        if raw_reservation:
            reservation = str(raw_reservation).rsplit("/", 1)[-1]
            found = world.reservation(reservation)
            if found is None or found.zone != zone:
                raise invalid_argument(
                    f"Invalid value for field 'queuedResource.reservationName': reservation "
                    f"{raw_reservation!r} does not exist in zone '{zone}'.",
                    "queuedResource.reservationName",
                )
        tier_class: CapacityClass | None = None
        if "spot" in body:
            tier_class = "preemptible"
        elif "guaranteed" in body:
            tier_class = "on_demand"
        tpu = body.get("tpu")
        specs = tpu.get("nodeSpec") if isinstance(tpu, dict) else None
        if not isinstance(specs, list) or not specs:
            raise invalid_argument(
                "Field 'queuedResource.tpu.nodeSpec' is required.", "queuedResource.tpu.nodeSpec"
            )
        plans: list[NodePlan] = []
        for index, node_spec in enumerate(specs):
            prefix = f"queuedResource.tpu.nodeSpec[{index}]"
            if not isinstance(node_spec, dict):
                raise invalid_argument(f"Field '{prefix}' must be an object.", prefix)
            parent = node_spec.get("parent", f"projects/{project}/locations/{zone}")
            if parent != f"projects/{project}/locations/{zone}":
                raise invalid_argument(
                    f"Invalid value for field '{prefix}.parent': {parent!r}; it must be the queued "
                    f"resource's own location 'projects/{project}/locations/{zone}'.",
                    f"{prefix}.parent",
                )
            multi = node_spec.get("multisliceParams")
            if multi and node_spec.get("nodeId"):
                raise invalid_argument(
                    f"Only one of '{prefix}.nodeId' and '{prefix}.multisliceParams' may be set.",
                    f"{prefix}.nodeId",
                )
            if multi:
                count = int(multi.get("nodeCount", 0))
                if count <= 1:
                    raise invalid_argument(
                        f"Invalid value for field '{prefix}.multisliceParams.nodeCount': {count}; it must be "
                        "greater than 1.",
                        f"{prefix}.multisliceParams.nodeCount",
                    )
                id_prefix = str(multi.get("nodeIdPrefix") or qr_id)
                node_ids = [f"{id_prefix}-{i}" for i in range(count)]
            else:
                node_ids = [str(node_spec.get("nodeId") or "")]
            for node_id in node_ids:
                check_resource_id(node_id, f"{prefix}.nodeId")
                plans.append(
                    self._parse_node(
                        project,
                        zone,
                        node_id,
                        node_spec.get("node"),
                        field_prefix=f"{prefix}.node",
                        world=world,
                        tier_class=tier_class,
                        reservation=reservation,
                        multislice=bool(multi),
                    )
                )
        seen: set[str] = set()
        for plan in plans:
            if plan.node_id in seen:
                raise invalid_argument(
                    f"Node id {plan.node_id!r} appears twice in the request.", "queuedResource.tpu.nodeSpec"
                )
            seen.add(plan.node_id)
        classes = {p.capacity_class for p in plans}
        capacity_class: CapacityClass = plans[0].capacity_class if len(classes) == 1 else "on_demand"
        kept = {
            k: body[k]
            for k in ("tpu", "spot", "guaranteed", "queueingPolicy", "reservationName")
            if k in body
        }
        return kept, plans, capacity_class, reservation

    def get_queued_resource(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        check_zone(zone)
        self.advance()
        with self.db.read() as conn:
            row = self._qr_row(conn, project, zone, qr_id)
            if row is None:
                raise not_found(qr_name(project, zone, qr_id))
            return self._qr_json(conn, row)

    def list_queued_resources(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        check_zone(zone, allow_all=True)
        self.advance()
        with self.db.read() as conn:
            rows = self._rows_in(conn, "queued_resources", project, zone, "qr_id")
            items = [self._qr_json(conn, r) for r in rows]
        page, token = paginate(items, page_size, page_token)
        out: dict[str, Any] = {"queuedResources": page, "unreachable": []}
        if token:
            out["nextPageToken"] = token
        return out

    def delete_queued_resource(
        self, project: str, zone: str, qr_id: str, *, force: bool = False, request_id: str = ""
    ) -> dict[str, Any]:
        check_zone(zone)
        now = self.clock()
        self.advance(now)
        if request_id:
            replay = self._operation_for_request(project, request_id)
            if replay is not None:
                return replay
        world = self.world
        name = qr_name(project, zone, qr_id)
        with self.db.write() as conn:
            row = self._qr_row(conn, project, zone, qr_id)
            if row is None:
                raise not_found(name)
            if row["state"] == "DELETING" and row["op_name"]:
                return self._op_json(self._op_row(conn, row["op_name"]))
            nodes = conn.execute(
                "SELECT * FROM nodes WHERE project = ? AND zone = ? AND queued_resource = ?",
                (project, zone, qr_id),
            ).fetchall()
            if not force and nodes and row["state"] not in ("ACCEPTED", "FAILED", "SUSPENDED"):
                raise failed_precondition(
                    f"Queued resource '{name}' is {row['state']} and its nodes still exist; delete its nodes "
                    "first, or delete it with force=true to delete them too."
                )
            op_name = self._insert_op(conn, project, zone, name, "delete", now)
            for node in nodes:
                if node["state"] != "DELETING":
                    self._start_node_delete(conn, world, node, now)
            if nodes:
                conn.execute(
                    "UPDATE queued_resources SET state = 'DELETING', state_initiator = 'USER', op_name = ? "
                    "WHERE project = ? AND zone = ? AND qr_id = ?",
                    (op_name, project, zone, qr_id),
                )
            else:
                conn.execute(
                    "DELETE FROM queued_resources WHERE project = ? AND zone = ? AND qr_id = ?",
                    (project, zone, qr_id),
                )
                self._complete_op(conn, op_name, now, response={"@type": EMPTY_TYPE})
            if request_id:
                conn.execute(
                    "INSERT OR IGNORE INTO request_ids (project, request_id, op_name) VALUES (?, ?, ?)",
                    (project, request_id, op_name),
                )
            op = self._op_json(self._op_row(conn, op_name))
        self.advance()
        return op

    def reset_queued_resource(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        """Put a SUSPENDED or FAILED queued resource back in the queue (its leftover nodes go away)."""
        check_zone(zone)
        now = self.clock()
        self.advance(now)
        world = self.world
        orders: list[SignalOrder] = []
        name = qr_name(project, zone, qr_id)
        with self.db.write() as conn:
            row = self._qr_row(conn, project, zone, qr_id)
            if row is None:
                raise not_found(name)
            if row["state"] not in ("SUSPENDED", "FAILED"):
                raise failed_precondition(
                    f"Queued resource '{name}' is {row['state']}; only a SUSPENDED or FAILED queued resource "
                    "can be reset."
                )
            for node in conn.execute(
                "SELECT node_id FROM nodes WHERE project = ? AND zone = ? AND queued_resource = ?",
                (project, zone, qr_id),
            ).fetchall():
                orders.extend(self._host_signals(conn, project, zone, node["node_id"], signal.SIGKILL))
                conn.execute(
                    "DELETE FROM hosts WHERE project = ? AND zone = ? AND node_id = ?",
                    (project, zone, node["node_id"]),
                )
                conn.execute(
                    "DELETE FROM nodes WHERE project = ? AND zone = ? AND node_id = ?",
                    (project, zone, node["node_id"]),
                )
            valid_after, valid_until = validity_window(
                json.loads(row["spec"]).get("queueingPolicy"), now, world
            )
            conn.execute(
                "UPDATE queued_resources SET state = 'ACCEPTED', state_initiator = 'USER', error = NULL, "
                "valid_after = ?, valid_until = ? WHERE project = ? AND zone = ? AND qr_id = ?",
                (valid_after, valid_until, project, zone, qr_id),
            )
            op_name = self._insert_op(conn, project, zone, name, "reset", now)
            qr = self._qr_json(conn, self._existing_qr_row(conn, project, zone, qr_id))
            self._complete_op(conn, op_name, now, response={"@type": QUEUED_RESOURCE_TYPE, **qr})
            self._queue_now(conn, world, project, zone, qr_id, now)
            op = self._op_json(self._op_row(conn, op_name))
        self._send(orders)
        return op

    # =============================================================================================
    # Operations
    # =============================================================================================

    def _insert_op(
        self,
        conn: sqlite3.Connection,
        project: str,
        zone: str,
        target: str,
        verb: str,
        now: float,
        *,
        due_at: float | None = None,
        error: dict[str, Any] | None = None,
    ) -> str:
        op_id = f"operation-{int(now * 1000)}-{secrets.token_hex(6)}"
        conn.execute(
            "INSERT INTO operations (project, zone, op_id, target, verb, create_time, due_at, error) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (project, zone, op_id, target, verb, now, due_at, json.dumps(error) if error else None),
        )
        return f"projects/{project}/locations/{zone}/operations/{op_id}"

    def _complete_op(
        self,
        conn: sqlite3.Connection,
        op_name: str,
        at: float,
        *,
        response: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        project, zone, op_id = split_op_name(op_name)
        conn.execute(
            "UPDATE operations SET done = 1, end_time = ?, due_at = NULL, response = ?, error = ? "
            "WHERE project = ? AND zone = ? AND op_id = ? AND done = 0",
            (
                at,
                json.dumps(response) if response is not None else None,
                json.dumps(error) if error is not None else None,
                project,
                zone,
                op_id,
            ),
        )

    def _op_row(self, conn: sqlite3.Connection, op_name: str) -> sqlite3.Row:
        project, zone, op_id = split_op_name(op_name)
        row = conn.execute(
            "SELECT * FROM operations WHERE project = ? AND zone = ? AND op_id = ?", (project, zone, op_id)
        ).fetchone()
        if row is None:
            raise not_found(op_name)
        return cast(sqlite3.Row, row)

    @staticmethod
    def _op_json(row: sqlite3.Row) -> dict[str, Any]:
        name = f"projects/{row['project']}/locations/{row['zone']}/operations/{row['op_id']}"
        metadata: dict[str, Any] = {
            "@type": NODE_OPERATION_METADATA_TYPE,
            "createTime": rfc3339(float(row["create_time"])),
            "target": row["target"],
            "verb": row["verb"],
            "statusDetail": "",
            "cancelRequested": False,
            "apiVersion": "v2",
        }
        done = bool(row["done"])
        if done and row["end_time"] is not None:
            metadata["endTime"] = rfc3339(float(row["end_time"]))
        out: dict[str, Any] = {"name": name, "metadata": metadata, "done": done}
        if done:
            if row["error"]:
                out["error"] = json.loads(row["error"])
            elif row["response"]:
                out["response"] = json.loads(row["response"])
        return out

    def get_operation(self, project: str, zone: str, op_id: str) -> dict[str, Any]:
        check_zone(zone)
        self.advance()
        with self.db.read() as conn:
            return self._op_json(
                self._op_row(conn, f"projects/{project}/locations/{zone}/operations/{op_id}")
            )

    def list_operations(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        check_zone(zone, allow_all=True)
        self.advance()
        with self.db.read() as conn:
            rows = self._rows_in(conn, "operations", project, zone, "create_time, op_id")
            ops = [self._op_json(r) for r in rows]
        page, token = paginate(ops, page_size, page_token)
        out: dict[str, Any] = {"operations": page}
        if token:
            out["nextPageToken"] = token
        return out

    def delete_operation(self, project: str, zone: str, op_id: str) -> dict[str, Any]:
        check_zone(zone)
        name = f"projects/{project}/locations/{zone}/operations/{op_id}"
        with self.db.write() as conn:
            self._op_row(conn, name)
            conn.execute(
                "DELETE FROM operations WHERE project = ? AND zone = ? AND op_id = ?", (project, zone, op_id)
            )
        return {}

    # =============================================================================================
    # Catalog-like resources
    # =============================================================================================

    def _zone_generations(self, zone: str) -> list[Generation]:
        check_zone(zone)
        world = self.world
        return [self.catalog.generations[g] for g in sorted(world.zones.get(zone, {}))]

    def list_accelerator_types(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        items = [
            accelerator_type_json(project, zone, AcceleratorType(generation=gen, size=size))
            for gen in self._zone_generations(zone)
            for size in gen.valid_sizes
        ]
        page, token = paginate(items, page_size, page_token)
        out: dict[str, Any] = {"acceleratorTypes": page, "unreachable": []}
        if token:
            out["nextPageToken"] = token
        return out

    def get_accelerator_type(self, project: str, zone: str, type_name: str) -> dict[str, Any]:
        accel = self._accelerator_by_api_name(type_name)
        if accel is None or accel.generation not in self._zone_generations(zone):
            raise not_found(f"projects/{project}/locations/{zone}/acceleratorTypes/{type_name}")
        return accelerator_type_json(project, zone, accel)

    def _runtime_versions(self, zone: str) -> list[str]:
        versions = {gen.runtime_version for gen in self._zone_generations(zone)}
        if versions:
            versions.update(_COMMON_RUNTIME_VERSIONS)
        return sorted(versions)

    def list_runtime_versions(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        items = [
            {"name": f"projects/{project}/locations/{zone}/runtimeVersions/{v}", "version": v}
            for v in self._runtime_versions(zone)
        ]
        page, token = paginate(items, page_size, page_token)
        out: dict[str, Any] = {"runtimeVersions": page, "unreachable": []}
        if token:
            out["nextPageToken"] = token
        return out

    def get_runtime_version(self, project: str, zone: str, version: str) -> dict[str, Any]:
        if version not in self._runtime_versions(zone):
            raise not_found(f"projects/{project}/locations/{zone}/runtimeVersions/{version}")
        return {"name": f"projects/{project}/locations/{zone}/runtimeVersions/{version}", "version": version}

    def list_locations(self, project: str, page_size: int = 0, page_token: str = "") -> dict[str, Any]:
        items = [location_json(project, zone) for zone in sorted(self.world.zones)]
        page, token = paginate(items, page_size, page_token)
        out: dict[str, Any] = {"locations": page}
        if token:
            out["nextPageToken"] = token
        return out

    def get_location(self, project: str, zone: str) -> dict[str, Any]:
        if zone not in self.world.zones:
            raise not_found(f"projects/{project}/locations/{zone}")
        return location_json(project, zone)

    # =============================================================================================
    # Cloud Quotas
    # =============================================================================================

    def quota_infos(self, project: str) -> list[dict[str, Any]]:
        """Every TPU API quota of the generations this world offers, as Cloud Quotas' QuotaInfo."""
        world = self.world
        infos: list[dict[str, Any]] = []
        for gen_name in world.generations_offered():
            gen = self.catalog.generations[gen_name]
            zones = sorted(z for z in world.zones if world.offers(z, gen_name))
            regions = sorted({region_of(z) for z in zones})
            for capacity_class in ("on_demand", "preemptible"):
                capacity = (
                    CapacityType.ON_DEMAND if capacity_class == "on_demand" else CapacityType.PREEMPTIBLE
                )
                for scope, locations in (("zone", zones), ("region", regions)):
                    quota_id = gen.quota_id(capacity, scope) or ""
                    infos.append(
                        quota_info_json(
                            project,
                            gen,
                            quota_id,
                            capacity_class,
                            scope,
                            [
                                (loc, world.quota_limit(gen_name, capacity_class, loc))
                                for loc in locations  # type: ignore[arg-type]
                            ],
                        )
                    )
        return sorted(infos, key=lambda i: str(i["quotaId"]))

    # =============================================================================================
    # Metadata server
    # =============================================================================================

    def metadata_value(self, zone: str, node_id: str, worker: int, path: str) -> str | None:
        """The text the metadata server answers for ``path`` (after /computeMetadata/v1/) on one host of
        a node, or None when there is no such key. Raises 404 for an unknown node or worker."""
        self.advance()
        world = self.world
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM nodes WHERE zone = ? AND node_id = ?", (zone, node_id)
            ).fetchall()
        # Prefer the world's project when several projects have a node of that name in the zone.
        rows = sorted(rows, key=lambda r: r["project"] != world.project)
        if not rows:
            raise not_found(f"zones/{zone}/nodes/{node_id}")
        row = rows[0]
        if not 0 <= worker < int(row["hosts"]):
            raise not_found(f"zones/{zone}/nodes/{node_id}/workers/{worker}")
        spec = json.loads(row["spec"])
        user_metadata: dict[str, str] = spec.get("metadata") or {}
        endpoints = self._endpoints(row)
        attributes: dict[str, str] = {
            **user_metadata,
            "agent-worker-number": str(worker),
            "accelerator-type": row["accelerator_type"],
            "worker-network-endpoints": ",".join(
                f"unknown:unknown:{e.get('ipAddress', '')}" for e in endpoints
            ),
        }
        scheduling = spec.get("schedulingConfig") or {}
        values: dict[str, str] = {
            "instance/preempted": "TRUE" if row["preempted_flag"] else "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/name": f"t1v-n-{int(row['uid']) % 16**8:08x}-w-{worker}",
            "instance/hostname": f"t1v-n-{int(row['uid']) % 16**8:08x}-w-{worker}",
            "instance/id": row["uid"],
            "instance/zone": f"projects/{row['project']}/zones/{zone}",
            "instance/scheduling/preemptible": "TRUE"
            if scheduling.get("preemptible") or scheduling.get("spot")
            else "FALSE",
            "instance/attributes/": "".join(f"{k}\n" for k in sorted(attributes)),
            "project/project-id": row["project"],
        }
        for key, value in attributes.items():
            values[f"instance/attributes/{key}"] = value
        return values.get(path)

    # =============================================================================================
    # Admin
    # =============================================================================================

    def status(self) -> dict[str, Any]:
        now = self.clock()
        self.advance(now)
        world = self.world
        with self.db.read() as conn:
            epoch_row = conn.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
            epoch = float(epoch_row["value"]) if epoch_row is not None else now
            stockouts = {r["zone"] for r in conn.execute("SELECT zone FROM stockouts").fetchall()}
            zones: list[dict[str, Any]] = []
            for zone in sorted(world.zones):
                pools = []
                for gen_name in sorted(world.zones[zone]):
                    for pool in ("on_demand", "preemptible"):
                        capacity = 0 if zone in stockouts else world.pool_chips(zone, gen_name, pool)  # type: ignore[arg-type]
                        in_use = self._pool_in_use(conn, zone, gen_name, pool)
                        pools.append(
                            {
                                "generation": gen_name,
                                "capacity_class": pool,
                                "capacity_chips": capacity,
                                "in_use_chips": in_use,
                                "free_chips": max(0, capacity - in_use),
                            }
                        )
                zones.append(
                    {"zone": zone, "region": region_of(zone), "stockout": zone in stockouts, "pools": pools}
                )
            reservations = [
                {
                    **r.model_dump(),
                    "in_use_chips": self._reservation_in_use(conn, r.name),
                    "free_chips": max(0, r.chips - self._reservation_in_use(conn, r.name)),
                }
                for r in world.reservations
            ]
            hosts: dict[tuple[str, str, str], int] = {}
            for h in conn.execute("SELECT project, zone, node_id FROM hosts").fetchall():
                hkey = (h["project"], h["zone"], h["node_id"])
                hosts[hkey] = hosts.get(hkey, 0) + 1
            nodes = [
                {
                    "project": r["project"],
                    "zone": r["zone"],
                    "name": r["node_id"],
                    "accelerator_type": r["accelerator_type"],
                    "chips": r["chips"],
                    "hosts": r["hosts"],
                    "state": r["state"],
                    "capacity_class": r["capacity_class"],
                    "reservation": r["reservation"],
                    "queued_resource": r["queued_resource"],
                    "preempted": bool(r["preempted_flag"]),
                    "preempt_at": rfc3339(float(r["preempt_at"])) if r["preempt_at"] is not None else None,
                    "registered_hosts": hosts.get((r["project"], r["zone"], r["node_id"]), 0),
                }
                for r in conn.execute("SELECT * FROM nodes ORDER BY project, zone, node_id").fetchall()
            ]
            queued = [
                {
                    "project": r["project"],
                    "zone": r["zone"],
                    "name": r["qr_id"],
                    "state": r["state"],
                    "node_count": len(json.loads(r["plan"])),
                    "capacity_class": r["capacity_class"],
                }
                for r in conn.execute(
                    "SELECT * FROM queued_resources ORDER BY project, zone, qr_id"
                ).fetchall()
            ]
        return {
            "backend": "sim",
            "project": world.project,
            "now": rfc3339(now),
            "speed": world.speed,
            "sim_time_s": (now - epoch) * world.speed,
            "zones": zones,
            "reservations": reservations,
            "nodes": nodes,
            "queued_resources": queued,
            "faults": self.faults().model_dump(),
            "world": world.summary(),
        }

    def reset(self, world: World | None = None) -> World:
        """Forget every node, queued resource, operation, registration and stockout; with ``world``,
        put that world in force too. Host processes are not signalled (they are the launcher's)."""
        now = self.clock()
        with self.db.write() as conn:
            for table in STATE_TABLES:
                conn.execute(f"DELETE FROM {table}")
            conn.execute("DELETE FROM meta WHERE key IN ('faults', 'epoch')")
            conn.execute("INSERT INTO meta (key, value) VALUES ('epoch', ?)", (repr(now),))
            if world is not None:
                self._store_world(conn, world.model_dump_json())
        return self.world

    def preempt(
        self, zone: str, node_id: str, *, notice: bool = True, project: str | None = None
    ) -> dict[str, Any]:
        """Preempt a READY node now (any capacity class: this is the operator's hand, not the model)."""
        now = self.clock()
        self.advance(now)
        project = project or self.world.project
        with self.db.write() as conn:
            row = self._node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(node_name(project, zone, node_id))
            if row["state"] != "READY" or row["kill_at"] is not None:
                raise failed_precondition(
                    f"Node '{node_id}' is {row['state']}"
                    + (" and already being preempted" if row["kill_at"] is not None else "")
                    + "; only a READY node can be preempted."
                )
            self._update_node(
                conn,
                (project, zone, node_id),
                {"preempt_at": now, "preempt_notice": int(notice), "preempt_entry": None},
            )
        self.advance(now)
        return self.get_node(project, zone, node_id)

    def set_stockout(self, zone: str, *, clear: bool = False) -> bool:
        check_zone(zone)
        now = self.clock()
        with self.db.write() as conn:
            if clear:
                conn.execute("DELETE FROM stockouts WHERE zone = ?", (zone,))
            else:
                conn.execute("INSERT OR IGNORE INTO stockouts (zone, since) VALUES (?, ?)", (zone, now))
        self.advance(now)
        return not clear

    def register_host(
        self, zone: str, node_id: str, worker: int, pid: int, *, project: str | None = None
    ) -> dict[str, Any]:
        project = project or self.world.project
        if pid <= 1:
            raise invalid_argument(f"Invalid pid {pid}.", "pid")
        start_ticks = processes.process_start_ticks(pid)
        if start_ticks is None and processes.is_same_process(pid, None) is False:
            raise invalid_argument(f"No process with pid {pid} is running.", "pid")
        with self.db.write() as conn:
            row = self._node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(node_name(project, zone, node_id))
            if not 0 <= worker < int(row["hosts"]):
                raise invalid_argument(
                    f"Worker {worker} is out of range: node '{node_id}' has {row['hosts']} hosts.", "worker"
                )
            conn.execute(
                "INSERT OR REPLACE INTO hosts (project, zone, node_id, worker, pid, start_ticks) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (project, zone, node_id, worker, pid, start_ticks),
            )
        return {"project": project, "zone": zone, "node": node_id, "worker": worker, "pid": pid}

    def unregister_hosts(
        self, zone: str, node_id: str, worker: int | None = None, *, project: str | None = None
    ) -> int:
        project = project or self.world.project
        with self.db.write() as conn:
            if worker is None:
                cur = conn.execute(
                    "DELETE FROM hosts WHERE project = ? AND zone = ? AND node_id = ?",
                    (project, zone, node_id),
                )
            else:
                cur = conn.execute(
                    "DELETE FROM hosts WHERE project = ? AND zone = ? AND node_id = ? AND worker = ?",
                    (project, zone, node_id, worker),
                )
            return int(cur.rowcount)

    def set_endpoints(
        self, zone: str, node_id: str, endpoints: list[dict[str, Any]] | None, *, project: str | None = None
    ) -> dict[str, Any]:
        """Override a node's networkEndpoints (e.g. the ssh endpoints of its simulated hosts); None
        restores the default (127.0.0.1:8470 per host)."""
        project = project or self.world.project
        if endpoints is not None:
            for i, endpoint in enumerate(endpoints):
                if not isinstance(endpoint, dict) or not isinstance(endpoint.get("ipAddress"), str):
                    raise invalid_argument(f"endpoints[{i}] needs an ipAddress string.", f"endpoints[{i}]")
                if "port" in endpoint and not isinstance(endpoint["port"], int):
                    raise invalid_argument(f"endpoints[{i}].port must be an integer.", f"endpoints[{i}].port")
        with self.db.write() as conn:
            row = self._node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(node_name(project, zone, node_id))
            self._update_node(
                conn,
                (project, zone, node_id),
                {"endpoints": json.dumps(endpoints) if endpoints is not None else None},
            )
            return self._node_json(self._existing_node_row(conn, project, zone, node_id))

    # =============================================================================================
    # Rows and rendering
    # =============================================================================================

    @staticmethod
    def _node_row(conn: sqlite3.Connection, project: str, zone: str, node_id: str) -> sqlite3.Row | None:
        return conn.execute(  # type: ignore[no-any-return]
            "SELECT * FROM nodes WHERE project = ? AND zone = ? AND node_id = ?", (project, zone, node_id)
        ).fetchone()

    @staticmethod
    def _qr_row(conn: sqlite3.Connection, project: str, zone: str, qr_id: str) -> sqlite3.Row | None:
        return conn.execute(  # type: ignore[no-any-return]
            "SELECT * FROM queued_resources WHERE project = ? AND zone = ? AND qr_id = ?",
            (project, zone, qr_id),
        ).fetchone()

    def _existing_node_row(
        self, conn: sqlite3.Connection, project: str, zone: str, node_id: str
    ) -> sqlite3.Row:
        row = self._node_row(conn, project, zone, node_id)
        if row is None:  # only after this transaction wrote it: a bug, not a user error
            raise RuntimeError(f"node {project}/{zone}/{node_id} vanished inside its own transaction")
        return row

    def _existing_qr_row(self, conn: sqlite3.Connection, project: str, zone: str, qr_id: str) -> sqlite3.Row:
        row = self._qr_row(conn, project, zone, qr_id)
        if row is None:
            raise RuntimeError(
                f"queued resource {project}/{zone}/{qr_id} vanished inside its own transaction"
            )
        return row

    @staticmethod
    def _rows_in(
        conn: sqlite3.Connection, table: str, project: str, zone: str, order_by: str
    ) -> list[sqlite3.Row]:
        if zone == "-":
            return conn.execute(
                f"SELECT * FROM {table} WHERE project = ? ORDER BY zone, {order_by}", (project,)
            ).fetchall()
        return conn.execute(
            f"SELECT * FROM {table} WHERE project = ? AND zone = ? ORDER BY {order_by}", (project, zone)
        ).fetchall()

    @staticmethod
    def _update_node(conn: sqlite3.Connection, key: tuple[str, str, str], updates: dict[str, Any]) -> None:
        columns = ", ".join(f"{column} = ?" for column in updates)
        conn.execute(
            f"UPDATE nodes SET {columns} WHERE project = ? AND zone = ? AND node_id = ?",
            (*updates.values(), *key),
        )

    @staticmethod
    def _endpoints(row: sqlite3.Row) -> list[dict[str, Any]]:
        if row["endpoints"]:
            return list(json.loads(row["endpoints"]))
        return [
            {
                "ipAddress": DEFAULT_ENDPOINT_IP,
                "port": DEFAULT_ENDPOINT_PORT,
                "accessConfig": {"externalIp": DEFAULT_ENDPOINT_IP},
            }
            for _ in range(int(row["hosts"]))
        ]

    def _node_json(self, row: sqlite3.Row) -> dict[str, Any]:
        project, zone, node_id = row["project"], row["zone"], row["node_id"]
        spec = json.loads(row["spec"])
        gen = self.catalog.generations[row["generation"]]
        out: dict[str, Any] = {"name": node_name(project, zone, node_id)}
        out.update(spec)
        out["acceleratorType"] = row["accelerator_type"]
        out["acceleratorConfig"] = {"type": gen.api_enum, "topology": row["topology"]}
        if "networkConfig" not in spec and "networkConfigs" not in spec:
            out["networkConfig"] = {
                "network": f"projects/{project}/global/networks/default",
                "subnetwork": f"projects/{project}/regions/{region_of(zone)}/subnetworks/default",
                "enableExternalIps": True,
            }
        out["state"] = row["state"]
        if row["state"] == "READY":
            out["health"] = "HEALTHY"
        out["id"] = row["uid"]
        out["createTime"] = rfc3339(float(row["create_time"]))
        out["apiVersion"] = "V2"
        if row["state"] != "CREATING":
            out["networkEndpoints"] = self._endpoints(row)
        if row["queued_resource"]:
            out["queuedResource"] = qr_name(project, zone, row["queued_resource"])
        if row["multislice"]:
            out["multisliceNode"] = True
        return out

    def _qr_json(self, conn: sqlite3.Connection, row: sqlite3.Row) -> dict[str, Any]:
        spec = json.loads(row["spec"])
        out: dict[str, Any] = {
            "name": qr_name(row["project"], row["zone"], row["qr_id"]),
            "createTime": rfc3339(float(row["create_time"])),
        }
        out.update(spec)
        state_name = row["state"]
        state: dict[str, Any] = {"state": state_name, "stateInitiator": row["state_initiator"]}
        data_key = {
            "ACCEPTED": "acceptedData",
            "PROVISIONING": "provisioningData",
            "ACTIVE": "activeData",
            "SUSPENDING": "suspendingData",
            "SUSPENDED": "suspendedData",
            "DELETING": "deletingData",
            "CREATING": "creatingData",
        }.get(state_name)
        if data_key:
            state[data_key] = {}
        if state_name == "FAILED":
            state["failedData"] = {"error": json.loads(row["error"]) if row["error"] else {}}
        out["state"] = state
        return out


def _placeholders(values: tuple[str, ...]) -> str:
    return ", ".join("?" for _ in values)
