"""Preemption: on demand (admin API), on a schedule and at a random rate; notice (metadata flag, SIGTERM,
SIGKILL after the grace period, in real seconds) or none; quota held until deleted. The processes
signalled are the VM's, found by the marker its sshd sets (a process here carries it itself)."""

from __future__ import annotations

import functools
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2
from sim_helpers import (
    FAST_POLLING,
    PARENT,
    ZONE,
    create_ready,
    make_world,
    node,
    spot_node,
    tpu_client,
)

from tpuctl import processes
from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.vms.layout import VM_MARKER
from tpuctl.testing.clock import FakeClock, wait_for

Spawn = Callable[..., "subprocess.Popen[bytes]"]

# 1 real second of grace (never scaled by the world's speed): room enough to look at the node between
# SIGTERM and SIGKILL on a loaded machine.
SLOW_GRACE = {"durations": {"preemption_grace_s": 1}}


def host_process(
    spawn: Spawn, tmp_path: Path, client: tpu_v2.TpuClient, node_id: str, worker: int = 0
) -> tuple[subprocess.Popen[bytes], Path]:
    """A process of host ``worker`` of a node's VM (it carries the marker its sshd would set) that
    records SIGTERM in a file and keeps running (as a program saving a checkpoint would), so only
    SIGKILL ends it."""
    uid = client.get_node(name=f"{PARENT}/nodes/{node_id}").id
    term_marker = tmp_path / "got-sigterm"
    ready_marker = tmp_path / "ready"
    script = (
        "import pathlib, signal, time\n"
        f"term = pathlib.Path({str(term_marker)!r})\n"
        "signal.signal(signal.SIGTERM, lambda *_: term.write_text('TERM'))\n"
        f"pathlib.Path({str(ready_marker)!r}).write_text('ready')\n"
        "while True:\n"
        "    time.sleep(0.01)\n"
    )
    proc = spawn(script, env={"PATH": "/usr/bin:/bin", VM_MARKER: f"{uid}/{worker}"})
    wait_for(ready_marker.exists)
    return proc, term_marker


def node_state(client: tpu_v2.TpuClient, node_id: str) -> tpu_v2.Node.State:
    state: tpu_v2.Node.State = client.get_node(name=f"{PARENT}/nodes/{node_id}").state
    return state


def test_preemption_with_notice_sigterm_then_sigkill_after_grace(
    start_server: Callable[..., SimServer],
    connect_admin: Callable[[SimServer], SimAdminClient],
    children: Spawn,
    tmp_path: Path,
) -> None:
    server = start_server(make_world(**SLOW_GRACE))
    client = tpu_client(server.url)
    admin = connect_admin(server)
    create_ready(client, "pre", spot_node("v5litepod-8"))
    proc, term_marker = host_process(children, tmp_path, client, "pre")
    assert admin.metadata(ZONE, "pre", 0) == "FALSE"

    started = time.monotonic()
    answer = admin.preempt(ZONE, "pre", notice=True)
    assert answer["state"] == "READY"  # until the grace period ends
    assert admin.metadata(ZONE, "pre", 0, "instance/preempted") == "TRUE"
    wait_for(term_marker.exists, timeout=5)
    assert proc.poll() is None  # SIGTERM was handled; the process lives on through the grace period
    assert node_state(client, "pre") == tpu_v2.Node.State.READY

    assert proc.wait(timeout=10) == -signal.SIGKILL
    killed_after = time.monotonic() - started
    assert killed_after >= 0.9, killed_after  # not before the 1 s grace period
    wait_for(lambda: node_state(client, "pre") == tpu_v2.Node.State.PREEMPTED)


def test_preemption_without_notice_kills_at_once(
    client: tpu_v2.TpuClient, admin: SimAdminClient, children: Spawn, tmp_path: Path
) -> None:
    create_ready(client, "now", spot_node("v5litepod-8"))
    proc, term_marker = host_process(children, tmp_path, client, "now")
    answer = admin.preempt(ZONE, "now", notice=False)
    assert answer["state"] == "PREEMPTED"
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert not term_marker.exists()
    assert admin.metadata(ZONE, "now", 0) == "TRUE"
    with pytest.raises(Exception, match="only a READY node"):
        admin.preempt(ZONE, "now")


def test_preempted_node_holds_quota_until_deleted_but_frees_capacity(
    start_server: Callable[..., SimServer], connect_admin: Callable[[SimServer], SimAdminClient]
) -> None:
    server = start_server(
        make_world(
            zones={"us-central1-a": {"v5e": {"on_demand": 0, "preemptible": 8}}},
            quotas={"generations": {"v5e": {"preemptible": {"zone": 16, "region": 16}}}},
        )
    )
    client = tpu_client(server.url)
    admin = connect_admin(server)
    create_ready(client, "p1", spot_node("v5litepod-8"))
    admin.preempt(ZONE, "p1", notice=False)
    assert node_state(client, "p1") == tpu_v2.Node.State.PREEMPTED
    # Capacity came back: an 8-chip node fits in the 8-chip pool again...
    create_ready(client, "p2", spot_node("v5litepod-8"))
    # ...but quota did not: 8 (preempted) + 8 (p2) = 16 is the limit.
    with pytest.raises(exceptions.TooManyRequests):
        client.create_node(parent=PARENT, node_id="p3", node=spot_node("v5litepod-1"))
    client.delete_node(name=f"{PARENT}/nodes/p1").result(polling=FAST_POLLING)
    status = admin.status()
    assert [n["name"] for n in status["nodes"]] == ["p2"]
    client.delete_node(name=f"{PARENT}/nodes/p2").result(polling=FAST_POLLING)
    create_ready(client, "p3", spot_node("v5litepod-8"))


