"""The executor interface and the plain data that crosses it.

The launcher builds a :class:`LaunchSpec` (what to run, and the worker contract of docs/architecture.md), an
executor turns it into one process per host. Everything here is plain Python: no rendering, no typer.
"""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tpuctl.runtime import hostenv

#: User environment variables: a portable shell identifier.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: ``--env`` names whose values are never printed (dry-run, describe): matched case-insensitively anywhere
#: in the name, so HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY and DB_PASSWORD are all hidden. A value
#: declared secret (``--secret``, a job file's ``secrets:``) is never printed whatever its name.
_SECRET_NAME_RE = re.compile(
    r"(TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION)", re.IGNORECASE
)
#: What a plan shows in place of a hidden value.
REDACTED = "<secret>"


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME_RE.search(name))


def redact_env(env: Mapping[str, str], user_keys: Sequence[str] | None = None) -> dict[str, str]:
    """A copy of ``env`` safe to print: values of secret-looking names replaced by ``REDACTED``."""
    keys = set(env if user_keys is None else user_keys)
    return {k: (REDACTED if k in keys and is_secret_name(k) else v) for k, v in env.items()}


#: What the shell does on SIGTERM, set before the user's command. A VM's shutdown (a preemption's) and a
#: stop send SIGTERM to every process: a shell without a trap dies at once, and the host's status would be
#: the shell's (killed) while its program is still saving its checkpoint on the notice. Trapped, the
#: shell waits for its foreground command and exits with that command's status (POSIX: ``exit`` in a trap
#: exits with the status of the command before it), running nothing after it; a program that died of the
#: SIGTERM has the shell die of it too, as a host without a shell does. The commands the shell runs get
#: SIGTERM's default disposition (a trapped signal, unlike an ignored one, is reset for them).
_SHELL_ON_SIGTERM = "trap 's=$?; [ \"$s\" -eq 143 ] && { trap - TERM; kill -TERM $$; }; exit $s' TERM; "
#: Runs ``argv[1]`` with ``/bin/sh -c`` (after ``_SHELL_ON_SIGTERM``, on the same line, so the shell's
#: line numbers are the command's), the rest of argv as its "$@", in place of the interpreter (its exit
#: status is the host's), with the interpreter's directory first on PATH. Python, not a shell, does
#: this: the interpreter's path may be relative to the login home, which the launcher resolves for the
#: program it starts (argv[0]) but not for an argument, and ``sys.executable`` is then absolute.
SHELL_LAUNCHER = (
    "import os,sys;"
    "os.environ['PATH']=os.path.dirname(sys.executable)+os.pathsep+os.environ.get('PATH','');"
    f"os.execv('/bin/sh',['/bin/sh','-c',{_SHELL_ON_SIGTERM!r}+sys.argv[1],'sh',*sys.argv[2:]])"
)


