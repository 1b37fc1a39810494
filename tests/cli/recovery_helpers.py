"""Helpers for the preemption-recovery tests: a fast simulated world, a reference run of the LM example
on local processes (no tpuctl), and a "chaos" thread that preempts a run's slice when its host 0 has
reached a given step. (A module of its own: several test directories have a conftest.py.)"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tpuctl.runtime.preemption import parse_event
from tpuctl.sim import SimAdminClient
from tpuctl.sim.admin import NodeStatus
from tpuctl.testing.clock import wait_for

# The LM and its reference moved to tpuctl.testing (the server's tests use them too); named here for
# the recovery tests that import them from this module.
from tpuctl.testing.lm_reference import HASH as HASH
from tpuctl.testing.lm_reference import HOST_XLA_ENV as HOST_XLA_ENV
from tpuctl.testing.lm_reference import LM_ARGS as LM_ARGS
from tpuctl.testing.lm_reference import LM_STEPS as LM_STEPS
from tpuctl.testing.lm_reference import V5E_16_ARGS as V5E_16_ARGS
from tpuctl.testing.lm_reference import fast_jax_env as fast_jax_env
from tpuctl.testing.lm_reference import run_reference as run_reference

REPO = Path(__file__).resolve().parents[2]
ZONE = "us-central2-b"
OTHER_ZONE = "europe-west4-a"
V5E_ZONE = "us-central1-a"
V5E_OTHER = "us-east1-c"

WORLD: dict[str, Any] = {
    # A 60 s create takes 60 ms; the notice's grace is long enough (in real seconds) for the tiny LM
    # to save a checkpoint on a loaded 2-core machine, as 30 s is for a real model.
    "speed": 1000,
    "seed": 5,
    "zones": {
        ZONE: {"v4": {"on_demand": 64, "preemptible": 64}},
        OTHER_ZONE: {"v4": {"on_demand": 64, "preemptible": 64}},
        V5E_ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}},
        V5E_OTHER: {"v5e": {"on_demand": 64, "preemptible": 64}},
    },
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    "durations": {
        "node_create_s": 60,
        "node_delete_s": 10,
        "stockout_s": 5,
        "preemption_grace_s": 20,
    },
}


def serve_for_jax_runs(
    serve_sim: Callable[..., SimAdminClient],
    world: dict[str, Any],
    *,
    state_dir: Path,
    jax_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> SimAdminClient:
    """``world`` served over this test's state dir to its in-process CLI commands (``serve_sim``), with
    the hosts started fast (``fast_jax_env``): the simulator the end-to-end JAX run tests use."""
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(state_dir))
    for key, value in fast_jax_env(jax_cache).items():
        monkeypatch.setenv(key, value)
    return serve_sim(world)


def events_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        event = parse_event(line)
        if event is not None:
            out.append(event)
    return out


def final_hash(path: Path) -> str | None:
    matches = HASH.findall(path.read_text(errors="replace")) if path.exists() else []
    return matches[-1] if matches else None


def run_dir(state_dir: Path, timeout: float = 60) -> Path:
    """The one run directory under the state dir, once it exists."""
    runs = wait_for(
        lambda: [p for p in (state_dir / "runs").glob("run-*") if p.is_dir()],
        timeout,
        0.05,
        what="a run directory",
    )
    return runs[0]


@dataclass
class Preempt:
    """Preempt the run's slice once its ``attempt``-th start (1-based) has done ``after_steps`` steps
    (counted from where that start began, so a late checkpoint cannot make two preemptions collapse)."""

    attempt: int
    after_steps: int
    notice: bool = True
    stockout: str | None = None  # stock this zone out first
    done_at: float | None = None
    node: str | None = None
    zone: str | None = None


@dataclass
class Chaos:
    """A thread that plays the preemptions of a plan against the run in ``state_dir``."""

    admin: SimAdminClient
    state_dir: Path
    plan: list[Preempt]
    timeout: float = 300.0
    error: BaseException | None = None
    _thread: threading.Thread | None = None
    _halt: threading.Event = field(default_factory=threading.Event)
    preempt: Callable[[str, str, bool], None] | None = None
    #: Which READY node to preempt (default: the only one; None while there is not exactly one).
    pick: Callable[[list[NodeStatus]], NodeStatus | None] | None = None

    def start(self) -> Chaos:
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        self._thread.start()
        return self

    def _live_node(self) -> NodeStatus | None:
        nodes = [n for n in self.admin.status()["nodes"] if n.get("state") == "READY"]
        if self.pick is not None:
            return self.pick(nodes)
        return nodes[0] if len(nodes) == 1 else None

    def _run(self) -> None:
        try:
            deadline = time.monotonic() + self.timeout
            log = run_dir(self.state_dir) / "worker-0.log"
            for step in self.plan:
                while not self._halt.is_set() and time.monotonic() < deadline:
                    evs = events_of(log)
                    starts = [i for i, e in enumerate(evs) if e["event"] == "start"]
                    if len(starts) >= step.attempt:
                        mine = evs[starts[step.attempt - 1] :]
                        first = mine[0]["step"]
                        done = [e["step"] for e in mine if e["event"] == "step"]
                        node = self._live_node()
                        if done and done[-1] - first >= step.after_steps and node is not None:
                            if step.stockout:
                                self.admin.stockout(step.stockout)
                            step.node, step.zone = node["name"], node["zone"]
                            step.done_at = time.time()
                            if self.preempt is not None:
                                self.preempt(node["zone"], node["name"], step.notice)
                            else:
                                self.admin.preempt(node["zone"], node["name"], notice=step.notice)
                            break
                    time.sleep(0.02)
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self, timeout: float = 30.0, *, check: bool = True) -> None:
        """Stop the thread; with ``check``, raise what it raised (call ``check()`` later otherwise, so
        a test can first show what the run said)."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if check:
            self.check()

    def check(self) -> None:
        if self.error is not None:
            raise self.error


def kill_quietly(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def program_pids(run_id: str) -> dict[int, int | None]:
    """{pid: start ticks} of every live process a simulated VM runs for ``run_id`` (found by the VM
    marker and the run id in its environment, as the simulator and ``runs resume`` find them)."""
    from tpuctl.processes import process_start_ticks

    found: dict[int, int | None] = {}
    wanted = f"TPUCTL_RUN_ID={run_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environ and any(v.startswith(b"TPUCTL_SIM_VM=") for v in environ):
            found[int(entry.name)] = process_start_ticks(int(entry.name))
    return found


def steps_program(report: str = "", *, imports: str = "") -> str:
    """A stdlib program of 20 steps of 0.1 s that stops at a preemption notice as the runtime's programs
    do; at its start it prints ``"attempt", restart, <report>`` (``report``: more print arguments, Python
    source; ``imports``: module names it needs for them, comma-separated)."""
    modules = ", ".join(filter(None, [imports, "os, sys, time"]))
    said = ", ".join(filter(None, ['"attempt", restart', report]))
    return f"""\
import {modules}
from tpuctl.runtime.preemption import PreemptionWatch, emit, exit_preempted
watch = PreemptionWatch.from_env().install()
restart = int(os.environ["TPUCTL_RESTART_COUNT"])
print({said}, flush=True)
emit("start", step=0, restored=None, restart_count=restart, steps=20)
for step in range(1, 21):
    time.sleep(0.1)
    emit("step", step=step, dt=0.1)
    if watch.should_stop(step):
        sys.exit(exit_preempted(step, saved=False))
print("done", flush=True)
"""
