"""The hypervisor: one process per simulator state runs its VMs, so a VM never depends on the command
that created it; a dead VM answers nothing and dies before its new state can be read."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from sim_helpers import ZONE, create_ready, make_world, node, tpu_client
from vm_helpers import USER, start_vms

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.hypervisor import ensure_hypervisor, hypervisor_pid, stop_hypervisor
from tpuctl.sim.state import SimDatabase, db_path_for
from tpuctl.sim.vms import procs
from tpuctl.sim.vms.layout import chosen_ports, disk_dir, vm_root_for
from tpuctl.testing.clock import wait_for


def _ssh(address: str, port: int, key: asyncssh.SSHKey, command: str) -> str:
    async def run() -> str:
        async with asyncssh.connect(
            address, port, username=USER, client_keys=[key], known_hosts=None, connect_timeout=5
        ) as conn:
            result = await conn.run(command, check=True, timeout=30)
            return str(result.stdout)

    return asyncio.run(run())


def _answers(address: str, port: int, key: asyncssh.SSHKey) -> bool:
    try:
        return _ssh(address, port, key, "echo up").strip() == "up"
    except (OSError, asyncssh.Error):
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _start(state_dir: Path, tmp_path: Path, **kwargs: Any) -> bool:
    SimDatabase(db_path_for(state_dir)).close()
    return ensure_hypervisor(state_dir, ports=chosen_ports(), wheelhouse=tmp_path / "wheels", **kwargs)


def test_a_vm_outlives_the_simulator_process_that_created_it(
    start_server: Callable[..., SimServer], state_dir: Path
) -> None:
    server = start_server(make_world(), vms="hypervisor")
    key = asyncssh.generate_private_key("ssh-ed25519")
    public = key.export_public_key().decode().strip()
    client = tpu_client(server.url)
    ready = create_ready(client, "lives", node("v5litepod-8", metadata={"ssh-keys": f"{USER}:{public}"}))
    address, port = ready.network_endpoints[0].ip_address, server.ssh_port
    wait_for(lambda: _answers(address, port, key), timeout=120, what="the host's sshd, from the hypervisor")
    _ssh(address, port, key, "echo kept > ~/note")

    server.stop()  # the command that created the slice exits

    assert _ssh(address, port, key, "cat ~/note").strip() == "kept"
    vm_root = vm_root_for(state_dir)
    assert hypervisor_pid(vm_root) is not None
    with pytest.raises(RuntimeError, match="hypervisor"):
        _ = server.fleet
    # Stopped, the hypervisor leaves the disk of a READY node for the next one to serve.
    assert stop_hypervisor(vm_root) is True
    assert (vm_root / "disks").is_dir() and (vm_root / "image").is_dir()


def test_one_hypervisor_per_state_and_it_stops_when_told(state_dir: Path, tmp_path: Path) -> None:
    vm_root = vm_root_for(state_dir)
    assert _start(state_dir, tmp_path) is True
    pid = wait_for(lambda: hypervisor_pid(vm_root), timeout=30, what="the hypervisor's lock")
    assert pid is not None
    assert _start(state_dir, tmp_path) is False

    # One started anyway finds the lock taken and leaves the state to the first.
    second = subprocess.run(
        [sys.executable, "-m", "tpuctl.sim.hypervisor", "--state-dir", str(state_dir),
         "--ssh-port", "2222", "--metadata-port", "8080", "--wheelhouse", str(tmp_path)],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert hypervisor_pid(vm_root) == pid

    assert stop_hypervisor(vm_root) is True
    assert hypervisor_pid(vm_root) is None
    wait_for(lambda: not _alive(pid), timeout=10, what="the hypervisor process gone")
    assert stop_hypervisor(vm_root) is False


def test_it_exits_when_idle_and_when_its_state_is_thrown_away(state_dir: Path, tmp_path: Path) -> None:
    vm_root = vm_root_for(state_dir)
    _start(state_dir, tmp_path, idle_exit_s=0.2)
    idle = wait_for(lambda: hypervisor_pid(vm_root), timeout=30, what="the hypervisor up")
    assert idle is not None
    wait_for(lambda: not _alive(idle), timeout=60, what="the idle hypervisor gone")
    # It exited normally (an exception would leave its root and log) and left nothing in the temp dir:
    # no VM root (its image alone is ~17 MB), nothing renamed away on the way.
    assert list(vm_root.parent.glob(f"{vm_root.name}*")) == []

    _start(state_dir, tmp_path)
    pid = wait_for(lambda: hypervisor_pid(vm_root), timeout=30, what="a new hypervisor")
    assert pid is not None
    db_path_for(state_dir).unlink()
    wait_for(lambda: not _alive(pid), timeout=30, what="the hypervisor of a removed state gone")


def test_a_hard_preemption_kills_before_the_new_state_can_be_read(
    server: SimServer, admin: SimAdminClient, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_ready(tpu_client(server.url), "hard", node("v5litepod-8"))
    states_at_kill: list[str] = []
    real = procs.signal_hosts

    def spy(vm_root: Path, hosts: Any, sig: signal.Signals, *, wipe: bool) -> None:
        if sig is signal.SIGKILL:
            # Another reader (a client in another process) sees only what is committed.
            with sqlite3.connect(db_path_for(state_dir)) as other:
                row = other.execute("SELECT state FROM nodes WHERE node_id = 'hard'").fetchone()
            states_at_kill.append(row[0])
        real(vm_root, hosts, sig, wipe=wipe)

    monkeypatch.setattr(procs, "signal_hosts", spy)
    assert admin.preempt(ZONE, "hard", notice=False)["state"] == "PREEMPTED"
    assert states_at_kill == ["READY"]


def test_a_vm_whose_disk_is_gone_answers_nothing(start_server: Callable[..., SimServer]) -> None:
    server = start_server(make_world())
    vms = start_vms(server, "gone", "v5litepod-8")
    assert vms.ssh(0, "echo up").stdout == "up\n"
    procs.wipe_disk(disk_dir(server.engine.ctx.vm_root, str(vms.node.id), 0))
    # Its sshd is still listening until the next reconcile notices the node; it serves no session.
    with pytest.raises((OSError, asyncssh.Error)):
        vms.ssh(0, "true")
