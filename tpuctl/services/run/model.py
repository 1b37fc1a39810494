"""The run's data: what the user asked for (``RunRequest``), where it goes (``Target``), the validated
request (``PreparedRun``), how one start of the program ended (``AttemptResult``), how the run ended
(``RunResult``, ``SupervisedResult``) and the limits of its recovery (``RecoveryPolicy``). Plain values:
no I/O here."""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tpuctl.catalog import AcceleratorType, CapacityType
from tpuctl.hosts.base import LaunchSpec, ShipResult
from tpuctl.hosts.bundle import DEFAULT_LIMIT_BYTES, Bundle
from tpuctl.services.placement_choices import PlacementChoices
from tpuctl.services.run.accounting import PreemptionRecord
from tpuctl.services.run.sliceset import SliceSet

if TYPE_CHECKING:
    from tpuctl.backends.base import RecoveryTuning
    from tpuctl.hosts.setup import SetupSpec
    from tpuctl.hosts.ssh import KeyPair
    from tpuctl.services.placement import PlacementRequest
    from tpuctl.services.run.rundir import RunDir


@dataclass(frozen=True)
class Example:
    module: str
    description: str


#: Programs shipped with tpuctl's runtime, runnable with ``--example NAME`` and no user script.
EXAMPLES: dict[str, Example] = {
    "lm": Example(
        "tpuctl.runtime.examples.lm_train",
        "a small transformer language model on deterministic synthetic data, with checkpoints",
    ),
}

#: The variable (beyond the worker contract of docs/architecture.md) that carries ``--checkpoint-every``
#: to any program.
CHECKPOINT_EVERY_ENV = "TPUCTL_CHECKPOINT_EVERY"
#: JAX's own configuration variables for its persistent compilation cache (jax/_src/config.py).
JAX_COMPILATION_CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"
JAX_CACHE_MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


class ExecutorKind(StrEnum):
    """How a run reaches its hosts (``--executor``, and the run's record): over SSH, on every backend
    (the simulator's hosts are VMs too; the old local-process executor ``sim`` is gone)."""

    SSH = "ssh"


EXECUTOR_KINDS = tuple(kind.value for kind in ExecutorKind)
RUN_ID_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


@dataclass(frozen=True)
class PhaseUpdate:
    """Where one phase of an attempt stands (creating its slice, setting its hosts up): begun, ``done``
    of ``total`` hosts so far, then ended with its ``outcome`` ("done in 12.3 s"). A console gives each
    phase one line, however many hosts and updates it has; one phase runs at a time."""

    title: str  # what the phase does: "setting up 4 hosts: runtime (cpu)"
    done: int | None = None
    total: int | None = None
    outcome: str | None = None  # None while the phase runs

    @property
    def ended(self) -> bool:
        return self.outcome is not None


class LaunchObserver(Protocol):
    """Told what happens during a run; the CLI renders it (rich), tests collect it."""

    def line(self, worker: int, text: str) -> None:
        """One line of output from host ``worker``'s program, as it arrives."""

    def status(self, text: str) -> None:
        """A step of the launcher worth its own line (a preemption, a host failed, ...)."""

    def phase(self, update: PhaseUpdate) -> None:
        """A phase of an attempt begun, advanced or ended (see ``PhaseUpdate``)."""

    def detail(self, worker: int | None, text: str) -> None:
        """A line that says how a phase went, for whoever asks for details (``-v``): a host's setup
        commands and their output (``worker``; its log keeps them either way), or a step of the launcher
        (None: shipping the bundle, deleting a slice)."""


class Silent:
    """The observer of nobody: a run nobody watches."""

    def line(self, worker: int, text: str) -> None:
        pass

    def status(self, text: str) -> None:
        pass

    def phase(self, update: PhaseUpdate) -> None:
        pass

    def detail(self, worker: int | None, text: str) -> None:
        pass


