"""Crash safety: tpuctl killed with SIGKILL at seeded random moments, then put back together.

`pod create`, `pod delete` and `cost report` (the in-process simulator dies with them; its state stays in
the state dir's sim.db): after each kill the ledger passes SQLite's integrity check and replays from its
event log, and after one `pod gc` the ledger and the simulator agree: every slice the simulator has is a
live ledger entry (nothing is left that neither the ledger nor gc knows), and every live ledger entry is
a slice.

`tpuctl run` (the supervisor of the bundled LM on a 2-host slice), killed during placement, the hosts'
start-up, training, a checkpoint, a recovery from a preemption or teardown; either the tpuctl process
alone (its hosts orphaned) or the whole tree with the hosts. After each kill: the same ledger checks;
`tpuctl runs resume RUN` (itself killed once in a while, then run again) completes the run with the final
parameters of an uninterrupted one, bit for bit, or, when the run had already succeeded, says so and
exits 2; no process of the run is left; and after one `pod gc` the ledger and the simulator agree with no
slice left.

Default: 5 pod/cost kills and 1 run kill (one phase, one way; its takeover killed the other way).
`--slow`: 75 and 25 (every phase, both ways, at least twice each), 100 over the four commands."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hardening_helpers import (
    PROJECT,
    assert_ledger_agrees,
    fast_world,
    no_crash,
    sim_nodes,
    write_world,
)

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.storage import storage_dir_for
from tpuctl.sim.world import world_from_data
from tpuctl.testing.cli import CliResult, invoke
from tpuctl.testing.stored_envs import StoredEnvs

#: Kills of `pod create`/`pod delete`/`cost report`, and of `tpuctl run`: by default, and with --slow
#: (100 kills over the four commands). Each killed run is resumed to its end (~25 s on 2 cores): the
#: default suite affords one, its takeover killed too (the other way), the slow loop sees every phase
#: both ways.
POD_KILLS, SLOW_POD_KILLS = 5, 75
RUN_KILLS, SLOW_RUN_KILLS = 1, 25
#: Which kills also kill the takeover (every Nth): the default's one, every third of the slow loop's.
CHAIN_EVERY, SLOW_CHAIN_EVERY = 1, 3

# The end-to-end run helpers (the reference run, host logs' events) live with the CLI's recovery tests.
_CLI_TESTS = str(Path(__file__).resolve().parents[1] / "cli")
if _CLI_TESTS not in sys.path:
    sys.path.append(_CLI_TESTS)


def _env(state_dir: Path, world: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    env["TPUCTL_STATE_DIR"] = str(state_dir)
    env["TPUCTL_SIM_WORLD"] = str(world)
    # A killed supervisor's run is taken over once its ledger lease expires: short leases, so a resume
    # after a kill waits seconds for it, not the default minute.
    env["TPUCTL_LEASE_DURATION"] = "4"
    env["TPUCTL_LEASE_RENEW_EVERY"] = "1"
    return env


def _kill_during(argv: list[str], env: dict[str, str], delay_s: float) -> int | None:
    """Start `tpuctl ARGV`, SIGKILL it after ``delay_s`` unless it ended; its exit code if it ended."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuctl", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        try:
            out, err = proc.communicate(timeout=delay_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
            return None
        no_crash(CliResult(proc.returncode, out.decode(), err.decode()))
        return proc.returncode
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _check(state_dir: Path, world: Path, *, no_slices: bool = False) -> None:
    """One `pod gc -y` (in-process, its own simulator over the state dir), then the agreement; with
    ``no_slices``, also that the simulator has no slice at all."""
    result = invoke(["--state-dir", str(state_dir), "pod", "gc", "-y", "-o", "json"])
    no_crash(result)
    assert result.code == 0, result.stdout + result.stderr
    server = SimServer(
        state_dir, world_from_data(yaml.safe_load(world.read_text()), "test"), ticker_interval_s=0
    )
    server.start()
    admin = SimAdminClient(server.url)
    try:
        admin.advance()
        assert_ledger_agrees(state_dir, admin)
        if no_slices:
            assert sim_nodes(admin) == []
    finally:
        admin.close()
        server.stop()


#: At most this many live v5e-4 slices before the loop deletes instead of creating: half of what the
#: fast world's four zones hold (64 chips each), whatever killed creates left behind meanwhile.
MAX_ALIVE = 32


def _alive_pods(state_dir: Path) -> list[str]:
    from tpuctl.store import Ledger

    if not (state_dir / "ledger.db").exists():
        return []
    with Ledger(state_dir) as ledger:
        return sorted(p.name for p in ledger.list_pods(alive=True))


def crash_loop(kills: int, seed: int, tmp_path: Path) -> Counter[str]:
    state_dir = tmp_path / "state"
    world = write_world(tmp_path / "world.yaml", fast_world())
    env = _env(state_dir, world)
    rng = random.Random(seed)
    tally: Counter[str] = Counter()
    i = 0
    deadline = time.monotonic() + 60 * kills  # a bound, never the expected time
    while tally["killed"] < kills and time.monotonic() < deadline:
        i += 1
        pick = rng.random()
        names = _alive_pods(state_dir)
        # Creates outnumber deletes; once the world is half full, delete instead, so that every create
        # that finishes has quota and capacity left (a full world would answer exit 4, rightly).
        if pick < 0.55 and len(names) < MAX_ALIVE:
            argv = ["pod", "create", "v5e-4", "--name", f"c{i:03d}", "-o", "json"]
            what = "create"
        elif pick < 0.85:
            if not names:
                continue
            argv, what = ["pod", "delete", rng.choice(names), "-y"], "delete"
        else:
            argv, what = ["cost", "report", "-o", "json"], "cost"
        # Python start-up and imports take ~0.5-1 s here: most kills land inside the command's work.
        code = _kill_during(argv, env, rng.uniform(0.2, 2.5))
        if code is None:
            tally["killed"] += 1
            tally[f"killed_{what}"] += 1
        else:
            assert code == 0, (argv, code)
            tally[f"finished_{what}"] += 1
        _check(state_dir, world)
    assert tally["killed"] == kills, tally
    return tally


def test_kill_9_during_commands(tmp_path: Path) -> None:
    tally = crash_loop(POD_KILLS, 5, tmp_path)
    assert tally["killed_create"] > 0, tally


@pytest.mark.slow
def test_kill_9_during_pod_and_cost_commands_many_times(
    tmp_path: Path,
) -> None:
    tally = crash_loop(SLOW_POD_KILLS, 6, tmp_path)
    print("crash tally:", dict(tally))
    assert tally["killed_create"] > 15 and tally["killed_delete"] > 7 and tally["killed_cost"] > 2, tally


# --- `tpuctl run`: kill -9 of the supervisor, then `runs resume` ----------------------------------------

#: The tiny LM on a v5p slice that the allocator places in either of two zones (so the run names no zone
#: until it is placed); checkpoints at steps 4 and 8, and a final one. The default suite's loop runs it on
#: one host (v5p-8: 1 host x 4 chips), the long loop on two (v5p-16: 2 hosts x 4 chips), where a kill of
#: the whole tree also reaches a second host's process group.
RUN_TYPE, SLOW_RUN_TYPE = "v5p-8", "v5p-16"
RUN_ZONES = ("us-central1-a", "us-east5-a")
RUN_STEPS = 12
RUN_LM = ["--steps", str(RUN_STEPS), "--checkpoint-every", "4", "--log-every", "4", "--batch", "8", "--seed",
          "11", "--layers", "1", "--d-model", "16", "--heads", "2", "--vocab", "32", "--seq-len", "16",
          "--step-delay", "0.02"]  # fmt: skip
#: Where in a run's life a kill lands (see ``_trigger``)...
PHASES = ("placement", "startup", "training", "checkpoint", "recovery", "teardown")
#: ... and what it kills: the tpuctl process alone (its hosts live on, orphaned, as after a crashed
#: terminal or the OOM killer picking tpuctl), or the whole tree: tpuctl's process group and every host's
#: (each host leads its own), as an OOM kill of the job's cgroup or a crashed machine would.
HOW = ("supervisor", "tree")


@dataclass(frozen=True)
class Kill:
    phase: str
    how: str
    chain: bool  # kill the first `runs resume` too, at a random moment, before resuming again


def _run_world() -> dict[str, Any]:
    """v5p in two zones; a create takes 0.5 s and a delete 0.2 s of real time, so kills land inside them.
    A notice's grace (20 s here) outlasts the tiny LM's checkpoint on a loaded machine."""
    return {
        "project": PROJECT,
        "speed": 1000,
        "seed": 5,
        "zones": {z: {"v5p": {"on_demand": 64, "preemptible": 64}} for z in RUN_ZONES},
        "quotas": {
            "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
        },
        "latency": {"base_ms": 0, "jitter_ms": 0},
        "durations": {
            "node_create_s": 500,
            "node_delete_s": 200,
            "stockout_s": 5,
            "preemption_grace_s": 20,
        },
    }


def kill_plan(kills: int, rng: random.Random, chain_every: int) -> list[Kill]:
    """Every round of twelve is each (phase, how) once; its first six are the six phases with the two ways
    alternating, so even a few kills see different phases and both ways. Every ``chain_every``-th kill
    chains a kill of the takeover."""
    pairs: list[tuple[str, str]] = []
    while len(pairs) < kills:
        first = rng.randrange(2)
        way = {p: HOW[(first + i) % 2] for i, p in enumerate(rng.sample(PHASES, len(PHASES)))}
        pairs += list(way.items())
        pairs += [(p, HOW[1 - HOW.index(way[p])]) for p in rng.sample(PHASES, len(PHASES))]
    return [
        Kill(phase, how, chain=i % chain_every == chain_every - 1)
        for i, (phase, how) in enumerate(pairs[:kills])
    ]


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text(errors="replace").rsplit(")", 1)[-1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def run_processes(run_id: str) -> list[int]:
    """Live (not zombie) processes started as a host of ``run_id`` (their environment says so)."""
    from tpuctl.processes import is_zombie

    marker = f"TPUCTL_RUN_ID={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and not is_zombie(int(entry)):
            found.append(int(entry))
    return found


def _sigkill(proc: subprocess.Popen[bytes], how: str) -> None:
    if how == "supervisor":
        os.kill(proc.pid, signal.SIGKILL)
        return
    # Freeze tpuctl first, so that it starts no host between the listing and the kill.
    os.killpg(proc.pid, signal.SIGSTOP)
    victims = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class _Watched:
    """A tpuctl process, its output read on threads as it comes (its own session: a kill of its group
    reaches nothing else)."""

    def __init__(self, env: dict[str, str], *argv: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tpuctl", *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(stream,), daemon=True)
            for stream in (self.proc.stdout, self.proc.stderr)
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            self.lines.append(raw.decode(errors="replace"))

    def count(self, needle: str) -> int:
        return sum(needle in line for line in list(self.lines))

    def end(self, how: str | None) -> int | None:
        """Kill it (``how``) unless it ended; its exit status if it ended first, else None."""
        code = self.proc.poll()
        if code is None and how is not None:
            _sigkill(self.proc, how)
        try:
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        for t in self._threads:
            t.join(timeout=10)
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)


def _trigger(
    phase: str, rng: random.Random, env: dict[str, str]
) -> tuple[Callable[[_Watched, Path | None], bool], float]:
    """When to kill (seen in the run's status lines and host 0's events) and a random delay after that."""
    from recovery_helpers import events_of

    def steps(log: Path | None) -> list[int]:
        return [] if log is None else [e["step"] for e in events_of(log) if e["event"] == "step"]

    if phase == "placement":  # the request is on its way, or the slice is being created (0.5 s)
        return (lambda run, log: run.count("tpuctl: creating ") > 0), rng.uniform(0.0, 0.5)
    if phase == "startup":
        if rng.random() < 0.5:  # as soon as a host runs: most often before the hosts' pids are recorded
            return (lambda run, log: log is not None and bool(run_processes(log.parent.name))), 0.0
        # shipping, starting the hosts, recording their pids, JAX start-up and compile
        return (lambda run, log: run.count("tpuctl: shipping bundle") > 0), rng.uniform(0.0, 3.0)
    if phase == "training":  # between two steps, anywhere before the last
        at = rng.randint(1, RUN_STEPS - 1)
        return (lambda run, log: bool(steps(log)) and steps(log)[-1] >= at), rng.uniform(0.0, 0.25)
    if phase == "checkpoint":  # host 0 reports the step, then every host saves it (asynchronously)
        at = rng.choice([4, 8])
        return (lambda run, log: at in steps(log)), rng.uniform(0.0, 0.15)
    if phase == "recovery":
        # The slice is preempted, with notice, from another process once training runs; the kill lands
        # anywhere from the notice (every host checkpoints and stops, the slice is deleted, a new one is
        # placed) to the restart on the new slice.
        outran: list[bool] = []  # the run ended its slice before the preemption reached it

        def preempted(run: _Watched, log: Path | None) -> bool:
            ready = [
                m
                for line in list(run.lines)
                if (m := re.search(r"tpuctl: creating (\S+) .*… READY in", line))
            ]
            if outran or not ready or not steps(log):
                return False
            # In this process: a `tpuctl` started for it takes seconds on a loaded machine, long enough
            # for a 12-step run to finish first.
            done = invoke(["sim", "preempt", ready[0].group(1)], env=env)
            if done.code != 0 and "only a READY node can be preempted" in done.output:
                # The run outran the preemption (its slice is already being deleted): this round lands
                # no kill, and the loop tries the same kill on the next run.
                outran.append(True)
                return False
            assert done.code == 0, done.output
            return True

        return preempted, rng.uniform(0.0, 5.0)
    assert phase == "teardown"  # the program is done: hosts exit, the slice is deleted, the run recorded
    return (
        lambda run, log: log is not None and any(e["event"] == "done" for e in events_of(log))
    ), rng.uniform(0.0, 1.2)


def _kill_run(
    env: dict[str, str], state_dir: Path, kill: Kill, rng: random.Random, accelerator_type: str
) -> tuple[str | None, int | None, str]:
    """`tpuctl run` of the LM, SIGKILLed at a random moment of ``kill.phase``: the run id, the exit status if
    it ended first (None: killed) and its output."""
    from recovery_helpers import HOST_XLA_ENV

    runs = state_dir / "runs"
    before = {p.name for p in runs.glob("run-*")}
    run = _Watched(
        env,
        "run",
        "--example",
        "lm",
        "--type",
        accelerator_type,
        "--checkpoint-every",
        "4",
        "-v",  # every step of tpuctl's is said as it begins: what the kill triggers watch for
        *HOST_XLA_ENV,
        "--",
        *RUN_LM,
    )
    ready, delay = _trigger(kill.phase, rng, env)
    run_id: str | None = None
    # A hang detector, not a speed target: at load 19 on 2 cores one run took over 120 s to its end.
    deadline = time.monotonic() + 300
    while run.proc.poll() is None:
        assert time.monotonic() < deadline, f"no {kill.phase} seen in 300 s: {run.output[-3000:]}"
        if run_id is None:
            new = sorted({p.name for p in runs.glob("run-*")} - before)
            run_id = new[-1] if new else None
        if ready(run, runs / run_id / "worker-0.log" if run_id else None):
            time.sleep(delay)
            break
        time.sleep(0.01)
    code = run.end(kill.how)
    if run_id is None:
        new = sorted({p.name for p in runs.glob("run-*")} - before)
        run_id = new[-1] if new else None
    return run_id, code, run.output


def _resume_once_the_lease_expired(env: dict[str, str], run_id: str) -> CliResult:
    """`runs resume`, again while the killed supervisor's lease is still live (exit 9), bounded."""
    deadline = time.monotonic() + 30.0
    while True:
        resumed = _tpuctl(env, "runs", "resume", run_id, "-o", "json")
        if resumed.code != 9 or time.monotonic() > deadline:
            return resumed
        time.sleep(0.5)  # a real process's lease running out, not simulated time


def _tpuctl(env: dict[str, str], *argv: str, timeout: float = 240) -> CliResult:
    """`tpuctl ARGV` to its end; one that outlives ``timeout`` fails the test with every thread's stack
    (Python's fault handler, on SIGABRT) and what it printed, so a hang says where it hung."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuctl", *argv],
        env={**env, "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=30)
        pytest.fail(
            f"`tpuctl {' '.join(argv)}` still ran after {timeout:.0f} s; its output and stacks:\n"
            f"{out.decode(errors='replace')[-3000:]}\n{err.decode(errors='replace')[-12000:]}"
        )
    result = CliResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
    no_crash(result)
    return result


def _ledger_sound(state_dir: Path) -> None:
    from tpuctl.store import Ledger

    with Ledger(state_dir) as ledger:
        assert ledger.integrity_check() == "ok"
        assert ledger.check_view() == []


def _run_status(state_dir: Path, run_id: str) -> Any:
    from tpuctl.store import Ledger

    with Ledger(state_dir) as ledger:
        record = ledger.get_run(run_id)
    assert record is not None, run_id
    return record.status


def run_crash_loop(
    kills: int,
    seed: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    reference: str,
    jax_cache: Path,
    accelerator_type: str,
    chain_every: int,
) -> Counter[str]:
    from recovery_helpers import fast_jax_env, final_hash

    from tpuctl.services.run.lease import lease_holder
    from tpuctl.store import Ledger
    from tpuctl.store.records import RunStatus, SegmentKind

    state_dir = tmp_path / "state"
    world = write_world(tmp_path / "world.yaml", _run_world())
    env = {**_env(state_dir, world), **fast_jax_env(jax_cache)}
    monkeypatch.setenv("TPUCTL_SIM_WORLD", str(world))  # the in-process `pod gc`: the same world
    rng = random.Random(seed)
    tally: Counter[str] = Counter()
    plan = kill_plan(kills, rng, chain_every)
    started = 0
    chain_due = False  # a planned kill of the takeover waits for a run that has one
    while tally["killed"] < kills:
        started += 1
        # A planned kill misses when the run ends first (a loaded machine's recovery can outrun it).
        assert started <= 2 * kills + 2, f"too few kills landed: {tally}"
        kill = plan[tally["killed"]]
        chain_due = chain_due or kill.chain
        run_id, code, output = _kill_run(env, state_dir, kill, rng, accelerator_type)
        assert run_id is not None, output[-3000:]
        no_crash(CliResult(code or 0, output, ""))
        if code is None:
            tally["killed"] += 1
            tally[f"killed_{kill.phase}_{kill.how}"] += 1
            with Ledger(state_dir) as ledger:  # a kill once the supervisor acted on a preemption
                kinds = {seg.kind for seg in ledger.segments(run_id)}
            tally["killed_after_preemption"] += SegmentKind.PREEMPTED in kinds
        else:
            assert code == 0, output[-3000:]
            tally[f"finished_{kill.phase}"] += 1
        where = f"{kill} of {run_id} ({tally})"
        # Right after the kill: the ledger passes SQLite's check and its view replays from the event log.
        _ledger_sound(state_dir)

        if chain_due and code is None and _run_status(state_dir, run_id) is not RunStatus.SUCCEEDED:
            chain_due = False
            # The takeover is killed too, anywhere from its start-up to its run's end, the other way than
            # the run was (so one chained pair sees both), then resumed again.
            how = HOW[1 - HOW.index(kill.how)]
            tally[f"killed_takeover_{how}"] += 1
            takeover = _Watched(env, "runs", "resume", run_id)
            time.sleep(rng.uniform(0.3, 7.0))
            ended = takeover.end(how)
            no_crash(CliResult(ended or 0, takeover.output, ""))
            tally["killed_resume" if ended is None else "finished_resume"] += 1
            _ledger_sound(state_dir)

        before = _run_status(state_dir, run_id)
        resumed = _resume_once_the_lease_expired(env, run_id)
        if before is RunStatus.SUCCEEDED:
            # It had finished, and said so in the ledger, before the kill: nothing to resume, and it says so.
            assert resumed.code == 2, (where, resumed.output[-3000:])
            error = resumed.json
            assert error["error"] == "usage" and error["exit_code"] == 2, error
            assert error["message"] == f"run {run_id} already succeeded; there is nothing to resume", error
            tally["already_done"] += 1
        else:
            assert resumed.code == 0, (where, resumed.output[-4000:])
            assert resumed.json["run"]["status"] == "succeeded", (where, resumed.stdout)
            tally["resumed"] += 1

        # Bit for bit what the uninterrupted run computes; recorded as done, by nobody now.
        assert final_hash(state_dir / "runs" / run_id / "worker-0.log") == reference, where
        with Ledger(state_dir) as ledger:
            record = ledger.get_run(run_id)
            assert record is not None and record.status is RunStatus.SUCCEEDED, where
            assert record.exit_code == 0 and record.steps == RUN_STEPS, (where, record)
            detail = record.detail or {}
            assert detail.get("supervisor") is None and detail["recovery"]["steps_completed"] == RUN_STEPS
            assert [s for s in ledger.segments(run_id) if s.end is None] == [], where
            tally["recoveries"] += record.preemptions
        assert lease_holder(state_dir / "runs" / run_id) is None, where
        # Nothing any of its supervisors started is left running.
        assert run_processes(run_id) == [], where
        # One `pod gc`: the ledger and the simulator agree, and no slice is left.
        _check(state_dir, world, no_slices=True)
    return tally


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One JAX compilation cache for every host started here: a start loads the program, compiles nothing."""
    return tmp_path_factory.mktemp("jax-cache")


def _reference_hash(workdir: Path, jax_cache: Path, accelerator_type: str) -> str:
    """The final params of an uninterrupted run of the same program and seed on the same mesh, no tpuctl."""
    from recovery_helpers import fast_jax_env, run_reference

    from tpuctl.catalog import Catalog

    shape = Catalog.load().resolve(accelerator_type)
    return run_reference(
        workdir,
        RUN_LM,
        hosts=shape.hosts,
        chips=shape.generation.chips_per_host,
        accelerator_type=accelerator_type,
        topology=shape.topology,
        extra_env=fast_jax_env(jax_cache),
    )


@pytest.fixture(scope="module")
def run_reference_hash(tmp_path_factory: pytest.TempPathFactory, jax_cache: Path) -> str:
    return _reference_hash(tmp_path_factory.mktemp("reference"), jax_cache, RUN_TYPE)


@pytest.fixture(scope="module")
def slow_run_reference_hash(tmp_path_factory: pytest.TempPathFactory, jax_cache: Path) -> str:
    return _reference_hash(tmp_path_factory.mktemp("reference-slow"), jax_cache, SLOW_RUN_TYPE)


# A killed run of a one-host slice (a phase, one way), its takeover killed the other way, then resumed to
# the end; every phase both ways is the slow loop's. The timeout turns a hang into a stack
# (each command inside is bounded too); it is not there to bound a loop that a loaded machine slows.
@pytest.mark.timeout(900)
def test_kill_9_during_tpuctl_run_then_runs_resume(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_reference_hash: str,
    jax_cache: Path,
    stored_envs: StoredEnvs,
) -> None:
    # The bucket holds the runtime's environment, as after a team's earlier runs: what is tested here is
    # the killed supervisor and its resume, not the first build of an environment.
    stored_envs.seed(storage_dir_for(tmp_path / "state"))
    tally = run_crash_loop(
        RUN_KILLS, 24, tmp_path, monkeypatch, run_reference_hash, jax_cache, RUN_TYPE, CHAIN_EVERY
    )
    print("run crash tally:", dict(tally))
    phases = {phase for phase in PHASES for how in HOW if tally[f"killed_{phase}_{how}"]}
    assert len(phases) == RUN_KILLS, tally
    assert tally["killed_resume"] + tally["finished_resume"] == 1, tally


@pytest.mark.slow
# 25 killed runs of a two-host slice, each resumed to the end (and checked bit for bit): 15 min alone on 2
# cores, past the 300 s per-test timeout, which is there to turn a hang into a stack, not to bound a loop
# this long.
@pytest.mark.timeout(2400)
def test_kill_9_during_tpuctl_run_many_times(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    slow_run_reference_hash: str,
    jax_cache: Path,
    stored_envs: StoredEnvs,
) -> None:
    # The bucket holds the runtime's environment, as after a team's earlier runs: what is tested here is
    # the killed supervisor and its resume, not the first build of an environment.
    stored_envs.seed(storage_dir_for(tmp_path / "state"))
    tally = run_crash_loop(
        SLOW_RUN_KILLS,
        22,
        tmp_path,
        monkeypatch,
        slow_run_reference_hash,
        jax_cache,
        SLOW_RUN_TYPE,
        SLOW_CHAIN_EVERY,
    )
    print("run crash tally:", dict(tally))
    for phase in PHASES:
        for how in HOW:
            assert tally[f"killed_{phase}_{how}"] >= 2, tally
    assert tally["killed_resume"] >= 5 and tally["killed_after_preemption"] >= 1, tally
