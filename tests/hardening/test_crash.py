"""Crash safety: `tpuctl pod create`, `pod delete` and `cost report` killed with SIGKILL at seeded random
moments (the in-process simulator dies with them; its state stays in the state dir's sim.db). After each
kill the ledger passes SQLite's integrity check and replays from its event log, and after one `pod gc`
the ledger and the simulator agree: every slice the simulator has is a live ledger entry (nothing is left
that neither the ledger nor gc knows), and every live ledger entry is a slice.

Default: 8 kills. `--slow`: 100."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hardening_helpers import Result, assert_ledger_agrees, fast_world, no_crash, write_world

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.world import world_from_data


def _env(state_dir: Path, world: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    env["TPUCTL_STATE_DIR"] = str(state_dir)
    env["TPUCTL_SIM_WORLD"] = str(world)
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
        no_crash(Result(proc.returncode, out.decode(), err.decode()))
        return proc.returncode
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _check(state_dir: Path, world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One `pod gc -y` (in-process, its own simulator over the state dir), then the agreement."""
    from tpuctl.cli.main import run as tpuctl

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        tpuctl(["--state-dir", str(state_dir), "pod", "gc", "-y", "-o", "json"])
    out = capsys.readouterr()
    no_crash(Result(int(exit_info.value.code or 0), out.out, out.err))
    assert exit_info.value.code == 0, out.out + out.err
    server = SimServer(state_dir, world_from_data(fast_world(), "test"), ticker_interval_s=0)
    server.start()
    admin = SimAdminClient(server.url)
    try:
        admin.advance()
        assert_ledger_agrees(state_dir, admin)
    finally:
        admin.close()
        server.stop()


def crash_loop(kills: int, seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Counter[str]:
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
        if pick < 0.55:
            argv = ["pod", "create", "v5e-4", "--name", f"c{i:03d}", "-o", "json"]
            what = "create"
        elif pick < 0.85:
            from tpuctl.store import Ledger

            ledger = Ledger(state_dir) if (state_dir / "ledger.db").exists() else None
            try:
                names = sorted(p.name for p in ledger.list_pods(alive=True)) if ledger else []
            finally:
                if ledger:
                    ledger.close()
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
        _check(state_dir, world, capsys)
    assert tally["killed"] == kills, tally
    return tally


def test_kill_9_during_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tally = crash_loop(8, 5, tmp_path, capsys)
    assert tally["killed_create"] > 0, tally


@pytest.mark.slow
def test_kill_9_one_hundred_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tally = crash_loop(100, 6, tmp_path, capsys)
    print("crash tally:", dict(tally))
    assert tally["killed_create"] > 20 and tally["killed_delete"] > 10 and tally["killed_cost"] > 5, tally
