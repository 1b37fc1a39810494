"""Time in the simulated cloud: ``advance(now)`` applies every transition whose time has come, from the
timestamps stored in the database (CREATING -> READY, DELETING -> gone, preemptions and their grace
periods, queued resources finding capacity...).

Time-driven behaviour is computed lazily: every request first calls ``advance``, so the state is right
in each separate CLI invocation with no daemon running; while a server is up, its ticker thread calls
it as well, so that preemption grace periods end (and SIGKILLs land) on time.
"""

from __future__ import annotations

import fnmatch
import json
import random
import signal
import sqlite3
from typing import Any, Protocol

from tpuctl.sim.api_errors import ApiError, eid, rpc_status
from tpuctl.sim.engine import maintenance
from tpuctl.sim.engine.capacity import Capacity
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.hosts import VmOrder, host_signals, send
from tpuctl.sim.engine.operations import complete_op
from tpuctl.sim.engine.plans import NodePlan, plan_from_json
from tpuctl.sim.engine.records import (
    QR_PENDING_STATES,
    delete_node_rows,
    existing_node_row,
    existing_qr_row,
    insert_node,
    node_json,
    node_row,
    placeholders,
    set_qr_state,
    update_node,
)
from tpuctl.sim.shapes import node_name
from tpuctl.sim.wire import EMPTY_TYPE, NODE_TYPE, rfc3339
from tpuctl.sim.world import World


class TimelineStep(Protocol):
    """More transitions by time, applied after the TPU API's in the same transaction (Compute Engine's
    view over the same node rows: its operations, instances and MIGs)."""

    def due(self, conn: sqlite3.Connection, now: float) -> bool: ...

    def advance(self, conn: sqlite3.Connection, world: World, now: float, orders: list[VmOrder]) -> None: ...


