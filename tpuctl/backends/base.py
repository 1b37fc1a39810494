"""The backend seam: everything that differs between the simulator and Google, behind one interface.

A backend is chosen once, when a session opens (``tpuctl.backends.open_backend``), and the services use
only what this interface offers: they never ask which backend they run on. A new backend (another cloud
surface, another simulator) is one new implementation of :class:`Backend`, not an edit of the services.

What lives here, and nowhere else:

* how the cloud is reached: endpoint and credentials (:meth:`Backend.open_cloud`);
* how patient tpuctl is with it: retry, poll and margin defaults (:class:`Tuning`);
* how a host is reached over SSH: address and port (:meth:`Backend.host_addresses`);
* the preemption notice's grace, where the backend can tell it (:meth:`Backend.notice_grace_s`);
* local host processes, where the backend has them (:meth:`Backend.local_hosts`: the simulator's
  host mechanism; ``None`` on Google, whose hosts are VMs reached over SSH);
* where price refreshes come from when no billing endpoint is given (:meth:`Backend.own_prices`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tpuctl.cloud.retry import RetryPolicy

if TYPE_CHECKING:
    from tpuctl.cloud.base import Node, TpuCloud
    from tpuctl.hosts.base import Executor

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


@dataclass(frozen=True)
class HostAddress:
    """How tpuctl reaches one host over SSH."""

    address: str
    port: int = 22


class LocalHosts(Protocol):
    """Host processes on this machine: the simulator's hosts (until they are VMs of their own).

    Contract: every path is below one directory of the state dir per slice; ``cleanup`` wipes a slice's
    host disks (a host's disk dies with it); ``leftover_pids`` finds a run's host processes that nobody
    supervises any more (so a takeover can stop them)."""

    def executor(self, node: Node, *, num_hosts: int, python: str | None, for_plan: bool) -> Executor:
        """An executor that starts one local process per host of ``node``."""
        ...

    def checkpoint_dir(self, runs_dir: Path, run_id: str) -> str:
        """Where a run's checkpoints go by default: somewhere every host of the slice can read."""
        ...

    def cleanup(self, node: Node) -> None:
        """Wipe the host disks of ``node`` (it was deleted or re-created)."""
        ...

    def leftover_pids(self, run_id: str) -> list[int]:
        """Pids of host processes of ``run_id`` still running on this machine."""
        ...


class Backend(Protocol):
    """One cloud surface tpuctl can run against. Built by ``open_backend``; see the module docstring."""

    @property
    def name(self) -> str:
        """``sim`` or ``gcp``: shown to the user (banners, JSON); never branched on by a service."""
        ...

    @property
    def tuning(self) -> Tuning: ...

    @property
    def default_executor(self) -> str:
        """The executor a run uses when none is asked for (``sim``: local hosts; ``ssh``)."""
        ...

    def open_cloud(self, state_dir: Path, closers: list[Closer]) -> TpuCloud:
        """The cloud client of this backend; what it starts is closed by ``closers`` (last first)."""
        ...

    def host_addresses(self, node: Node) -> list[HostAddress]:
        """How to reach each host of ``node`` over SSH, in worker order (one per network endpoint)."""
        ...

    def notice_grace_s(self, cloud: TpuCloud) -> float | None:
        """The preemption notice's grace in real seconds, where the backend can tell (None: unknown)."""
        ...

    def local_hosts(self, cloud: TpuCloud, state_dir: Path) -> LocalHosts | None:
        """Local host processes, where this backend has them; None where hosts are reached by SSH only."""
        ...

    def own_prices(self) -> OwnPrices | None:
        """The backend's own price list and where it comes from, when it has one (the simulator's world
        file); None where prices come from Google's billing catalog."""
        ...
