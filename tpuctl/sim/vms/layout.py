"""Where the simulated VMs live: their addresses, disks, image and ports.

Pure functions and constants; importing this module costs nothing (the engine uses it on every request).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path

#: Hosts are numbered into 127.16.0.1 .. 127.255.255.254, skipping .0 and .255 in the last octet (a
#: host part of all zeros or all ones reads as a network or broadcast address to some tools).
_PER_X = 256 * 254
ADDRESS_SPACE = (256 - 16) * _PER_X
#: Never a host's address: the one the port probe binds.
PROBE_ADDRESS = "127.16.0.0"
#: The environment marker the sshd sets on every session: ``<node uid>/<worker>``. Never a path.
VM_MARKER = "TPUCTL_SIM_VM"
#: The API's port in networkEndpoints (the TPU runtime's, as Google reports it).
ENDPOINT_PORT = 8470
SSH_PORTS = (22, 2222)
METADATA_PORTS = (80, 8080)


def host_address(index: int) -> str:
    """The loopback address of the host numbered ``index`` (wraps around the address space)."""
    i = index % ADDRESS_SPACE
    x, rest = divmod(i, _PER_X)
    y, z = divmod(rest, 254)
    return f"127.{16 + x}.{y}.{1 + z}"


def address_offset(state_dir: Path) -> int:
    """Where one simulator state's host numbering starts: two simulators (two state dirs) on one machine
    then almost never hand out the same address, and one state always hands out the same ones."""
    digest = hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()
    return int(digest[:12], 16) % ADDRESS_SPACE


#: The file in a VM root that names the state dir it belongs to (so a test can find its VMs).
STATE_DIR_FILE = "state-dir"


def vm_roots_of(parent: Path) -> list[Path]:
    """The VM roots (in the temp dir) of every simulator state below ``parent``."""
    found: list[Path] = []
    prefix = os.path.realpath(parent) + os.sep
    for root in Path(tempfile.gettempdir()).glob("tpuctl-sim-vms-*"):
        try:
            owner = (root / STATE_DIR_FILE).read_text(encoding="utf-8")
        except OSError:
            continue
        if (os.path.realpath(owner) + os.sep).startswith(prefix):
            found.append(root)
    return found


def services_address(state_dir: Path) -> str:
    """The loopback address of one simulator state's network services (Cloud Storage, the package
    mirror): fixed for the state, in 127.15.0.0/16, outside the hosts' range (127.16.0.0 and up)."""
    digest = int(hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:8], 16) % (256 * 254)
    y, z = divmod(digest, 254)
    return f"127.15.{y}.{1 + z}"


def vm_root_for(state_dir: Path) -> Path:
    """The VMs' root for the simulator whose state dir is ``state_dir`` (the dir holding ``sim/sim.db``):
    in the temp dir, never below the state dir, stable for one state."""
    digest = hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"tpuctl-sim-vms-{digest}"


def disk_name(uid: str, worker: int) -> str:
    return f"{uid}-{worker}"


def parse_disk_name(name: str) -> tuple[str, int] | None:
    """(node uid, worker) of a disk directory's name; None for anything else (a disk being wiped)."""
    uid, sep, worker = name.partition("-")
    return (uid, int(worker)) if sep and uid and worker.isdigit() else None


def disk_dir(vm_root: Path, uid: str, worker: int) -> Path:
    """Host ``worker`` of the node with unique id ``uid``: its disk (a new node, a new disk)."""
    return vm_root / "disks" / disk_name(uid, worker)


def marker(uid: str, worker: int) -> str:
    return f"{uid}/{worker}"


def host_key_path(disk: Path) -> Path:
    return disk / "etc" / "ssh" / "ssh_host_ed25519_key"


def read_host_public_key(disk: Path) -> str | None:
    """The host's OpenSSH public key line (``ssh-ed25519 AAAA...``), or None before the disk exists."""
    try:
        return host_key_path(disk).with_suffix(".pub").read_text().strip() or None
    except OSError:
        return None


def choose_port(candidates: Sequence[int], address: str = PROBE_ADDRESS) -> int:
    """The first of ``candidates`` this process can bind on a loopback ``address``; the last one when
    none can be probed (an unprivileged process cannot bind 22 or 80: EACCES)."""
    for port in candidates[:-1]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((address, port))
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EPERM, errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                    continue
                raise
            return port
    return candidates[-1]


@functools.cache
def chosen_ports() -> tuple[int, int]:
    """(ssh_port, metadata_port) for this process: 22 and 80 where it may bind them (root), else 2222
    and 8080. Decided once per process."""
    return choose_port(SSH_PORTS), choose_port(METADATA_PORTS)