class Timeline:
    """The transitions applied by time, for one engine."""

    def __init__(self, ctx: Context, capacity: Capacity) -> None:
        self.ctx = ctx
        self.capacity = capacity
        self.steps: list[TimelineStep] = []

    def advance(self, now: float | None = None) -> None:
        """Apply every transition due by ``now`` (default: the clock). Cheap when nothing is due."""
        now = self.ctx.clock() if now is None else now
        if not self._anything_due(now):
            return
        world = self.ctx.world
        orders: list[VmOrder] = []
        with self.ctx.db.write() as conn:
            self._advance_in(conn, world, now, orders)
            # A VM dies before its new state can be read (the transaction commits after this): a client
            # that sees a node PREEMPTED, STOPPED or gone never reaches a live process of it, as on
            # Google. (Were the commit to fail, the next advance kills again: killing is idempotent.)
            send(self.ctx.vm_root, [o for o in orders if o.sig is signal.SIGKILL])
        send(self.ctx.vm_root, [o for o in orders if o.sig is not signal.SIGKILL])

    def queue_now(
        self, conn: sqlite3.Connection, world: World, project: str, zone: str, qr_id: str, now: float
    ) -> None:
        """The service looks at a queued resource the moment it is queued (created or reset): with
        capacity there it starts provisioning at ``now``. Left to the next ``advance``, it would be looked
        at first whenever the next request (or tick) comes, and fail if that is after its validUntil
        (``--valid-for 30s`` is 30 ms at speed 1000), though capacity was there all along."""
        self._advance_queued_resource(conn, world, existing_qr_row(conn, project, zone, qr_id), now)

    def _anything_due(self, now: float) -> bool:
        with self.ctx.db.read() as conn:
            row = conn.execute(
                """
                SELECT
                  EXISTS(SELECT 1 FROM nodes WHERE due_at <= :now OR preempt_at <= :now OR kill_at <= :now
                         OR maintenance_at <= :now OR maintenance_until <= :now)
                  OR EXISTS(SELECT 1 FROM operations WHERE done = 0 AND due_at <= :now)
                  OR EXISTS(SELECT 1 FROM queued_resources WHERE state IN
                            ('ACCEPTED', 'WAITING_FOR_RESOURCES', 'PROVISIONING', 'SUSPENDING', 'DELETING'))
                """,
                {"now": now},
            ).fetchone()
            return bool(row[0]) or any(step.due(conn, now) for step in self.steps)

    def _advance_in(self, conn: sqlite3.Connection, world: World, now: float, orders: list[VmOrder]) -> None:
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
            _finish_preemption(conn, row, orders)
        # 4b. Host maintenance: noticed VMs stop, then maintained ones come back (``maintenance``).
        for row in conn.execute(
            "SELECT * FROM nodes WHERE maintenance_at <= ? ORDER BY maintenance_at", (now,)
        ).fetchall():
            maintenance.stop(conn, world, row, orders)
        for row in conn.execute("SELECT * FROM nodes WHERE maintenance_until <= ?", (now,)).fetchall():
            maintenance.restart(conn, row)
        # 5. Queued resources, oldest first (first come, first served for freed capacity).
        for row in conn.execute(
            f"SELECT * FROM queued_resources WHERE state IN ({placeholders(QR_PENDING_STATES)}) "
            "ORDER BY create_time",
            QR_PENDING_STATES,
        ).fetchall():
            self._advance_queued_resource(conn, world, row, now)
        # 6. The other surfaces' views over the rows changed above.
        for step in self.steps:
            step.advance(conn, world, now, orders)

    # --- nodes -----------------------------------------------------------------------------------

    def _finish_transition(
        self, conn: sqlite3.Connection, world: World, row: sqlite3.Row, orders: list[VmOrder]
    ) -> None:
        key = (row["project"], row["zone"], row["node_id"])
        at = float(row["due_at"])
        next_state = row["next_state"]
        if next_state == "GONE":
            # A deleted VM's processes and disk go with it.
            orders.extend(host_signals(conn, *key, signal.SIGKILL, wipe=True))
            delete_node_rows(conn, key)
            if row["op_name"]:
                complete_op(conn, row["op_name"], at, response={"@type": EMPTY_TYPE})
            return
        updates: dict[str, Any] = {"state": next_state, "next_state": None, "due_at": None, "op_name": None}
        if next_state == "READY":
            updates["ready_time"] = at
            updates.update(_preemption_plan(conn, world, row, at))
        if next_state == "STOPPED":
            # A stopped VM's processes are gone, as on GCP.
            orders.extend(host_signals(conn, *key, signal.SIGKILL))
        update_node(conn, key, updates)
        if row["op_name"]:
            node = node_json(self.ctx.catalog, existing_node_row(conn, *key))
            complete_op(conn, row["op_name"], at, response={"@type": NODE_TYPE, **node})

    def _start_preemption(
        self, conn: sqlite3.Connection, world: World, row: sqlite3.Row, orders: list[VmOrder]
    ) -> None:
        key = (row["project"], row["zone"], row["node_id"])
        at = float(row["preempt_at"])
        if row["state"] != "READY":
            update_node(conn, key, {"preempt_at": None, "preempt_entry": None})
            return
        entry = row["preempt_entry"]
        if entry is not None:
            if entry >= len(world.preemption.schedule) or _schedule_fired(conn, entry) >= (
                world.preemption.schedule[entry].count
            ):
                # Another node used up this entry first.
                update_node(conn, key, {"preempt_at": None, "preempt_entry": None})
                return
            conn.execute(
                "INSERT INTO schedule_fired (entry, fired) VALUES (?, 1) "
                "ON CONFLICT(entry) DO UPDATE SET fired = fired + 1",
                (entry,),
            )
        # REAL seconds, not scaled by the world's speed: a program gets the time Google gives it to
        # checkpoint (Compute Engine's ACPI soft-off, then hard-off 30 s later for Spot:
        # https://cloud.google.com/compute/docs/instances/spot#preemption-process).
        grace = world.durations.preemption_grace_s
        if row["preempt_notice"] and grace > 0:
            # Notice: the metadata flag turns TRUE and the hosts get SIGTERM; the node stays READY until
            # the grace period ends (Compute Engine's ACPI soft-off, then hard-off).
            orders.extend(host_signals(conn, *key, signal.SIGTERM))
            update_node(
                conn,
                key,
                {"preempt_at": None, "preempt_entry": None, "preempted_flag": 1, "kill_at": at + grace},
            )
            _suspend_queued_resource(conn, row, "SUSPENDING")
        else:
            update_node(conn, key, {"preempt_at": None, "preempt_entry": None, "preempted_flag": 1})
            _finish_preemption(conn, existing_node_row(conn, *key), orders)

    # --- queued resources ------------------------------------------------------------------------

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
                    complete_op(conn, row["op_name"], now, response={"@type": EMPTY_TYPE})
            return
        if state == "SUSPENDING":
            if not any(n["kill_at"] is not None for n in nodes):
                set_qr_state(conn, key, "SUSPENDED", "SERVICE")
            return
        if state == "PROVISIONING":
            plan = json.loads(row["plan"])
            if len(nodes) < len(plan):
                # Someone deleted one of its nodes before it was ready: it can never become ACTIVE.
                message = "A node of the queued resource was deleted while it was being provisioned."
                _fail_queued_resource(conn, key, rpc_status("ABORTED", message))
            elif all(n["state"] == "READY" for n in nodes):
                set_qr_state(conn, key, "ACTIVE", "SERVICE")
            return
        # ACCEPTED or WAITING_FOR_RESOURCES.
        if row["valid_until"] is not None and now >= float(row["valid_until"]):
            message = (
                f"The queued resource could not be provisioned before its validUntil time "
                f"({rfc3339(float(row['valid_until']))}): there is no more capacity in the zone "
                f'"{row["zone"]}" for it. {eid()}'
            )
            _fail_queued_resource(conn, key, rpc_status("RESOURCE_EXHAUSTED", message))
            return
        if row["valid_after"] is not None and now < float(row["valid_after"]):
            return
        self._try_provision(conn, world, row, now)

    def _try_provision(self, conn: sqlite3.Connection, world: World, row: sqlite3.Row, now: float) -> None:
        """A waiting queued resource takes capacity when all of its nodes fit (failing on quota or on a
        node name taken meanwhile), or waits for it."""
        project, zone = row["project"], row["zone"]
        key = (project, zone, row["qr_id"])
        plans = [plan_from_json(self.ctx.catalog, p) for p in json.loads(row["plan"])]
        try:
            self.capacity.check_quota(conn, world, project, zone, plans)
        except ApiError as exc:
            _fail_queued_resource(conn, key, rpc_status("RESOURCE_EXHAUSTED", exc.message, exc.details))
            return
        short = _undersized_reservation(world, plans)
        if short is not None:
            _fail_queued_resource(conn, key, rpc_status("FAILED_PRECONDITION", short))
            return
        for plan in plans:
            if node_row(conn, project, zone, plan.node_id) is not None:
                name = node_name(project, zone, plan.node_id)
                _fail_queued_resource(
                    conn, key, rpc_status("ALREADY_EXISTS", f"Resource '{name}' already exists")
                )
                return
        placement = self.capacity.place(conn, world, zone, plans)
        if placement is None:
            if row["state"] != "WAITING_FOR_RESOURCES":
                set_qr_state(conn, key, "WAITING_FOR_RESOURCES", "SERVICE")
            return
        due = now + world.real_seconds(world.durations.queued_provision_s)
        for plan, reservation in zip(plans, placement, strict=True):
            insert_node(
                conn,
                world.seed,
                project,
                zone,
                plan,
                reservation,
                now,
                due,
                op_name=None,
                queued_resource=row["qr_id"],
            )
        set_qr_state(conn, key, "PROVISIONING", "SERVICE")


