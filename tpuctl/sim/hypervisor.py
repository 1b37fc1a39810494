"""The hypervisor: the one long-lived process per simulator state that runs its VMs and its network.

On Google a VM does not depend on the command that created it, and neither does the network around it.
So it is here: every simulator that serves the API over a state (a CLI command's in-process one, a
detached supervisor's, ``tpuctl sim serve``) only makes sure this process runs
(``ensure_hypervisor``); the hypervisor serves the VMs of READY nodes (``Fleet``) and the network
around them (``NetworkServices``: the simulated APIs at the network's own address, the storage emulator
and the package mirror), reconciling with the state every
``_TICK_S``. No VM is handed from one process to another when a command exits.

One per state: it holds an exclusive ``flock`` on ``hypervisor.lock`` in the state's VM root for its
whole life; a second one started at the same time finds the lock taken and exits. It exits on SIGTERM
(``stop_hypervisor``, a test's teardown), when its state or VM root is removed, or after
``idle_exit_s`` with no node whose VMs it serves. The VMs' own processes outlive it (its listeners
close; a later hypervisor serves the same disks again). When it exits with no disk left to serve, it
removes its VM root (image, log and all) from the temp dir.

Run as ``python -m tpuctl.sim.hypervisor --state-dir DIR --ssh-port P --metadata-port P --wheelhouse
DIR``; its output goes to ``hypervisor.log`` in the VM root.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tpuctl.sim.vms.layout import STATE_DIR_FILE, services_address, vm_root_for

LOCK_FILE = "hypervisor.lock"
PID_FILE = "hypervisor.pid"
LOG_FILE = "hypervisor.log"
_TICK_S = 0.05
#: How long a freshly started hypervisor tries for the lock: a spawner checks it with a brief lock of
#: its own, which must not make the hypervisor it starts give up.
_LOCK_TRIES_S = 2.0
_DEFAULT_IDLE_EXIT_S = 600.0
#: How long an exiting hypervisor waits for its image build to end before it removes the VM root (one
#: still building would write into a root removed under it); past this the root is left to a later one.
_IMAGE_SETTLE_S = 3.0


def ensure_hypervisor(
    state_dir: Path, *, ports: tuple[int, int], wheelhouse: Path, idle_exit_s: float = _DEFAULT_IDLE_EXIT_S
) -> bool:
    """Start the hypervisor of ``state_dir`` in the background unless one runs; returns whether this call
    started one. Returns at once: the hypervisor brings its network and VMs up on its own."""
    vm_root = vm_root_for(state_dir)
    if _lock_is_held(vm_root / LOCK_FILE):
        return False
    vm_root.mkdir(parents=True, exist_ok=True)
    os.chmod(vm_root, 0o700)
    (vm_root / STATE_DIR_FILE).write_text(str(state_dir), encoding="utf-8")
    command = [
        sys.executable, "-m", "tpuctl.sim.hypervisor",
        "--state-dir", str(state_dir),
        "--ssh-port", str(ports[0]),
        "--metadata-port", str(ports[1]),
        "--wheelhouse", str(wheelhouse),
        "--idle-exit-s", str(idle_exit_s),
    ]  # fmt: skip
    with open(vm_root / LOG_FILE, "ab") as log:
        # Its own session: a Ctrl-C in the terminal of the command that started it is not its business.
        subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
        )
    return True


def stop_hypervisor(vm_root: Path, *, timeout_s: float = 5.0) -> bool:
    """SIGTERM the hypervisor of ``vm_root`` (SIGKILL after ``timeout_s``); returns whether one ran."""
    deadline = time.monotonic() + timeout_s
    # A hypervisor that has just taken the lock may not have written its pid yet.
    while (pid := hypervisor_pid(vm_root)) is None:
        if not _lock_is_held(vm_root / LOCK_FILE) or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    while _lock_is_held(vm_root / LOCK_FILE):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    return True


def hypervisor_pid(vm_root: Path) -> int | None:
    """The pid of the hypervisor running over ``vm_root`` (None when none holds the lock)."""
    if not _lock_is_held(vm_root / LOCK_FILE):
        return None
    try:
        return int((vm_root / PID_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _lock_is_held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock this check took
    return False


@contextlib.contextmanager
def _held_lock(path: Path) -> Iterator[bool]:
    """Hold ``path``'s lock while the block runs; yields False (holding nothing) when another process
    keeps it for ``_LOCK_TRIES_S``."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except FileNotFoundError:  # the VM root was removed (the state thrown away) before this started
        yield False
        return
    try:
        deadline = time.monotonic() + _LOCK_TRIES_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.05)
        yield True
    finally:
        os.close(fd)


def serve(state_dir: Path, *, ports: tuple[int, int], wheelhouse: Path, idle_exit_s: float) -> int:
    """Run the hypervisor of ``state_dir`` in this process until it is told to stop or has nothing left
    to serve; returns the exit status."""
    vm_root = vm_root_for(state_dir)
    os.umask(0o077)  # disks, buckets, logs: owner-only, as the state dir is
    with _held_lock(vm_root / LOCK_FILE) as held:
        if not held:
            return 0  # another hypervisor serves this state, or the state is gone
        (vm_root / PID_FILE).write_text(str(os.getpid()), encoding="utf-8")
        root_inode = os.stat(vm_root).st_ino  # the root this hypervisor serves (and may remove)
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        signal.signal(signal.SIGINT, lambda *_: stopping.set())
        settled = _run(state_dir, vm_root, ports, wheelhouse, idle_exit_s, stopping)
        with contextlib.suppress(FileNotFoundError):
            (vm_root / PID_FILE).unlink()
        if settled:  # still holding the lock: no other hypervisor uses the root
            _remove_unless_disks_remain(vm_root, root_inode)
    return 0


