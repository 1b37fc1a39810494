"""The SSH executor: asyncssh to every worker of a slice, in parallel.

Key pair: tpuctl manages one ed25519 key pair per state dir (``<state>/ssh/tpuctl_ed25519``, 0600 in a
0700 directory), generated once. Its public key goes into the node's ``ssh-keys`` metadata when tpuctl
creates the slice (``ssh_keys_metadata``), which is how TPU VMs authorize logins.

Remote layout, relative to the login directory unless ``remote_root`` is absolute::

    <remote_root>/bundles/<sha256>/        the bundle, .tpuctl-bundle marker last (the per-host cache)
    <remote_root>/runs/<run_id>/worker-N.pid

Shipping pipes a deterministic .tar.gz into ``tar -xzf -`` on the host (no sftp subsystem needed) into a
temporary directory that is renamed into place once complete. The program runs as
``cd BUNDLE && exec env K=V ... PYTHON -u PROGRAM...``; sshd makes each session's shell a session and
process-group leader and ``exec`` keeps its pid, so the pid file names the group that a stop signals.

Quoting: every piece of every remote command that comes from a name, a path, an argument or an env value
goes through ``shlex.quote``; the only unquoted shell text is tpuctl's own constant syntax.

Host keys are not verified (``known_hosts=None``): a new TPU VM's host key is not known in advance, and
IP addresses are reused across slices, so a trust-on-first-use file would reject every re-created slice.
Fetching the host keys from the node's guest attributes would close this; see the module's report.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tpuctl.errors import RunFailedError, TpuctlError
from tpuctl.hosts.base import (
    EventQueue,
    HostEvent,
    HostPlan,
    LaunchSpec,
    ShipResult,
    decode_line,
)
from tpuctl.hosts.bundle import COMPLETE_MARKER, Bundle

if TYPE_CHECKING:
    import asyncssh

T = TypeVar("T")

KEY_NAME = "tpuctl_ed25519"
DEFAULT_USERNAME = "tpuctl"
_CONNECT_TIMEOUT_S = 20.0
_SHIP_TIMEOUT_S = 300.0
_COMMAND_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class SshHost:
    address: str
    port: int = 22


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_openssh: str  # "ssh-ed25519 AAAA... tpuctl"


def ensure_key_pair(state_dir: Path) -> KeyPair:
    """The tpuctl-managed key pair of this state dir, generated on first use (private key 0600)."""
    import asyncssh

    from tpuctl.store.paths import ensure_private_dir

    directory = ensure_private_dir(state_dir / "ssh")
    private = directory / KEY_NAME
    public = directory / (KEY_NAME + ".pub")
    if not private.exists():
        key = asyncssh.generate_private_key("ssh-ed25519", comment="tpuctl")
        data = key.export_private_key()
        # O_EXCL: two tpuctl commands generating at once must not interleave two keys in one file.
        try:
            fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            public.write_bytes(key.export_public_key())
    os.chmod(private, 0o600)
    loaded = asyncssh.read_private_key(str(private))
    return KeyPair(private, loaded.export_public_key().decode("ascii").strip())


def ssh_keys_metadata(username: str, public_openssh: str) -> str:
    """The value of a TPU VM's ``ssh-keys`` metadata item: ``USER:KEYTYPE KEY COMMENT``."""
    return f"{username}:{public_openssh}"


def _q(value: str) -> str:
    return shlex.quote(value)


@dataclass
class _Remote:
    worker: int
    host: SshHost
    conn: asyncssh.SSHClientConnection | None = None
    process: asyncssh.SSHClientProcess[bytes] | None = None
    done: asyncio.Event | None = None
    pidfile: str = ""
    pump: asyncio.Future[None] | None = None


