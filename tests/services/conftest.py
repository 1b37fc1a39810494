"""Fixtures for the allocator's tests: a simulator per test (in the test's own state dir, with a world the
test writes), the real TpuApiCloud client pointed at it, a Session over it, and the CLI run in-process
against the same simulator."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tpuctl.catalog import Catalog
from tpuctl.cloud.tpu_api import TpuApiCloud
from tpuctl.services.allocator import Allocator, build_request
from tpuctl.services.placement import PlacementRequest
from tpuctl.services.session import Session
from tpuctl.settings import load_settings
from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.world import World, world_from_data
from tpuctl.store.ledger import Ledger

PROJECT = "tpuctl-sim"

#: Eight zones offering v5e whose regions the catalog prices, cheapest spot first (USD per chip-hour,
#: spot / on-demand): us-central1 0.245/1.20, us-east1 0.245/1.20, asia-northeast1 0.424/1.541,
#: europe-west4 0.445/1.56, us-west4 0.48/1.20, us-south1 0.566/1.416, us-east5 0.60/1.20,
#: asia-southeast1 0.78/1.56.
V5E_ZONES = [
    "us-central1-a",
    "us-east1-c",
    "asia-northeast1-b",
    "europe-west4-b",
    "us-west4-a",
    "us-south1-a",
    "us-east5-b",
    "asia-southeast1-b",
]

BASE_WORLD: dict[str, Any] = {
    "project": PROJECT,
    # 1000x: a 60 s create takes 0.06 s; a 5 s stockout 5 ms.
    "speed": 1000,
    "seed": 11,
    "zones": {z: {"v5e": {"on_demand": 256, "preemptible": 256}} for z in V5E_ZONES},
    "quotas": {
        "default": {
            "on_demand": {"zone": 256, "region": 512},
            "preemptible": {"zone": 256, "region": 512},
        }
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    "durations": {
        "node_create_s": 60,
        "node_delete_s": 10,
        "node_stop_s": 10,
        "node_start_s": 10,
        "queued_provision_s": 60,
        "stockout_s": 5,
        "preemption_grace_s": 1,
    },
}


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def make_world(**overrides: Any) -> World:
    """The base world with ``overrides`` deep-merged (dicts merge; lists and scalars replace)."""
    return world_from_data(merge(BASE_WORLD, overrides), "test world")


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict[str, Any]:
        data = json.loads(self.stdout)
        assert isinstance(data, dict)
        return data


@dataclass
class SimEnv:
    """One running simulator and what the tests need around it."""

    server: SimServer
    admin: SimAdminClient
    state_dir: Path
    _sessions: list[Session] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def session(self) -> Session:
        settings = load_settings({"state_dir": self.state_dir, "backend": "sim"})
        cloud = TpuApiCloud.for_simulator(project=PROJECT, base_url=self.url)
        ledger = Ledger(self.state_dir)
        sess = Session(
            settings=settings,
            catalog=Catalog.load(),
            cloud=cloud,
            ledger=ledger,
            state_dir=self.state_dir,
            _closers=[cloud.close, ledger.close],
        )
        self._sessions.append(sess)
        return sess

    def allocator(self, session: Session | None = None, **kwargs: Any) -> Allocator:
        kwargs.setdefault("poll_interval_s", 0.01)
        kwargs.setdefault("poll_max_interval_s", 0.05)
        return Allocator(session or self.session(), **kwargs)

    def request(self, type_name: str, session: Session | None = None, **flags: Any) -> PlacementRequest:
        sess = session or self.session()
        return build_request(sess.catalog, sess.settings, type_name, **flags)

    def close(self) -> None:
        for sess in self._sessions:
            sess.close()
        self.admin.close()
        self.server.stop()


@pytest.fixture
def sim(state_dir: Path) -> Iterator[Callable[..., SimEnv]]:
    """``sim(**world_overrides)`` starts a simulator in this test's state dir (stopped at teardown)."""
    envs: list[SimEnv] = []

    def start(**overrides: Any) -> SimEnv:
        state_dir.mkdir(parents=True, exist_ok=True)
        server = SimServer(state_dir, make_world(**overrides))
        server.start()
        env = SimEnv(server=server, admin=SimAdminClient(server.url), state_dir=state_dir)
        envs.append(env)
        return env

    yield start
    for env in envs:
        env.close()


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run ``tpuctl ARGS`` in-process; with ``env`` (a SimEnv) against that simulator."""

    def run(*args: str, env: SimEnv | None = None) -> CliResult:
        from tpuctl.cli.main import run as tpuctl_main

        if env is not None:
            monkeypatch.setenv("TPUCTL_SIM_URL", env.url)
        capsys.readouterr()
        try:
            tpuctl_main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
