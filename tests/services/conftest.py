"""Fixtures for the allocator's tests: a simulator per test (in the test's own state dir, with a world the
test writes), served (``sim``) or in this process on a fake clock (``in_process_sim``), the real client
on it, a Session over it, and the CLI run in-process against the same simulator. The helpers live in
``allocator_helpers``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from allocator_helpers import InProcessEnv, SimEnv, make_world

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.testing.cli import Cli, CliResult


@pytest.fixture
def sim(state_dir: Path) -> Iterator[Callable[..., SimEnv]]:
    """``sim(**world_overrides)`` starts a simulator in this test's state dir (stopped at teardown);
    ``ticker_interval_s=0`` turns its ticker off, so time only moves when a request comes; ``clock`` is
    the simulator's (a ``FakeClock`` lets the test move simulated time)."""
    envs: list[SimEnv] = []

    def start(
        *, ticker_interval_s: float = 0.05, clock: Callable[[], float] = time.time, **overrides: Any
    ) -> SimEnv:
        state_dir.mkdir(parents=True, exist_ok=True)
        server = SimServer(
            state_dir, make_world(**overrides), clock=clock, ticker_interval_s=ticker_interval_s
        )
        server.start()
        env = SimEnv(server=server, admin=SimAdminClient(server.url), state_dir=state_dir)
        envs.append(env)
        return env

    yield start
    for env in envs:
        env.close()


@pytest.fixture
def in_process_sim(state_dir: Path) -> Iterator[Callable[..., InProcessEnv]]:
    """``in_process_sim(**world_overrides)``: the simulator in this test's state dir, in this process
    (closed at teardown); time moves only when something waits on its fake clock or the test advances it."""
    from tpuctl.store.paths import ensure_private_dir
    from tpuctl.testing.backend import InProcessBackend, InProcessCli
    from tpuctl.testing.cloud import InProcessSim

    sims: list[InProcessSim] = []
    envs: list[InProcessEnv] = []

    def start(**overrides: Any) -> InProcessEnv:
        sim = InProcessSim(ensure_private_dir(state_dir), make_world(**overrides))
        sims.append(sim)
        env = InProcessEnv(InProcessCli(InProcessBackend(sim)), state_dir)
        envs.append(env)
        return env

    yield start
    for env in envs:
        env.close()
    for sim in sims:
        sim.close()


@pytest.fixture
def cli(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """Run ``tpuctl ARGS`` in-process; with ``env`` against that simulator: a SimEnv's for this and every
    later command of the test, an InProcessEnv's for this command."""

    def run(*args: str, env: SimEnv | InProcessEnv | None = None) -> CliResult:
        if isinstance(env, InProcessEnv):
            result: CliResult = env.cli(*args)  # (allocator_helpers is unchecked here: see pyproject)
            return result
        if env is not None:
            monkeypatch.setenv("TPUCTL_SIM_URL", env.url)
        return cli(*args)

    return run
