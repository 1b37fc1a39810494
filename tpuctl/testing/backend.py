"""The simulator backend with no server and no real time, for tests, as httpx ships ``MockTransport``.

``InProcessBackend`` is a real ``tpuctl.backends.base.Backend`` over an ``InProcessSim``
(``tpuctl.testing.cloud``): its cloud is the real ``TpuApiCloud`` and ``ComputeCloud`` (both of Google's
TPU surfaces, behind the same ``SurfaceRouter`` as ``SimBackend``'s), their HTTP answered by the
simulator's route table in this process, and its time is the simulator's ``FakeClock``. Handed to the CLI
(``invoke(args, backend=...)``, or ``InProcessCli``), every session of a command opens it instead of
serving a simulator: its clock, monotonic clock and sleep are the fake clock's (``timekeeping``), so a command
that waits for a slice moves simulated time and returns in milliseconds, and a test moves time with
``clock.advance`` instead of sleeping.

It serves no hosts: there are no VMs, no sshd and no metadata servers here. A test that reaches hosts
(``tpuctl run``, SSH) uses the served simulator (the ``serve_sim`` fixture).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from tpuctl.backends.base import (
    BackendLabel,
    Closer,
    HostAddress,
    OwnPrices,
    Timekeeping,
    Tuning,
    WheelhouseOnly,
)
from tpuctl.backends.sim import (
    NAME,
    SIM_BUCKET,
    SIM_CLIENTS,
    SIM_LABEL,
    SIM_TUNING,
    SimBackend,
    mirror_limit,
    sim_account_access,
    sim_buckets,
    sim_image_python,
    sim_os_login,
    world_prices,
)
from tpuctl.cloud.compute import ComputeCloud
from tpuctl.testing.cli import CliResult, invoke
from tpuctl.testing.clock import FakeClock
from tpuctl.testing.cloud import ENDPOINT, InProcessSim, SimAdapter, httpx_transport

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from tpuctl.cloud.account_access import AccountAccess
    from tpuctl.cloud.base import Node, TpuCloud
    from tpuctl.cloud.buckets import BucketClient
    from tpuctl.cloud.identity import IdentityIssuer
    from tpuctl.cloud.instances import InstanceClient, VmInstance
    from tpuctl.cloud.oslogin import OsLoginAccess
    from tpuctl.hosts.pythons import ImagePython
    from tpuctl.sim import SimAdminClient
    from tpuctl.sim.storage import StorageEmulator
    from tpuctl.sim.world import World

#: Where the prices of ``catalog prices --refresh`` come from, as the price source names it.
WORLD_SOURCE = "(in-process test world)"


class InProcessBackend:
    """The simulator in this process on a fake clock; ``name`` is ``sim``, as the user sees it."""

    name = NAME
    label: BackendLabel = SIM_LABEL
    runtime: Literal["cpu", "tpu"] = "cpu"
    default_bucket: str | None = SIM_BUCKET
    host_wheelhouse: Path | None = None  # its hosts are never set up (it runs no VMs)

    def __init__(self, sim: InProcessSim, *, tuning: Tuning = SIM_TUNING) -> None:
        self.sim = sim
        self.tuning = tuning
        self._storage: StorageEmulator | None = None

    @property
    def storage_url(self) -> str:
        """The Cloud Storage of this simulator: the GCS emulator, in memory, started on first use (the
        one thing here that listens: on loopback, at an ephemeral port) and kept until ``close``, so that
        every command of a test sees the same buckets."""
        if self._storage is None:
            from tpuctl.sim.storage import StorageEmulator

            engine = self.sim.engine  # the world in force says who may use the bucket
            self._storage = StorageEmulator(lambda: engine.world, None, default_bucket=SIM_BUCKET)
            self._storage.start()
        return self._storage.url

    def close(self) -> None:
        """Stop the storage emulator, if it was started."""
        storage, self._storage = self._storage, None
        if storage is not None:
            storage.stop()

    @property
    def timekeeping(self) -> Timekeeping:
        """The fake clock's time: now, elapsed time and every wait (a wait moves it at once)."""
        fake = self.sim.clock
        return Timekeeping(clock=fake.now, monotonic=fake.now, sleep=fake.sleep)

    # --- Backend ----------------------------------------------------------------------------------------

    def open_cloud(self, state_dir: Path, closers: list[Closer]) -> TpuCloud:
        """Both surfaces over the route table, called as ``SimBackend`` calls a served simulator
        (``SIM_CLIENTS``) but for their waits, which pass on the fake clock. ``state_dir`` is the
        ledger's, not the simulator's: its state is the ``InProcessSim``'s, as a served one's is its own."""
        from tpuctl.catalog import Catalog
        from tpuctl.cloud.quotas import COMPUTE_SERVICE, TPU_SERVICE, CloudQuotasClient
        from tpuctl.cloud.surfaces import SurfaceRouter
        from tpuctl.cloud.tpu_api import TpuApiCloud

        config = replace(SIM_CLIENTS, sleep=self.sim.clock.sleep)
        project = self.sim.engine.world.project

        def quotas(service: str) -> CloudQuotasClient:
            transport = httpx_transport(self.sim.engine)
            return CloudQuotasClient.from_config(
                config, base_url=ENDPOINT, service=service, transport=transport
            )

        adapter = SimAdapter(self.sim.engine)
        return SurfaceRouter(
            TpuApiCloud(
                project=project,
                endpoint=ENDPOINT,
                config=config,
                quotas=quotas(TPU_SERVICE),
                http_adapter=adapter,
            ),
            _InProcessCompute(
                project=project,
                catalog=Catalog.load(),
                endpoint=ENDPOINT,
                config=config,
                quotas=quotas(COMPUTE_SERVICE),
                http_adapter=adapter,
            ),
        )

    def host_addresses(self, cloud: TpuCloud, node: Node) -> list[HostAddress]:
        from tpuctl.errors import UnreachableError

        raise UnreachableError(
            f"slice {node.name} has no hosts to reach: the in-process simulator runs no VMs",
            fix="a test that reaches hosts serves the simulator (the serve_sim fixture)",
        )

    def open_os_login(self, cloud: TpuCloud, closers: list[Closer]) -> OsLoginAccess:
        """The simulator's OS Login over its route table, its waits on the fake clock."""
        transport = httpx_transport(self.sim.engine)
        return sim_os_login(ENDPOINT, closers, transport=transport, sleep=self.sim.clock.sleep)

    def open_buckets(self, state_dir: Path, closers: list[Closer]) -> BucketClient:
        return sim_buckets(self.storage_url, closers)

    def open_instances(self, cloud: TpuCloud, closers: list[Closer]) -> InstanceClient:
        from tpuctl.errors import UsageError

        # Its route table serves no general-purpose VMs (nothing here runs a VM): a served simulator does.
        raise UsageError("the in-process test simulator runs no general-purpose VMs", fix="use SimServer")

    def instance_address(self, cloud: TpuCloud, vm: VmInstance) -> HostAddress:
        return HostAddress(vm.address or "", 22)

    def open_account_access(self, cloud: TpuCloud, closers: list[Closer]) -> AccountAccess:
        """The simulator's Policy Troubleshooter and Compute Engine over its route table, waits on the
        fake clock."""
        transport = httpx_transport(self.sim.engine)
        return sim_account_access(ENDPOINT, closers, transport=transport, sleep=self.sim.clock.sleep)

    def host_env(self, worker: int, addresses: list[HostAddress], chips_per_host: int) -> dict[str, str]:
        return SimBackend().host_env(worker, addresses, chips_per_host)

    def image_python(self, image: str) -> ImagePython:
        return sim_image_python(known=True)

    def host_index_limit(self, cloud: TpuCloud) -> WheelhouseOnly | None:
        return None if self.sim.engine.world.package_fetch_through else mirror_limit()

    def notice_grace_s(self, cloud: TpuCloud) -> float | None:
        return float(self.sim.engine.world.durations.preemption_grace_s)

    def maintenance_notice_s(self, cloud: TpuCloud) -> float | None:
        return float(self.sim.engine.world.durations.maintenance_notice_s)

    def identity_issuer(self, cloud: TpuCloud) -> IdentityIssuer:
        """Where a served simulator's issuer would be: this one serves no HTTP, so a test that verifies
        tokens serves a simulator for its issuer (``tpuctl.server.auth.Authenticator`` takes any)."""
        from tpuctl.cloud.identity import IdentityIssuer

        return IdentityIssuer.at(ENDPOINT)

    def own_prices(self) -> OwnPrices:
        return world_prices(self.sim.engine.world, WORLD_SOURCE)


