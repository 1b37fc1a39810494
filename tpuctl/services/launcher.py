"""The launcher: ``tpuctl run`` as a service. Validate, bundle, find or create the slice, ship, start every
host at once, stream their output, and end with the program's result.

Plain Python: the CLI renders through a :class:`LaunchObserver` (``line(worker, text)`` for host output,
``status(text)`` for the launcher's own steps). Every step is also a method of its own
(``prepare`` -> ``provision`` -> ``execute`` -> ``finish``) so the preemption supervisor can re-run
``provision`` and ``execute`` for a later segment of the same run.

Failure semantics: the first host to exit non-zero (or to die: killed by a signal, connection lost) fails
the run. The others get SIGTERM to their process groups, SIGKILL after ``grace_s``; the run then ends
with ``RunFailedError`` naming that host and its exit status. Ctrl-C stops every host the same way and
ends with ``InterruptedByUser``. No wait is unbounded: the event loop polls, stops are bounded, and
``timeout_s`` caps the whole run when given.

State: the run is a row of the ledger's ``runs`` table (status, pod, zone, exit code) with a
provisioning and a running segment; each host's output goes to ``<state>/runs/<run_id>/worker-N.log``.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from tpuctl.catalog import AcceleratorType, CapacityType
from tpuctl.cloud.base import LABEL_RUN, Node, OperationProgress
from tpuctl.errors import (
    InterruptedByUser,
    NotFoundError,
    RunFailedError,
    TpuctlError,
    UsageError,
)
from tpuctl.services.bundle import DEFAULT_LIMIT_BYTES, Bundle, build_bundle
from tpuctl.services.executors.base import (
    ENV_NAME_RE,
    Executor,
    HostPlan,
    LaunchSpec,
    ShipResult,
)
from tpuctl.store.paths import ensure_private_dir, private_file
from tpuctl.store.records import RunStatus, SegmentKind

if TYPE_CHECKING:
    from tpuctl.services.placement import PlacementRequest
    from tpuctl.services.pods import CreateSpec
    from tpuctl.services.session import Session


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

#: The variable (beyond DESIGN.md's contract) that carries ``--checkpoint-every`` to any program.
CHECKPOINT_EVERY_ENV = "TPUCTL_CHECKPOINT_EVERY"
EXECUTOR_KINDS = ("sim", "ssh")
_POLL_S = 0.25
#: After the hosts were told to stop, how long to wait for their exit events before giving up on them.
_DRAIN_AFTER_STOP_S = 10.0
_RUN_ID_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


class LaunchObserver(Protocol):
    """Told what happens during a run; the CLI renders it (rich), tests collect it."""

    def line(self, worker: int, text: str) -> None:
        """One line of output from host ``worker``, as it arrives."""

    def status(self, text: str) -> None:
        """A step of the launcher itself (creating the slice, shipping, a host failed, ...)."""


class _Silent:
    def line(self, worker: int, text: str) -> None:
        pass

    def status(self, text: str) -> None:
        pass


@dataclass(frozen=True)
class RunRequest:
    """What the user asked for, as given (validated by ``Launcher.prepare``)."""

    script: str | None = None
    args: tuple[str, ...] = ()
    example: str | None = None
    workdir: str | None = None
    env: tuple[str, ...] = ()  # "KEY=VALUE" pairs
    pod: str | None = None
    accelerator_type: str | None = None
    zone: str | None = None
    capacity: CapacityType = CapacityType.ON_DEMAND
    keep_pod: bool = False
    checkpoint_every: int | None = None
    checkpoint_dir: str | None = None
    executor: str | None = None  # sim | ssh; None: sim on the simulator, ssh on Google
    timeout_s: float | None = None
    grace_s: float = 5.0
    bundle_limit_bytes: int = DEFAULT_LIMIT_BYTES
    run_id: str | None = None
    python: str | None = None  # the hosts' interpreter (default: this one on the simulator, python3 on SSH)
    ssh_remote_root: str = ".tpuctl"


@dataclass(frozen=True)
class Target:
    """Where the run goes: an existing READY node, or a slice to create. A new slice is placed by the
    allocator (any allowed zone, cheapest first, failing over on stockouts), except for SSH runs, which
    need tpuctl's key in the node's metadata at creation and so go through ``PodService`` in one zone
    (the allocator's requests carry no metadata yet)."""

    accelerator: AcceleratorType
    node: Node | None = None  # --pod
    create: CreateSpec | None = None  # placement flags, one zone (SSH runs)
    placement: PlacementRequest | None = None  # placement flags, through the allocator

    @property
    def name(self) -> str:
        if self.node is not None:
            return self.node.name
        if self.placement is not None:
            return self.placement.name
        assert self.create is not None
        return self.create.name

    @property
    def zone(self) -> str | None:
        """The zone, when known before placement (None: the allocator chooses)."""
        if self.node is not None:
            return self.node.zone
        if self.placement is not None:
            zones = self.placement.zones
            return zones[0] if len(zones) == 1 else None
        assert self.create is not None
        return self.create.zone

    @property
    def capacity(self) -> CapacityType:
        if self.node is not None:
            return self.node.capacity
        if self.placement is not None:
            return self.placement.capacity_types[0]
        assert self.create is not None
        return self.create.capacity

    @property
    def creates(self) -> bool:
        return self.node is None


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
    executor_kind: str
    checkpoint_dir: str
    log_dir: Path

    def spec(self, restart_count: int = 0) -> LaunchSpec:
        accel = self.target.accelerator
        env = dict(self.user_env)
        if self.request.checkpoint_every is not None:
            env.setdefault(CHECKPOINT_EVERY_ENV, str(self.request.checkpoint_every))
        return LaunchSpec(
            run_id=self.run_id,
            program=self.program,
            num_workers=accel.hosts,
            chips_per_host=accel.chips_per_host,
            accelerator_type=accel.api_name,
            topology=accel.topology,
            checkpoint_dir=self.checkpoint_dir,
            restart_count=restart_count,
            user_env=env,
        )


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

    @property
    def succeeded(self) -> bool:
        return (
            self.failed_worker is None
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
        }


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """``["A=1", "B=x=y"]`` -> dict, validated: a shell identifier, not one of tpuctl's own names."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not ENV_NAME_RE.match(key):
            raise UsageError(
                f"bad --env {pair!r}: expected KEY=VALUE with KEY a letter or _ followed by letters, "
                "digits or _",
                field="--env",
                value=pair,
                fix="write it as --env NAME=value, e.g. --env LEARNING_RATE=3e-4",
            )
        if key.startswith("TPUCTL_") or key == "PYTHONPATH":
            raise UsageError(
                f"bad --env {pair!r}: {key} is set by tpuctl on every host (the worker environment)",
                field="--env",
                value=pair,
                fix="choose another name; tpuctl sets TPUCTL_* and PYTHONPATH itself",
            )
        if "\x00" in value:
            raise UsageError(
                f"bad --env {key}: the value holds a NUL byte", field="--env", value=key, fix="remove it"
            )
        env[key] = value
    return env


def new_run_id(now: float | None = None) -> str:
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y%m%d-%H%M%S")
    return f"run-{stamp}-{secrets.token_hex(2)}"


class Launcher:
    """Runs a program on every host of a slice. Collaborators come in through the session; the executor
    for a node comes from ``executor_factory`` (tests inject their own)."""

    def __init__(
        self,
        session: Session,
        *,
        observer: LaunchObserver | None = None,
        executor_factory: Callable[[PreparedRun, Node], Executor] | None = None,
    ) -> None:
        from tpuctl.services.pods import PodService

        self._session = session
        self._pods = PodService(session)
        self._observer: LaunchObserver = observer or _Silent()
        self._executor_factory = executor_factory or self._default_executor
        #: The executor of the attempt in progress (tests and the supervisor look at it).
        self.current_executor: Executor | None = None

    @property
    def runs_dir(self) -> Path:
        return self._session.state_dir / "runs"

    # --- prepare: validate everything before anything changes --------------------------------------

    def prepare(self, request: RunRequest) -> PreparedRun:
        """Validate the request and build the bundle; raises UsageError for any bad input."""
        user_env = parse_env(request.env)
        program, display, workdir = self._program(request)
        if request.checkpoint_every is not None and request.checkpoint_every < 0:
            raise UsageError(
                f"--checkpoint-every must be 0 or more, got {request.checkpoint_every}",
                field="--checkpoint-every",
                value=request.checkpoint_every,
                fix="give a number of steps, e.g. --checkpoint-every 50",
            )
        if request.example is not None and request.checkpoint_every is not None:
            program = (*program, "--checkpoint-every", str(request.checkpoint_every))
        if request.timeout_s is not None and request.timeout_s <= 0:
            raise UsageError(
                f"--timeout must be positive, got {request.timeout_s}",
                field="--timeout",
                value=request.timeout_s,
                fix="give seconds, e.g. --timeout 3600",
            )
        executor_kind = request.executor or ("sim" if self._session.backend.name == "sim" else "ssh")
        if executor_kind not in EXECUTOR_KINDS:
            raise UsageError(
                f"unknown executor {executor_kind!r}",
                field="--executor",
                value=executor_kind,
                fix="use one of: " + ", ".join(EXECUTOR_KINDS),
            )
        if executor_kind == "sim" and self._session.backend.name != "sim":
            raise UsageError(
                "the sim executor runs simulated hosts only; this command talks to Google",
                field="--executor",
                value=executor_kind,
                fix="drop --executor (real slices use ssh)",
            )
        run_id = request.run_id or new_run_id(self._session.clock())
        if not _RUN_ID_RE.match(run_id):
            raise UsageError(
                f"invalid run id {run_id!r}",
                field="--run-id",
                value=run_id,
                fix="use lowercase letters, digits and dashes, starting with a letter (at most 63)",
            )
        target = self._target(request, run_id, executor_kind)
        bundle = build_bundle(workdir, limit_bytes=request.bundle_limit_bytes)
        log_dir = self.runs_dir / run_id
        checkpoint_dir = request.checkpoint_dir or self._default_checkpoint_dir(
            run_id, executor_kind, request
        )
        return PreparedRun(
            request=request,
            run_id=run_id,
            program=program,
            display=display,
            user_env=user_env,
            bundle=bundle,
            target=target,
            executor_kind=executor_kind,
            checkpoint_dir=checkpoint_dir,
            log_dir=log_dir,
        )

    def _program(self, request: RunRequest) -> tuple[tuple[str, ...], str, Path | None]:
        if request.example is not None:
            example = EXAMPLES.get(request.example)
            if example is None:
                raise UsageError(
                    f"unknown example {request.example!r}",
                    field="--example",
                    value=request.example,
                    fix="use one of: " + ", ".join(f"{k} ({v.description})" for k, v in EXAMPLES.items()),
                )
            if request.script is not None:
                raise UsageError(
                    "give either a SCRIPT or --example, not both",
                    field="SCRIPT",
                    value=request.script,
                    fix="with --example, pass the example's own arguments after `--`",
                )
            workdir = Path(request.workdir).expanduser() if request.workdir else None
            return ("-m", example.module, *request.args), f"example:{request.example}", workdir
        if request.script is None:
            raise UsageError(
                "nothing to run: give a SCRIPT or --example NAME",
                field="SCRIPT",
                fix="e.g. `tpuctl run train.py --type v5e-8` or `tpuctl run --example lm --type v5e-8`",
            )
        script = Path(request.script).expanduser()
        if not script.is_file():
            raise UsageError(
                f"script {request.script} does not exist"
                + (" (it is a directory)" if script.is_dir() else ""),
                field="SCRIPT",
                value=request.script,
                fix="check the path (relative paths are from the current directory)",
            )
        script = script.resolve()
        workdir = Path(request.workdir).expanduser().resolve() if request.workdir else script.parent
        if not workdir.is_dir():
            raise UsageError(
                f"--workdir {request.workdir} does not exist or is not a directory",
                field="--workdir",
                value=request.workdir,
                fix="pass the directory that holds your program and its files",
            )
        if not script.is_relative_to(workdir):
            raise UsageError(
                f"script {script} is outside the working directory {workdir}",
                field="--workdir",
                value=str(workdir),
                fix="pass a --workdir that contains the script (it is shipped with its directory)",
            )
        rel = script.relative_to(workdir).as_posix()
        if rel == "tpuctl" or rel.startswith("tpuctl/"):
            raise UsageError(
                f"script {rel} is inside a tpuctl/ directory, whose paths the runtime takes in the bundle",
                field="SCRIPT",
                value=request.script,
                fix="move the script out of tpuctl/, or pick another --workdir",
            )
        return (rel, *request.args), rel, workdir

    def _target(self, request: RunRequest, run_id: str, executor_kind: str) -> Target:
        catalog = self._session.catalog
        if request.pod is not None:
            if request.accelerator_type is not None:
                raise UsageError(
                    "--pod and --type exclude each other",
                    field="--pod",
                    value=request.pod,
                    fix="run on an existing slice with --pod, or create one with --type",
                )
            node = self._find_pod(request.pod, request.zone)
            if node.state != "READY":
                raise UsageError(
                    f"pod {node.name} in {node.zone} is {node.state}, not READY",
                    field="--pod",
                    value=request.pod,
                    fix="wait until `tpuctl pod list` shows it READY, or run with --type to create a slice",
                )
            try:
                accel = catalog.resolve(node.accelerator_type)
            except UsageError as exc:
                raise UsageError(
                    f"pod {node.name} has accelerator type {node.accelerator_type!r}, which the catalog "
                    "does not know",
                    field="--pod",
                    value=request.pod,
                    fix="update tpuctl",
                ) from exc
            return Target(accelerator=accel, node=node)
        if request.accelerator_type is None:
            raise UsageError(
                "say where to run: --pod NAME (an existing slice) or --type TYPE (a new one)",
                field="--type",
                fix="e.g. --type v5e-8, or --pod my-slice (see `tpuctl pod list`)",
            )
        if executor_kind == "sim":
            from tpuctl.services.allocator import build_request

            placement = build_request(
                catalog,
                self._session.settings,
                request.accelerator_type,
                zones=[request.zone] if request.zone else (),
                spot=request.capacity is CapacityType.SPOT,
                preemptible=request.capacity is CapacityType.PREEMPTIBLE,
                labels={LABEL_RUN: run_id},
            )
            return Target(accelerator=placement.accelerator, placement=placement)
        spec = self._pods.build_spec(
            request.accelerator_type,
            zone=request.zone,
            capacity=request.capacity,
            labels={LABEL_RUN: run_id},
        )
        return Target(accelerator=spec.accelerator, create=spec)

    def _find_pod(self, name: str, zone: str | None) -> Node:
        cloud = self._session.cloud
        try:
            if zone:
                return cloud.get_node(zone, name)
            matches = [n for n in cloud.list_nodes(None) if n.name == name]
        except NotFoundError:
            matches = []
        if not matches:
            raise UsageError(
                f"pod {name!r} does not exist" + (f" in {zone}" if zone else ""),
                field="--pod",
                value=name,
                fix="`tpuctl pod list` shows the slices; or run with --type TYPE to create one",
            )
        if len(matches) > 1:
            raise UsageError(
                f"pod name {name!r} exists in several zones ({', '.join(sorted(n.zone for n in matches))})",
                field="--zone",
                value=name,
                fix="pass --zone to say which",
            )
        return matches[0]

    def _default_checkpoint_dir(self, run_id: str, executor_kind: str, request: RunRequest) -> str:
        if executor_kind == "sim":
            # Simulated hosts share this machine's disk, as real hosts share a gs:// bucket.
            return str(self.runs_dir / run_id / "checkpoints")
        # A host-local default; multi-host runs that checkpoint want --checkpoint-dir gs://...
        root = request.ssh_remote_root
        return f"{root}/runs/{run_id}/checkpoints"

    # --- plan (--dry-run) --------------------------------------------------------------------------

    def plan(self, prepared: PreparedRun) -> dict[str, Any]:
        """What ``run`` would ship and run where: bundle, target, and each host's command and env
        (secret-looking --env values redacted). Changes nothing."""
        target = prepared.target
        accel = target.accelerator
        where: dict[str, Any] = {
            "pod": target.name,
            "zone": target.zone,
            "accelerator_type": accel.api_name,
            "topology": accel.topology,
            "hosts": accel.hosts,
            "chips_per_host": accel.chips_per_host,
            "capacity": target.capacity.value,
            "existing": target.node is not None,
        }
        if target.create is not None:
            where["create"] = self._pods.plan_create(
                self._with_ssh_metadata(prepared, target.create, plan=True)
            )
        chosen_zone = target.zone
        if target.placement is not None:
            from tpuctl.services.allocator import Allocator

            placement_plan = Allocator(self._session).plan(target.placement)
            error = placement_plan.error()
            if error is not None:
                raise error  # the run could not start: say why, with the placement's exit code
            where["create"] = placement_plan.to_dict()
            chosen_zone = (where["create"].get("chosen") or {}).get("zone") or chosen_zone
            where["zone"] = chosen_zone
        if target.creates:
            where["delete_after"] = not prepared.request.keep_pod
        executor = self._plan_executor(prepared, chosen_zone)
        spec = prepared.spec()
        hosts: list[HostPlan] = executor.plan(spec, digest=prepared.bundle.digest)
        return {
            "run_id": prepared.run_id,
            "program": list(prepared.program),
            "executor": prepared.executor_kind,
            "bundle": prepared.bundle.summary(),
            "target": where,
            "checkpoint_dir": prepared.checkpoint_dir,
            "hosts": [h.to_dict(user_keys=list(prepared.user_env)) for h in hosts],
        }

    def _plan_executor(self, prepared: PreparedRun, zone: str | None) -> Executor:
        if prepared.target.node is not None:
            return self._build_executor(prepared, prepared.target.node, for_plan=True)
        # No node yet: plan against placeholder endpoints of the right size.
        from tpuctl.cloud.base import NetworkEndpoint

        accel = prepared.target.accelerator
        node = Node(
            name=prepared.target.name,
            zone=zone or "<zone chosen by the allocator>",
            accelerator_type=accel.api_name,
            state="PLANNED",
            capacity=prepared.target.capacity,
            network_endpoints=tuple(NetworkEndpoint(f"<worker-{i} address>", 22) for i in range(accel.hosts)),
        )
        return self._build_executor(prepared, node, for_plan=True)

    # --- run ---------------------------------------------------------------------------------------

    def run(self, request: RunRequest, *, progress: OperationProgress | None = None) -> RunResult:
        """Prepare, provision, execute, finish. Raises RunFailedError / InterruptedByUser on failure."""
        prepared = self.prepare(request)
        return self.run_prepared(prepared, progress=progress)

    def run_prepared(self, prepared: PreparedRun, *, progress: OperationProgress | None = None) -> RunResult:
        ledger = self._session.ledger
        target = prepared.target
        started = time.monotonic()
        ledger.create_run(
            prepared.run_id,
            script=prepared.display,
            args=list(prepared.program),
            status=RunStatus.PROVISIONING if target.creates else RunStatus.PENDING,
            pod=target.name,
            zone=target.zone,
            accelerator_type=target.accelerator.api_name,
            capacity=target.capacity,
            detail={
                "hosts": target.accelerator.hosts,
                "bundle_sha256": prepared.bundle.digest,
                "bundle_bytes": prepared.bundle.total_bytes,
                "executor": prepared.executor_kind,
                "log_dir": str(prepared.log_dir),
                "checkpoint_dir": prepared.checkpoint_dir,
                "created_pod": target.creates,
                "env_keys": sorted(prepared.user_env),
            },
        )
        node: Node | None = target.node
        created = False
        deleted = False
        status = RunStatus.FAILED
        exit_code: int | None = None
        failure: BaseException | None = None
        attempt: AttemptResult | None = None
        try:
            if node is None:
                node = self.provision(prepared, progress=progress)
                created = True
            attempt = self.execute(prepared, node)
            if attempt.interrupted:
                status, exit_code = RunStatus.CANCELLED, 130
                raise InterruptedByUser("interrupted: every host was stopped")
            if attempt.timed_out:
                status, exit_code = RunStatus.FAILED, 124
                raise RunFailedError(
                    f"run {prepared.run_id} exceeded --timeout {prepared.request.timeout_s:g} s; "
                    "every host was stopped",
                    fix="raise --timeout, or check the logs with `tpuctl runs logs " + prepared.run_id + "`",
                    returncode=124,
                )
            if not attempt.succeeded:
                worker = attempt.failed_worker
                rc = attempt.returncode
                status, exit_code = RunStatus.FAILED, _exit_status(rc)
                raise RunFailedError(
                    f"run {prepared.run_id} failed: host {worker} {_describe_exit(rc)}; the other hosts "
                    "were stopped",
                    worker=worker,
                    returncode=rc,
                    fix=f"see its output: `tpuctl runs logs {prepared.run_id} --worker {worker}`",
                )
            status, exit_code = RunStatus.SUCCEEDED, 0
        except KeyboardInterrupt:
            status, exit_code = RunStatus.CANCELLED, 130
            failure = InterruptedByUser("interrupted: every host was stopped")
        except BaseException as exc:
            failure = exc
        finally:
            if created and node is not None and not prepared.request.keep_pod:
                deleted = self._delete_pod(node, prepared.run_id)
                if deleted and prepared.executor_kind == "sim":
                    # The simulated hosts' disks go with the slice.
                    shutil.rmtree(self._sim_hosts_dir(node), ignore_errors=True)
            detail: dict[str, Any] = {"deleted_pod": deleted}
            if attempt is not None:
                detail.update(
                    {
                        "exit_codes": {str(k): v for k, v in attempt.exit_codes.items()},
                        "failed_worker": attempt.failed_worker,
                        "shipped_hosts": sum(1 for s in attempt.shipped if s.shipped),
                    }
                )
            if failure is not None and not isinstance(failure, (RunFailedError, InterruptedByUser)):
                detail["error"] = str(failure)
            self._finish(prepared, status, exit_code, detail)
        if failure is not None:
            raise failure
        assert node is not None and attempt is not None
        return RunResult(
            run_id=prepared.run_id,
            pod=node.name,
            zone=node.zone,
            hosts=prepared.target.accelerator.hosts,
            exit_code=0,
            duration_s=time.monotonic() - started,
            log_dir=prepared.log_dir,
            bundle_sha256=prepared.bundle.digest,
            shipped_hosts=sum(1 for s in attempt.shipped if s.shipped),
            deleted_pod=deleted,
        )

    def provision(
        self,
        prepared: PreparedRun,
        *,
        progress: OperationProgress | None = None,
        prefer_zone: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> Node:
        """Create the run's slice and wait until READY (a provisioning segment in the ledger).

        ``prefer_zone``: try that zone first, then the others in the allocator's order (a recovery goes
        back where the run was: its data and its quota are there)."""
        target = prepared.target
        ledger = self._session.ledger
        segment = ledger.add_segment(
            prepared.run_id,
            SegmentKind.PROVISIONING,
            start=self._session.clock(),
            pod=target.name,
            zone=target.zone,
            capacity=target.capacity,
            detail=detail,
        )
        accel = target.accelerator
        where = f"in {target.zone}" if target.zone else "where the allocator finds room"
        self._observer.status(f"creating {target.name} ({accel.api_name}, {accel.hosts} hosts) {where}")
        try:
            if target.placement is not None:
                from tpuctl.services.allocator import Allocator

                allocator = Allocator(self._session)
                plan = allocator.plan(target.placement)
                if prefer_zone is not None:
                    first = [c for c in plan.order if c.zone == prefer_zone]
                    plan = dataclasses.replace(
                        plan, order=[*first, *(c for c in plan.order if c.zone != prefer_zone)]
                    )
                placement = allocator.place(target.placement, progress=progress, plan=plan)
                node = placement.nodes[0]
            else:
                assert target.create is not None
                spec = self._with_ssh_metadata(prepared, target.create, plan=False)
                try:
                    node = self._pods.create(spec, wait=True, progress=progress, run_id=prepared.run_id)
                except BaseException:
                    # PodService cleans up after a cloud failure; after Ctrl-C mid-create, so do we.
                    self._delete_own_leftover(spec.zone, spec.name, spec.request_id)
                    raise
        except BaseException as exc:
            failed = {**(detail or {}), "error": str(exc) or type(exc).__name__}
            ledger.close_segment(segment, end=self._session.clock(), detail=failed)
            raise
        ledger.close_segment(segment, end=self._session.clock())
        ledger.update_segment(segment, pod=node.name, zone=node.zone, capacity=node.capacity)
        self._observer.status(f"{node.name} is {node.state} in {node.zone}")
        return node

    def execute(
        self,
        prepared: PreparedRun,
        node: Node,
        *,
        restart_count: int = 0,
        record_segment: bool = True,
        soft_exit_codes: frozenset[int] = frozenset(),
        soft_wait_s: float = 60.0,
        on_started: Callable[[Executor], None] | None = None,
    ) -> AttemptResult:
        """Ship and start on every host of ``node``, stream until all exit; never raises for the
        program's own failure (see ``AttemptResult``). A running segment is recorded in the ledger unless
        ``record_segment`` is False (the preemption supervisor keeps its own segments).

        ``soft_exit_codes``: statuses that end a host without failing the others (the runtime's
        "preempted, checkpoint saved"): the other hosts get ``soft_wait_s`` to reach the same end before
        they are stopped. ``on_started(executor)`` is called once every host has started."""
        ledger = self._session.ledger
        spec = prepared.spec(restart_count)
        if len(node.network_endpoints) not in (0, spec.num_workers):
            self._observer.status(
                f"note: {node.name} reports {len(node.network_endpoints)} endpoints for "
                f"{spec.num_workers} hosts"
            )
        # Run logs hold the program's output: private like the rest of the state dir.
        ensure_private_dir(prepared.log_dir.parent)
        ensure_private_dir(prepared.log_dir)
        executor = self._executor_factory(prepared, node)
        self.current_executor = executor
        segment = (
            ledger.add_segment(
                prepared.run_id,
                SegmentKind.RUNNING,
                start=self._session.clock(),
                pod=node.name,
                zone=node.zone,
                capacity=node.capacity,
                detail={"restart_count": restart_count},
            )
            if record_segment
            else None
        )
        logs: dict[int, IO[str]] = {}
        shipped: list[ShipResult] = []
        exit_codes: dict[int, int | None] = {}
        exit_times: dict[int, float] = {}
        failed: tuple[int, int | None] | None = None
        interrupted = timed_out = False
        started_at = time.time()
        try:
            for worker in range(spec.num_workers):
                logs[worker] = private_file(prepared.log_dir / f"worker-{worker}.log").open(
                    "a", encoding="utf-8", buffering=1
                )
            self._observer.status(
                f"shipping bundle {prepared.bundle.short_digest} ({len(prepared.bundle.files)} files, "
                f"{prepared.bundle.total_bytes} bytes) to {spec.num_workers} hosts"
            )
            shipped = executor.ship(prepared.bundle)
            copied = sum(1 for s in shipped if s.shipped)
            self._observer.status(
                f"bundle on {spec.num_workers} hosts ({copied} copied, "
                f"{len(shipped) - copied} already had it)"
            )
            ledger.update_run(prepared.run_id, status=RunStatus.RUNNING, pod=node.name, zone=node.zone)
            executor.start(spec)
            self._observer.status(f"started {' '.join(prepared.program)} on {spec.num_workers} hosts")
            if on_started is not None:
                on_started(executor)
            deadline = (
                None if prepared.request.timeout_s is None else time.monotonic() + prepared.request.timeout_s
            )
            try:
                failed, timed_out = self._pump(
                    executor, spec.num_workers, logs, exit_codes, deadline, prepared, soft_exit_codes,
                    soft_wait_s, exit_times,
                )  # fmt: skip
            except KeyboardInterrupt:
                interrupted = True
                self._observer.status("interrupted: stopping every host")
                executor.stop(prepared.request.grace_s)
                self._drain(executor, spec.num_workers, logs, exit_codes)
        finally:
            try:
                executor.close()
            finally:
                self.current_executor = None
                for fh in logs.values():
                    fh.close()
                if segment is not None:
                    ledger.close_segment(
                        segment,
                        end=self._session.clock(),
                        detail={
                            "restart_count": restart_count,
                            "exit_codes": {str(k): v for k, v in exit_codes.items()},
                        },
                    )
        return AttemptResult(
            exit_codes=exit_codes,
            failed_worker=None if failed is None else failed[0],
            returncode=None if failed is None else failed[1],
            interrupted=interrupted,
            timed_out=timed_out,
            shipped=shipped,
            started_at=started_at,
            ended_at=time.time(),
            exit_times=exit_times,
        )

    def _pump(
        self,
        executor: Executor,
        num_workers: int,
        logs: Mapping[int, IO[str]],
        exit_codes: dict[int, int | None],
        deadline: float | None,
        prepared: PreparedRun,
        soft_exit_codes: frozenset[int] = frozenset(),
        soft_wait_s: float = 60.0,
        exit_times: dict[int, float] | None = None,
    ) -> tuple[tuple[int, int | None] | None, bool]:
        """Route events until every host exited; returns (first failure, timed out)."""
        failed: tuple[int, int | None] | None = None
        timed_out = False
        stop_deadline: float | None = None
        soft_deadline: float | None = None
        exit_times = {} if exit_times is None else exit_times
        while len(exit_codes) < num_workers:
            now = time.monotonic()
            if stop_deadline is not None and now > stop_deadline:
                break  # the executor promised exits after stop(); don't wait on one that never comes
            if soft_deadline is not None and now > soft_deadline and stop_deadline is None:
                self._observer.status(
                    f"{num_workers - len(exit_codes)} host(s) did not stop within {soft_wait_s:g} s of the "
                    "others: stopping them"
                )
                executor.stop(prepared.request.grace_s)
                stop_deadline = time.monotonic() + _DRAIN_AFTER_STOP_S
                continue
            if deadline is not None and now > deadline and stop_deadline is None:
                timed_out = True
                self._observer.status("--timeout reached: stopping every host")
                executor.stop(prepared.request.grace_s)
                stop_deadline = time.monotonic() + _DRAIN_AFTER_STOP_S
                continue
            event = executor.next_event(_POLL_S)
            if event is None:
                continue
            if event.kind == "line":
                logs[event.worker].write(event.text + "\n")
                self._observer.line(event.worker, event.text)
                continue
            exit_codes[event.worker] = event.returncode
            exit_times[event.worker] = event.at
            if event.returncode == 0 or failed is not None or timed_out:
                continue
            if event.returncode in soft_exit_codes:
                # An agreed stop (every host stops at the same step): let the others get there too.
                if soft_deadline is None:
                    soft_deadline = time.monotonic() + soft_wait_s
                continue
            failed = (event.worker, event.returncode)
            self._observer.status(
                f"host {event.worker} {_describe_exit(event.returncode)}: stopping the other hosts"
            )
            executor.stop(prepared.request.grace_s)
            stop_deadline = time.monotonic() + _DRAIN_AFTER_STOP_S
        return failed, timed_out

    def _drain(
        self,
        executor: Executor,
        num_workers: int,
        logs: Mapping[int, IO[str]],
        exit_codes: dict[int, int | None],
    ) -> None:
        deadline = time.monotonic() + _DRAIN_AFTER_STOP_S
        while len(exit_codes) < num_workers and time.monotonic() < deadline:
            event = executor.next_event(_POLL_S)
            if event is None:
                continue
            if event.kind == "line":
                logs[event.worker].write(event.text + "\n")
            else:
                exit_codes[event.worker] = event.returncode

    def _finish(
        self, prepared: PreparedRun, status: RunStatus, exit_code: int | None, detail: dict[str, Any]
    ) -> None:
        ledger = self._session.ledger
        record = ledger.get_run(prepared.run_id)
        merged = dict(record.detail or {}) if record is not None else {}
        merged.update(detail)
        ledger.update_run(prepared.run_id, status=status, exit_code=exit_code, detail=merged)

    def _delete_pod(self, node: Node, run_id: str) -> bool:
        self._observer.status(f"deleting {node.name} ({node.zone})")
        try:
            self._pods.delete(node.name, zone=node.zone, wait=True, reason=f"end of run {run_id}")
        except Exception as exc:  # reported; it must not mask how the run itself ended
            message = exc.message if isinstance(exc, TpuctlError) else f"{type(exc).__name__}: {exc}"
            self._observer.status(
                f"could not delete {node.name}: {message}; delete it with `tpuctl pod delete {node.name}`"
            )
            return False
        return True

    def _delete_own_leftover(self, zone: str, name: str, request_id: str) -> None:
        from tpuctl.cloud.base import LABEL_REQUEST

        try:
            node = self._session.cloud.get_node(zone, name)
            if node.labels.get(LABEL_REQUEST) == request_id:
                self._session.cloud.delete_node(zone, name, wait=False)
        except Exception:  # best effort: `tpuctl pod gc` finds whatever is left
            pass

    # --- executors ---------------------------------------------------------------------------------

    def _sim_hosts_dir(self, node: Node) -> Path:
        return self._session.state_dir / "sim-hosts" / node.zone / node.name

    def _default_executor(self, prepared: PreparedRun, node: Node) -> Executor:
        return self._build_executor(prepared, node, for_plan=False)

    def _build_executor(self, prepared: PreparedRun, node: Node, *, for_plan: bool) -> Executor:
        hosts = prepared.target.accelerator.hosts
        if prepared.executor_kind == "sim":
            from tpuctl.services.executors.sim import SimExecutor

            registry = None if for_plan else _SimRegistry.for_session(self._session)
            return SimExecutor(
                self._sim_hosts_dir(node),
                zone=node.zone,
                node=node.name,
                num_hosts=hosts,
                registry=registry,
                metadata_base_url=self._session.cloud.endpoint,
                python=prepared.request.python or sys.executable,
            )
        from tpuctl.services.executors.ssh import (
            DEFAULT_USERNAME,
            KeyPair,
            SshExecutor,
            SshHost,
            ensure_key_pair,
        )

        endpoints = list(node.network_endpoints)
        if len(endpoints) != hosts:
            raise UsageError(
                f"pod {node.name} reports {len(endpoints)} network endpoints for its {hosts} hosts",
                field="--pod",
                value=node.name,
                fix="wait until the slice is READY with every host up (`tpuctl pod describe`)",
            )
        on_sim = self._session.backend.name == "sim"
        ssh_hosts = [
            # On Google, the endpoints' port is the TPU runtime's (8470), not SSH: use 22. The
            # simulator's endpoints are overridden to point at test SSH servers, port included.
            SshHost(e.external_ip or e.ip_address if not on_sim else e.ip_address, e.port if on_sim else 22)
            for e in endpoints
        ]
        key = (
            KeyPair(self._session.state_dir / "ssh" / "tpuctl_ed25519", "<tpuctl public key>")
            if for_plan
            else ensure_key_pair(self._session.state_dir)
        )
        return SshExecutor(
            ssh_hosts,
            username=DEFAULT_USERNAME,
            key=key,
            remote_root=prepared.request.ssh_remote_root,
            python=prepared.request.python or "python3",
        )

    def _with_ssh_metadata(self, prepared: PreparedRun, spec: CreateSpec, *, plan: bool) -> CreateSpec:
        """The create spec with tpuctl's public key in the node's ``ssh-keys`` metadata (SSH runs)."""
        if prepared.executor_kind != "ssh":
            return spec
        from tpuctl.services.executors.ssh import DEFAULT_USERNAME, ensure_key_pair, ssh_keys_metadata

        public = "<tpuctl public key>" if plan else ensure_key_pair(self._session.state_dir).public_openssh
        metadata = {**spec.metadata, "ssh-keys": ssh_keys_metadata(DEFAULT_USERNAME, public)}
        return dataclasses.replace(spec, metadata=metadata)

    # --- reading runs ------------------------------------------------------------------------------

    def log_paths(self, run_id: str, worker: int | None = None) -> list[tuple[int, Path]]:
        """(worker, log file) of a run, all workers or one; raises UsageError for an unknown one."""
        record = self._session.ledger.get_run(run_id)
        if record is None:
            raise UsageError(
                f"no run {run_id!r}", field="RUN", value=run_id, fix="`tpuctl runs list` shows the runs"
            )
        hosts = int((record.detail or {}).get("hosts", 0))
        log_dir = Path((record.detail or {}).get("log_dir") or self.runs_dir / run_id)
        if worker is not None and not 0 <= worker < max(hosts, 1):
            raise UsageError(
                f"run {run_id} has workers 0..{hosts - 1}, not {worker}",
                field="--worker",
                value=worker,
                fix=f"pass --worker between 0 and {hosts - 1}",
            )
        workers = [worker] if worker is not None else list(range(hosts))
        return [(w, log_dir / f"worker-{w}.log") for w in workers]


@dataclass
class _SimRegistry:
    """Registers host pids with the simulator's admin API (so simulated preemptions can signal them)."""

    base_url: str
    _client: Any = field(default=None, repr=False)

    @classmethod
    def for_session(cls, session: Session) -> _SimRegistry:
        return cls(session.cloud.endpoint)

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