@dataclass(frozen=True)
class RunRequest:
    """What the user asked for, as given (validated by ``Launcher.prepare``)."""

    script: str | None = None
    #: A shell command run on every host in the workdir instead of a script (a job file's ``run:``);
    #: ``args`` reach it as ``"$@"``, and its exit status is the host's.
    command: str | None = None
    args: tuple[str, ...] = ()
    example: str | None = None
    workdir: str | None = None
    env: tuple[str, ...] = ()  # "KEY=VALUE" pairs
    #: Names of variables whose values are secret (a job file's ``secrets:``, ``--secret``): their values
    #: are never in this request (it is saved in plain text); the run keeps them only encrypted.
    secret_names: tuple[str, ...] = ()
    #: A job file's ``priority`` (a ``PriorityBand``'s value) and ``workspace``: recorded with the run;
    #: they take effect with a server (whose queue orders its runs by band, and limits each workspace).
    priority: str | None = None
    workspace: str | None = None
    #: The run's labels (``--label``, checked by ``tpuctl.params.labels``): on the run and on its slice.
    labels: Mapping[str, str] = field(default_factory=dict)
    pod: str | None = None
    accelerator_type: str | None = None
    #: Other slice types the run may be placed on, after or beside ``accelerator_type`` (a job file's
    #: accelerator list, set or ``any_of``): with it, the types the allocator ranks; empty: that type only.
    other_accelerator_types: tuple[str, ...] = ()
    #: How those types are ranked: "ordered" (the user's order first, then price) or "cheapest" (price).
    type_preference: str = "ordered"
    #: Slices of ``accelerator_type`` joined into one job (``--slices``; N > 1: a multislice).
    slices: int = 1
    #: Where and how a new slice is placed (the placement flags, as on ``pod create``); with ``pod``, its
    #: one zone, if given, is where that slice is.
    placement: PlacementChoices = field(default_factory=PlacementChoices)
    keep_pod: bool = False
    checkpoint_every: int | None = None
    checkpoint_dir: str | None = None
    executor: str | None = None  # ssh (the only one; kept so --executor ssh keeps working)
    timeout_s: float | None = None
    grace_s: float = 5.0
    #: ``--max-hours``: the run ends (its slices deleted) this many hours after it was first prepared,
    #: waiting for capacity included; ``deadline_at`` is that moment (epoch seconds), fixed once, so a
    #: recovery or ``runs resume`` keeps it.
    max_hours: float | None = None
    deadline_at: float | None = None
    bundle_limit_bytes: int = DEFAULT_LIMIT_BYTES
    run_id: str | None = None
    python: str | None = None  # the hosts' interpreter; default: the setup's environment (or python3)
    ssh_remote_root: str = ".tpuctl"
    #: Shell commands run on every host after each provision, before the program (``--setup``).
    setup: tuple[str, ...] = ()
    #: A requirements file installed on every host after each provision (``--requirements``).
    requirements: str | None = None
    #: Install the bundled runtime's pinned packages (JAX, optax, orbax) on every host.
    runtime_deps: bool = True
    #: The bucket runs checkpoint to (``gs://<bucket>/tpuctl/runs/<run id>/checkpoints``).
    bucket: str | None = None
    #: An OpenSSH-style ProxyCommand (``%h %p %r``) for hosts without external IPs, e.g. an IAP tunnel.
    ssh_proxy_command: str | None = None
    #: USD per hour of one slice that ``--budget`` counts where tpuctl knows no price
    #: (``--assume-price-per-hour``); None: a budget goes only where there is a price.
    assumed_price_per_hour: float | None = None


@dataclass(frozen=True)
class Target:
    """Where the run goes: existing READY slices (``--pod``: one node, or a multislice made by ``pod create
    --slices N``), or slices to create, placed by the allocator like every slice tpuctl creates (any
    allowed zone, cheapest first under the price cap, failing over on stockouts; N slices through one
    multislice queued resource), on every backend and with every executor."""

    accelerator: AcceleratorType
    existing: SliceSet | None = None  # --pod
    placement: PlacementRequest | None = None  # placement flags, through the allocator

    @property
    def name(self) -> str:
        if self.existing is not None:
            return self.existing.name
        assert self.placement is not None
        return self.placement.name

    @property
    def slices(self) -> int:
        """How many slices the job spans."""
        if self.existing is not None:
            return self.existing.count
        assert self.placement is not None
        return self.placement.slices

    @property
    def hosts(self) -> int:
        """Every host of every slice: the job's process count."""
        return self.accelerator.hosts * self.slices

    @property
    def zone(self) -> str | None:
        """The zone, when known before placement (None: the allocator chooses)."""
        if self.existing is not None:
            return self.existing.zone
        assert self.placement is not None
        zones = self.placement.zones
        return zones[0] if len(zones) == 1 else None

    @property
    def capacity(self) -> CapacityType:
        if self.existing is not None:
            return self.existing.capacity
        assert self.placement is not None
        return self.placement.capacity_types[0]

    @property
    def creates(self) -> bool:
        return self.existing is None


