"""The fleet: every simulated VM this simulator process serves, reconciled with the state on each tick.

A host of a READY node (one in its preemption notice's grace included) is served: its disk exists, its
sshd and metadata server listen on its address. Any other host is not: its listeners close, and its
processes are killed. A disk lives until its node is deleted, preempted or re-created (a new node has a
new uid, so a new disk); a stopped node keeps its disks. A dead VM's disk is renamed away at once, and
its files are removed by the fleet's reaper thread. An address already in use (EADDRINUSE) is
another process of this simulator serving that host (`tpuctl sim serve` beside a CLI's in-process
simulator): it is tried again at the next tick.

One asyncio loop thread holds every sshd; each metadata server is a ThreadingHTTPServer. Nothing here
runs in ``SimServer.start()``: the image is built on a thread of its own, and the VMs come up on the
ticker thread's ``reconcile()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from tpuctl.sim.engine import SimEngine
from tpuctl.sim.engine.records import host_addresses
from tpuctl.sim.vms import procs
from tpuctl.sim.vms.disks import create_disk, ensure_image, image_dir
from tpuctl.sim.vms.layout import STATE_DIR_FILE, disk_dir, host_key_path, parse_disk_name
from tpuctl.sim.vms.metadata_http import MetadataServer
from tpuctl.sim.vms.sshd import HostRef, LoginSetup, login_env, serve
from tpuctl.sim.vms.systemctl import boot_user_units

#: How often wiped disks' files are looked for and removed.
_REAP_TICK_S = 0.2
#: Node states whose VMs have lost their disks (preempted hard-off, being deleted).
_DISKLESS_STATES = frozenset({"PREEMPTED", "DELETING", "TERMINATED"})


@dataclass
class _Served:
    host: HostRef
    sshd: asyncssh.SSHAcceptor
    metadata: MetadataServer


class Fleet:
    """The VMs of one simulator state served by this process. Thread-safe: ``reconcile`` and ``stop``
    may be called from any thread (never concurrently with themselves: the ticker calls reconcile)."""

    def __init__(
        self,
        engine: SimEngine,
        *,
        ports: tuple[int, int],
        network_env: Mapping[str, str] | None = None,
        network_ready: Callable[[], bool] | None = None,
    ) -> None:
        """``network_ready``: whether the simulated network answers; no VM is served before it does."""
        self.engine = engine
        self._network_ready = network_ready
        self._network_seen = False
        self.vm_root: Path = engine.ctx.vm_root
        self.ssh_port, self.metadata_port = ports
        self._setup = LoginSetup(image_dir(self.vm_root), self.metadata_port, dict(network_env or {}))
        self._served: dict[tuple[str, int], _Served] = {}
        self._by_address: dict[str, tuple[str, str, str, int]] = {}
        self._lock = threading.RLock()
        self._image_ready = threading.Event()
        self._reaper_halt = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._image_builder: threading.Thread | None = None
        self.last_error: BaseException | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the sshd loop and build the image, both in the background (returns at once)."""
        if self._loop is not None:
            return
        self.vm_root.mkdir(parents=True, exist_ok=True)
        (self.vm_root / STATE_DIR_FILE).write_text(str(self.engine.ctx.state_dir), encoding="utf-8")
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="tpuctl-sim-sshd", daemon=True).start()
        self._image_builder = threading.Thread(target=self._build_image, name="tpuctl-sim-image", daemon=True)
        self._image_builder.start()
        self._reaper_halt.clear()
        threading.Thread(target=self._reap, name="tpuctl-sim-disk-reaper", daemon=True).start()

    def _reap(self) -> None:
        """Remove wiped disks' files (``wipe_disk`` only renames a disk away) on a thread of its own:
        that takes seconds per set-up host on a busy machine, and on the reconcile tick it would hold up
        the VMs of the next slice."""
        while not self._reaper_halt.wait(_REAP_TICK_S):
            try:
                procs.reap_wiped_disks(self.vm_root / "disks")
            except OSError as exc:  # the state thrown away under it: the next tick (if any) sees
                self.last_error = exc

    def _build_image(self) -> None:
        try:
            ensure_image(self.vm_root)
        except Exception as exc:  # no image: the VMs never come up; say why in last_error
            self.last_error = exc
            return
        self._image_ready.set()

    def image_settled(self, timeout: float) -> bool:
        """Whether the image build is over (built or failed), waiting up to ``timeout``: until then it
        may still write below the VM root."""
        builder = self._image_builder
        if builder is not None:
            builder.join(timeout)
        return builder is None or not builder.is_alive()

    def wait_image(self, timeout: float) -> bool:
        return self._image_ready.wait(timeout)

    def image_ready(self) -> bool:
        return self._image_ready.is_set()

    def stop(self) -> None:
        """Close every listener; the VMs' processes keep running (a VM outlives the simulator process
        that served it)."""
        with self._lock:
            for served in list(self._served.values()):
                self._close(served)
            self._served.clear()
            self._by_address.clear()
        self._reaper_halt.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None

    # --- reconciling -----------------------------------------------------------------------------

    def host_of(self, address: str) -> tuple[str, str, str, int] | None:
        """(project, zone, node, worker) of the host served on ``address``."""
        return self._by_address.get(address)

    def served(self) -> list[HostRef]:
        with self._lock:
            return [s.host for s in self._served.values()]

    def reconcile(self) -> None:
        """Serve the hosts that should be, stop the others, wipe disks whose VMs are gone."""
        if not self._image_ready.is_set() or self._loop is None:
            return
        if not self._network_seen and self._network_ready is not None:
            self._network_seen = self._network_ready()
            if not self._network_seen:
                return
        wanted, keep = self._wanted()
        with self._lock:
            for key in [k for k in self._served if k not in wanted]:
                served = self._served.pop(key)
                self._by_address.pop(served.host.address, None)
                self._close(served)
                procs.kill_vm(
                    self.vm_root, served.host.uid, served.host.worker, wipe=served.host.uid not in keep
                )
            for key, host in wanted.items():
                if key not in self._served:
                    self._bring_up(host)
        self._sweep(keep)

    def _wanted(self) -> tuple[dict[tuple[str, int], HostRef], set[str]]:
        with self.engine.db.read() as conn:
            rows = conn.execute(
                "SELECT project, zone, node_id, uid, hosts, state, host_base FROM nodes"
            ).fetchall()
        wanted: dict[tuple[str, int], HostRef] = {}
        keep: set[str] = set()
        for row in rows:
            uid = str(row["uid"])
            if row["state"] not in _DISKLESS_STATES:
                keep.add(uid)
            if row["state"] != "READY" or row["host_base"] is None:
                continue
            for worker, address in enumerate(host_addresses(row)):
                disk = disk_dir(self.vm_root, uid, worker)
                wanted[(uid, worker)] = HostRef(
                    row["project"], row["zone"], row["node_id"], uid, worker, address, disk
                )
        return wanted, keep

    def _bring_up(self, host: HostRef) -> None:
        assert self._loop is not None
        create_disk(host.disk)
        key = asyncssh.read_private_key(str(host_key_path(host.disk)))
        try:
            metadata = MetadataServer((host.address, self.metadata_port), self.engine, self.host_of)
        except OSError as exc:
            self._note_bind_error(exc)
            return
        future = asyncio.run_coroutine_threadsafe(
            serve(host, self.ssh_port, key, self._login_keys, self._setup), self._loop
        )
        try:
            sshd = future.result(timeout=10)
        except OSError as exc:
            metadata.server_close()
            self._note_bind_error(exc)
            return
        metadata.start()
        self._served[(host.uid, host.worker)] = _Served(host, sshd, metadata)
        # The VM boots: its lingering users' enabled units start, as systemd starts them.
        boot_user_units(host.disk, lambda user, home: login_env(host, user, home, self._setup))
        self._by_address[host.address] = (host.project, host.zone, host.node_id, host.worker)

    def _note_bind_error(self, exc: OSError) -> None:
        # EADDRINUSE: another process of this simulator serves the host; the next tick tries again.
        if exc.errno != errno.EADDRINUSE:
            self.last_error = exc

    def _login_keys(self, host: HostRef, username: str) -> list[str]:
        return self.engine.login_keys(host.project, host.zone, host.node_id, username)

    def _close(self, served: _Served) -> None:
        served.metadata.stop()
        if self._loop is not None:
            served.sshd.close()
            future = asyncio.run_coroutine_threadsafe(served.sshd.wait_closed(), self._loop)
            with contextlib.suppress(Exception):
                future.result(timeout=5)

    def _sweep(self, keep: set[str]) -> None:
        """Disks of VMs no node has any more (deleted while no process served them, a reset): their
        processes killed, the disks wiped."""
        disks = self.vm_root / "disks"
        if not disks.is_dir():
            return
        for entry in disks.iterdir():
            parsed = parse_disk_name(entry.name)
            if parsed is None or parsed[0] in keep:
                continue
            procs.signal_vm(*parsed, entry, signal.SIGKILL)
            procs.wipe_disk(entry)
