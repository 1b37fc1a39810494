"""The simulated hosts of each node, as the engine sees them: the signals their VMs get (on preemption,
stop and delete), their network endpoints, what their metadata server answers and which SSH keys they
accept. The VMs themselves (disks, sshd, metadata servers) are ``tpuctl.sim.vms``'."""

from __future__ import annotations

import json
import signal
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.sim.api_errors import invalid_argument, not_found
from tpuctl.sim.engine.context import Context
from tpuctl.sim.engine.metadata_values import megascale_of, metadata_values, tpu_vm_instance_name
from tpuctl.sim.engine.oslogin import OsLogin, os_login_enabled
from tpuctl.sim.engine.records import existing_node_row, host_addresses, node_json, node_row, update_node
from tpuctl.sim.shapes import node_name
from tpuctl.sim.vms import procs
from tpuctl.sim.vms.layout import disk_dir, read_host_public_key

if TYPE_CHECKING:
    from tpuctl.sim.engine.timeline import Timeline


@dataclass(frozen=True)
class VmOrder:
    """A signal for every process of some VMs, sent once the transaction that decided it commits; a
    SIGKILL with ``wipe`` also wipes their disks."""

    hosts: tuple[tuple[str, int], ...]
    sig: signal.Signals
    wipe: bool = False


def host_signals(
    conn: sqlite3.Connection,
    project: str,
    zone: str,
    node_id: str,
    sig: signal.Signals,
    *,
    wipe: bool = False,
) -> list[VmOrder]:
    """``sig`` for every host of a node (its VMs), to send after the transaction commits."""
    row = node_row(conn, project, zone, node_id)
    if row is None:
        return []
    hosts = tuple((str(row["uid"]), worker) for worker in range(int(row["hosts"])))
    return [VmOrder(hosts, sig, wipe)]


def send(vm_root: Path, orders: Iterable[VmOrder]) -> None:
    for order in orders:
        procs.signal_hosts(vm_root, order.hosts, order.sig, wipe=order.wipe)


