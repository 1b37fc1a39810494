"""SimExecutor against real local processes (plain Python programs, no JAX): the worker environment,
events in order, registration with the simulator, and stops that take the whole process tree down."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.hosts.base import HostEvent, LaunchSpec
from tpuctl.hosts.bundle import build_bundle
from tpuctl.hosts.sim import SimExecutor


class FakeRegistry:
    def __init__(self) -> None:
        self.registered: list[tuple[str, str, int, int]] = []
        self.unregistered: list[tuple[str, str]] = []

    def register_host(self, zone: str, node: str, worker: int, pid: int) -> object:
        self.registered.append((zone, node, worker, pid))
        return None

    def unregister_hosts(self, zone: str, node: str) -> object:
        self.unregistered.append((zone, node))
        return 0


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def collect(executor: SimExecutor, hosts: int, timeout_s: float = 30.0) -> list[HostEvent]:
    events: list[HostEvent] = []
    deadline = time.monotonic() + timeout_s
    while sum(1 for e in events if e.kind == "exit") < hosts:
        assert time.monotonic() < deadline, f"hosts did not all exit: {events}"
        event = executor.next_event(0.2)
        if event is not None:
            events.append(event)
    return events


def spec(program: tuple[str, ...], hosts: int, **env: str) -> LaunchSpec:
    return LaunchSpec(
        run_id="run-test-0001",
        program=program,
        num_workers=hosts,
        chips_per_host=4,
        accelerator_type="v5litepod-16",
        topology="4x4",
        checkpoint_dir="/ckpt/run-test-0001",
        restart_count=2,
        user_env=env,
    )


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[tuple[SimExecutor, FakeRegistry]]:
    registry = FakeRegistry()
    ex = SimExecutor(
        tmp_path / "hosts",
        zone="us-central1-a",
        node="pod-1",
        num_hosts=3,
        registry=registry,
        metadata_base_url="http://127.0.0.1:9",
    )
    try:
        yield ex, registry
    finally:
        ex.close()


ENV_PROGRAM = """\
import json, os, sys
keys = ["TPUCTL_RUN_ID", "TPUCTL_WORKER_ID", "TPUCTL_NUM_WORKERS", "TPUCTL_ACCELERATOR_TYPE",
        "TPUCTL_TOPOLOGY", "TPUCTL_CHECKPOINT_DIR", "TPUCTL_RESTART_COUNT", "TPUCTL_METADATA_URL",
        "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS", "GREETING"]
import tpuctl.runtime.hostenv  # the runtime comes with the bundle
print(json.dumps({"env": {k: os.environ.get(k) for k in keys}, "argv": sys.argv[1:], "cwd": os.getcwd(),
                  "runtime": tpuctl.runtime.hostenv.__file__}))
