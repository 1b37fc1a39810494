"""A Compute Engine slice's preemption reaches its hosts as a TPU API preemption does
(docs/google-facts.md#preemption): the notice on every host's metadata server (``instance/preempted`` TRUE;
``maintenance-event`` stays NONE, a preemption is no host maintenance), SIGTERM to every process of every
host, the grace, then SIGKILL, the disks wiped and the sshds gone; Compute then shows TERMINATED instances and
a ``compute.instances.preempted`` operation each. For a lone instance and for a MIG slice."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import asyncssh
import httpx
import pytest
from api_schema import schema_problems
from compute_helpers import ZONE, Clients, compute_world, instance_body, mig_body, setup_slice_records
from google.cloud import compute_v1
from sim_helpers import PROJECT

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.testing.clock import FakeClock, wait_for

__all__ = ["schema_problems"]  # fixtures

MD = {"Metadata-Flavor": "Google"}
USER = "alice"
GRACE_S = 30
PROGRAM = (
    "import os, pathlib, signal, time\n"
    "home = pathlib.Path.home()\n"
    "signal.signal(signal.SIGTERM, lambda *_: (home / 'term').write_text('TERM'))\n"
    "(home / 'pid').write_text(str(os.getpid()))\n"
    "while True: time.sleep(0.05)\n"
)


def _ssh(address: str, port: int, key: asyncssh.SSHKey, command: str) -> str:
    async def run() -> str:
        async with asyncssh.connect(
            address, port, username=USER, client_keys=[key], known_hosts=None, connect_timeout=10
        ) as conn:
            done = await conn.run(command, timeout=30, check=True)
            return str(done.stdout).strip()

    return asyncio.run(run())


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _gone(path: Path) -> bool:
    return not path.exists()


def _dead(pid: int) -> bool:
    return not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _make(c: Clients, kind: str, ssh_keys: str) -> tuple[str, list[str]]:
    """The slice (its preempt_compute name) and its instances' names."""
    if kind == "instance":
        body = instance_body("solo", model="SPOT", metadata={"ssh-keys": ssh_keys})
        c.done(c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=body))
        return "solo", ["solo"]
    setup_slice_records(c, metadata={"ssh-keys": ssh_keys})
    c.done(c.migs.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=mig_body("m", 2)))
    wait_for(
        lambda: c.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="m").status.is_stable,
        timeout=20,
    )
    managed = c.migs.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager="m")
    return "m", sorted(m.name for m in managed)


@pytest.mark.parametrize("kind", ["instance", "mig"])
def test_preemption_reaches_every_host(
    kind: str, start_server: Callable[..., SimServer], schema_problems: list[str]
) -> None:
    clock = FakeClock(time.time(), ticking=True)
    world = compute_world(durations={"compute_op_s": 10, "node_create_s": 600, "preemption_grace_s": GRACE_S})
    server = start_server(world, clock=clock)
    c = Clients(server.url)
    key = asyncssh.generate_private_key("ssh-ed25519")
    target, names = _make(c, kind, f"{USER}:{key.export_public_key().decode().strip()}")
    addresses = [
        c.instances.get(project=PROJECT, zone=ZONE, instance=n).network_interfaces[0].network_i_p
        for n in names
    ]
    wait_for(lambda: {h.address for h in server.fleet.served()} >= set(addresses), timeout=60)
    homes, pids = [], []
    for address in addresses:
        home = Path(_ssh(address, server.ssh_port, key, "echo $HOME"))
        (home / "prog.py").write_text(PROGRAM)
        # Detached from the SSH session, as a launcher starts it: only the VM's fate reaches it.
        _ssh(address, server.ssh_port, key, "setsid python3 prog.py </dev/null >/dev/null 2>&1 &")
        written = wait_for(partial(_read, home / "pid"), what="program up")
        homes.append(home)
        pids.append(int(written))
    base = [f"http://{a}:{server.metadata_port}/computeMetadata/v1/instance/" for a in addresses]
    assert {httpx.get(b + "preempted", headers=MD).text for b in base} == {"FALSE"}

    # From the ETag of FALSE: TRUE whether the long poll reaches the VM before the preemption or after.
    params = {
        "wait_for_change": "true",
        "last_etag": httpx.get(base[-1] + "preempted", headers=MD).headers["ETag"],
    }
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        watch = pool.submit(httpx.get, base[-1] + "preempted", params=params, headers=MD, timeout=30)
        with SimAdminClient(server.url) as admin:
            admin.preempt_compute(ZONE, target)
        assert watch.result(timeout=20).text == "TRUE"
    for home, pid, b in zip(homes, pids, base, strict=True):
        wait_for((home / "term").exists, what="SIGTERM seen by the program")
        assert _alive(pid) and home.exists()  # the grace: it may checkpoint
        assert httpx.get(b + "preempted", headers=MD).text == "TRUE"
        assert httpx.get(b + "maintenance-event", headers=MD).text == "NONE"
    assert {c.instances.get(project=PROJECT, zone=ZONE, instance=n).status for n in names} == {"STOPPING"}

    clock.advance(GRACE_S)  # the grace is REAL seconds; the injected clock stands for them
    for home, pid in zip(homes, pids, strict=True):
        wait_for(partial(_dead, pid), what="SIGKILL after the grace")
        wait_for(partial(_gone, home), what="the preempted VM's disk wiped")
    wait_for(lambda: not {h.address for h in server.fleet.served()} & set(addresses), what="its sshds gone")
    for address in addresses:
        with pytest.raises(OSError):
            _ssh(address, server.ssh_port, key, "true")
    wait_for(
        lambda: (
            {c.instances.get(project=PROJECT, zone=ZONE, instance=n).status for n in names} == {"TERMINATED"}
        )
    )
    request = compute_v1.ListZoneOperationsRequest(
        project=PROJECT, zone=ZONE, filter='operationType="compute.instances.preempted"'
    )
    preempted = sorted(o.target_link.rsplit("/", 1)[-1] for o in c.operations.list(request=request))
    assert preempted == names
