"""The sshd of one simulated VM: an asyncssh server on the host's address.

Public-key authentication only; the keys accepted are asked of the engine at authentication time (the
node's ``ssh-keys`` metadata, or OS Login's imported keys). Each accepted login is recorded, as sshd logs
it, in the disk's ``var/log/auth.log`` (:func:`auth_log`): who logged in, from where, with which key.

A command runs as sshd runs it: through the user's login shell (``bash -l -c CMD``), in a session of its
own, in the user's home on the host's disk, with an environment built from scratch (nothing of the
simulator's). A lost channel hangs up the session's process group (SIGHUP), as the loss of a session does
under a real sshd.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from tpuctl.sim.vms.disks import home_dir, host_path
from tpuctl.sim.vms.layout import VM_MARKER, marker


@dataclass(frozen=True)
class HostRef:
    """One host of a node, and where its VM lives."""

    project: str
    zone: str
    node_id: str
    uid: str
    worker: int
    address: str
    disk: Path


#: Asked at authentication time: the ``keytype base64`` keys ``username`` may log in with on a host.
KeyLookup = Callable[[HostRef, str], list[str]]


@dataclass(frozen=True)
class LoginSetup:
    """What every session's environment is made of, beside the user and the host."""

    image: Path
    metadata_port: int
    network_env: Mapping[str, str]


def login_env(host: HostRef, user: str, home: Path, setup: LoginSetup) -> dict[str, str]:
    """The session's environment, from scratch (the contract's list, plus the VM marker), with the
    simulated network's variables (``tpuctl.sim.network.network_env``: its services, the simulated APIs
    among them)."""
    metadata = f"{host.address}:{setup.metadata_port}"
    return {
        **setup.network_env,
        "HOME": str(home),
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "PATH": host_path(setup.image, str(home)),
        # Where the VM's metadata server is, for each client library's own override of the name a real
        # VM resolves (metadata.google.internal, which the simulator cannot make resolve): google-auth reads
        # GCE_METADATA_HOST, JAX GCE_METADATA_IP, tensorstore (orbax's arrays) and gcloud
        # GCE_METADATA_ROOT. Without the last, tensorstore finds no credentials and says so on every host.
        "GCE_METADATA_HOST": metadata,
        "GCE_METADATA_IP": metadata,
        "GCE_METADATA_ROOT": metadata,
        # Which VM this is: how the simulator finds a VM's processes, and how a tpuctl on it knows it is
        # on one (``Settings.sim_vm``: it then calls as the VM's service account, from the metadata
        # server above, as on a Google VM).
        VM_MARKER: marker(host.uid, host.worker),
    }


def auth_log(disk: Path) -> Path:
    """Where a VM's sshd records the logins it accepted (one line each, as OpenSSH's "Accepted publickey
    for USER from ADDRESS port PORT ssh2: TYPE FINGERPRINT")."""
    return disk / "var" / "log" / "auth.log"


#: The destinations a port forward may name: the VM's own loopback.
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class _Server(asyncssh.SSHServer):
    def __init__(self, host: HostRef, keys: KeyLookup) -> None:
        self._host = host
        self._keys = keys
        self._peer = ("?", 0)
        self._accepted: tuple[str, asyncssh.SSHKey] | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        if not self._host.disk.is_dir():
            # Killed and wiped (preempted, deleted) but not yet closed by the next reconcile: a VM that
            # is gone answers nothing.
            conn.abort()
            return
        peer = conn.get_extra_info("peername") or ("?", 0)
        self._peer = (str(peer[0]), int(peer[1]))

    def auth_completed(self) -> None:
        if self._accepted is None:
            return
        user, key = self._accepted
        address, port = self._peer
        line = (
            f"Accepted publickey for {user} from {address} port {port} ssh2: "
            f"{key.algorithm.decode()} {key.get_fingerprint('sha256')}\n"
        )
        with contextlib.suppress(OSError):  # a disk wiped meanwhile records nothing
            path = auth_log(self._host.disk)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as log:
                log.write(line)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> bool:
        """A local port forward (``ssh -L``, direct-tcpip), as OpenSSH's default ``AllowTcpForwarding
        yes`` allows it: how a laptop reaches the team server on its VM's loopback. Stricter than a real
        sshd, which forwards to anywhere its VM reaches: only to the VM's loopback (the simulated VMs
        share this machine's, so that is where a VM's loopback service listens)."""
        return dest_host in _LOOPBACK

    def begin_auth(self, username: str) -> bool:
        return True  # authentication is always required

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        offered = key.public_data
        for line in self._keys(self._host, username):
            with contextlib.suppress(asyncssh.KeyImportError, ValueError):
                if asyncssh.import_public_key(line).public_data == offered:
                    self._accepted = (username, key)
                    return True
        return False


