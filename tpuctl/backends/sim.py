"""The simulator backend: the built-in simulated TPU cloud on loopback, in-process or at ``sim_url``.

The simulator answers in milliseconds, so tpuctl polls and retries it fast; it listens on loopback, so its
clients never go through a proxy from the environment. It authenticates as Google does: on the laptop its
clients send the simulated Application Default Credentials (``sim_credentials``), whose account is the
world's principal; on a simulated VM (the team server's) the VM's own service account's token from the
VM's metadata server (``vm_credentials``), as a tpuctl on a Google VM sends, and the simulator's IAM
decides what that account may do. Its
hosts are VMs served by the simulator (``tpuctl.sim.vms``): each has its own loopback address, disk and
sshd, and tpuctl reaches them over SSH exactly as it reaches Google's, on the port the simulator's status
names (22 where it can bind it). Their programs get CPU devices standing in for the chips (``host_env``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tpuctl.backends.base import (
    WALL_TIME,
    BackendLabel,
    Closer,
    HostAddress,
    OwnPrices,
    RecoveryTuning,
    Timekeeping,
    Tuning,
    WheelhouseOnly,
)
from tpuctl.cloud.config import CloudConfig
from tpuctl.cloud.retry import RetryPolicy

if TYPE_CHECKING:
    import httpx
    from google.auth.credentials import Credentials

    from tpuctl.cloud.account_access import AccountAccess
    from tpuctl.cloud.base import Node, TpuCloud
    from tpuctl.cloud.buckets import BucketClient
    from tpuctl.cloud.identity import IdentityIssuer
    from tpuctl.cloud.instances import InstanceClient, VmInstance
    from tpuctl.cloud.oslogin import OsLoginAccess
    from tpuctl.cloud.retry import Sleep
    from tpuctl.hosts.pythons import ImagePython
    from tpuctl.sim.world import World

NAME = "sim"

#: One retry policy for every call and every step: the simulator has no rate limits to respect and
#: injects its faults at a fixed rate, so a few fast retries (milliseconds) ride them out.
SIM_RETRY = RetryPolicy(max_attempts=8, initial_wait_s=0.02, max_wait_s=0.5, deadline_s=30.0)


def sim_credentials() -> Credentials:
    """The simulated Application Default Credentials: the token the simulator takes as its world's
    principal, the account logged in on this machine (``tpuctl.sim.iam``)."""
    from google.oauth2.credentials import Credentials as TokenCredentials

    from tpuctl.sim.iam import ADC_TOKEN

    return TokenCredentials(token=ADC_TOKEN)  # type: ignore[no-untyped-call]


def vm_credentials() -> Credentials:
    """A simulated VM's own credentials: its service account's token from its metadata server, taken by
    google-auth's Compute Engine credentials exactly as on a Google VM (google-auth finds the server
    through ``GCE_METADATA_HOST``, which a simulated VM's logins have: ``tpuctl.sim.vms.sshd``)."""
    from google.auth import compute_engine

    return compute_engine.Credentials()  # type: ignore[no-untyped-call]


#: How every client of the simulator calls it (the TPU API, Compute Engine and Cloud Quotas surfaces)
#: from the laptop.
SIM_CLIENTS = CloudConfig(
    backend=NAME,
    credentials=sim_credentials,
    retry=SIM_RETRY,
    poll_interval_s=0.05,
    poll_max_interval_s=1.0,
    trust_env=False,
)
#: ... and from a simulated VM: the same but for whose credentials they send (the VM's).
SIM_VM_CLIENTS = replace(SIM_CLIENTS, credentials=vm_credentials)

SIM_TUNING = Tuning(
    step_retry=SIM_RETRY,
    gc_retry=SIM_RETRY,
    poll_interval_s=0.05,
    poll_max_interval_s=0.5,
    # The budget margin covers a stop over SSH: the signal commands, the hosts' exit reports and the
    # delete (a few seconds on a loaded machine).
    recovery=RecoveryTuning(
        poll_s=0.25, confirm_timeout_s=5.0, backoff_initial_s=0.2, backoff_max_s=2.0, budget_margin_s=5.0
    ),
    budget_poll_s=1.0,
    delete_margin_s=5.0,
    # A simulated host publishes its key as soon as it is served (seconds): a minute is ample, and a
    # slice that never publishes fails well within a test's time limit, with tpuctl's own message.
    host_keys_wait_s=60.0,
)