class _InProcessCompute(ComputeCloud):
    """``ComputeCloud`` whose SDK clients send their requests through ``http_adapter`` (ComputeCloud
    itself takes no adapter, unlike TpuApiCloud): mounted once on each client's ``requests`` session."""

    def __init__(self, *, http_adapter: SimAdapter, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._adapter = http_adapter
        self._adapted: set[int] = set()
        self._adapting = threading.Lock()

    def _client(self, kind: str) -> Any:
        client = super()._client(kind)
        with self._adapting:
            if id(client) not in self._adapted:
                session = getattr(client.transport, "_session", None)
                if session is None:
                    raise TypeError(f"the Compute {kind} client's transport has no requests session to adapt")
                for scheme in ("http://", "https://"):
                    session.mount(scheme, self._adapter)
                self._adapted.add(id(client))
        return client


@dataclass
class InProcessCli:
    """The CLI over one ``InProcessBackend``: ``cli(*args, env=..., stdin=...)`` runs ``tpuctl ARGS`` in
    this process with every session on that backend. ``clock`` moves simulated time; ``admin`` is the
    simulator's admin API; ``cloud()`` the cloud layer on the same simulator with no ledger (what another
    tool would do behind tpuctl's back)."""

    backend: InProcessBackend
    _opened: list[Any] = field(default_factory=list)

    def __call__(self, *args: str, env: Mapping[str, str | None] | None = None, stdin: str = "") -> CliResult:
        return invoke(args, env=env, stdin=stdin, backend=self.backend)

    @property
    def sim(self) -> InProcessSim:
        return self.backend.sim

    @property
    def clock(self) -> FakeClock:
        return self.backend.sim.clock

    @property
    def world(self) -> World:
        return self.backend.sim.engine.world

    @property
    def admin(self) -> SimAdminClient:
        """The admin API (``/sim/v1``) over the route table; one client, closed by ``close``."""
        from tpuctl.sim import SimAdminClient

        for opened in self._opened:
            if isinstance(opened, SimAdminClient):
                return opened
        admin = SimAdminClient(ENDPOINT, transport=httpx_transport(self.sim.engine))
        self._opened.append(admin)
        return admin

    @property
    def transport(self) -> httpx.BaseTransport:
        """An httpx transport to the simulator's route table (for raw requests: ``httpx.Client(transport=
        ...)`` with ``ENDPOINT`` URLs)."""
        return httpx_transport(self.sim.engine)

    def cloud(self) -> TpuCloud:
        """A cloud client of the backend (both surfaces), closed by ``close``."""
        closers: list[Closer] = []
        cloud = self.backend.open_cloud(self.sim.state_dir, closers)
        self._opened.append(cloud)
        return cloud

    def close(self) -> None:
        while self._opened:
            self._opened.pop().close()
        self.backend.close()
