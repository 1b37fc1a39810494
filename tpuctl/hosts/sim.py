"""The simulator's executor: every simulated host is one local process.

Each host has a working directory under the state dir (``<hosts_root>/worker-N``) holding the bundles it
was sent, keyed by digest. Its process runs ``sys.executable`` in the bundle directory with the
environment of ``tpuctl.runtime.hostenv.sim_host_env`` (JAX on CPU with one device per chip, the
coordinator on a free loopback port, the simulator's per-host metadata URL), the worker environment
contract and the user's ``--env``. Every process leads its own process group (``start_new_session``),
so stopping a host kills whatever it spawned, and the terminal's Ctrl-C reaches only the launcher, which
then stops the hosts itself, in order.

Each pid is registered with the simulator (``HostRegistry``) so that a simulated preemption can
SIGTERM/SIGKILL it, as GCP's would the real host.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from tpuctl.hosts.base import (
    EventQueue,
    HostEvent,
    HostPlan,
    LaunchSpec,
    ShipResult,
    decode_line,
)
from tpuctl.hosts.bundle import COMPLETE_MARKER, Bundle
from tpuctl.runtime import hostenv

#: How long an exited host's reader may take to drain the pipe before its exit is reported anyway (a
#: grandchild that inherited stdout could keep it open forever).
_DRAIN_TIMEOUT_S = 2.0
#: After SIGKILL, how long to wait for the kernel to reap a host before giving up on it.
_KILL_WAIT_S = 3.0


class HostRegistry(Protocol):
    """Tells the simulator which local pid is which host of a node (its admin API)."""

    def register_host(self, zone: str, node: str, worker: int, pid: int) -> object: ...

    def unregister_hosts(self, zone: str, node: str) -> object: ...


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _inherited_env(base: Mapping[str, str]) -> dict[str, str]:
    # A simulated host sees what a real one would: no tpuctl settings of the launcher's shell (they
    # could point it at another state dir), and only the bundle on PYTHONPATH.
    return {k: v for k, v in base.items() if not k.startswith("TPUCTL_") and k != "PYTHONPATH"}


@dataclass
class _Host:
    worker: int
    proc: subprocess.Popen[bytes]
    reader: threading.Thread
    exited: threading.Event


class SimExecutor:
    """One local process per simulated host of one node. See ``executors.base.Executor``."""

    def __init__(
        self,
        hosts_root: Path,
        *,
        zone: str,
        node: str,
        num_hosts: int,
        registry: HostRegistry | None = None,
        metadata_base_url: str | None = None,
        python: str = sys.executable,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        if num_hosts < 1:
            raise ValueError(f"num_hosts must be >= 1, got {num_hosts}")
        self._root = hosts_root
        self._zone = zone
        self._node = node
        self._num_hosts = num_hosts
        self._registry = registry
        self._metadata_base = metadata_base_url.rstrip("/") if metadata_base_url else None
        self._python = python
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._events = EventQueue()
        self._hosts: dict[int, _Host] = {}
        self._digest: str | None = None
        self._coordinator_port: int | None = None
        self._lock = threading.Lock()
        self._registered = False
        self._closed = False

    # --- Executor ----------------------------------------------------------------------------------

    @property
    def num_hosts(self) -> int:
        return self._num_hosts

    def host_dir(self, worker: int) -> Path:
        return self._root / f"worker-{worker}"

    def bundle_dir(self, worker: int, digest: str) -> Path:
        return self.host_dir(worker) / "bundles" / digest

    def ship(self, bundle: Bundle) -> list[ShipResult]:
        results = []
        for worker in range(self._num_hosts):
            started = time.monotonic()
            target = self.bundle_dir(worker, bundle.digest)
            shipped = not _complete(target, bundle.digest)
            if shipped:
                if target.exists():
                    shutil.rmtree(target)  # a copy interrupted half way: never trust it
                staging = target.with_name(f".{target.name}.tmp-{secrets.token_hex(4)}")
                private_dirs(staging.parent)
                try:
                    bundle.write_to(staging)
                    staging.rename(target)
                finally:
                    if staging.exists():
                        shutil.rmtree(staging, ignore_errors=True)
            results.append(
                ShipResult(worker, shipped, bundle.total_bytes if shipped else 0, time.monotonic() - started)
            )
        self._digest = bundle.digest
        return results

    def plan(
        self, spec: LaunchSpec, *, coordinator_port: int | None = None, digest: str | None = None
    ) -> list[HostPlan]:
        self._check_spec(spec)
        port = coordinator_port or self._coordinator_port
        chosen = digest or self._digest or "<bundle-sha256>"
        plans = []
        for worker in range(self._num_hosts):
            bundle_dir = self.bundle_dir(worker, chosen)
            env = hostenv.sim_host_env(
                run_id=spec.run_id,
                worker_id=worker,
                num_workers=spec.num_workers,
                chips_per_host=spec.chips_per_host,
                coordinator_port=port or 1,  # replaced below: the port is picked at start
                accelerator_type=spec.accelerator_type,
                topology=spec.topology,
                checkpoint_dir=spec.checkpoint_dir,
                restart_count=spec.restart_count,
                bundle_dir=bundle_dir,
                metadata_url=self.metadata_url(worker),
            )
            if port is None:
                env[hostenv.COORDINATOR_ADDRESS] = "127.0.0.1:<a free port, chosen at start>"
            env.update(spec.contract_env(worker))
            env.update(spec.user_env)
            plans.append(
                HostPlan(
                    worker=worker,
                    where=f"simulated host {worker} of {self._node} ({self._zone}): a local process",
                    cwd=str(bundle_dir),
                    argv=(self._python, "-u", *spec.program),
                    env=env,
                )
            )
        return plans

    def metadata_url(self, worker: int) -> str | None:
        if self._metadata_base is None:
            return None
        return f"{self._metadata_base}/sim/metadata/{self._zone}/{self._node}/{worker}"

    def start(self, spec: LaunchSpec) -> None:
        if self._digest is None:
            raise RuntimeError("ship() the bundle before start()")
        if self._hosts:
            raise RuntimeError("this executor already started its hosts")
        self._coordinator_port = free_loopback_port()
        plans = self.plan(spec)
        try:
            for plan in plans:
                self._start_one(plan)
        except BaseException:
            self.stop(grace_s=1.0)
            raise

    def _start_one(self, plan: HostPlan) -> None:
        env = _inherited_env(self._base_env)
        env.update(plan.env)
        private_dirs(self.host_dir(plan.worker))
        proc = subprocess.Popen(
            list(plan.argv),
            cwd=plan.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # Its own session and process group: a stop reaches the whole tree, and the terminal's
            # Ctrl-C does not hit the hosts behind the launcher's back.
            start_new_session=True,
        )
        exited = threading.Event()
        reader = threading.Thread(
            target=self._pump, args=(plan.worker, proc, exited), name=f"sim-host-{plan.worker}", daemon=True
        )
        with self._lock:
            self._hosts[plan.worker] = _Host(plan.worker, proc, reader, exited)
        reader.start()
        if self._registry is not None:
            try:
                self._registry.register_host(self._zone, self._node, plan.worker, proc.pid)
            except Exception:
                # A program that already finished cannot be preempted any more: nothing to register.
                if proc.poll() is None:
                    raise
            self._registered = True

    def _pump(self, worker: int, proc: subprocess.Popen[bytes], exited: threading.Event) -> None:
        stream: IO[bytes] | None = proc.stdout
        assert stream is not None
        drained = threading.Event()

        def drain() -> None:
            try:
                for raw in iter(stream.readline, b""):
                    self._events.put(HostEvent(worker, "line", decode_line(raw)))
            except (OSError, ValueError):
                pass  # the pipe was closed under us by close(): nothing more to read
            finally:
                drained.set()

        threading.Thread(target=drain, name=f"sim-host-{worker}-out", daemon=True).start()
        returncode = proc.wait()
        drained.wait(_DRAIN_TIMEOUT_S)
        exited.set()
        self._events.put(HostEvent(worker, "exit", returncode=returncode))

    def next_event(self, timeout_s: float) -> HostEvent | None:
        return self._events.get(timeout_s)

    def stop(self, grace_s: float = 5.0) -> None:
        with self._lock:
            hosts = list(self._hosts.values())
        live = [h for h in hosts if h.proc.poll() is None]
        for host in live:
            _signal_group(host.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for host in live:
            host.exited.wait(max(0.0, deadline - time.monotonic()))
        # Kill every group, exited leaders included: a host's children must not outlive the run.
        for host in hosts:
            _signal_group(host.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + _KILL_WAIT_S
        for host in hosts:
            # An unkillable host (uninterruptible sleep) is left to the caller's pid checks.
            with contextlib.suppress(subprocess.TimeoutExpired):
                host.proc.wait(timeout=max(0.01, deadline - time.monotonic()))
        # SIGKILL is delivered at once but a process takes a moment to die; the children, orphaned to
        # init, are not ours to wait for, so watch the groups empty out instead.
        groups = {host.proc.pid for host in hosts}
        while groups and time.monotonic() < deadline:
            groups = _live_groups(groups)
            if groups:
                time.sleep(0.01)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop(grace_s=1.0)
        with self._lock:
            hosts = list(self._hosts.values())
        for host in hosts:
            host.exited.wait(_DRAIN_TIMEOUT_S + 1.0)
            if host.proc.stdout is not None:
                host.proc.stdout.close()
        if self._registry is not None and self._registered:
            with contextlib.suppress(Exception):
                self._registry.unregister_hosts(self._zone, self._node)

    # --- for tests and benchmarks ------------------------------------------------------------------

    def pids(self) -> dict[int, int]:
        """Worker -> pid of the host process (also after it exited)."""
        with self._lock:
            return {w: h.proc.pid for w, h in self._hosts.items()}

    def _check_spec(self, spec: LaunchSpec) -> None:
        if spec.num_workers != self._num_hosts:
            raise ValueError(f"spec is for {spec.num_workers} workers, the node has {self._num_hosts}")


def local_hosts(hosts_root: Path, run_id: str) -> list[int]:
    """Pids of the live processes started as simulated hosts of ``run_id`` under ``hosts_root`` (the state
    dir's ``sim-hosts``): the run id in their environment, their working directory below the root. Found
    from /proc alone (none without one), so also the hosts nobody recorded."""
    marker = f"{hostenv.RUN_ID}={run_id}".encode()
    root = os.path.realpath(hosts_root)
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for name in entries:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")  # fails for a zombie: nothing to stop there
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if (cwd == root or cwd.startswith(root + os.sep)) and marker in environ.split(b"\0"):
            found.append(int(name))
    return found


def _complete(directory: Path, digest: str) -> bool:
    try:
        return (directory / COMPLETE_MARKER).read_text(encoding="ascii").strip() == digest
    except OSError:
        return False


def _live_groups(pgids: set[int]) -> set[int]:
    """The process groups among ``pgids`` that still have a member that is not a zombie."""
    live: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return live  # no /proc: the leaders' wait above is all we can do
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        # fields[0] is the state (field 3), fields[2] the process group (field 5).
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) in pgids:
            live.add(int(fields[2]))
    return live


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def private_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents 0700 (they live in the private state dir)."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)
        d.chmod(0o700)
