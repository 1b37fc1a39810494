"""A slice never outlives its run by long, laptop or not: ``run --detach --max-hours`` on a served
simulator, then ``kill -9`` of the run's background supervisor and of every other tpuctl client process
(the served simulator, the cloud, stays up). The run's deadman on host 0 deletes the slice with the host's
own token once the program ended and no supervisor checked in for the grace, not before; the simulator's
deletion log says it was that path; and the next tpuctl command records in the ledger why the slice went.
One host and a tiny program without the runtime's packages; the grace is seconds. The plan of a run with
``--max-hours`` shows its deadline and what keeps it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.hosts import deadman
from tpuctl.services.run.backstop import checkin_every
from tpuctl.sim import SimAdminClient
from tpuctl.sim.vms.layout import vm_root_for
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import PodState, RunStatus
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import Cli
from tpuctl.testing.clock import wait_for

ZONE = "us-central1-a"
WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {ZONE: {"v5e": {"on_demand": 8, "preemptible": 8}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
}
GRACE_S = 4.0
#: Says it started, then ends once the test has killed its supervisor (the file BARRIER appears): the grace,
#: not the program, decides when the slice goes. (A program that ended on a timer could end before the
#: kill, and its live supervisor would then delete the slice itself, before the test looked.)
PROGRAM = """\
import os, pathlib, time
print('started', flush=True)
barrier = pathlib.Path(os.environ['BARRIER'])
deadline = time.monotonic() + 120
while not barrier.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print('done', flush=True)
"""
ENV = {
    "TPUCTL_BACKSTOP_GRACE": f"{GRACE_S}",
    "TPUCTL_LEASE_DURATION": "3",
    "TPUCTL_LEASE_RENEW_EVERY": "1",
}


def tpuctl_clients(sim_url: str) -> list[int]:
    """Every tpuctl command process (``python -m tpuctl run|runs ...``) talking to this test's simulator:
    the background supervisor and any client still alive. Not the simulator's own processes."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = f"TPUCTL_SIM_URL={sim_url}".encode() in environ
        if ours and b"tpuctl" in argv and (b"run" in argv or b"runs" in argv):
            found.append(int(entry))
    return found


