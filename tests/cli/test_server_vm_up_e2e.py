"""`tpuctl server up` on the served simulator, through the CLI, as a team runs it (slow: two VMs set up
from the package mirror): the server VM created, logged in to through OS Login, tpuctl installed and
started as a user unit; a laptop reaches it through an SSH port forward to the VM's loopback (what
``gcloud compute ssh ... -- -N -L`` does), submits a run and exits; the run's slice is preempted and the run
recovers and finishes with no client running; ``server down`` takes the final copy and deletes the VM;
a second ``server up`` restores the ledger from the bucket and the laptop still lists the run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from tpuctl.backends.sim import SIM_BUCKET, sim_os_login
from tpuctl.hosts.ssh import ensure_key_pair
from tpuctl.services.server_vm.plan import SERVER_PORT
from tpuctl.sim import SimAdminClient
from tpuctl.sim.admin import NodeStatus
from tpuctl.sim.iam import default_service_account
from tpuctl.sim.network import API_PORT
from tpuctl.sim.vms.layout import services_address
from tpuctl.testing.cli import Cli
from tpuctl.testing.clock import wait_for
from tpuctl.testing.ports import unused_port

ZONE = "us-central1-a"
WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    "durations": {"preemption_grace_s": 1},
}
#: The first attempt prints for about 15 s (long enough to be preempted mid-run), a recovery at once.
PROGRAM = """
import os, time
attempt = os.environ.get("TPUCTL_RESTART_COUNT", "0")
for i in range(30):
    print(f"attempt {attempt} line {i}", flush=True)
    time.sleep(0.5 if attempt == "0" else 0.01)
