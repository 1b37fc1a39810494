"""Fixtures for the simulator's tests: a server per test in the test's own state dir (the root
conftest's ``state_dir``), the REAL google-cloud-tpu client pointed at it, the admin client, and dummy
host processes. Everything started here is stopped or killed at teardown."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.cloud import tpu_v2
from sim_helpers import make_world, tpu_client

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.world import World


@pytest.fixture
def start_server(state_dir: Path) -> Iterator[Callable[..., SimServer]]:
    """Start servers (stopped at teardown). Defaults: the base test world, the state_dir fixture."""
    servers: list[SimServer] = []

    def start(world: World | None = None, *, state: Path | None = None, **kwargs: Any) -> SimServer:
        server = SimServer(state or state_dir, world, **kwargs)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(start_server: Callable[..., SimServer]) -> SimServer:
    return start_server(make_world())


@pytest.fixture
def client(server: SimServer) -> Iterator[tpu_v2.TpuClient]:
    tpu = tpu_client(server.url)
    yield tpu
    tpu.transport.close()


@pytest.fixture
def admin(server: SimServer) -> Iterator[SimAdminClient]:
    with SimAdminClient(server.url) as sim_admin:
        yield sim_admin


@pytest.fixture
def children() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Spawn dummy host processes; every one is killed and reaped at teardown."""
    spawned: list[subprocess.Popen[bytes]] = []

    def spawn(script: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", script], env=env)
        spawned.append(proc)
        return proc

    yield spawn
    for proc in spawned:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def connect_admin() -> Iterator[Callable[[SimServer], SimAdminClient]]:
    """Admin clients for servers a test starts itself; closed at teardown."""
    opened: list[SimAdminClient] = []

    def connect(server: SimServer) -> SimAdminClient:
        sim_admin = SimAdminClient(server.url)
        opened.append(sim_admin)
        return sim_admin

    yield connect
    for sim_admin in opened:
        sim_admin.close()
