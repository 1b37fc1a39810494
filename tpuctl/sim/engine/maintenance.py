"""Host maintenance in the simulated cloud, played as Google documents it for TPU VMs
(docs/google-facts.md#host-maintenance):

1. the notice: every host's metadata ``instance/maintenance-event`` reads
   ``TERMINATE_ON_HOST_MAINTENANCE`` (a TPU VM cannot live-migrate), and the node's ``upcomingMaintenance``
   says PENDING, for the world's ``durations.maintenance_notice_s`` (REAL seconds, as a program's time to
   checkpoint is);
2. the stop: every process of the VMs is killed. A TPU API node of on-demand or reserved capacity is kept:
   REPAIRING (health UNHEALTHY_MAINTENANCE, maintenance ONGOING) with its disks, for
   ``durations.maintenance_s`` (simulated seconds), then READY again with its VMs restarted (the metadata
   key back to NONE). A spot or preemptible node, and every Compute Engine slice (tpuctl asks
   ``automaticRestart: false``; the simulator does not model the restart of one that asks for it, the
   stricter choice), is not restarted: TERMINATED, its disks gone.

The SIGKILL at the stop, with no SIGTERM first, is the stricter reading: Google's stop may give the guest
a graceful shutdown, unconfirmed for TPU VMs.
"""

from __future__ import annotations

import signal
import sqlite3
from typing import Any

from tpuctl.sim.api_errors import failed_precondition
from tpuctl.sim.engine.hosts import VmOrder, host_signals
from tpuctl.sim.engine.records import update_node
from tpuctl.sim.world import World

#: What the metadata server says of a maintenance that stops the VM.
TERMINATE = "TERMINATE_ON_HOST_MAINTENANCE"
#: Capacity classes whose TPU API VMs Google restarts after host maintenance.
_KEPT_CLASSES = frozenset({"on_demand", "reserved"})

Key = tuple[str, str, str]


def start(conn: sqlite3.Connection, world: World, row: sqlite3.Row, now: float) -> dict[str, Any]:
    """Give a READY node's hosts the maintenance notice now; their VMs stop when it runs out. Returns
    the columns set (the caller's transaction applies them)."""
    if row["state"] != "READY" or row["kill_at"] is not None or row["maintenance_at"] is not None:
        raise failed_precondition(
            f"Node '{row['node_id']}' is {row['state']}"
            + (" and being preempted" if row["kill_at"] is not None else "")
            + (" and already noticed of a maintenance" if row["maintenance_at"] is not None else "")
            + "; only a READY node can be maintained."
        )
    updates = {
        "maintenance_event": TERMINATE,
        "maintenance_at": now + world.durations.maintenance_notice_s,
        "maintenance_until": None,
    }
    update_node(conn, _key(row), updates)
    return updates


def stop(conn: sqlite3.Connection, world: World, row: sqlite3.Row, orders: list[VmOrder]) -> None:
    """The notice ran out: the VMs stop; a kept node is REPAIRING until its VMs are back, another one is
    TERMINATED (see the module docstring)."""
    key, at = _key(row), float(row["maintenance_at"])
    if row["state"] != "READY":
        # Gone another way meanwhile (deleted, preempted): nothing left to maintain.
        update_node(conn, key, {"maintenance_event": None, "maintenance_at": None})
        return
    kept = row["surface"] == "tpu" and row["capacity_class"] in _KEPT_CLASSES
    orders.extend(host_signals(conn, *key, signal.SIGKILL, wipe=not kept))
    if kept:
        until = at + world.real_seconds(world.durations.maintenance_s)
        update_node(conn, key, {"state": "REPAIRING", "maintenance_at": None, "maintenance_until": until})
    else:
        update_node(conn, key, {"state": "TERMINATED", "maintenance_event": None, "maintenance_at": None})


def restart(conn: sqlite3.Connection, row: sqlite3.Row) -> None:
    """A kept node's VMs are back: READY, no maintenance pending (the fleet serves its hosts again, their
    disks as they were)."""
    updates: dict[str, Any] = {"maintenance_event": None, "maintenance_until": None}
    if row["state"] == "REPAIRING":
        updates["state"] = "READY"
    update_node(conn, _key(row), updates)


def _key(row: sqlite3.Row) -> Key:
    return (row["project"], row["zone"], row["node_id"])