class Hosts:
    """Endpoints, metadata, login keys and host keys of the simulated hosts."""

    def __init__(self, ctx: Context, timeline: Timeline, oslogin: OsLogin) -> None:
        self.ctx = ctx
        self.timeline = timeline
        self.oslogin = oslogin

    def set_endpoints(
        self, zone: str, node_id: str, new: list[dict[str, Any]] | None, *, project: str | None = None
    ) -> dict[str, Any]:
        """Override a node's networkEndpoints; None restores the default (each host's own address, port
        8470). The VMs keep serving on their own addresses."""
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

    def metadata_value(
        self, zone: str, node_id: str, worker: int, path: str, *, project: str | None = None
    ) -> str | None:
        """The text the metadata server answers for ``path`` (after /computeMetadata/v1/) on one host of
        a node, or None when there is no such key. Raises 404 for an unknown node or worker."""
        self.timeline.advance()
        return self._metadata_values(self._host_row(zone, node_id, worker, project), worker).get(path)

    def metadata_tree(
        self, zone: str, node_id: str, worker: int, *, project: str | None = None
    ) -> dict[str, str]:
        """Every key (path after /computeMetadata/v1/) the host's metadata server answers."""
        self.timeline.advance()
        return self._metadata_values(self._host_row(zone, node_id, worker, project), worker)

    def _metadata_values(self, row: sqlite3.Row, worker: int) -> dict[str, str]:
        megascale = None
        if row["multislice"]:  # only a multislice node's hosts read their queued resource's plan
            with self.ctx.db.read() as conn:
                megascale = megascale_of(conn, self.ctx.catalog, row)
        return metadata_values(
            row,
            worker,
            self.ctx.vm_ports[1],
            compute_agent_worker_number=self.ctx.world.compute_agent_worker_number,
            megascale=megascale,
        )

    def resolve_instance(self, project: str, zone: str, name: str) -> str | None:
        """The internal address of Compute Engine instance ``name`` of ``project`` in ``zone``, as the
        VPC's internal DNS answers ``name.zone.c.project.internal``; None when there is no such
        instance, or it is not up (its slice not READY: no address to answer with)."""
        self.timeline.advance()
        with self.ctx.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM nodes WHERE project = ? AND zone = ? AND surface IN ('compute', 'vm')",
                (project, zone),
            ).fetchall()
        for row in rows:
            names: list[str] = json.loads(row["spec"])["compute"]["names"]
            if name in names and row["state"] == "READY" and row["host_base"] is not None:
                return host_addresses(row)[names.index(name)]
        return None

    def _host_row(self, zone: str, node_id: str, worker: int, project: str | None) -> sqlite3.Row:
        world = self.ctx.world
        with self.ctx.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM nodes WHERE zone = ? AND node_id = ?", (zone, node_id)
            ).fetchall()
        if project is not None:
            rows = [r for r in rows if r["project"] == project]
        # Prefer the world's project when several projects have a node of that name in the zone.
        rows = sorted(rows, key=lambda r: r["project"] != world.project)
        if not rows:
            raise not_found(f"zones/{zone}/nodes/{node_id}")
        row: sqlite3.Row = rows[0]
        if not 0 <= worker < int(row["hosts"]):
            raise not_found(f"zones/{zone}/nodes/{node_id}/workers/{worker}")
        return row

    def login_keys(self, project: str, zone: str, node_id: str, username: str) -> list[str]:
        """The public keys (``keytype base64``) host logins of ``username`` accept right now: the node's
        ``ssh-keys`` metadata lines for that user, as the guest agent writes them to the user's
        authorized_keys; or, when OS Login is on (the node's ``enable-oslogin`` metadata, else the
        project's: the world's ``os_login``), the unexpired keys imported through OS Login for the account
        whose POSIX name it is, and ``ssh-keys`` is ignored (https://cloud.google.com/compute/docs/oslogin:
        "OS Login ... ignores ssh-keys metadata")."""
        with self.ctx.db.read() as conn:
            row = node_row(conn, project, zone, node_id)
            if row is None:
                return []
            metadata: dict[str, str] = json.loads(row["spec"]).get("metadata") or {}
        if os_login_enabled(self.ctx.world, metadata):
            return self.oslogin.accepted_keys(username)
        return ssh_keys_for(metadata.get("ssh-keys", ""), username)

    def host_keys(self, project: str, zone: str, node_id: str) -> list[str | None]:
        """Each worker's host public key (OpenSSH line), None where its disk does not exist (yet)."""
        with self.ctx.db.read() as conn:
            row = node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(node_name(project, zone, node_id))
            uid, hosts = str(row["uid"]), int(row["hosts"])
        return [read_host_public_key(disk_dir(self.ctx.vm_root, uid, w)) for w in range(hosts)]

    def instance_names(self, project: str, zone: str, node_id: str) -> list[str]:
        """Each worker's Compute Engine instance name (what its metadata server calls ``instance/name``)."""
        with self.ctx.db.read() as conn:
            row = node_row(conn, project, zone, node_id)
            if row is None:
                raise not_found(node_name(project, zone, node_id))
            uid, hosts = str(row["uid"]), int(row["hosts"])
        return [tpu_vm_instance_name(uid, w) for w in range(hosts)]


def ssh_keys_for(ssh_keys: str, username: str) -> list[str]:
    """The ``keytype base64`` keys of ``username`` in an ``ssh-keys`` metadata value: one ``user:key``
    per line, the key an authorized_keys line (``keytype base64 [comment]``), as the guest agent reads it
    (https://cloud.google.com/compute/docs/connect/add-ssh-keys#metadata)."""
    keys: list[str] = []
    for line in ssh_keys.splitlines():
        user, sep, key = line.strip().partition(":")
        fields = key.split()
        if sep and user == username and len(fields) >= 2:
            keys.append(f"{fields[0]} {fields[1]}")
    return keys