def _exit_status(returncode: int | None) -> int:
    """The process-style exit status for a host's end: 128+N for a signal, 255 for a lost host."""
    if returncode is None:
        return 255
    if returncode < 0:
        return 128 - returncode
    return returncode


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "was lost (no exit status: the connection dropped)"
    if returncode < 0:
        import signal

        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


# --- tpuctl bench step ----------------------------------------------------------------------------------

#: The line the bench program's host 0 prints (tpuctl/services/executors/programs/bench_step.py).
BENCH_STEP_PREFIX = "TPUCTL_BENCH_STEP "


def bench_step_program() -> Path:
    """The bench program shipped as the run's script (its directory is the bundle's workdir)."""
    from tpuctl.services.executors import programs

    return Path(programs.__file__).resolve().parent / "bench_step.py"


class BenchCollector:
    """An observer that passes everything on and keeps host 0's result line."""

    def __init__(self, inner: LaunchObserver | None = None) -> None:
        self._inner: LaunchObserver = inner or _Silent()
        self.result: dict[str, Any] | None = None

    def line(self, worker: int, text: str) -> None:
        if worker == 0 and text.startswith(BENCH_STEP_PREFIX):
            import json

            self.result = json.loads(text[len(BENCH_STEP_PREFIX) :])
        self._inner.line(worker, text)

    def status(self, text: str) -> None:
        self._inner.status(text)