@dataclass(frozen=True)
class PreparedRun:
    """A validated request: nothing outside the process has changed yet."""

    request: RunRequest
    run_id: str
    program: tuple[str, ...]
    display: str  # the script (relative to the workdir) or "example:lm"
    user_env: dict[str, str]
    bundle: Bundle
    target: Target
    executor_kind: ExecutorKind
    checkpoint_dir: str
    run_dir: RunDir  # its logs, saved request and lease on this machine
    setup: SetupSpec
    #: The run's SSH key (``runkey``), once its supervisor loaded it from the ledger; None before (a
    #: plan, or a launcher used on its own: the state dir's key then).
    ssh_key: KeyPair | None = field(default=None, repr=False)
    #: The values of the request's ``secret_names``, by name (``secretenv``): given to ``Runs.prepare``
    #: by whoever read them (the CLI, a job file's loader), or decrypted from the ledger on a resume.
    #: Held in memory only: never in a repr, the saved request, a plan (``<secret>``) or a host's argv.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def python(self) -> str:
        """The hosts' interpreter: ``--python``, else the setup's environment (python3 when none)."""
        from tpuctl.hosts.setup import env_python

        return self.request.python or env_python(self.setup, self.request.ssh_remote_root)

    def spec(self, restart_count: int = 0) -> LaunchSpec:
        accel = self.target.accelerator
        env = dict(self.user_env)
        if self.request.checkpoint_every is not None:
            env.setdefault(CHECKPOINT_EVERY_ENV, str(self.request.checkpoint_every))
        env.update({k: v for k, v in self._compilation_cache_env().items() if k not in env})
        return LaunchSpec(
            run_id=self.run_id,
            program=self.program,
            num_workers=self.target.hosts,
            num_slices=self.target.slices,
            chips_per_host=accel.chips_per_host,
            accelerator_type=accel.api_name,
            topology=accel.topology,
            checkpoint_dir=self.checkpoint_dir,
            restart_count=restart_count,
            user_env=env,
            secret_env=dict(self.secrets),
            shell=self.request.command is not None,
        )

    def _compilation_cache_env(self) -> dict[str, str]:
        """JAX's persistent compilation cache in the run's bucket (``checkpoints.compilation_cache_dir``),
        read by JAX itself from the environment, so unmodified programs get it too. Only where the setup
        installs the runtime into the program's interpreter: a gs:// cache needs the etils and gcsfs
        that set brings, and JAX fails a compile whose cache it cannot open. Every compile is cached
        (JAX's default skips those under 1 s), since a recovery pays for each one again otherwise."""
        from tpuctl.services.run.checkpoints import compilation_cache_dir

        directory = compilation_cache_dir(self.checkpoint_dir, self.run_id)
        if directory is None or self.setup.runtime is None or self.request.python is not None:
            return {}
        return {
            JAX_COMPILATION_CACHE_DIR_ENV: directory,
            JAX_CACHE_MIN_COMPILE_TIME_ENV: "0",
        }