print("second line")
sys.exit(int(os.environ["TPUCTL_WORKER_ID"]) * 10)
"""


def test_each_host_gets_the_worker_environment_and_reports_lines_then_exit(
    tmp_path: Path, executor: tuple[SimExecutor, FakeRegistry]
) -> None:
    ex, registry = executor
    work = tmp_path / "proj"
    work.mkdir()
    (work / "prog.py").write_text(ENV_PROGRAM)
    bundle = build_bundle(work)
    ex.ship(bundle)
    ex.start(spec(("prog.py", "a b", "$(echo no)"), 3, GREETING="hi there"))

    events = collect(ex, 3)
    by_worker: dict[int, list[HostEvent]] = {w: [e for e in events if e.worker == w] for w in range(3)}
    for worker, evs in by_worker.items():
        assert [e.kind for e in evs] == ["line", "line", "exit"], evs
        report = json.loads(evs[0].text)
        assert report["env"] == {
            "TPUCTL_RUN_ID": "run-test-0001",
            "TPUCTL_WORKER_ID": str(worker),
            "TPUCTL_NUM_WORKERS": "3",
            "TPUCTL_ACCELERATOR_TYPE": "v5litepod-16",
            "TPUCTL_TOPOLOGY": "4x4",
            "TPUCTL_CHECKPOINT_DIR": "/ckpt/run-test-0001",
            "TPUCTL_RESTART_COUNT": "2",
            "TPUCTL_METADATA_URL": f"http://127.0.0.1:9/sim/metadata/us-central1-a/pod-1/{worker}",
            "JAX_NUM_CPU_DEVICES": "4",
            "JAX_PLATFORMS": "cpu",
            "GREETING": "hi there",
        }
        assert report["argv"] == ["a b", "$(echo no)"]  # no shell in between
        assert report["cwd"] == str(ex.bundle_dir(worker, bundle.digest))
        assert report["runtime"].startswith(str(ex.bundle_dir(worker, bundle.digest)))
        assert evs[1].text == "second line"
        assert evs[2].returncode == worker * 10
    pids = ex.pids()
    assert sorted(registry.registered) == sorted(("us-central1-a", "pod-1", w, pids[w]) for w in range(3))
    ex.close()
    assert registry.unregistered == [("us-central1-a", "pod-1")]


TREE_PROGRAM = """\
import os, signal, subprocess, sys, time
if os.environ["TPUCTL_WORKER_ID"] == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a host that ignores the polite request
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print("pids", os.getpid(), child.pid, flush=True)
time.sleep(300)
"""


def test_stop_kills_every_process_tree_escalating_to_sigkill(
    tmp_path: Path, executor: tuple[SimExecutor, FakeRegistry]
) -> None:
    ex, _ = executor
    work = tmp_path / "proj"
    work.mkdir()
    (work / "tree.py").write_text(TREE_PROGRAM)
    ex.ship(build_bundle(work))
    ex.start(spec(("tree.py",), 3))
    pids: dict[int, tuple[int, int]] = {}
    deadline = time.monotonic() + 30
    while len(pids) < 3:
        assert time.monotonic() < deadline
        event = ex.next_event(0.2)
        if event is not None and event.kind == "line" and event.text.startswith("pids"):
            _, parent, child = event.text.split()
            pids[event.worker] = (int(parent), int(child))
    everything = [p for pair in pids.values() for p in pair]
    assert all(alive(p) for p in everything)

    started = time.monotonic()
    ex.stop(grace_s=1.0)
    took = time.monotonic() - started
    assert not [p for p in everything if alive(p)]
    assert took < 1.0 + 4.0
    exits = {e.worker: e.returncode for e in collect(ex, 3, timeout_s=5) if e.kind == "exit"}
    # Hosts 0 and 2 ended on SIGTERM; host 1 ignored it and was killed.
    assert exits == {0: -signal.SIGTERM, 1: -signal.SIGKILL, 2: -signal.SIGTERM}
    # Idempotent.
    ex.stop(grace_s=0.1)


def test_next_event_returns_none_on_timeout_and_plan_has_no_side_effects(
    tmp_path: Path, executor: tuple[SimExecutor, FakeRegistry]
) -> None:
    ex, registry = executor
    started = time.monotonic()
    assert ex.next_event(0.2) is None
    assert 0.15 < time.monotonic() - started < 2.0
    plans = ex.plan(spec(("-m", "x"), 3), digest="d" * 64)
    assert [p.worker for p in plans] == [0, 1, 2]
    assert plans[2].cwd == str(ex.bundle_dir(2, "d" * 64))
    assert plans[0].argv[1:] == ("-u", "-m", "x")
    assert not (tmp_path / "hosts").exists()
    assert registry.registered == []


def test_launcher_environment_does_not_leak_tpuctl_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUCTL_STATE_DIR", "/somewhere/else")
    monkeypatch.setenv("PYTHONPATH", "/dev/null/nope")
    monkeypatch.setenv("KEEP_ME", "yes")
    ex = SimExecutor(tmp_path / "hosts", zone="us-central1-a", node="p", num_hosts=1)
    try:
        work = tmp_path / "proj"
        work.mkdir()
        (work / "p.py").write_text(
            "import os, json; print(json.dumps([os.environ.get('TPUCTL_STATE_DIR'), "
            "os.environ['PYTHONPATH'], os.environ.get('KEEP_ME')]))"
        )
        ex.ship(build_bundle(work))
        ex.start(spec(("p.py",), 1))
        line = next(e for e in collect(ex, 1) if e.kind == "line")
        state_dir, pythonpath, keep = json.loads(line.text)
        assert state_dir is None
        assert "/dev/null/nope" not in pythonpath.split(os.pathsep)
        assert keep == "yes"
    finally:
        ex.close()