"""


class PortForward:
    """``ssh -N -L LOCAL:127.0.0.1:SERVER_PORT user@vm``, in a thread of its own."""

    def __init__(self, address: str, port: int, username: str, key: Path) -> None:
        self.local = unused_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._run(address, port, username, key),), daemon=True
        )
        self._thread.start()
        assert self._ready.wait(30), "the port forward did not start"
        if self._error is not None:
            raise self._error

    async def _run(self, address: str, port: int, username: str, key: Path) -> None:
        self._stop = asyncio.Event()
        try:
            conn = await asyncssh.connect(
                address, port, username=username, client_keys=[str(key)], known_hosts=None
            )
            async with conn:
                await conn.forward_local_port("127.0.0.1", self.local, "127.0.0.1", SERVER_PORT)
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # said to the test's thread
            self._error = exc
            self._ready.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local}"

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def _laptop(env: dict[str, str], url: str, *args: str) -> dict[str, Any]:
    """One laptop command through the server, as a process that exits; its JSON document."""
    argv = [sys.executable, "-m", "tpuctl", "--server", url, *args, "-o", "json"]
    done = subprocess.run(argv, env=env, capture_output=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = done.stdout.decode()
    document: dict[str, Any] = json.loads(out[out.index("{") :])
    return document


def _forward(
    cli: Cli, admin: SimAdminClient, project: str, state_dir: Path, closers: list[Callable[[], None]]
) -> PortForward:
    status = cli(
        "--backend",
        "sim",
        "--project",
        project,
        "server",
        "status",
        "--zone",
        ZONE,
        "--bucket",
        SIM_BUCKET,
        "-o",
        "json",
    )
    assert status.code == 0, status.stderr
    state = json.loads(status.stdout)["server"]
    assert (state["unit"], state["ready"]) == ("active", True), state
    logs = cli("--backend", "sim", "--project", project, "server", "logs", "--zone", ZONE)
    assert logs.code == 0 and "Started tpuctl team server" in logs.stdout, logs.stderr
    vm = state["vm"]
    key = ensure_key_pair(state_dir)
    access = sim_os_login(admin.base_url, closers)
    username = access.authorize_key(project, key.public_openssh, expires_at=time.time() + 3600).username
    assert key.private_path is not None
    forward = PortForward(vm["external_ip"] or vm["internal_ip"], admin.status()["ssh_port"], username,
                          key.private_path)  # fmt: skip
    closers.append(forward.close)
    return forward


@pytest.fixture
def closers() -> Iterator[list[Callable[[], None]]]:
    done: list[Callable[[], None]] = []
    yield done
    for close in reversed(done):
        close()


@pytest.mark.slow
def test_server_up_keeps_a_run_going_without_its_client_and_comes_back_from_its_copy(
    one_server_vm: None,
    cli: Cli,
    serve_sim: Callable[..., SimAdminClient],
    tmp_path: Path,
    state_dir: Path,
    closers: list[Callable[[], None]],
) -> None:
    admin = serve_sim(WORLD)
    project = str(admin.status()["project"])
    up_args = (
        "--backend",
        "sim",
        "--project",
        project,
        "server",
        "up",
        "--zone",
        ZONE,
        "--bucket",
        SIM_BUCKET,
    )
    started = time.monotonic()
    up = cli(*up_args, "-o", "json")
    assert up.code == 0, up.stderr[-4000:]
    first = json.loads(up.stdout)["server"]
    assert first["vm"]["status"] == "RUNNING" and first["restored"].startswith("no copy to restore")
    assert any("tunnel-through-iap" in line for line in first["reach"])
    assert "installing tpuctl on the VM" in up.stderr  # progress on stderr
    up_s = time.monotonic() - started

    forward = _forward(cli, admin, project, state_dir, closers)
    laptop_env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    laptop_env["TPUCTL_STATE_DIR"] = str(tmp_path / "laptop")
    script = tmp_path / "proj" / "prog.py"
    script.parent.mkdir()
    script.write_text(PROGRAM)
    submitted = _laptop(laptop_env, forward.url, "run", str(script), "--type", "v5e-8", "--zone", ZONE,
                        "--no-runtime-deps", "--detach")  # fmt: skip
    run_id = str(submitted["run"]["run_id"])

    def slice_printing() -> NodeStatus | None:
        runs = _laptop(laptop_env, forward.url, "runs", "list")["runs"]
        if not runs or runs[0]["status"] != "running":
            return None
        # The run's slice, not the server's VM (which the simulator lists as a node of its own).
        slices = [n for n in admin.status()["nodes"] if n["accelerator_type"].startswith("v5")]
        return slices[0] if slices and slices[0]["state"] == "READY" else None

    node = wait_for(slice_printing, timeout=300, interval=1.0, what="the run to run")
    assert node is not None

    def printed() -> bool:
        argv = [sys.executable, "-m", "tpuctl", "--server", forward.url, "runs", "logs", run_id]
        done = subprocess.run(argv, env=laptop_env, capture_output=True, timeout=120, check=False)
        return "attempt 0 line 2" in done.stdout.decode()

    wait_for(printed, timeout=120, interval=1.0, what="the first attempt's lines")  # preempted mid-run
    admin.preempt(node["zone"], node["name"], notice=True)

    def ended() -> str | None:
        status = str(_laptop(laptop_env, forward.url, "runs", "list")["runs"][0]["status"])
        return status if status in ("succeeded", "failed", "cancelled") else None

    assert wait_for(ended, timeout=300, interval=2.0, what="the run to end") == "succeeded"
    # The server on the VM called the simulated APIs where its VM's logins are told they are (the
    # network's own address, as a Google VM reaches googleapis.com), as the VM's service account (from
    # its metadata server), never as the laptop's user who created the VM.
    network = SimAdminClient(f"http://{services_address(state_dir)}:{API_PORT}")
    closers.append(network.close)
    creates = [m for m in network.mutations() if m["method"] == "POST" and m["path"].endswith("/nodes")]
    assert len(creates) == 2  # the first slice, preempted, and the recovery's
    assert {m["caller"] for m in creates} == {default_service_account(project)}
    assert not [m for m in admin.mutations() if m["path"].endswith("/nodes")]  # none through the laptop's

    down = cli(
        "--backend",
        "sim",
        "--project",
        project,
        "server",
        "down",
        "--zone",
        ZONE,
        "--bucket",
        SIM_BUCKET,
        "-o",
        "json",
    )
    assert down.code == 0, down.stderr[-3000:]
    final = json.loads(down.stdout)["server"]
    assert final["deleted"] and final["final_copy"].startswith(f"copied to gs://{SIM_BUCKET}/")
    for close in reversed(closers):
        close()
    closers.clear()

    again = cli(*up_args, "-o", "json")
    assert again.code == 0, again.stderr[-4000:]
    assert json.loads(again.stdout)["server"]["restored"].startswith(f"restored gs://{SIM_BUCKET}/")
    forward = _forward(cli, admin, project, state_dir, closers)
    listed = _laptop(laptop_env, forward.url, "runs", "list")["runs"]
    assert [(r["run_id"], r["status"]) for r in listed] == [(run_id, "succeeded")]
    assert (
        cli(
            "--backend", "sim", "--project", project, "server", "down", "--zone", ZONE, "--bucket", SIM_BUCKET
        ).code
        == 0
    )
    print(f"first server up: {up_s:.0f} s; whole scenario: {time.monotonic() - started:.0f} s")
