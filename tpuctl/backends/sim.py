"""The simulator backend: the built-in simulated TPU cloud on loopback, in-process or at ``sim_url``.

The simulator answers in milliseconds, so tpuctl polls and retries it fast; its hosts are, for now,
local processes under the state dir (``LocalSimHosts``), registered with the simulator's admin API so
that a simulated preemption can signal them as Google's would the real host.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.backends.base import Closer, HostAddress, OwnPrices, RecoveryTuning, Tuning
from tpuctl.cloud.retry import RetryPolicy

if TYPE_CHECKING:
    from tpuctl.cloud.base import Node, TpuCloud
    from tpuctl.hosts.base import Executor
    from tpuctl.sim.world import World

#: One retry policy for every step: the simulator's faults are injected at a fixed rate, so a few
#: fast retries (milliseconds) ride them out.
_SIM_RETRY = RetryPolicy(max_attempts=8, initial_wait_s=0.02, max_wait_s=0.5, deadline_s=30.0)

SIM_TUNING = Tuning(
    step_retry=_SIM_RETRY,
    gc_retry=_SIM_RETRY,
    poll_interval_s=0.05,
    poll_max_interval_s=0.5,
    recovery=RecoveryTuning(
        poll_s=0.25, confirm_timeout_s=5.0, backoff_initial_s=0.2, backoff_max_s=2.0, budget_margin_s=3.0
    ),
    budget_poll_s=1.0,
    delete_margin_s=5.0,
)

#: Below the state dir: one directory per simulated slice, one per host below it (the host's "disk").
HOSTS_DIR = "sim-hosts"


@dataclass
class SimBackend:
    """The simulator: started in-process for the session, or the one serving at ``url``."""

    world_path: Path | None = None
    url: str | None = None
    name: str = "sim"
    tuning: Tuning = SIM_TUNING
    default_executor: str = "sim"

    def open_cloud(self, state_dir: Path, closers: list[Closer]) -> TpuCloud:
        from tpuctl.cloud.tpu_api import TpuApiCloud

        base_url, project = self._serve(state_dir, closers)
        return TpuApiCloud.for_simulator(project=project, base_url=base_url)

    def _serve(self, state_dir: Path, closers: list[Closer]) -> tuple[str, str]:
        from tpuctl.sim import SimAdminClient, SimServer

        if self.url:
            admin = SimAdminClient(self.url)
            try:
                project = admin.status().get("project", "tpuctl-sim")
            finally:
                admin.close()
            return self.url.rstrip("/"), str(project)
        server = SimServer(state_dir, self._world())
        url = server.start()
        closers.append(server.stop)
        return url, server.world.project

    def _world(self) -> World | None:
        from tpuctl.sim import load_world

        return load_world(self.world_path) if self.world_path else None

    def host_addresses(self, node: Node) -> list[HostAddress]:
        # A simulated endpoint names the SSH server standing in for its host, port included.
        return [HostAddress(e.ip_address, e.port) for e in node.network_endpoints]

    def notice_grace_s(self, cloud: TpuCloud) -> float | None:
        """The world's preemption grace in real seconds (its durations are scaled by its speed)."""
        from tpuctl.sim import SimAdminClient

        try:
            admin = SimAdminClient(cloud.endpoint, timeout_s=5.0)
            try:
                world = admin.status().get("world") or {}
            finally:
                admin.close()
            grace = float((world.get("durations") or {}).get("preemption_grace_s", 0.0))
            return grace / float(world.get("speed") or 1.0)
        except Exception:  # an older or foreign simulator: the caller's default stands
            return None

    def local_hosts(self, cloud: TpuCloud, state_dir: Path) -> LocalSimHosts:
        return LocalSimHosts(state_dir / HOSTS_DIR, admin_url=cloud.endpoint)

    def own_prices(self) -> OwnPrices:
        from tpuctl.sim import default_world, load_world

        world = load_world(self.world_path) if self.world_path else default_world()
        where = str(self.world_path) if self.world_path else "(built-in default world)"
        overrides = {
            generation: {
                region: {
                    key: float(value)
                    for key, value in (("on_demand", price.on_demand), ("spot", price.spot))
                    if value is not None
                }
                for region, price in regions.items()
            }
            for generation, regions in world.prices.items()
        }
        return OwnPrices(overrides, where, world.project)


@dataclass
class LocalSimHosts:
    """Simulated hosts as local processes: each host's disk is ``<root>/<zone>/<node>/worker-N``."""

    root: Path
    admin_url: str

    def _node_dir(self, node: Node) -> Path:
        return self.root / node.zone / node.name

    def executor(self, node: Node, *, num_hosts: int, python: str | None, for_plan: bool) -> Executor:
        from tpuctl.hosts.sim import SimExecutor

        return SimExecutor(
            self._node_dir(node),
            zone=node.zone,
            node=node.name,
            num_hosts=num_hosts,
            registry=None if for_plan else _AdminRegistry(self.admin_url),
            metadata_base_url=self.admin_url,
            python=python or sys.executable,
        )

    def checkpoint_dir(self, runs_dir: Path, run_id: str) -> str:
        # Local hosts share this machine's disk, as real hosts share a gs:// bucket.
        return str(runs_dir / run_id / "checkpoints")

    def cleanup(self, node: Node) -> None:
        shutil.rmtree(self._node_dir(node), ignore_errors=True)

    def leftover_pids(self, run_id: str) -> list[int]:
        from tpuctl.hosts.sim import local_hosts

        return local_hosts(self.root, run_id)


@dataclass
class _AdminRegistry:
    """Registers host pids with the simulator's admin API (so simulated preemptions can signal them)."""

    base_url: str
    _client: Any = field(default=None, repr=False)

    def _admin(self) -> Any:
        if self._client is None:
            from tpuctl.sim import SimAdminClient

            self._client = SimAdminClient(self.base_url, timeout_s=10.0)
        return self._client

    def register_host(self, zone: str, node: str, worker: int, pid: int) -> object:
        return self._admin().register_host(zone, node, worker, pid)

    def unregister_hosts(self, zone: str, node: str) -> object:
        try:
            return self._admin().unregister_hosts(zone, node)
        finally:
            self._admin().close()
            self._client = None