class SshExecutor:
    """Runs the program on every worker of a slice over SSH. See ``executors.base.Executor``."""

    def __init__(
        self,
        hosts: Sequence[SshHost],
        *,
        username: str,
        key: KeyPair,
        remote_root: str = ".tpuctl",
        python: str = "python3",
        connect_timeout_s: float = _CONNECT_TIMEOUT_S,
    ) -> None:
        if not hosts:
            raise ValueError("SshExecutor needs at least one host")
        self._hosts = [_Remote(i, h) for i, h in enumerate(hosts)]
        self._username = username
        self._key = key
        self._root = remote_root.rstrip("/") or "/"
        self._python = python
        self._connect_timeout_s = connect_timeout_s
        self._events = EventQueue()
        self._digest: str | None = None
        # The event loop thread starts on first use, so that plan() (--dry-run) has no side effects.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._closed = False

    @property
    def num_hosts(self) -> int:
        return len(self._hosts)

    # --- plumbing ----------------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="tpuctl-ssh", daemon=True)
            self._thread.start()
        return self._loop

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    async def _connect(self, remote: _Remote) -> asyncssh.SSHClientConnection:
        import asyncssh

        if remote.conn is not None:
            return remote.conn

        async def connect() -> asyncssh.SSHClientConnection:
            return await asyncssh.connect(
                remote.host.address,
                remote.host.port,
                username=self._username,
                client_keys=[str(self._key.private_path)],
                known_hosts=None,
                agent_path=None,
                config=None,
                keepalive_interval=10,
                keepalive_count_max=3,
            )

        try:
            remote.conn = await asyncio.wait_for(connect(), timeout=self._connect_timeout_s)
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise RunFailedError(
                f"cannot reach host {remote.worker} at {self._where(remote)}: {exc or type(exc).__name__}",
                worker=remote.worker,
                fix="check that the slice is READY and that tpuctl's key is in its ssh-keys metadata "
                "(`tpuctl pod describe`)",
            ) from None
        return remote.conn

    def _where(self, remote: _Remote) -> str:
        return f"{self._username}@{remote.host.address}:{remote.host.port}"

    def _bundle_path(self, digest: str) -> str:
        return f"{self._root}/bundles/{digest}"

    # --- ship --------------------------------------------------------------------------------------

    def ship(self, bundle: Bundle) -> list[ShipResult]:
        payload = bundle.tar_gz()

        async def all_hosts() -> list[ShipResult]:
            return list(
                await asyncio.gather(*(self._ship_one(r, bundle.digest, payload) for r in self._hosts))
            )

        results = self._call(all_hosts(), _SHIP_TIMEOUT_S + self._connect_timeout_s)
        self._digest = bundle.digest
        return results

    async def _ship_one(self, remote: _Remote, digest: str, payload: bytes) -> ShipResult:
        started = time.monotonic()
        conn = await self._connect(remote)
        target = self._bundle_path(digest)
        marker = f"{target}/{COMPLETE_MARKER}"
        probe = await conn.run(f"cat {_q(marker)} 2>/dev/null", check=False, timeout=_COMMAND_TIMEOUT_S)
        if str(probe.stdout or "").strip() == digest:
            return ShipResult(remote.worker, False, 0, time.monotonic() - started)
        staging = f"{target}.tmp-{secrets.token_hex(4)}"
        command = (
            f"mkdir -p {_q(staging)} && tar -xzf - -C {_q(staging)} && rm -rf {_q(target)} "
            f"&& mv {_q(staging)} {_q(target)} || {{ rc=$?; rm -rf {_q(staging)}; exit $rc; }}"
        )
        result = await conn.run(command, input=payload, encoding=None, check=False, timeout=_SHIP_TIMEOUT_S)
        if result.exit_status != 0:
            stderr = result.stderr.decode("utf-8", "replace") if isinstance(result.stderr, bytes) else ""
            raise RunFailedError(
                f"shipping the bundle to host {remote.worker} ({self._where(remote)}) failed "
                f"(exit {result.exit_status}): {stderr.strip()[:300]}",
                worker=remote.worker,
                fix="check the host's free disk space and that `tar` is installed",
            )
        return ShipResult(remote.worker, True, len(payload), time.monotonic() - started)

    # --- plan and start ----------------------------------------------------------------------------

    def plan(self, spec: LaunchSpec, *, digest: str | None = None) -> list[HostPlan]:
        if spec.num_workers != self.num_hosts:
            raise ValueError(f"spec is for {spec.num_workers} workers, the slice has {self.num_hosts}")
        chosen = digest or self._digest or "<bundle-sha256>"
        bundle = self._bundle_path(chosen)
        run_dir = f"{self._root}/runs/{spec.run_id}"
        plans = []
        for remote in self._hosts:
            env = spec.contract_env(remote.worker)
            env.update(spec.user_env)
            argv = (self._python, "-u", *spec.program)
            pidfile = f"{run_dir}/worker-{remote.worker}.pid"
            assignments = " ".join(_q(f"{k}={v}") for k, v in env.items())
            command = (
                f"mkdir -p {_q(run_dir)} && echo $$ > {_q(pidfile)} && cd {_q(bundle)} && "
                # PYTHONPATH is the bundle's absolute path, known only on the host: "$PWD" after cd.
                f'exec env {assignments} PYTHONPATH="$PWD" {" ".join(_q(a) for a in argv)}'
            )
            plans.append(
                HostPlan(
                    worker=remote.worker,
                    where=self._where(remote),
                    cwd=bundle,
                    argv=argv,
                    env={**env, "PYTHONPATH": f"<{bundle}>"},
                    shell_command=command,
                )
            )
        return plans

    def start(self, spec: LaunchSpec) -> None:
        if self._digest is None:
            raise RuntimeError("ship() the bundle before start()")
        if self._started:
            raise RuntimeError("this executor already started its hosts")
        self._started = True
        plans = self.plan(spec)
        run_dir = f"{self._root}/runs/{spec.run_id}"

        async def all_hosts() -> None:
            await asyncio.gather(
                *(self._start_one(r, p, run_dir) for r, p in zip(self._hosts, plans, strict=True))
            )

        try:
            self._call(all_hosts(), self._connect_timeout_s + _COMMAND_TIMEOUT_S)
        except BaseException:
            self.stop(grace_s=1.0)
            raise

    async def _start_one(self, remote: _Remote, plan: HostPlan, run_dir: str) -> None:
        import asyncssh

        conn = await self._connect(remote)
        assert plan.shell_command is not None
        remote.pidfile = f"{run_dir}/worker-{remote.worker}.pid"
        remote.done = asyncio.Event()
        remote.process = await conn.create_process(
            plan.shell_command, stdin=asyncssh.DEVNULL, stderr=asyncssh.STDOUT, encoding=None
        )
        # Keep a reference: the loop holds tasks only weakly, and a collected pump would lose the host.
        remote.pump = asyncio.ensure_future(self._pump(remote))

    async def _pump(self, remote: _Remote) -> None:
        process = remote.process
        assert process is not None and remote.done is not None
        returncode: int | None = None
        try:
            while True:
                raw = await process.stdout.readline()
                if not raw:
                    break
                self._events.put(HostEvent(remote.worker, "line", decode_line(raw)))
            completed = await process.wait()
            if completed.exit_status is not None and completed.exit_status >= 0:
                returncode = completed.exit_status
            elif completed.exit_signal:
                returncode = -_signal_number(completed.exit_signal[0])
        except Exception as exc:
            self._events.put(HostEvent(remote.worker, "line", f"[tpuctl] connection to host lost: {exc}"))
        finally:
            remote.done.set()
            self._events.put(HostEvent(remote.worker, "exit", returncode=returncode))

    def next_event(self, timeout_s: float) -> HostEvent | None:
        return self._events.get(timeout_s)

    # --- stop and close ----------------------------------------------------------------------------

    def stop(self, grace_s: float = 5.0) -> None:
        if self._loop is None or self._loop.is_closed():
            return
        # Bounded: a host that could not be reached is reported by its exit event.
        with contextlib.suppress(TimeoutError, TpuctlError):
            self._call(self._stop_all(grace_s), grace_s + 2 * _COMMAND_TIMEOUT_S)

    async def _stop_all(self, grace_s: float) -> None:
        live = [r for r in self._hosts if r.done is not None and not r.done.is_set()]
        if not live:
            return
        await asyncio.gather(*(self._signal(r, "TERM") for r in live))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in live if r.done)), timeout=grace_s)
        still = [r for r in live if r.done is not None and not r.done.is_set()]
        await asyncio.gather(*(self._signal(r, "KILL") for r in still))
        for r in still:
            if r.process is not None:
                r.process.close()  # closes the channel: the pump sees EOF and reports the exit

    async def _signal(self, remote: _Remote, name: str) -> None:
        if remote.conn is None or not remote.pidfile:
            return
        # The pid file holds the session leader's pid, which is also its process group id.
        command = f'pid=$(cat {_q(remote.pidfile)}) && kill -{name} "-$pid" 2>/dev/null; true'
        with contextlib.suppress(Exception):
            await remote.conn.run(command, check=False, timeout=_COMMAND_TIMEOUT_S)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loop is None:
            return
        self.stop(grace_s=1.0)

        async def disconnect() -> None:
            for remote in self._hosts:
                if remote.conn is not None:
                    remote.conn.close()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(remote.conn.wait_closed(), timeout=2.0)

        with contextlib.suppress(TimeoutError):
            self._call(disconnect(), 10.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():
                return  # a stuck callback: leave the daemon thread; the process exit ends it
        self._loop.close()


def _signal_number(name: str) -> int:
    import signal

    try:
        return int(signal.Signals["SIG" + name.upper().removeprefix("SIG")])
    except KeyError:
        return 1