def _remove_unless_disks_remain(vm_root: Path, inode: int) -> None:
    """After a normal exit, the VM root goes from the temp dir (its image alone is ~17 MB per state)
    unless a disk in it is still a node's: a stopped node's, or a READY one's when told to stop (its VM
    outlives this process, and a later hypervisor serves the same disk). Disks already wiped do not
    count. Only the root this hypervisor served (``inode``): one made anew at the same path since (the
    state thrown away and made again) is another hypervisor's. Renamed away first, atomically: a
    hypervisor started for the same state from then on makes a fresh root, never one half removed under
    it."""
    from tpuctl.sim.vms.layout import parse_disk_name

    disks = vm_root / "disks"
    try:
        if os.stat(vm_root).st_ino != inode:
            return
        if disks.is_dir() and any(parse_disk_name(entry.name) for entry in disks.iterdir()):
            return
    except FileNotFoundError:
        return  # removed with its state already
    doomed = vm_root.with_name(f"{vm_root.name}.gone-{os.getpid()}")
    try:
        os.rename(vm_root, doomed)
    except OSError:
        return  # already gone (the state thrown away with it), or not ours to move
    shutil.rmtree(doomed, ignore_errors=True)


def _run(
    state_dir: Path,
    vm_root: Path,
    ports: tuple[int, int],
    wheelhouse: Path,
    idle_exit_s: float,
    stopping: threading.Event,
) -> bool:
    """Serve until told to stop, idle or thrown away; returns whether nothing of this process writes
    below the VM root any more (the image build may still be running)."""
    from tpuctl.sim.engine import SimEngine
    from tpuctl.sim.fetch_through import fetch_through_for
    from tpuctl.sim.network import NetworkServices
    from tpuctl.sim.state import SimDatabase, db_path_for
    from tpuctl.sim.storage import storage_dir_for
    from tpuctl.sim.vms import procs
    from tpuctl.sim.vms.fleet import Fleet

    db_path = db_path_for(state_dir)
    try:
        # What "the same state" is: these two files. Either removed (a new one at the same path has
        # another inode) and this hypervisor has nothing left to serve.
        identity = (os.stat(db_path).st_ino, os.stat(vm_root).st_ino)
    except FileNotFoundError:
        return False  # nothing was served: the state is being made or thrown away by someone else
    db = SimDatabase(db_path)
    engine = SimEngine(db, clock=time.time)
    network = NetworkServices(
        services_address(state_dir),
        storage_dir=storage_dir_for(state_dir),
        wheelhouse=wheelhouse,
        world=lambda: engine.world,
        # This process's environment is the one of the command that started it: the user's pip/uv.
        fetch_through=fetch_through_for(state_dir, lambda: engine.world, os.environ, Path.home()),
        # The APIs on the network's own address, known before anything binds (``network.env`` says it
        # to every login): the VMs reach them there, whichever API server (a command's, `sim serve`)
        # runs or has gone, as a Google VM reaches googleapis.com whatever laptop created it.
        engine=engine,
    )
    try:
        engine.ctx.vm_ports = ports
        network.start()
        fleet = Fleet(engine, ports=ports, network_env=network.env, network_ready=network.ready)
        fleet.start()
        idle_since = time.monotonic()
        reported: set[str] = set()
        try:
            while not stopping.wait(_TICK_S):
                if _identity(db_path, vm_root) != identity:
                    break  # the state was thrown away
                try:
                    fleet.reconcile()
                except Exception as exc:  # a busy database: the next tick tries again
                    fleet.last_error = exc
                _report(fleet.last_error, network.last_error, reported=reported)
                if fleet.served() or not fleet.image_ready():
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > idle_exit_s:
                    break
        finally:
            fleet.stop()
            if not stopping.is_set():  # an idle exit leaves no wiped disk's files behind
                procs.reap_wiped_disks(vm_root / "disks")
        # Within the 5 s stop_hypervisor grants before its SIGKILL.
        return fleet.image_settled(timeout=_IMAGE_SETTLE_S)
    finally:
        network.stop()
        db.close()


def _identity(db_path: Path, vm_root: Path) -> tuple[int, int] | None:
    try:
        return os.stat(db_path).st_ino, os.stat(vm_root).st_ino
    except FileNotFoundError:
        return None


def _report(*errors: BaseException | None, reported: set[str]) -> None:
    """Each distinct error once, to the hypervisor's log (what a VM that never comes up points at)."""
    for error in errors:
        text = repr(error)
        if error is not None and text not in reported:
            reported.add(text)
            print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuctl.sim.hypervisor", description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--ssh-port", type=int, required=True)
    parser.add_argument("--metadata-port", type=int, required=True)
    parser.add_argument("--wheelhouse", type=Path, required=True)
    parser.add_argument("--idle-exit-s", type=float, default=_DEFAULT_IDLE_EXIT_S)
    args = parser.parse_args(argv)
    return serve(
        args.state_dir,
        ports=(args.ssh_port, args.metadata_port),
        wheelhouse=args.wheelhouse,
        idle_exit_s=args.idle_exit_s,
    )


if __name__ == "__main__":
    sys.exit(main())
