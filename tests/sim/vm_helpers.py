"""Helpers for the VM tests: a node whose hosts are served, SSH into them, their metadata servers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import asyncssh
from google.cloud import tpu_v2
from sim_helpers import create_ready, node, tpu_client

from tpuctl.sim import SimServer
from tpuctl.testing.clock import wait_for

USER = "alice"


def ssh_run(
    address: str, port: int, key: asyncssh.SSHKey, command: str, *, user: str = USER, timeout_s: float = 150
) -> asyncssh.SSHCompletedProcess:
    """Run ``command`` over SSH on the simulated VM at ``address`` (the simulator's one sshd port)."""

    async def run() -> asyncssh.SSHCompletedProcess:
        async with asyncssh.connect(
            address, port, username=user, client_keys=[key], known_hosts=None, connect_timeout=10
        ) as conn:
            return await conn.run(command, timeout=timeout_s)

    return asyncio.run(run())


@dataclass
class Vms:
    server: SimServer
    client: tpu_v2.TpuClient
    node: tpu_v2.Node
    key: asyncssh.SSHKey

    @property
    def addresses(self) -> list[str]:
        return [e.ip_address for e in self.node.network_endpoints]

    def metadata_base(self, worker: int) -> str:
        return f"http://{self.addresses[worker]}:{self.server.metadata_port}"

    def ssh(
        self, worker: int, command: str, *, user: str = USER, key: Any = None
    ) -> asyncssh.SSHCompletedProcess:
        """Run ``command`` on host ``worker`` (as ``user`` with ``key``, default the node's) over SSH."""
        return ssh_run(
            self.addresses[worker], self.server.ssh_port, key or self.key, command, user=user, timeout_s=30
        )

    def server_host_key(self, worker: int) -> str:
        """The host key an SSH client sees on host ``worker`` (OpenSSH public line, no comment)."""

        async def fetch() -> str:
            async with asyncssh.connect(
                self.addresses[worker],
                self.server.ssh_port,
                username=USER,
                client_keys=[self.key],
                known_hosts=None,
            ) as conn:
                host_key = conn.get_server_host_key()
                assert host_key is not None
                return host_key.export_public_key().decode().split()[1]

        return asyncio.run(fetch())


def start_vms(server: SimServer, node_id: str, accelerator_type: str = "v5litepod-16", **fields: Any) -> Vms:
    """Create a READY node whose ssh-keys authorize a fresh key for ``alice``; wait until its hosts are
    served (the ticker brings them up)."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    public = key.export_public_key().decode().strip()
    metadata = {"ssh-keys": f"{USER}:{public}", **fields.pop("metadata", {})}
    client = tpu_client(server.url)
    ready = create_ready(client, node_id, node(accelerator_type, metadata=metadata, **fields))
    hosts = len(ready.network_endpoints)
    uid = str(ready.id)
    wait_for(
        lambda: sum(h.uid == uid for h in server.fleet.served()) == hosts,
        timeout=120,
        what=f"{hosts} hosts of {node_id} served (fleet error: {server.fleet.last_error!r})",
    )
    return Vms(server, client, ready, key)
