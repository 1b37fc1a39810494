"""The rows of nodes and queued resources: finding, writing and rendering them as the TPU API's JSON."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from tpuctl.catalog import Catalog
from tpuctl.sim.engine.plans import NodePlan
from tpuctl.sim.shapes import node_name, node_uid, qr_name
from tpuctl.sim.vms.layout import ENDPOINT_PORT, host_address
from tpuctl.sim.vpc import full_paths
from tpuctl.sim.wire import rfc3339

#: Queued-resource states in which the service still has work to do for it.
QR_PENDING_STATES = ("ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "SUSPENDING", "DELETING")
#: Queued-resource states whose quota stays consumed until the QR is deleted (GCP behaviour).
QR_QUOTA_HOLDING_STATES = ("SUSPENDED", "FAILED")

#: Where a node's hosts answer when nobody set its endpoints (admin API): one per host.
DEFAULT_ENDPOINT_PORT = ENDPOINT_PORT
#: The address of every host of a node made by a state older than per-host addresses.
LEGACY_ENDPOINT_IP = "127.0.0.1"

#: The queued-resource state's data field for each state (FAILED's carries the error).
_QR_STATE_DATA = {
    "ACCEPTED": "acceptedData",
    "PROVISIONING": "provisioningData",
    "ACTIVE": "activeData",
    "SUSPENDING": "suspendingData",
    "SUSPENDED": "suspendedData",
    "DELETING": "deletingData",
    "CREATING": "creatingData",
}


def placeholders(values: tuple[str, ...]) -> str:
    return ", ".join("?" for _ in values)


def node_row(conn: sqlite3.Connection, project: str, zone: str, node_id: str) -> sqlite3.Row | None:
    return conn.execute(  # type: ignore[no-any-return]
        "SELECT * FROM nodes WHERE project = ? AND zone = ? AND node_id = ?", (project, zone, node_id)
    ).fetchone()


def qr_row(conn: sqlite3.Connection, project: str, zone: str, qr_id: str) -> sqlite3.Row | None:
    return conn.execute(  # type: ignore[no-any-return]
        "SELECT * FROM queued_resources WHERE project = ? AND zone = ? AND qr_id = ?",
        (project, zone, qr_id),
    ).fetchone()


def existing_node_row(conn: sqlite3.Connection, project: str, zone: str, node_id: str) -> sqlite3.Row:
    row = node_row(conn, project, zone, node_id)
    if row is None:  # only after this transaction wrote it: a bug, not a user error
        raise RuntimeError(f"node {project}/{zone}/{node_id} vanished inside its own transaction")
    return row


def existing_qr_row(conn: sqlite3.Connection, project: str, zone: str, qr_id: str) -> sqlite3.Row:
    row = qr_row(conn, project, zone, qr_id)
    if row is None:
        raise RuntimeError(f"queued resource {project}/{zone}/{qr_id} vanished inside its own transaction")
    return row


def rows_in(
    conn: sqlite3.Connection, table: str, project: str, zone: str, order_by: str
) -> list[sqlite3.Row]:
    """A project's rows of ``table`` in ``zone`` ("-": every zone), as a List call returns them."""
    if zone == "-":
        return conn.execute(
            f"SELECT * FROM {table} WHERE project = ? ORDER BY zone, {order_by}", (project,)
        ).fetchall()
    return conn.execute(
        f"SELECT * FROM {table} WHERE project = ? AND zone = ? ORDER BY {order_by}", (project, zone)
    ).fetchall()


def update_node(conn: sqlite3.Connection, key: tuple[str, str, str], updates: dict[str, Any]) -> None:
    columns = ", ".join(f"{column} = ?" for column in updates)
    conn.execute(
        f"UPDATE nodes SET {columns} WHERE project = ? AND zone = ? AND node_id = ?",
        (*updates.values(), *key),
    )


def delete_node_rows(conn: sqlite3.Connection, key: tuple[str, str, str]) -> None:
    """A node's row goes (the caller kills its hosts after the transaction commits)."""
    conn.execute("DELETE FROM nodes WHERE project = ? AND zone = ? AND node_id = ?", key)


