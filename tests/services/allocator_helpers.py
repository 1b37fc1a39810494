"""Helpers for the allocator's tests: the test world, a running simulator with a Session over the real
TpuApiCloud client (``SimEnv``), or the simulator in this process on a fake clock (``InProcessEnv``). (A
module of its own, not conftest.py: several test directories have a conftest.py, so `import conftest`
would be ambiguous.)"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuctl import params
from tpuctl.backends.sim import SimBackend
from tpuctl.catalog import Catalog
from tpuctl.cloud.retry import RetryPolicy
from tpuctl.cloud.tpu_api import TpuApiCloud
from tpuctl.services.allocator import Allocator, build_request
from tpuctl.services.placement import PlacementRequest, Strategy
from tpuctl.services.session import Session
from tpuctl.settings import load_settings
from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.world import World, world_from_data
from tpuctl.store.ledger import Ledger
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import CliResult
from tpuctl.testing.clock import FakeClock
from tpuctl.testing.cloud import ENDPOINT

PROJECT = "tpuctl-sim"
FAST_RETRY = RetryPolicy(max_attempts=8, initial_wait_s=0.002, max_wait_s=0.02, deadline_s=10.0)

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


class _Placing:
    """What both kinds of simulator give the tests: requests built as the CLI builds them, allocators."""

    def session(self) -> Session:
        raise NotImplementedError

    def allocator(self, session: Session | None = None, **kwargs: Any) -> Allocator:
        return Allocator(session or self.session(), **kwargs)

    def request(
        self,
        type_name: str,
        session: Session | None = None,
        *,
        capacity_types: Sequence[str] = (),
        spot: bool = False,
        queued: bool = False,
        strategy: str | None = None,
        race_k: str | None = None,
        valid_for: str | None = None,
        **typed: Any,
    ) -> PlacementRequest:
        """The request the CLI would build from these flags: raw values parsed at the edge, as pod create
        does, the rest passed as they are."""
        sess = session or self.session()
        types, queued_type = params.capacity_types(capacity_types, spot=spot)
        return build_request(
            sess.catalog,
            sess.settings,
            type_name,
            capacity_types=types,
            queued=queued or queued_type,
            strategy=Strategy.CHEAPEST if strategy is None else params.strategy(strategy),
            race_k=None if race_k is None else params.whole(race_k, "race_k"),
            valid_for_s=None if valid_for is None else params.duration(valid_for, "valid_for"),
            **typed,
        )


@dataclass
class SimEnv(_Placing):
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
        # Operations of a 1000x world finish in tens of milliseconds: poll them that often.
        # Injected faults are retried with millisecond waits (8 tries, as the CLI's simulator policy).
        cloud = TpuApiCloud.for_simulator(
            project=PROJECT,
            base_url=self.url,
            poll_interval_s=0.01,
            poll_max_interval_s=0.05,
            retry=FAST_RETRY,
        )
        ledger = Ledger(self.state_dir)
        sess = Session(
            settings=settings,
            backend=SimBackend(url=self.url),
            catalog=Catalog.load(),
            cloud=cloud,
            ledger=ledger,
            state_dir=self.state_dir,
            _closers=[cloud.close, ledger.close],
        )
        self._sessions.append(sess)
        return sess

    def allocator(self, session: Session | None = None, **kwargs: Any) -> Allocator:
        kwargs.setdefault("retry", FAST_RETRY)
        kwargs.setdefault("poll_interval_s", 0.01)
        kwargs.setdefault("poll_max_interval_s", 0.05)
        return super().allocator(session, **kwargs)

    def close(self) -> None:
        for sess in self._sessions:
            sess.close()
        self.admin.close()
        self.server.stop()


@dataclass
class InProcessEnv(_Placing):
    """The simulator in this process (``tpuctl.testing.backend``): sessions and the CLI on its backend,
    whose waits move the fake ``clock``."""

    runner: InProcessCli
    state_dir: Path
    _sessions: list[Session] = field(default_factory=list)

    @property
    def admin(self) -> SimAdminClient:
        return self.runner.admin

    @property
    def clock(self) -> FakeClock:
        return self.runner.clock

    @property
    def url(self) -> str:
        return ENDPOINT

    def session(self) -> Session:
        from tpuctl.services.session import open_session

        settings = load_settings({"state_dir": self.state_dir, "backend": "sim"})
        sess = open_session(settings, backend=self.runner.backend)
        self._sessions.append(sess)
        return sess

    def cli(self, *args: str) -> CliResult:
        return self.runner(*args)

    def close(self) -> None:
        for sess in self._sessions:
            sess.close()
        self.runner.close()
