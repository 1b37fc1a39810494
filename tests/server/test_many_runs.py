"""Many runs across two `tpuctl server` replicas on one PostgreSQL, one host each and a tiny program on the
served simulator: twenty runs submitted at once, half to each replica, all finish; the lease history of
every run shows no moment when two replicas held it (``tpuctl.testing.lease_holds``); both replicas
supervised some; each run created exactly one slice, and none is left.

Behind ``--slow`` (twenty simulated VMs); the default suite's case of the same claims is the races over
concurrent connections in tests/store/test_leases.py.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tpuctl.client.api import ServerClient
from tpuctl.server.wire import SubmitRun
from tpuctl.sim import SimAdminClient
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LeaseAction, RunStatus
from tpuctl.store.secrets import generate_key
from tpuctl.testing.clock import wait_for
from tpuctl.testing.lease_holds import assert_one_holder_at_a_time
from tpuctl.testing.ports import unused_port

ZONE = "us-central1-a"
RUNS = 20
#: Fewer than RUNS: neither replica can take every run in its first tick, so both must supervise some.
MAX_RUNS = 12
WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {ZONE: {"v5e": {"on_demand": 8 * RUNS, "preemptible": 8 * RUNS}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
}
PROGRAM = b"""
import time
for i in range(4):
    print(f"line {i}", flush=True)
    time.sleep(0.1)
"""
JOB = {"script": "prog.py", "resources": {"accelerators": "v5e-8", "zone": ZONE}, "runtime_deps": False}


def _bundle() -> tuple[str, bytes]:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("prog.py")
        info.size = len(PROGRAM)
        tar.addfile(info, io.BytesIO(PROGRAM))
    data = raw.getvalue()
    return hashlib.sha256(data).hexdigest(), data


@pytest.fixture
def servers(
    tmp_path: Path, serve_sim: Callable[..., SimAdminClient], postgres_url: str
) -> Iterator[tuple[SimAdminClient, list[tuple[subprocess.Popen[bytes], str]]]]:
    """The simulator and two replicas on one PostgreSQL database (each process, its URL)."""
    admin = serve_sim(WORLD)  # points TPUCTL_SIM_URL at it
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    env.update(
        TPUCTL_SIM_URL=os.environ["TPUCTL_SIM_URL"],
        TPUCTL_STATE_DIR=str(tmp_path / "server"),
        TPUCTL_DATABASE_URL=postgres_url,
        TPUCTL_SECRET_KEY=generate_key().decode("ascii"),
        # Nothing here waits for a lease to expire, and twenty runs on a loaded machine must not lose
        # theirs to a renewal that came late (the replicas would take them from each other, correctly,
        # for ever).
        TPUCTL_LEASE_DURATION="20",
        TPUCTL_LEASE_RENEW_EVERY="1",
    )
    started: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        for i in range(2):
            url = f"http://127.0.0.1:{unused_port()}"
            argv = [sys.executable, "-m", "tpuctl", "server", "--listen", url.removeprefix("http://")]
            argv += ["--max-runs", str(MAX_RUNS)]
            # Its log to a file: twenty runs' lines would fill a pipe nobody reads, and block the server.
            with (tmp_path / f"replica-{i}.log").open("wb") as log:
                proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            started.append((proc, url))
            ready = functools.partial(_ready, proc, url, tmp_path / f"replica-{i}.log")
            wait_for(ready, timeout=120.0, interval=0.1, what="a replica to be ready")
        yield admin, started
    finally:
        for proc, _url in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def _ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> bool:
    assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_twenty_runs_submitted_at_once_across_two_replicas_finish_with_one_holder_at_a_time(
    servers: tuple[SimAdminClient, list[tuple[subprocess.Popen[bytes], str]]],
    postgres_url: str,
    tmp_path: Path,
) -> None:
    admin, replicas = servers
    sha, data = _bundle()
    clients = [ServerClient(url) for _proc, url in replicas]
    try:
        for client in clients:
            client.upload_bundle(sha, data)
        body = SubmitRun(job=JOB, bundle_sha256=sha, script_in_bundle="prog.py")
        with concurrent.futures.ThreadPoolExecutor(max_workers=RUNS) as pool:
            submitted = list(pool.map(lambda i: clients[i % 2].submit(body), range(RUNS)))
    finally:
        for client in clients:
            client.close()
    run_ids = sorted(s.run.run_id for s in submitted)
    assert len(set(run_ids)) == RUNS and all(s.created for s in submitted)

    logs = [tmp_path / f"replica-{i}.log" for i in range(len(replicas))]
    seen: list[RunStatus] = []

    def all_ended() -> list[RunStatus] | None:
        for (proc, _url), log in zip(replicas, logs, strict=True):
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        with Ledger.open(postgres_url) as ledger:
            seen[:] = [RunStatus(r.status) for r in ledger.list_runs() if r.run_id in run_ids]
        return list(seen) if len(seen) == RUNS and all(s.finished for s in seen) else None

    try:
        statuses = wait_for(all_ended, timeout=1200.0, interval=1.0, what=f"{RUNS} runs to end")
    except AssertionError as exc:  # what the replicas said, with the runs' statuses
        tails = "\n".join(log.read_text(errors="replace")[-3000:] for log in logs)
        raise AssertionError(f"{exc}; statuses {sorted(seen)}; the replicas said:\n{tails}") from None
    assert statuses == [RunStatus.SUCCEEDED] * RUNS

    with Ledger.open(postgres_url) as ledger:
        histories = [ledger.lease_history(run_id) for run_id in run_ids]
    assert_one_holder_at_a_time(histories)
    pids = {proc.pid for proc, _url in replicas}
    claimed_by = {h.owner.pid for history in histories for h in history if h.action is LeaseAction.CLAIM}
    assert claimed_by == pids  # both replicas supervised some runs, and nobody else claimed any
    assert all(history[0].action is LeaseAction.CLAIM for history in histories)
    creates = [m for m in admin.mutations() if m["method"] == "POST" and m["path"].endswith("/nodes")]
    assert len(creates) == RUNS  # one slice per run: no run was started twice
    assert admin.status()["nodes"] == []  # and every one deleted
