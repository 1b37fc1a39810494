"""The team server's first acceptance case, end to end on the simulator's VMs and a real PostgreSQL: two
`tpuctl server` replicas share one ledger; a client submits `run --example lm --type v5e-16 --spot` and
exits. The slice is preempted and the run recovers; the replica holding it is killed -9 and the other
adopts it once its lease expired, not before. The run ends with the uninterrupted run's parameters bit for
bit, one slice created per start, the last one deleted, and `cost report --group-by run` through either
replica equals the ledger's own. Slow (4 hosts set up twice or more): run with --slow; the default suite
has the one-host version (test_server_e2e)."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from server_place import Place, ended_under, make_place, output

from tpuctl.runtime.preemption import parse_event
from tpuctl.sim import SimAdminClient
from tpuctl.store.records import LeaseAction, RunStatus
from tpuctl.testing.clock import wait_for
from tpuctl.testing.lm_reference import HASH, HOST_XLA_ENV, V5E_16_ARGS, fast_jax_env, run_reference
from tpuctl.testing.ports import unused_port

ZONE = "us-central1-a"
WORLD: dict[str, Any] = {
    # A 60 s create takes 60 ms; the notice's grace (20 s simulated, in real seconds: a notice is wall
    # time for the program) leaves the tiny LM time to save its checkpoint on a loaded 2-core machine.
    "speed": 1000,
    "seed": 5,
    "zones": {ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    "durations": {"node_create_s": 60, "node_delete_s": 10, "stockout_s": 5, "preemption_grace_s": 20},
}


def _events(place: Place, run_id: str) -> list[dict[str, Any]]:
    """Host 0's runtime events, every start's, in order (from the ledger, where any replica reads them)."""
    with place.ledger() as ledger:
        lines = ledger.log_lines(run_id, worker=0)
    return [e for line in lines if (e := parse_event(line.text)) is not None]


def _steps_of_start(events: list[dict[str, Any]], start: int) -> int:
    """How many steps the ``start``-th start (0-based) has done so far; -1 before it started."""
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    if len(starts) <= start:
        return -1
    mine = events[starts[start] :]
    first = mine[0]["step"]
    done = [e["step"] for e in mine if e["event"] == "step"]
    return done[-1] - first if done else 0


def _cost_by_run(env: dict[str, str]) -> dict[str, Any]:
    """`cost report --group-by run -o json` as ``env`` runs it (locally, or through a server), without
    its window (the instant it was asked at)."""
    out = subprocess.run(
        [sys.executable, "-m", "tpuctl", "cost", "report", "--group-by", "run", "-o", "json"],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    document: dict[str, Any] = json.loads(out.stdout)
    document.pop("window")  # the instant each report was asked at
    return document


@pytest.mark.slow
def test_a_v5e_16_spot_lm_run_survives_a_preemption_and_its_replicas_death_bit_identical(
    tmp_path: Path,
    serve_sim: Callable[..., SimAdminClient],
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jax = fast_jax_env(tmp_path / "jax-cache")
    reference = run_reference(
        tmp_path / "reference", V5E_16_ARGS, hosts=4, accelerator_type="v5litepod-16", topology="4x4",
        extra_env=jax,
    )  # fmt: skip
    for key, value in jax.items():  # the simulator's VMs start their programs with these (a fast start)
        monkeypatch.setenv(key, value)
    # A lease long enough for four JAX hosts starting on 2 loaded cores not to starve its renewals.
    lease = {"TPUCTL_LEASE_DURATION": "10", "TPUCTL_LEASE_RENEW_EVERY": "1"}
    places = make_place(tmp_path, serve_sim, postgres_url, world=WORLD, server_env=lease)
    place = next(places)
    try:
        _scenario(place, reference, tmp_path)
    finally:
        next(places, None)  # kills whatever the place started


def _scenario(place: Place, reference: str, tmp_path: Path) -> None:
    a = place.start_server()
    b_place = dataclasses.replace(place, url=f"http://127.0.0.1:{unused_port()}")
    b = b_place.start_server()
    submitted = place.client(
        "run", "--example", "lm", "--type", "v5e-16", "--spot", "--zone", ZONE, "--checkpoint-every", "4",
        *HOST_XLA_ENV, "--detach", "-o", "json", "--", *V5E_16_ARGS,
    )  # fmt: skip
    out = submitted.communicate(timeout=300)[0].decode()
    assert submitted.returncode == 0, out[-3000:]  # the client exits once the server has the run
    run_id = str(json.loads(out[out.index("{") :])["run"]["run_id"])

    # Preempted (with notice) once its first start has done 6 steps.
    wait_for(lambda: _steps_of_start(_events(place, run_id), 0) >= 6, 300, 0.2, what="6 steps")
    (node,) = [n for n in place.admin.status()["nodes"] if n.get("state") == "READY"]
    place.admin.preempt(node["zone"], node["name"], notice=True)
    wait_for(lambda: _steps_of_start(_events(place, run_id), 1) >= 2, 300, 0.2, what="the recovery's steps")

    # The replica holding the run dies mid-run.
    with place.ledger() as ledger:
        held = ledger.lease_of(run_id)
    assert held is not None
    holder, survivor, survivor_place = (a, b, b_place) if held.owner.pid == a.pid else (b, a, place)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    with place.ledger() as ledger:
        last = ledger.lease_of(run_id)
    assert last is not None and last.owner.pid == holder.pid

    assert ended_under(place, survivor, run_id, timeout=600) is RunStatus.SUCCEEDED, output(survivor)
    events = _events(place, run_id)
    with place.ledger() as ledger:
        history = ledger.lease_history(run_id)
        lines = [line.text for line in ledger.log_lines(run_id, worker=0)]
    takeover = next(h for h in history if h.action is LeaseAction.TAKEOVER)
    assert takeover.owner.pid == survivor.pid and takeover.at >= last.expires_at  # after expiry, not before
    final = [m.group(1) for line in lines if (m := HASH.search(line))]
    assert final and final[-1] == reference
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) >= 3  # the first, the recovery, the takeover's
    assert place.creates() == len(starts)  # one slice per start, none twice
    assert place.admin.status()["nodes"] == []  # the last one deleted

    # The cost of the run through either replica (the dead one's place taken by a new process) is the
    # ledger's own.
    local = {k: v for k, v in place.client_env.items() if k != "TPUCTL_SERVER"}
    local["TPUCTL_DATABASE_URL"] = place.database
    truth = _cost_by_run(local)
    assert run_id in json.dumps(truth)
    replacement = dataclasses.replace(place if holder is a else b_place, started=place.started)
    replacement.start_server()
    for url in (survivor_place.url, replacement.url):
        assert _cost_by_run({**place.client_env, "TPUCTL_SERVER": url}) == truth