@dataclass(frozen=True)
class LaunchSpec:
    """One program to start on every host of a slice, with the worker environment contract.

    ``program`` is the interpreter's argv after the interpreter itself, relative to the bundle root:
    ``("train.py", "--lr", "3e-4")`` or ``("-m", "tpuctl.runtime.examples.lm_train", "--steps", "20")``;
    with ``shell``, a shell command and its arguments (a job file's ``run:``): ``("python3 -m x", "--lr",
    "3e-4")``.
    """

    run_id: str
    program: tuple[str, ...]
    num_workers: int
    chips_per_host: int
    accelerator_type: str  # the API's name, e.g. v5litepod-16
    topology: str
    checkpoint_dir: str
    restart_count: int = 0
    user_env: Mapping[str, str] = field(default_factory=dict)
    #: The run's secret values (``--secret``), by name: in the program's environment like ``user_env``,
    #: never in a plan, a repr or a log (``HostPlan`` shows them as ``REDACTED``).
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Slices the hosts span (``--slices``): ``num_workers`` counts the hosts of all of them, numbered
    #: slice by slice.
    num_slices: int = 1
    #: ``program`` is a shell command (``/bin/sh -c``) and its arguments ("$@"), not a Python program.
    shell: bool = False

    def __post_init__(self) -> None:
        if self.num_slices < 1 or self.num_workers % self.num_slices:
            raise ValueError(
                f"num_workers {self.num_workers} must be a multiple of num_slices {self.num_slices} (>= 1)"
            )

    def argv(self, python: str) -> tuple[str, ...]:
        """What each host executes, ``python`` being the run's interpreter. A shell command is started
        by that interpreter (``SHELL_LAUNCHER``), which puts its own directory first on PATH, so the
        command's ``python3`` is the run's environment's, with the runtime's packages, as a script's is."""
        if not self.shell:
            return (python, "-u", *self.program)
        return (python, "-c", SHELL_LAUNCHER, *self.program)

    @property
    def hosts_per_slice(self) -> int:
        return self.num_workers // self.num_slices

    def program_env(self, worker: int) -> dict[str, str]:
        """Everything tpuctl puts in host ``worker``'s program environment: the contract's, the user's
        and the secrets (the executor may add the host's own)."""
        return {**self.contract_env(worker), **self.user_env, **self.secret_env}

    def contract_env(self, worker: int) -> dict[str, str]:
        """The worker environment every host gets (docs/architecture.md, "The worker contract")."""
        return {
            hostenv.RUN_ID: self.run_id,
            hostenv.WORKER_ID: str(worker),
            hostenv.NUM_WORKERS: str(self.num_workers),
            hostenv.SLICE_ID: str(worker // self.hosts_per_slice),
            hostenv.NUM_SLICES: str(self.num_slices),
            hostenv.ACCELERATOR_TYPE: self.accelerator_type,
            hostenv.TOPOLOGY: self.topology,
            hostenv.CHECKPOINT_DIR: self.checkpoint_dir,
            hostenv.RESTART_COUNT: str(self.restart_count),
        }


@dataclass(frozen=True)
class HostPlan:
    """Exactly what one host runs: where, in which directory, the argv and the environment we set
    (on the simulator the process also inherits the launcher's environment, less TPUCTL_* and
    PYTHONPATH; on SSH hosts, the login environment). ``env`` shows a secret's value as ``REDACTED``:
    a plan never holds one. No value of ``env`` is in ``shell_command``: the executor hands them to the
    host another way (the SSH executor: its session's stdin), so none sits in a host's process argv."""

    worker: int
    where: str  # "local pid namespace of this machine" or "user@10.0.0.2:22"
    cwd: str
    argv: tuple[str, ...]
    env: dict[str, str]
    shell_command: str | None = None  # the remote command line, for SSH hosts

    def to_dict(self, *, user_keys: Sequence[str] = ()) -> dict[str, Any]:
        """JSON-ready, with secret-looking user values redacted."""
        env = redact_env(self.env, user_keys)
        command = self.shell_command
        data: dict[str, Any] = {
            "worker": self.worker,
            "where": self.where,
            "cwd": self.cwd,
            "argv": list(self.argv),
            "env": env,
        }
        if command is not None:
            data["command"] = command
        return data


@dataclass(frozen=True)
class HostEvent:
    """A line of a host's output, or its exit.

    For ``kind == "exit"``: ``returncode`` is the exit status; negative when a signal killed it (-9 for
    SIGKILL); None when the host was lost (the connection dropped) without an exit status.
    """

    worker: int
    kind: Literal["line", "exit"]
    text: str = ""
    returncode: int | None = None
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class ShipResult:
    worker: int
    shipped: bool  # False: the host already had this bundle (cache hit)
    bytes: int
    seconds: float


@dataclass(frozen=True)
class CommandResult:
    """One host's outcome of :meth:`Executor.run_command`: its exit status (negative: killed by that
    signal; None: timed out or the connection was lost) and its last ``TAIL_LINES`` output lines."""

    worker: int
    exit_status: int | None
    tail: tuple[str, ...]


class Executor(Protocol):
    """Runs one program on every host of one slice.

    Contract (both implementations, and any later one, keep it):

    1. ``ship(bundle)`` first: makes the bundle's files present on every host, in parallel, in a
       directory keyed by ``bundle.digest``. A host that already holds a complete copy of that digest is
       not sent it again (``ShipResult.shipped`` is False). A partial copy is never mistaken for a
       complete one (the completion marker is written last, then the directory renamed into place).
    2. ``plan(spec, digest=...)`` has no side effects and returns, per host, exactly the command,
       directory and environment that ``start(spec)`` will use; --dry-run prints it.
    3. ``start(spec)`` starts the program on all hosts without waiting for any of them to finish; it
       raises if a host cannot be started (after stopping those already started).
    4. ``next_event(timeout_s)`` returns the next :class:`HostEvent` from any host, or None when
       ``timeout_s`` passes with nothing new. Every line of a host comes before that host's single
       ``exit`` event; every started host produces exactly one ``exit`` event, also when it is stopped
       or lost.
    5. ``stop(grace_s)`` asks every host still running to stop (SIGTERM to its whole process group),
       kills what is left after ``grace_s`` (SIGKILL) and returns within about ``grace_s`` + a few
       seconds, whatever the hosts do. It is idempotent and may be called from any thread.
    6. ``close()`` stops anything still running and frees connections and threads. Idempotent.

    Nothing here blocks without a timeout.
    """

    @property
    def num_hosts(self) -> int: ...

    def ship(self, bundle: Any) -> list[ShipResult]: ...

    def plan(self, spec: LaunchSpec, *, digest: str | None = None) -> list[HostPlan]:
        """Per host, what ``start(spec)`` runs; ``digest`` names the bundle before it is shipped."""
        ...

    def start(self, spec: LaunchSpec) -> None: ...

    def next_event(self, timeout_s: float) -> HostEvent | None: ...

    def run_command(
        self,
        command: str,
        *,
        on_line: Callable[[int, str], None],
        timeout_s: float,
        workers: Sequence[int] | None = None,
        stdin: bytes = b"",
    ) -> dict[int, CommandResult]:
        """Run ``command`` through each host's login shell on every host at once (setup), or on
        ``workers`` only (the import check: one host), each output line to ``on_line(worker, text)`` as it
        comes; a host that does not finish within ``timeout_s`` has exit_status None. The result has
        one entry per host run on. ``stdin`` is the command's standard input, then end of file: for
        text too long for a command line (sshd runs the command as one argument of ``sh -c``, and Linux
        refuses an argument over 128 KiB)."""
        ...

    def stop(self, grace_s: float = 5.0) -> None: ...

    def close(self) -> None: ...


class ForwardingExecutor:
    """An executor that hands every call to ``inner``: the base of a wrapper that adds to a few calls
    (a lease's fence, a run's backstop) and leaves the rest as they are. Attributes beyond the protocol
    (the SSH executor's leftovers and hosts) are ``inner``'s too."""

    def __init__(self, inner: Executor) -> None:
        self._inner = inner

    @property
    def num_hosts(self) -> int:
        return self._inner.num_hosts

    def ship(self, bundle: Any) -> list[ShipResult]:
        return self._inner.ship(bundle)

    def plan(self, spec: LaunchSpec, *, digest: str | None = None) -> list[HostPlan]:
        return self._inner.plan(spec, digest=digest)

    def start(self, spec: LaunchSpec) -> None:
        self._inner.start(spec)

    def next_event(self, timeout_s: float) -> HostEvent | None:
        return self._inner.next_event(timeout_s)

    def run_command(
        self,
        command: str,
        *,
        on_line: Callable[[int, str], None],
        timeout_s: float,
        workers: Sequence[int] | None = None,
        stdin: bytes = b"",
    ) -> dict[int, CommandResult]:
        return self._inner.run_command(
            command, on_line=on_line, timeout_s=timeout_s, workers=workers, stdin=stdin
        )

    def stop(self, grace_s: float = 5.0) -> None:
        self._inner.stop(grace_s)

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class EventQueue:
    """The thread-safe queue executors' reader threads post :class:`HostEvent`s to."""

    def __init__(self) -> None:
        self._queue: queue.Queue[HostEvent] = queue.Queue()

    def put(self, event: HostEvent) -> None:
        self._queue.put(event)

    def get(self, timeout_s: float) -> HostEvent | None:
        try:
            return self._queue.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None


def decode_line(raw: bytes) -> str:
    """A host's output line as text (undecodable bytes replaced), without its line ending."""
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")