def test_scheduled_preemption_fires_count_times(start_server: Callable[..., SimServer]) -> None:
    clock = FakeClock(time.time(), ticking=True)  # real time for the client's polls, advanced below
    server = start_server(
        make_world(
            preemption={"schedule": [{"after_s": 50, "node": "sched-*", "notice": False, "count": 1}]}
        ),
        clock=clock,
    )
    client = tpu_client(server.url)
    create_ready(client, "sched-a", node("v5litepod-8"))  # the schedule applies to any capacity class
    create_ready(client, "other", spot_node("v5litepod-8"))
    wait_for(lambda: node_state(client, "sched-a") == tpu_v2.Node.State.PREEMPTED)
    client.delete_node(name=f"{PARENT}/nodes/sched-a").result(polling=FAST_POLLING)
    create_ready(client, "sched-a", node("v5litepod-8"))
    clock.advance(0.2)  # 200 simulated seconds, well past after_s
    server.engine.advance()
    assert node_state(client, "sched-a") == tpu_v2.Node.State.READY
    assert node_state(client, "other") == tpu_v2.Node.State.READY


def test_random_preemption_of_spot_nodes_only(start_server: Callable[..., SimServer]) -> None:
    # 72 per simulated hour: a mean of 50 simulated seconds = 0.05 real seconds.
    server = start_server(make_world(preemption={"rate_per_hour": 72}))
    client = tpu_client(server.url)
    for i in range(4):
        client.create_node(parent=PARENT, node_id=f"spot-{i}", node=spot_node("v5litepod-4"))
    create_ready(client, "steady", node("v5litepod-4"))

    def preempted(name: str) -> bool:
        return node_state(client, name) == tpu_v2.Node.State.PREEMPTED

    for i in range(4):
        wait_for(functools.partial(preempted, f"spot-{i}"), timeout=15)
    assert node_state(client, "steady") == tpu_v2.Node.State.READY


def test_random_preemption_times_are_seeded(start_server: Callable[..., SimServer], tmp_path: Path) -> None:
    def preempt_at(seed: int, state: Path) -> str:
        clock = FakeClock(1_800_000_000.0)
        server = start_server(
            make_world(seed=seed, preemption={"rate_per_hour": 1}),
            state=state,
            clock=clock,
            ticker_interval_s=0,
        )
        client = tpu_client(server.url)
        client.create_node(parent=PARENT, node_id="s", node=spot_node("v5litepod-4"))
        clock.advance(1.0)  # past the 0.12 s create
        (status_node,) = server.engine.status()["nodes"]
        assert status_node["state"] == "READY"
        value = status_node["preempt_at"]
        assert isinstance(value, str)
        return value

    first = preempt_at(7, tmp_path / "a")
    assert preempt_at(7, tmp_path / "b") == first
    assert preempt_at(8, tmp_path / "c") != first


def test_deleting_a_node_kills_its_vms_processes(
    client: tpu_v2.TpuClient, admin: SimAdminClient, children: Spawn, tmp_path: Path
) -> None:
    create_ready(client, "gone", node("v5litepod-8"))
    create_ready(client, "kept", node("v5litepod-8"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    proc, _ = host_process(children, tmp_path / "a", client, "gone")
    bystander, _ = host_process(children, tmp_path / "b", client, "kept")
    client.delete_node(name=f"{PARENT}/nodes/gone").result(polling=FAST_POLLING)
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert bystander.poll() is None  # another VM's process is never signalled


def test_signal_registered_checks_the_start_time(children: Spawn, tmp_path: Path) -> None:
    proc, term_marker = _plain_process(children, tmp_path)
    ticks = processes.process_start_ticks(proc.pid)
    assert ticks is not None
    assert not processes.signal_registered(proc.pid, ticks + 1, signal.SIGTERM)
    assert processes.signal_registered(proc.pid, ticks, signal.SIGTERM)
    wait_for(term_marker.exists)
    assert processes.process_start_ticks(2**22 + 12345) is None


def _plain_process(spawn: Spawn, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    term_marker = tmp_path / "got-sigterm"
    ready_marker = tmp_path / "ready"
    script = (
        "import pathlib, signal, time\n"
        f"term = pathlib.Path({str(term_marker)!r})\n"
        "signal.signal(signal.SIGTERM, lambda *_: term.write_text('TERM'))\n"
        f"pathlib.Path({str(ready_marker)!r}).write_text('ready')\n"
        "while True:\n"
        "    time.sleep(0.01)\n"
    )
    proc = spawn(script)
    wait_for(ready_marker.exists)
    return proc, term_marker