async def serve(
    host: HostRef,
    port: int,
    host_key: asyncssh.SSHKey,
    keys: KeyLookup,
    setup: LoginSetup,
) -> asyncssh.SSHAcceptor:
    """Listen on (host.address, port); raises OSError (EADDRINUSE: another process serves it)."""

    async def session(process: asyncssh.SSHServerProcess[bytes]) -> None:
        await _run_session(process, host, setup)

    return await asyncssh.create_server(
        lambda: _Server(host, keys),
        host.address,
        port,
        server_host_keys=[host_key],
        process_factory=session,
        encoding=None,
        reuse_address=True,
    )


async def _run_session(process: asyncssh.SSHServerProcess[bytes], host: HostRef, setup: LoginSetup) -> None:
    if not host.disk.is_dir():
        process.channel.get_connection().abort()  # the VM died since the connection was made
        return
    user = str(process.get_extra_info("username"))
    home = home_dir(host.disk, user, setup.image)
    command = process.command
    argv = ["/bin/bash", "-l", "-c", command] if command else ["/bin/bash", "-l"]
    try:
        child = await asyncio.create_subprocess_exec(
            *argv,
            cwd=home,
            env=login_env(host, user, home, setup),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        process.stderr.write(f"cannot start the login shell: {exc}\n".encode())
        process.exit(255)
        return
    pumps = [
        asyncio.ensure_future(_feed(process, child)),
        asyncio.ensure_future(_drain(child.stdout, process.stdout)),
        asyncio.ensure_future(_drain(child.stderr, process.stderr)),
    ]
    waiter = asyncio.ensure_future(child.wait())
    closed = asyncio.ensure_future(process.channel.wait_closed())
    await asyncio.wait({waiter, closed}, return_when=asyncio.FIRST_COMPLETED)
    if not waiter.done():
        # The client went away: hang up the session, as a real sshd's session loss does.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGHUP)
        for task in pumps:
            task.cancel()
        await waiter
        return
    await asyncio.gather(*pumps[1:], return_exceptions=True)
    pumps[0].cancel()
    closed.cancel()
    _report_exit(process, waiter.result())


def _report_exit(process: asyncssh.SSHServerProcess[bytes], returncode: int) -> None:
    with contextlib.suppress(asyncssh.Error, OSError):
        if returncode < 0:
            name = signal.Signals(-returncode).name.removeprefix("SIG")
            process.exit_with_signal(name)
        else:
            process.exit(returncode)


async def _feed(process: asyncssh.SSHServerProcess[bytes], child: asyncio.subprocess.Process) -> None:
    assert child.stdin is not None
    try:
        while data := await process.stdin.read(65536):
            child.stdin.write(data)
            await child.stdin.drain()
    except (asyncssh.Error, ConnectionError, BrokenPipeError):
        pass
    finally:
        child.stdin.close()


async def _drain(source: asyncio.StreamReader | None, sink: asyncssh.SSHWriter[bytes]) -> None:
    assert source is not None
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
    except (asyncssh.Error, ConnectionError, BrokenPipeError):
        pass