def bench_step_figures(raw: Mapping[str, Any], accelerator: AcceleratorType) -> dict[str, Any]:
    """Step time, tokens/s, achieved TFLOP/s and the fraction of peak: the catalog's peak (bf16, the
    whole slice) on TPU; on the simulator, the large matmul measured on the same CPU in the same run
    (all simulated hosts share that CPU, so it is the whole slice's peak too)."""
    achieved = float(raw["achieved_tflops"])
    if raw.get("platform") == "tpu":
        peak: float | None = accelerator.peak_bf16_tflops
        source = f"catalog: {accelerator.friendly_name} peak bf16 ({accelerator.chips} chips)"
    else:
        measured = raw.get("matmul_peak_tflops")
        peak = None if measured is None else float(measured)
        source = (
            f"measured: {raw.get('matmul_n')}^3 {raw.get('compute_dtype')} matmul on this machine's "
            f"{raw.get('platform')} in the same run"
        )
    return {
        "accelerator_type": accelerator.api_name,
        "hosts": raw.get("processes"),
        "devices": raw.get("devices"),
        "platform": raw.get("platform"),
        "params": raw.get("params"),
        "global_batch": raw.get("global_batch"),
        "seq_len": raw.get("seq_len"),
        "compute_dtype": raw.get("compute_dtype"),
        "step_time_s": raw["step_time_s"],
        "tokens_per_s": raw["tokens_per_s"],
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "peak_source": source,
        "fraction_of_peak": None if not peak else achieved / peak,
        "compile_s": raw.get("compile_s"),
    }