def test_a_killed_detached_run_is_deleted_by_its_backstop_after_the_grace(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    admin = serve_sim(WORLD)
    sim_url = os.environ["TPUCTL_SIM_URL"]
    script = tmp_path / "proj" / "prog.py"
    script.parent.mkdir()
    script.write_text(PROGRAM)
    env = {**os.environ, **ENV, "TPUCTL_STATE_DIR": str(state_dir)}
    argv = [sys.executable, "-m", "tpuctl", "run", str(script), "--type", "v5e-8", "--zone", ZONE]
    barrier = tmp_path / "supervisor-killed"
    argv += ["--no-runtime-deps", "--detach", "--max-hours", "1", "--env", f"BARRIER={barrier}", "-o", "json"]
    started = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-3000:]
    run_id = json.loads(started.stdout)["run"]["run_id"]
    ledger = Ledger(state_dir / "ledger.db")

    def program_started() -> bool:
        return any("started" in line.text for line in ledger.log_lines(run_id, worker=0))

    wait_for(program_started, timeout=120.0, interval=0.1, what="the program to start on host 0")
    record = ledger.get_run(run_id)
    assert record is not None and (record.detail or {}).get("backstop", {}).get("grace_s") == GRACE_S
    (node,) = [p for p in ledger.list_pods(run_id=run_id) if p.state is PodState.READY]

    (checkin,) = (
        vm_root_for(state_dir).joinpath("disks").glob(f"*/**/runs/{run_id}/backstop/{deadman.CHECKIN}")
    )
    killed = tpuctl_clients(sim_url)
    assert killed, "the background supervisor is a tpuctl process"
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    barrier.touch()  # the program ends now, with nobody left to delete its slice but the deadman
    # The slice stays at least the grace after the last check-in, which the deadman reads from the file's
    # time on host 0's disk. A check-in still in flight at the kill can only make it later. (Not "the kill
    # less one period": on a loaded machine a check-in over SSH can come later than its period.)
    last_checkin = checkin.stat().st_mtime
    assert last_checkin >= killed_at - 30 * checkin_every(GRACE_S), "the supervisor checked in while it lived"
    stays_until = last_checkin + GRACE_S

    def node_state() -> str:
        found = {n["name"]: n["state"] for n in admin.status()["nodes"]}
        return str(found.get(node.name, "GONE"))

    while time.time() < stays_until - 0.2:
        assert node_state() == "READY", "deleted before the grace"
        time.sleep(0.1)  # watching the real clock the deadman keeps: no simulated time here
    wait_for(
        lambda: node_state() in ("DELETING", "GONE") or None, timeout=60.0, interval=0.1, what="deletion"
    )
    took = time.time() - killed_at
    print(f"backstop: {node.name} deleted {took:.1f} s after its supervisor was killed (grace {GRACE_S} s)")

    (deletion,) = [d for d in admin.deletions() if d["name"] == node.name]
    assert deletion["path"] == "api" and deletion["resource"] == "tpu node"
    assert deletion["principal"].endswith("(a host's token)")
    assert deletion["at"] >= stays_until
    silent = re.search(r"no supervisor checked in for (\d+) s \(grace 4 s\)", deletion["reason"])
    assert deletion["reason"].startswith("the program ended (attempt 0, exit 0)") and silent is not None
    assert int(silent.group(1)) >= GRACE_S

    # The next command: the ledger says why the slice went, and the run is over.
    described = cli("runs", "describe", run_id, "-o", "json", env={**ENV, "TPUCTL_STATE_DIR": str(state_dir)})
    assert described.code == 0, described.stderr[-3000:]
    after = ledger.get_run(run_id)
    assert after is not None and after.status == RunStatus.FAILED
    why = (after.detail or {})["reason"]
    assert why.startswith("deleted by its backstop after the run's supervisor was silent for its grace (4 s)")
    assert why in described.stdout
    # From its last lease renewal (at most a renewal period before the kill) to the slice seen gone.
    silent_for = re.search(r"the slice seen gone (\d+) s later", why)
    assert silent_for is not None and int(silent_for.group(1)) >= GRACE_S - 1, why
    print(f"backstop: the ledger says: {why}")
    (gone,) = [p for p in ledger.list_pods(run_id=run_id) if p.name == node.name]
    assert gone.state is PodState.DELETED
    ledger.close()


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return {
        **WORLD,
        "zones": {"us-central1-c": {"tpu7x": {"on_demand": 16, "preemptible": 16}}},
        "compute_quotas": [{"quota_id": "TPUS-PER-TPU-FAMILY-per-project-region", "limit": 64}],
    }


def test_the_plan_of_a_run_with_max_hours_shows_its_deadline_and_what_keeps_it(
    sim_cli: InProcessCli, tmp_path: Path
) -> None:
    script = tmp_path / "prog.py"
    script.write_text("print('hi')\n")
    args = ("run", str(script), "--type", "tpu7x-8", "--zone", "us-central1-c", "--dry-run", "-o", "json")
    planned = sim_cli(*args, "--max-hours", "2")
    assert planned.code == 0, planned.stderr
    target = json.loads(planned.stdout)["plan"]["target"]
    backstop = target["backstop"]
    assert backstop["grace_s"] == 600.0 and backstop["deadman"] == "host 0"
    assert backstop["deadline"] is not None and backstop["compute_engine_deletes_at"] is not None
    kept = json.loads(sim_cli(*args, "--max-hours", "2", "--keep-pod").stdout)["plan"]["target"]
    assert kept["backstop"] is None
    refused = sim_cli(*args, "--max-hours", "0")
    assert refused.code == 2 and "--max-hours" in refused.stderr
