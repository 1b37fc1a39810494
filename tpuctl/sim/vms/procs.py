"""Every process of a simulated VM, found through /proc, signalled; a dead VM's disk wiped.

A process belongs to host ``(uid, worker)`` when its environment carries the marker the sshd sets on
every session (``TPUCTL_SIM_VM=<uid>/<worker>``, inherited by whatever the session starts, detached or
not) or when its working directory is under the host's disk (a program that scrubbed its environment).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
from collections.abc import Callable, Iterable
from pathlib import Path

from tpuctl.sim.vms.layout import VM_MARKER, disk_dir, marker, parse_disk_name

_PROC = Path("/proc")
#: What a wiped disk is renamed to carry, until its files are removed.
WIPING = ".wiping-"
_DISCARD_ROUNDS = 20


def vm_pids(uid: str, worker: int, disk: Path) -> list[int]:
    """The pids of every live process of the host (never this process)."""
    needle = f"{VM_MARKER}={marker(uid, worker)}".encode() + b"\0"
    disk_prefix = os.path.realpath(disk) + os.sep
    found: list[int] = []
    me = os.getpid()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        if _has_marker(entry, needle) or _cwd_under(entry, disk_prefix):
            found.append(int(entry.name))
    return found


def _has_marker(entry: Path, needle: bytes) -> bool:
    try:
        # The environ block is NUL-separated; a leading NUL makes the match exact at a boundary.
        return needle in b"\0" + (entry / "environ").read_bytes()
    except OSError:
        return False


def _cwd_under(entry: Path, disk_prefix: str) -> bool:
    try:
        return (os.readlink(entry / "cwd") + os.sep).startswith(disk_prefix)
    except OSError:
        return False


def signal_vm(uid: str, worker: int, disk: Path, sig: signal.Signals) -> int:
    """Send ``sig`` to every process of the host; returns how many were signalled."""
    sent = 0
    for pid in vm_pids(uid, worker, disk):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            sent += 1
    return sent


def kill_vm(vm_root: Path, uid: str, worker: int, *, wipe: bool) -> None:
    """SIGKILL every process of the host; with ``wipe``, its disk goes too (a preempted or deleted VM's
    disk is gone on Google's side as well)."""
    disk = disk_dir(vm_root, uid, worker)
    signal_vm(uid, worker, disk, signal.SIGKILL)
    if wipe:
        wipe_disk(disk)


def wipe_disk(disk: Path) -> None:
    """The disk is gone at once: renamed out of its name, so no later session, program or VM of the
    same name finds a file of it. Its files are removed afterwards by ``reap_wiped_disks`` (the
    fleet's reaper thread): a set-up host holds tens of thousands of files (its environments), removing
    them takes seconds on a busy machine, and this runs inside the simulator's database transaction that
    made the VM die, so every API request (the delete's own operation poll among them) would wait."""
    # The name is unique: two processes (or a preemption and a delete) may wipe the same disk at once.
    doomed = disk.with_name(f"{disk.name}{WIPING}{os.getpid()}-{secrets.token_hex(4)}")
    with contextlib.suppress(FileNotFoundError):
        os.replace(disk, doomed)


def reap_wiped_disks(disks: Path) -> int:
    """Remove the files of every disk ``wipe_disk`` took away under ``disks``; returns how many went."""
    reaped = 0
    for entry in disks.iterdir() if disks.is_dir() else ():
        if WIPING in entry.name:
            shutil.rmtree(entry, ignore_errors=True)
            reaped += 1
    return reaped


def signal_hosts(vm_root: Path, hosts: Iterable[tuple[str, int]], sig: signal.Signals, *, wipe: bool) -> None:
    """``sig`` to every process of each ``(uid, worker)`` host; SIGKILL with ``wipe`` also wipes."""
    for uid, worker in hosts:
        if sig is signal.SIGKILL:
            kill_vm(vm_root, uid, worker, wipe=wipe)
        else:
            signal_vm(uid, worker, disk_dir(vm_root, uid, worker), sig)


def discard_vms(vm_root: Path, *, remove: Callable[[Path], None] | None = None) -> int:
    """SIGKILL every process of every VM under ``vm_root`` and remove the root (disks and image): what a
    simulator state's VMs leave behind when the state itself is thrown away (a test's teardown).
    ``remove`` removes the root once nothing runs there (default: at once, here). Returns how many
    processes were killed."""
    from tpuctl.sim.hypervisor import stop_hypervisor

    killed = 0
    # Again while the root is there: a hypervisor a command spawned just before may take the lock (and
    # write into the root) while it is being removed; one that starts later finds no root and exits.
    for _ in range(_DISCARD_ROUNDS):
        stop_hypervisor(vm_root)  # first: it would serve the VMs again
        disks = vm_root / "disks"
        for disk in disks.iterdir() if disks.is_dir() else ():
            parsed = parse_disk_name(disk.name)
            if parsed is not None:
                killed += signal_vm(*parsed, disk, signal.SIGKILL)
        if remove is None:
            shutil.rmtree(vm_root, ignore_errors=True)
        else:
            remove(vm_root)
        if not vm_root.exists():
            break
    return killed