def insert_node(
    conn: sqlite3.Connection,
    seed: int,
    project: str,
    zone: str,
    plan: NodePlan,
    reservation: str | None,
    now: float,
    due: float,
    *,
    op_name: str | None,
    queued_resource: str | None = None,
    hosts: int | None = None,
    surface: str = "tpu",
) -> None:
    """A new CREATING node that becomes READY at ``due``; ``seed`` is the world's (for its uid). Its hosts
    get the next addresses of this state's numbering, never reused (a VM may outlive its node's row).
    ``hosts`` overrides the accelerator type's host count (a Compute Engine slice's VMs are its machine
    type's size, e.g. a v6e 2x4 slice of two ct6e-standard-4t); ``surface`` is the API that owns it."""
    accel = plan.accel
    host_count = accel.hosts if hosts is None else hosts
    host_base = _take_host_numbers(conn, host_count)
    conn.execute(
        """
        INSERT INTO nodes (project, zone, node_id, uid, generation, accelerator_type, topology, chips,
                           hosts, quota_units, capacity_class, reservation, state, next_state, due_at,
                           op_name, create_time, spec, queued_resource, multislice, host_base, surface)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'CREATING', 'READY', ?, ?, ?, ?, ?, ?, ?, ?)
        """,
        (
            project,
            zone,
            plan.node_id,
            node_uid(seed, project, zone, plan.node_id, now),
            accel.generation.name,
            accel.api_name,
            accel.topology,
            accel.chips,
            host_count,
            accel.quota_units,
            plan.capacity_class,
            reservation,
            due,
            op_name,
            now,
            json.dumps(plan.spec),
            queued_resource,
            int(plan.multislice),
            host_base,
            surface,
        ),
    )


def insert_vm_node(
    conn: sqlite3.Connection,
    seed: int,
    key: tuple[str, str, str],
    machine_type: str,
    family: str,
    capacity_class: str,
    spec: dict[str, Any],
    now: float,
    due: float,
) -> None:
    """A new CREATING one-host node of a general-purpose VM (``surface = 'vm'``): no accelerator, no
    chips, no quota units; its ``generation`` is the machine family (e2), which no TPU pool has."""
    project, zone, node_id = key
    conn.execute(
        """
        INSERT INTO nodes (project, zone, node_id, uid, generation, accelerator_type, topology, chips,
                           hosts, quota_units, capacity_class, reservation, state, next_state, due_at,
                           op_name, create_time, spec, queued_resource, multislice, host_base, surface)
        VALUES (?, ?, ?, ?, ?, ?, '', 0, 1, 0, ?, NULL, 'CREATING', 'READY', ?, NULL, ?, ?, NULL, 0, ?, 'vm')
        """,
        (
            project,
            zone,
            node_id,
            node_uid(seed, project, zone, node_id, now),
            family,
            machine_type,
            capacity_class,
            due,
            now,
            json.dumps(spec),
            _take_host_numbers(conn, 1),
        ),
    )


def _take_host_numbers(conn: sqlite3.Connection, count: int) -> int:
    """``count`` consecutive host numbers, inside the caller's write transaction."""
    rows = dict(
        conn.execute(
            "SELECT key, value FROM meta WHERE key IN ('host_address_offset', 'next_host')"
        ).fetchall()
    )
    taken = int(rows.get("next_host", 0))
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('next_host', ?)", (str(taken + count),))
    return int(rows.get("host_address_offset", 0)) + taken


def host_addresses(row: sqlite3.Row) -> list[str]:
    """Each host's own loopback address (what its sshd and metadata server bind), in worker order."""
    base = row["host_base"]
    if base is None:
        return [LEGACY_ENDPOINT_IP] * int(row["hosts"])
    return [host_address(int(base) + worker) for worker in range(int(row["hosts"]))]


def set_qr_state(conn: sqlite3.Connection, key: tuple[str, str, str], state: str, initiator: str) -> None:
    conn.execute(
        "UPDATE queued_resources SET state = ?, state_initiator = ? "
        "WHERE project = ? AND zone = ? AND qr_id = ?",
        (state, initiator, *key),
    )


