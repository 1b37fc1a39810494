"""The simulated hosts of each node: the registry of the processes that stand for them (signalled on
preemption, stop and delete), their network endpoints, and what their metadata server reads."""

from __future__ import annotations

import json
import signal
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl import processes
from tpuctl.sim.api_errors import invalid_argument, not_found
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.records import endpoints, existing_node_row, node_json, node_row, update_node
from tpuctl.sim.shapes import node_name

if TYPE_CHECKING:
    from tpuctl.sim.engine.timeline import Timeline


@dataclass(frozen=True)
class SignalOrder:
    """A signal to send to a registered host process once the transaction that decided it commits."""

    pid: int
    start_ticks: int | None
    sig: signal.Signals


def host_signals(
    conn: sqlite3.Connection, project: str, zone: str, node_id: str, sig: signal.Signals
) -> list[SignalOrder]:
    """``sig`` for every registered host process of a node, to send after the transaction commits."""
    rows = conn.execute(
        "SELECT pid, start_ticks FROM hosts WHERE project = ? AND zone = ? AND node_id = ? ORDER BY worker",
        (project, zone, node_id),
    ).fetchall()
    return [SignalOrder(int(r["pid"]), r["start_ticks"], sig) for r in rows]


def send(orders: Iterable[SignalOrder]) -> None:
    for order in orders:
        processes.signal_registered(order.pid, order.start_ticks, order.sig)


class Hosts:
    """The host registry, endpoints and metadata of the simulated hosts."""

    def __init__(self, ctx: Context, timeline: Timeline) -> None:
        self.ctx = ctx
        self.timeline = timeline

    def register(
        self, zone: str, node_id: str, worker: int, pid: int, *, project: str | None = None
    ) -> dict[str, Any]:
        project = project or self.ctx.world.project
        if pid <= 1:
            raise invalid_argument(f"Invalid pid {pid}.", "pid")
        start_ticks = processes.process_start_ticks(pid)
        if start_ticks is None and processes.is_same_process(pid, None) is False:
            raise invalid_argument(f"No process with pid {pid} is running.", "pid")
        with self.ctx.db.write() as conn:
            row = node_row(conn, project, zone, node_id)
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

    def unregister(
        self, zone: str, node_id: str, worker: int | None = None, *, project: str | None = None
    ) -> int:
        project = project or self.ctx.world.project
        with self.ctx.db.write() as conn:
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
        self, zone: str, node_id: str, new: list[dict[str, Any]] | None, *, project: str | None = None
    ) -> dict[str, Any]:
        """Override a node's networkEndpoints (e.g. the ssh endpoints of its simulated hosts); None
        restores the default (127.0.0.1:8470 per host)."""
        project = project or self.ctx.world.project
        if new is not None:
            for i, endpoint in enumerate(new):
                if not isinstance(endpoint, dict) or not isinstance(endpoint.get("ipAddress"), str):
                    raise invalid_argument(f"endpoints[{i}] needs an ipAddress string.", f"endpoints[{i}]")
                if "port" in endpoint and not isinstance(endpoint["port"], int):
                    raise invalid_argument(f"endpoints[{i}].port must be an integer.", f"endpoints[{i}].port")
        with self.ctx.db.write() as conn:
            row = node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(node_name(project, zone, node_id))
            update_node(
                conn, (project, zone, node_id), {"endpoints": json.dumps(new) if new is not None else None}
            )
            return node_json(self.ctx.catalog, existing_node_row(conn, project, zone, node_id))

    def metadata_value(self, zone: str, node_id: str, worker: int, path: str) -> str | None:
        """The text the metadata server answers for ``path`` (after /computeMetadata/v1/) on one host of
        a node, or None when there is no such key. Raises 404 for an unknown node or worker."""
        self.timeline.advance()
        world = self.ctx.world
        with self.ctx.db.read() as conn:
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
        return _metadata_values(row, worker).get(path)


def _metadata_values(row: sqlite3.Row, worker: int) -> dict[str, str]:
    """Every key the metadata server answers on host ``worker`` of the node in ``row``."""
    spec = json.loads(row["spec"])
    user_metadata: dict[str, str] = spec.get("metadata") or {}
    attributes: dict[str, str] = {
        **user_metadata,
        "agent-worker-number": str(worker),
        "accelerator-type": row["accelerator_type"],
        "worker-network-endpoints": ",".join(
            f"unknown:unknown:{e.get('ipAddress', '')}" for e in endpoints(row)
        ),
    }
    scheduling = spec.get("schedulingConfig") or {}
    hostname = f"t1v-n-{int(row['uid']) % 16**8:08x}-w-{worker}"
    values: dict[str, str] = {
        "instance/preempted": "TRUE" if row["preempted_flag"] else "FALSE",
        "instance/maintenance-event": "NONE",
        "instance/name": hostname,
        "instance/hostname": hostname,
        "instance/id": row["uid"],
        "instance/zone": f"projects/{row['project']}/zones/{row['zone']}",
        "instance/scheduling/preemptible": "TRUE"
        if scheduling.get("preemptible") or scheduling.get("spot")
        else "FALSE",
        "instance/attributes/": "".join(f"{k}\n" for k in sorted(attributes)),
        "project/project-id": row["project"],
    }
    for key, value in attributes.items():
        values[f"instance/attributes/{key}"] = value
    return values