@dataclass(frozen=True)
class AttemptResult:
    """How one start of the program on one slice ended (``execute`` does not raise for a failure)."""

    exit_codes: dict[int, int | None]
    failed_worker: int | None  # the first host that failed, None when all exited 0
    returncode: int | None  # that host's status (negative: signal; None: host lost)
    interrupted: bool
    timed_out: bool
    shipped: list[ShipResult]
    started_at: float
    ended_at: float
    exit_times: dict[int, float] = field(default_factory=dict)  # worker -> when its exit was seen
    exceptions: dict[int, str] = field(default_factory=dict)  # worker -> "ValueError: boom"
    #: False: stopped before the program started (no host ran it, so no exit status says anything).
    started: bool = True

    @property
    def succeeded(self) -> bool:
        return (
            self.started
            and self.failed_worker is None
            and not self.interrupted
            and not self.timed_out
            and all(code == 0 for code in self.exit_codes.values())
        )


@dataclass(frozen=True)
class RunResult:
    run_id: str
    pod: str
    zone: str
    hosts: int
    exit_code: int
    duration_s: float
    log_dir: Path
    bundle_sha256: str
    shipped_hosts: int
    deleted_pod: bool
    capacity: str | None = None  # the last slice's capacity type
    price_per_hour: float | None = None  # its price, USD per hour (None: unknown)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": "succeeded" if self.exit_code == 0 else "failed",
            "pod": self.pod,
            "zone": self.zone,
            "hosts": self.hosts,
            "exit_code": self.exit_code,
            "duration_s": round(self.duration_s, 3),
            "log_dir": str(self.log_dir),
            "bundle_sha256": self.bundle_sha256,
            "shipped_hosts": self.shipped_hosts,
            "deleted_pod": self.deleted_pod,
            "capacity": self.capacity,
            "price_per_hour": self.price_per_hour,
        }


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BUDGET = "budget"
    TIMED_OUT = "timed_out"
    #: Its host was taken for maintenance (docs/preemption.md#host-maintenance): the slice may come back.
    MAINTENANCE = "maintenance"


@dataclass(frozen=True)
class RecoveryPolicy:
    """Limits and timings of a supervised run. ``None`` timings take the backend's default (the
    simulator's are short; Google's follow its 30 s spot notice and its API's pace)."""

    max_restarts: int = 0
    max_preemptions: int = 10
    poll_s: float | None = None
    confirm_polls: int = 2
    confirm_timeout_s: float | None = None
    checkpoint_wait_s: float = 60.0
    backoff_initial_s: float | None = None
    backoff_max_s: float | None = None
    capacity_timeout_s: float = 6 * 3600.0
    budget_margin_s: float | None = None
    #: How long a slice Google keeps through host maintenance may take to come back READY before it is
    #: given up and replaced ("up to a few hours" for a large slice: docs/google-facts.md#host-maintenance).
    maintenance_wait_s: float = 4 * 3600.0

    def __post_init__(self) -> None:
        for name in ("max_restarts", "max_preemptions"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.confirm_polls < 1:
            raise ValueError(f"confirm_polls must be >= 1, got {self.confirm_polls}")

    @classmethod
    def off(cls) -> RecoveryPolicy:
        """No recovery: the first failure or preemption ends the run (``bench step``)."""
        return cls(max_restarts=0, max_preemptions=0)

    def resolved(self, defaults: RecoveryTuning) -> RecoveryPolicy:
        """This policy with every unset timing taken from the backend's defaults."""

        def pick(value: float | None, default: float) -> float:
            return value if value is not None else default

        return dataclasses.replace(
            self,
            poll_s=pick(self.poll_s, defaults.poll_s),
            confirm_timeout_s=pick(self.confirm_timeout_s, defaults.confirm_timeout_s),
            backoff_initial_s=pick(self.backoff_initial_s, defaults.backoff_initial_s),
            backoff_max_s=pick(self.backoff_max_s, defaults.backoff_max_s),
            budget_margin_s=pick(self.budget_margin_s, defaults.budget_margin_s),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class SupervisedResult:
    run: RunResult
    preemptions: list[PreemptionRecord]
    restarts: int
    summary: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {**self.run.to_dict(), "restarts": self.restarts, "recovery": self.summary}


def exit_status(returncode: int | None) -> int:
    """The process-style exit status for a host's end: 128+N for a signal, 255 for a lost host."""
    if returncode is None:
        return 255
    if returncode < 0:
        return 128 - returncode
    return returncode


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "was lost (no exit status: the connection dropped)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"