#: A yellow marker, so that nobody mistakes the simulator for Google; the state dir is its world.
SIM_LABEL = BackendLabel(
    name=NAME,
    style="black on yellow",
    headline="simulated TPU cloud (project {project})",
    names_state_dir=True,
    names_ambient_project=False,
)

#: The port a simulated slice's JAX coordinator listens on, on host 0's own address: the one JAX uses on
#: Cloud TPU VMs (jax/_src/clusters/cloud_tpu_cluster.py, ``coordinator_port = '8482'``).
COORDINATOR_PORT = 8482
#: The bucket of the simulator's GCS emulator that runs checkpoint to by default.
SIM_BUCKET = "tpuctl-sim"


@dataclass
class SimBackend:
    """The simulator: started in-process for the session, or the one serving at ``url``."""

    world_path: Path | None = None
    url: str | None = None
    wheelhouse: Path | None = None  # what the simulator's package mirror serves its hosts
    #: Whether tpuctl runs on a simulated VM (``Settings.sim_vm``): its clients then send the VM's service
    #: account's credentials (``SIM_VM_CLIENTS``), else the laptop's simulated ADC.
    on_vm: bool = False
    name: str = NAME
    tuning: Tuning = SIM_TUNING
    timekeeping: Timekeeping = WALL_TIME
    label: BackendLabel = SIM_LABEL
    runtime: Literal["cpu", "tpu"] = "cpu"
    default_bucket: str | None = SIM_BUCKET
    _status: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def clients(self) -> CloudConfig:
        """How this backend's clients call the simulator: as the VM's account on a VM, else the laptop's."""
        return SIM_VM_CLIENTS if self.on_vm else SIM_CLIENTS

    @property
    def host_wheelhouse(self) -> Path:
        """The wheelhouse the simulator's package mirror serves: the one given, else scripts/setup's (as the
        simulator server picks it)."""
        import os

        from tpuctl.sim.mirror import default_wheelhouse

        return self.wheelhouse or default_wheelhouse(os.environ)

    def open_cloud(self, state_dir: Path, closers: list[Closer]) -> TpuCloud:
        """Both of Google's TPU surfaces, as the simulator serves them at one URL: the TPU API and Compute
        Engine, each with its Cloud Quotas pool."""
        from tpuctl.catalog import Catalog
        from tpuctl.cloud.compute import ComputeCloud
        from tpuctl.cloud.quotas import COMPUTE_SERVICE, TPU_SERVICE, CloudQuotasClient
        from tpuctl.cloud.surfaces import SurfaceRouter
        from tpuctl.cloud.tpu_api import TpuApiCloud

        base_url, project = self._serve(state_dir, closers)
        config = self.clients

        def quotas(service: str) -> CloudQuotasClient:
            return CloudQuotasClient.from_config(config, base_url=base_url, service=service)

        return SurfaceRouter(
            TpuApiCloud(project=project, endpoint=base_url, config=config, quotas=quotas(TPU_SERVICE)),
            ComputeCloud(
                project=project,
                catalog=Catalog.load(),
                endpoint=base_url,
                config=config,
                quotas=quotas(COMPUTE_SERVICE),
            ),
        )

    def _serve(self, state_dir: Path, closers: list[Closer]) -> tuple[str, str]:
        from tpuctl.sim import SimAdminClient, SimServer

        if self.url:
            admin = SimAdminClient(self.url)
            try:
                project = admin.status().get("project", "tpuctl-sim")
            finally:
                admin.close()
            return self.url.rstrip("/"), str(project)
        server = SimServer(state_dir, self._world(), wheelhouse=self.wheelhouse, vms="hypervisor")
        url = server.start()
        closers.append(server.stop)
        return url, server.world.project

    def _world(self) -> World | None:
        from tpuctl.sim import load_world

        return load_world(self.world_path) if self.world_path else None

    def host_addresses(self, cloud: TpuCloud, node: Node) -> list[HostAddress]:
        # Each host's own address (external where the node has one, as on Google); the sshd's port is
        # the simulator's (22 when it could bind it).
        port = int(self._sim_status(cloud).get("ssh_port") or 22)
        return [HostAddress(e.external_ip or e.ip_address, port) for e in node.network_endpoints]

    def open_os_login(self, cloud: TpuCloud, closers: list[Closer]) -> OsLoginAccess:
        """The simulator's OS Login API, tokeninfo and Compute Engine, all at its URL."""
        return sim_os_login(cloud.endpoint, closers, config=self.clients)

    def open_instances(self, cloud: TpuCloud, closers: list[Closer]) -> InstanceClient:
        """The simulator's Compute Engine at its URL, called as every client of the simulator is."""
        from tpuctl.cloud.instances import InstanceClient

        client = InstanceClient(project=cloud.project, endpoint=cloud.endpoint, config=self.clients)
        closers.append(client.close)
        return client

    def instance_address(self, cloud: TpuCloud, vm: VmInstance) -> HostAddress:
        # The VM's own address; the sshd's port is the simulator's (22 when it could bind it).
        return HostAddress(vm.address or "", int(self._sim_status(cloud).get("ssh_port") or 22))

    def open_buckets(self, state_dir: Path, closers: list[Closer]) -> BucketClient:
        """The storage emulator of the simulated network over ``state_dir`` (the hosts' Cloud Storage),
        called as every client of the simulator is."""
        from tpuctl.sim.network import STORAGE_PORT
        from tpuctl.sim.vms.layout import services_address

        # A simulator serving at a URL says where its Cloud Storage is (its own state's address, which a
        # client with a state dir of its own, a team server's, cannot work out): one endpoint for every
        # client, as Google's is.
        served = self._status_at(self.url).get("storage_url") if self.url else None
        endpoint = str(served or f"http://{services_address(state_dir)}:{STORAGE_PORT}")
        return sim_buckets(endpoint, closers, config=self.clients)

    def open_account_access(self, cloud: TpuCloud, closers: list[Closer]) -> AccountAccess:
        """The simulator's Policy Troubleshooter and Compute Engine, both at its URL."""
        return sim_account_access(cloud.endpoint, closers, config=self.clients)

    def host_env(self, worker: int, addresses: list[HostAddress], chips_per_host: int) -> dict[str, str]:
        """A simulated host has no chips: JAX runs on CPU devices, one per chip, and the hosts join one
        job over loopback with gloo collectives (the runtime's sim cluster reads the coordinator from the
        metadata server; the port comes from here)."""
        coordinator = f"{addresses[0].address}:{COORDINATOR_PORT}"
        return {
            "TPUCTL_SIM": "1",
            "TPUCTL_COORDINATOR_PORT": str(COORDINATOR_PORT),
            # jax's coordinator binds [::]:port (every interface) unless told: host 0's own address.
            "JAX_COORDINATOR_BIND_ADDRESS": coordinator,
            "JAX_PLATFORMS": "cpu",
            "JAX_NUM_CPU_DEVICES": str(chips_per_host),
            "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        }

    def image_python(self, image: str) -> ImagePython:
        """Every simulated image, whatever its name, is a venv of the simulator's base interpreter
        (``tpuctl.sim.vms.disks``): this one's, where the simulator runs in this process; not known for
        one serving at a URL. Its hosts never download a Python (``tpuctl.sim.network``)."""
        return sim_image_python(known=self.url is None)

    def host_index_limit(self, cloud: TpuCloud) -> WheelhouseOnly | None:
        """The mirror serves its wheelhouse alone unless the world in force has ``package_fetch_through``."""
        world = self._sim_status(cloud).get("world") or {}
        return None if world.get("package_fetch_through") else mirror_limit()

    def notice_grace_s(self, cloud: TpuCloud) -> float | None:
        """The world's preemption grace, in real seconds (the simulator honours it unscaled)."""
        world = self._sim_status(cloud).get("world") or {}
        grace = (world.get("durations") or {}).get("preemption_grace_s")
        return float(grace) if grace is not None else None

    def maintenance_notice_s(self, cloud: TpuCloud) -> float | None:
        """The world's maintenance notice, in real seconds (the simulator honours it unscaled)."""
        world = self._sim_status(cloud).get("world") or {}
        notice = (world.get("durations") or {}).get("maintenance_notice_s")
        return float(notice) if notice is not None else None

    def _sim_status(self, cloud: TpuCloud) -> dict[str, Any]:
        """The simulator's admin status, read once per backend (empty when it cannot be read)."""
        return self._status_at(cloud.endpoint)

    def _status_at(self, endpoint: str) -> dict[str, Any]:
        if self._status is None:
            from tpuctl.sim import SimAdminClient

            try:
                admin = SimAdminClient(endpoint, timeout_s=5.0)
                try:
                    self._status = dict(admin.status())
                finally:
                    admin.close()
            except Exception:  # an older or foreign simulator: the callers' defaults stand
                return {}
        return self._status

    def identity_issuer(self, cloud: TpuCloud) -> IdentityIssuer:
        """The simulator's issuer (``tpuctl.sim.issuer``), serving Google's documents at its URL."""
        from tpuctl.cloud.identity import IdentityIssuer

        return IdentityIssuer.at(cloud.endpoint)

    def own_prices(self) -> OwnPrices:
        from tpuctl.sim import default_world, load_world

        world = load_world(self.world_path) if self.world_path else default_world()
        where = str(self.world_path) if self.world_path else "(built-in default world)"
        return world_prices(world, where)


def sim_os_login(
    base_url: str,
    closers: list[Closer],
    *,
    transport: httpx.BaseTransport | None = None,
    sleep: Sleep | None = None,
    config: CloudConfig = SIM_CLIENTS,
) -> OsLoginAccess:
    """OS Login at a simulator's ``base_url`` (``transport``: an in-process one), called as ``config``
    says (the laptop's clients unless told)."""
    from tpuctl.cloud.oslogin import OsLoginAccess, OsLoginEndpoints

    http = _sim_http(closers, config, transport)
    return OsLoginAccess(
        OsLoginEndpoints.at(base_url),
        config.credentials(),
        http,
        retry=config.retry,
        sleep=sleep or config.sleep,
    )


def sim_buckets(base_url: str, closers: list[Closer], *, config: CloudConfig = SIM_CLIENTS) -> BucketClient:
    """A simulated Cloud Storage at ``base_url``, called as ``config`` says (the laptop's clients unless
    told)."""
    from tpuctl.cloud.buckets import BucketClient

    http = _sim_http(closers, config)
    return BucketClient(base_url, config.credentials, http, retry=config.retry, sleep=config.sleep)


def sim_account_access(
    base_url: str,
    closers: list[Closer],
    *,
    transport: httpx.BaseTransport | None = None,
    sleep: Sleep | None = None,
    config: CloudConfig = SIM_CLIENTS,
) -> AccountAccess:
    """Another account's access, asked at a simulator's ``base_url`` (``transport``: an in-process one)
    as ``config`` says (the laptop's clients unless told)."""
    from tpuctl.cloud.account_access import AccountAccess, AccountEndpoints

    http = _sim_http(closers, config, transport)
    return AccountAccess(
        AccountEndpoints.at(base_url),
        config.credentials(),
        http,
        retry=config.retry,
        sleep=sleep or config.sleep,
    )


def _sim_http(
    closers: list[Closer], config: CloudConfig, transport: httpx.BaseTransport | None = None
) -> httpx.Client:
    """An HTTP client as ``config`` says every client of the simulator has one, closed by ``closers``."""
    import httpx

    http = httpx.Client(timeout=config.request_timeout_s, trust_env=config.trust_env, transport=transport)
    closers.append(http.close)
    return http


def world_prices(world: World, where: str) -> OwnPrices:
    """A simulated world's price list (USD per chip-hour by generation, region and capacity), laid over
    the bundled catalog; ``where``: the world's source, shown as the price source."""
    overrides = {
        generation: {
            region: {key: float(value) for key, value in price.model_dump(exclude_none=True).items()}
            for region, price in regions.items()
        }
        for generation, regions in world.prices.items()
    }
    return OwnPrices(overrides, where, world.project)


def sim_image_python(*, known: bool) -> ImagePython:
    """A simulated image's Python: this interpreter's version where ``known`` (the image is a venv of the
    simulator's base interpreter, this one where the simulator runs in this process), never downloads."""
    import sys

    from tpuctl.hosts.pythons import ImagePython

    version = f"{sys.version_info.major}.{sys.version_info.minor}" if known else None
    return ImagePython(version, downloads=False)


def mirror_limit() -> WheelhouseOnly:
    """The simulator's package mirror with its fetch-through off, and how a user turns it on."""
    import shlex
    from importlib import resources

    default_world = str(resources.files("tpuctl.sim").joinpath("data", "world.yaml"))
    return WheelhouseOnly(
        index="the simulator's package mirror",
        widen_fix="let the mirror fetch what it lacks from the package index your pip/uv configuration "
        "names (PyPI if none): set `package_fetch_through: true` in the simulator's world file (yours, or "
        f"a copy of the default: cp {shlex.quote(default_world)} my-world.yaml) and name it with "
        "TPUCTL_SIM_WORLD=FILE (or `sim_world: FILE` in your profile; a served simulator: "
        "`tpuctl sim serve --world FILE`); or install only what the wheelhouse has",
    )