def _preemption_plan(
    conn: sqlite3.Connection, world: World, row: sqlite3.Row, ready_at: float
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
        # A Compute Engine slice's row is named "<collection>/<name>": the glob matches the name.
        if not fnmatch.fnmatchcase(str(row["node_id"]).rsplit("/", 1)[-1], entry.node):
            continue
        if _schedule_fired(conn, index) >= entry.count:
            continue
        candidates.append((ready_at + world.real_seconds(entry.after_s), entry.notice, index))
    if not candidates:
        return {"preempt_at": None, "preempt_entry": None}
    at, notice, entry_index = min(candidates, key=lambda c: c[0])
    return {"preempt_at": at, "preempt_notice": int(notice), "preempt_entry": entry_index}


def _schedule_fired(conn: sqlite3.Connection, index: int) -> int:
    row = conn.execute("SELECT fired FROM schedule_fired WHERE entry = ?", (index,)).fetchone()
    return int(row["fired"]) if row is not None else 0


def _finish_preemption(conn: sqlite3.Connection, row: sqlite3.Row, orders: list[VmOrder]) -> None:
    key = (row["project"], row["zone"], row["node_id"])
    # Hard-off: every process of the VMs killed, their disks gone (recovery lands on fresh VMs).
    orders.extend(host_signals(conn, *key, signal.SIGKILL, wipe=True))
    updates: dict[str, Any] = {"kill_at": None, "preempted_flag": 1}
    if row["state"] == "READY":
        updates["state"] = "PREEMPTED"
    update_node(conn, key, updates)
    _suspend_queued_resource(conn, row, "SUSPENDED")


def _suspend_queued_resource(conn: sqlite3.Connection, node: sqlite3.Row, state: str) -> None:
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
    set_qr_state(conn, qr_key, state, "SERVICE")


def _fail_queued_resource(conn: sqlite3.Connection, key: tuple[str, str, str], error: dict[str, Any]) -> None:
    conn.execute(
        "UPDATE queued_resources SET state = 'FAILED', state_initiator = 'SERVICE', error = ? "
        "WHERE project = ? AND zone = ? AND qr_id = ?",
        (json.dumps(error), *key),
    )


def _undersized_reservation(world: World, plans: list[NodePlan]) -> str | None:
    """The error message when a named reservation is smaller than the nodes asked of it (it can never
    fit, so Google fails the request with FAILED_PRECONDITION rather than let it wait;
    docs/google-facts.md#tpu-api-errors)."""
    need: dict[str, int] = {}
    for plan in plans:
        if plan.reservation is not None:
            need[plan.reservation] = need.get(plan.reservation, 0) + plan.accel.chips
    for name, chips in need.items():
        reservation = world.reservation(name)
        if reservation is not None and reservation.chips < chips:
            return (
                "Insufficient reserved capacity. Contact customer support to increase your reservation. "
                f"{eid()}"
            )
    return None
