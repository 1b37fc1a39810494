"""The backend seam: everything that differs between the simulator and Google, behind one interface.

A backend is chosen once, when a session opens (``tpuctl.backends.open_backend``), and the services use
only what this interface offers: they never ask which backend they run on. A new backend (another cloud
surface, another simulator) is one new implementation of :class:`Backend`, not an edit of the services.

What lives here, and nowhere else:

* how the cloud is reached: each client's endpoint and its ``CloudConfig`` (credentials, retry and poll
  policy, whether proxy variables apply), the quotas clients included (:meth:`Backend.open_cloud`); the
  clients take what they are given and never ask which backend they serve;
* how patient tpuctl is with it: retry, poll and margin defaults (:class:`Tuning`);
* how the CLI marks it: the marker, and what its banner names (:class:`BackendLabel`);
* how a host is reached over SSH: address and port (:meth:`Backend.host_addresses`); every backend's
  hosts are VMs reached over SSH only; where OS Login decides who logs in, how it is reached
  (:meth:`Backend.open_os_login`: its endpoints, with the cloud's credentials);
* where general-purpose VMs are created and read, and how one is reached over SSH
  (:meth:`Backend.open_instances`, :meth:`Backend.instance_address`);
* where Cloud Storage is, to read a bucket's location and the caller's permissions on it
  (:meth:`Backend.open_buckets`);
* what a host's program needs beyond the worker contract (:meth:`Backend.host_env`: the simulator's CPU
  stand-in for the chips) and which pinned runtime set its setup installs (``runtime``);
* where checkpoints go when the user names no bucket (``default_bucket``);
* the wheels the hosts' package index serves, where tpuctl can read their metadata (``host_wheelhouse``);
* the preemption notice's grace, where the backend can tell it (:meth:`Backend.notice_grace_s`), and the
  maintenance notice's (:meth:`Backend.maintenance_notice_s`);
* where price refreshes come from when no billing endpoint is given (:meth:`Backend.own_prices`);
* whose time the services read and wait on (:class:`Timekeeping`): the wall clock on the simulator and
  Google, a test's fake clock on ``tpuctl.testing.backend``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from tpuctl.cloud.retry import RetryPolicy

if TYPE_CHECKING:
    from tpuctl.cloud.account_access import AccountAccess
    from tpuctl.cloud.base import Node, TpuCloud
    from tpuctl.cloud.buckets import BucketClient
    from tpuctl.cloud.identity import IdentityIssuer
    from tpuctl.cloud.instances import InstanceClient, VmInstance
    from tpuctl.cloud.oslogin import OsLoginAccess
    from tpuctl.hosts.pythons import ImagePython

#: A function run when the session closes (a server to stop, a client to close).
Closer = Callable[[], None]

#: Prices by generation, region and capacity key (USD per chip-hour), as a world file overrides them.
PriceOverrides = Mapping[str, Mapping[str, Mapping[str, float]]]


@dataclass(frozen=True)
class OwnPrices:
    """A backend's own price list (the simulator's world file), laid over the bundled catalog."""

    overrides: PriceOverrides
    where: str  # where they come from, for the price source shown to the user
    project: str  # the project whose slices they price


@dataclass(frozen=True)
class RecoveryTuning:
    """A run supervisor's defaults on this backend (a run's --flags override each)."""

    poll_s: float  # how often the slice's state is read while a run is healthy
    confirm_timeout_s: float  # how long a lost host may take to be confirmed preempted
    backoff_initial_s: float  # first wait before re-creating a lost slice
    backoff_max_s: float  # cap of that wait
    budget_margin_s: float  # stop this much before a budget would be spent


@dataclass(frozen=True)
class Tuning:
    """How patient tpuctl is with a backend: the simulator answers in milliseconds, Google in seconds."""

    #: One cloud call of placement or gc (rate limits, transient errors), retried with jitter.
    step_retry: RetryPolicy
    #: One cloud call of ``pod gc`` (a sweep that can wait: fewer, shorter tries than placement).
    gc_retry: RetryPolicy
    #: Polling a create until READY: first interval, then doubling up to the max.
    poll_interval_s: float
    poll_max_interval_s: float
    recovery: RecoveryTuning
    #: How often a run's budget watch reads the ledger.
    budget_poll_s: float
    #: How long deleting a slice takes, beyond the hosts' grace (the slice bills until it is gone).
    delete_margin_s: float
    #: How long a READY slice's hosts may take to publish their SSH host keys (their guest agent starts
    #: after READY); then the run fails saying why.
    host_keys_wait_s: float = 300.0


@dataclass(frozen=True)
class BackendLabel:
    """How the CLI marks a backend on every command, so that the CLI never compares backend names."""

    #: The marker's text; also the backend's name in JSON documents (``"backend": "sim"``).
    name: str
    #: The marker's rich style.
    style: str
    #: What the banner says after the marker; ``{project}`` is the session's project.
    headline: str
    #: The state dir holds this cloud itself (the simulator's world): the banner says where it is.
    names_state_dir: bool
    #: A project picked up from another tool's variable is called out: it is a real project that bills.
    names_ambient_project: bool


@dataclass(frozen=True)
class Timekeeping:
    """The time a backend's services read and wait on. Every wait of a service (polls, retries, backoff)
    goes through ``sleep`` and every deadline through ``monotonic``, so a backend on a fake clock moves
    simulated time instead of sleeping."""

    clock: Callable[[], float] = time.time  # now, epoch seconds
    monotonic: Callable[[], float] = time.monotonic  # elapsed time and deadlines (never goes back)
    sleep: Callable[[float], None] = time.sleep


#: The real backends' time.
WALL_TIME = Timekeeping()


@dataclass(frozen=True)
class WheelhouseOnly:
    """The hosts' package index serves its wheelhouse (``Backend.host_wheelhouse``) and nothing else: what
    a user calls that index, and how to let it serve more (the fix of a refusal that names it)."""

    index: str
    widen_fix: str


@dataclass(frozen=True)
class HostAddress:
    """How tpuctl reaches one host over SSH."""

    address: str
    port: int = 22


class Backend(Protocol):
    """One cloud surface tpuctl can run against. Built by ``open_backend``; see the module docstring."""

    @property
    def name(self) -> str:
        """``sim`` or ``gcp``: shown to the user (banners, JSON); never branched on by a service."""
        ...

    @property
    def tuning(self) -> Tuning: ...

    @property
    def timekeeping(self) -> Timekeeping:
        """Whose time the session reads and waits on (``WALL_TIME`` but on a test's fake clock)."""
        ...

    @property
    def label(self) -> BackendLabel:
        """How the CLI marks this backend (its banner on stderr)."""
        ...

    @property
    def runtime(self) -> Literal["cpu", "tpu"]:
        """The pinned runtime set a host's setup installs (``tpuctl/runtime/requirements/``): CPU JAX on
        the simulator, ``jax[tpu]`` on Google."""
        ...

    @property
    def default_bucket(self) -> str | None:
        """The bucket runs checkpoint to when neither ``--checkpoint-dir`` nor the profile names one
        (the simulator's emulator has one; Google has none: the user names it)."""
        ...

    @property
    def host_wheelhouse(self) -> Path | None:
        """The directory of the wheels the hosts' package index serves (the simulator's mirror), read for
        the modules each distribution installs; None where the hosts install from the public index."""
        ...

    def host_index_limit(self, cloud: TpuCloud) -> WheelhouseOnly | None:
        """Where the hosts' package index serves ``host_wheelhouse`` alone (the simulator's mirror with its
        fetch-through off), what it is and how to widen it; None where it serves whatever the index it
        stands for has."""
        ...

    def image_python(self, image: str) -> ImagePython:
        """The ``python3`` of the image the hosts boot (``image``: a TPU API runtime version or a Compute
        Engine image family) and whether uv on the hosts may download another (the run's plan)."""
        ...

    def open_cloud(self, state_dir: Path, closers: list[Closer]) -> TpuCloud:
        """The cloud client of this backend; what it starts is closed by ``closers`` (last first)."""
        ...

    def host_addresses(self, cloud: TpuCloud, node: Node) -> list[HostAddress]:
        """How to reach each host of ``node`` over SSH, in worker order (one per network endpoint)."""
        ...

    def open_os_login(self, cloud: TpuCloud, closers: list[Closer]) -> OsLoginAccess:
        """OS Login as this backend serves it (the project's setting, the caller, key imports), with the
        credentials ``cloud`` uses; what it opens is closed by ``closers``."""
        ...

    def open_instances(self, cloud: TpuCloud, closers: list[Closer]) -> InstanceClient:
        """Compute Engine's general-purpose VMs (the team server's) as this backend serves them, with the
        credentials ``cloud`` uses; closed by ``closers``."""
        ...

    def instance_address(self, cloud: TpuCloud, vm: VmInstance) -> HostAddress:
        """How to reach a general-purpose VM over SSH (as ``host_addresses`` for a slice's hosts)."""
        ...

    def open_buckets(self, state_dir: Path, closers: list[Closer]) -> BucketClient:
        """Cloud Storage as this backend serves it (Google's, or the simulator's emulator for the state
        in ``state_dir``), with the cloud's credentials; what it opens is closed by ``closers``."""
        ...

    def open_account_access(self, cloud: TpuCloud, closers: list[Closer]) -> AccountAccess:
        """Whether another account (the hosts') may do something, asked as this backend serves it (Policy
        Troubleshooter, the project's default service account), with the credentials ``cloud`` uses."""
        ...

    def host_env(self, worker: int, addresses: list[HostAddress], chips_per_host: int) -> dict[str, str]:
        """Variables host ``worker``'s program gets beyond the worker contract (empty on Google)."""
        ...

    def notice_grace_s(self, cloud: TpuCloud) -> float | None:
        """The preemption notice's grace in real seconds, where the backend can tell (None: unknown)."""
        ...

    def maintenance_notice_s(self, cloud: TpuCloud) -> float | None:
        """How long before a host maintenance the metadata server warns, in real seconds, where the
        backend can tell (None: unknown)."""
        ...

    def identity_issuer(self, cloud: TpuCloud) -> IdentityIssuer:
        """Where the issuer of the ID tokens a server verifies publishes its keys: Google's, or the
        simulator's own issuer at ``cloud``'s endpoint."""
        ...

    def own_prices(self) -> OwnPrices | None:
        """The backend's own price list and where it comes from, when it has one (the simulator's world
        file); None where prices come from Google's billing catalog."""
        ...