def endpoints(row: sqlite3.Row, *, external: bool = True) -> list[dict[str, Any]]:
    """A node's networkEndpoints: the ones set through the admin API, or each host's own address (with an
    external address only when the node has external IPs: the API's networkConfig.enableExternalIps
    defaults to false; the simulated "external" address is the same loopback one, the only one there is)."""
    if row["endpoints"]:
        return list(json.loads(row["endpoints"]))
    return [
        {
            "ipAddress": address,
            "port": DEFAULT_ENDPOINT_PORT,
            **({"accessConfig": {"externalIp": address}} if external else {}),
        }
        for address in host_addresses(row)
    ]


def resolved_network_config(project: str, zone: str, given: Any) -> dict[str, Any]:
    """The networkConfig as Google answers it: the network and subnetwork resolved to full resource names
    (``default`` when not given), the rest as sent. External IPs are off unless asked for: the field's
    proto3 default is false (discovery document, NetworkConfig.enableExternalIps; gcloud sends true unless
    ``--internal-ips``), and SkyPilot's provisioner reads the resolved ``network``."""
    config = dict(given) if isinstance(given, dict) else {}
    config.update(full_paths(project, zone, config.get("network"), config.get("subnetwork")))
    return config


def node_json(catalog: Catalog, row: sqlite3.Row) -> dict[str, Any]:
    """A node row as the TPU API's Node."""
    project, zone, node_id = row["project"], row["zone"], row["node_id"]
    spec = json.loads(row["spec"])
    gen = catalog.generations[row["generation"]]
    out: dict[str, Any] = {"name": node_name(project, zone, node_id)}
    out.update(spec)
    out["acceleratorType"] = row["accelerator_type"]
    out["acceleratorConfig"] = {"type": gen.api_enum, "topology": row["topology"]}
    if "networkConfigs" not in spec:
        out["networkConfig"] = resolved_network_config(project, zone, spec.get("networkConfig"))
    out["state"] = row["state"]
    if row["state"] == "READY":
        out["health"] = "HEALTHY"
    elif row["state"] == "REPAIRING":
        out["health"] = "UNHEALTHY_MAINTENANCE"
    upcoming = maintenance_upcoming(row)
    if upcoming is not None:
        out["upcomingMaintenance"] = upcoming
    out["id"] = row["uid"]
    out["createTime"] = rfc3339(float(row["create_time"]))
    out["apiVersion"] = "V2"
    if row["state"] != "CREATING":
        external = bool(out.get("networkConfig", {}).get("enableExternalIps"))
        out["networkEndpoints"] = endpoints(row, external=external)
    if row["queued_resource"]:
        out["queuedResource"] = qr_name(project, zone, row["queued_resource"])
    if row["multislice"]:
        out["multisliceNode"] = True
    return out


def maintenance_upcoming(row: sqlite3.Row) -> dict[str, Any] | None:
    """The node's ``upcomingMaintenance`` while a host maintenance is noticed or under way (None: none;
    ``tpuctl.sim.engine.maintenance`` plays it)."""
    if row["maintenance_at"] is not None:
        start_at = rfc3339(float(row["maintenance_at"]))
        status = "PENDING"
    elif row["state"] == "REPAIRING" and row["maintenance_until"] is not None:
        start_at, status = None, "ONGOING"
    else:
        return None
    out: dict[str, Any] = {"type": "UNSCHEDULED", "canReschedule": False, "maintenanceStatus": status}
    if start_at is not None:
        out["windowStartTime"] = out["latestWindowStartTime"] = start_at
    if row["maintenance_until"] is not None:
        out["windowEndTime"] = rfc3339(float(row["maintenance_until"]))
    return out


def qr_json(row: sqlite3.Row) -> dict[str, Any]:
    """A queued-resource row as the TPU API's QueuedResource."""
    spec = json.loads(row["spec"])
    out: dict[str, Any] = {
        "name": qr_name(row["project"], row["zone"], row["qr_id"]),
        "createTime": rfc3339(float(row["create_time"])),
    }
    out.update(spec)
    state_name = row["state"]
    state: dict[str, Any] = {"state": state_name, "stateInitiator": row["state_initiator"]}
    data_key = _QR_STATE_DATA.get(state_name)
    if data_key:
        state[data_key] = {}
    if state_name == "FAILED":
        state["failedData"] = {"error": json.loads(row["error"]) if row["error"] else {}}
    out["state"] = state
    return out
