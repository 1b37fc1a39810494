"""The SSH executor: asyncssh to every worker of a slice, in parallel; the program detached on each host.

Key pairs: tpuctl manages one ed25519 key pair per state dir (``<state>/ssh/tpuctl_ed25519``, 0600 in a
0700 directory), generated once, for the slices ``pod create`` makes; a run that creates its slices has a
key pair of its own (``KeyPair.generate``), kept in memory and, encrypted, in the ledger. The public key
goes into the node's ``ssh-keys`` metadata when tpuctl creates the slice (``ssh_keys_metadata``), which is
how TPU VMs authorize logins as ``tpuctl`` while OS Login is off; where it is on, the key is imported for
the caller's Google account instead, who logs in under its POSIX name (``tpuctl.services.access``). Which
of the two let the key in, and what to do when a host refuses it, travel with the username
(:class:`HostLogin`).

Host keys: each :class:`SshHost` carries the OpenSSH public host keys its node published (the guest
agent writes them to the node's guest attributes, query path ``hostkeys/``; see
https://cloud.google.com/compute/docs/instances/access-overview#instance-host-keys and the v2 API's
``nodes.getGuestAttributes``). They are the only keys trusted (asyncssh ``known_hosts``); any other key,
or a host with none known, is refused with :class:`~tpuctl.errors.HostKeyMismatchError`. There is no
trust on first use: addresses are reused across slices. Only ``verify_host_keys=False`` (tests) skips it.

Connecting retries with a bounded backoff (0.5 s doubling to 8 s, for ``connect_deadline_s`` in all):
a node is READY before its sshd listens. ``proxy_command`` reaches hosts without external IPs, e.g.
through an IAP tunnel; as OpenSSH does (ssh_config(5), ProxyCommand: "executed using the user's shell
'exec' directive"), it runs as ``/bin/sh -c 'exec COMMAND'``. Its tokens (:func:`expand_proxy_command`)
are OpenSSH's ``%h %p %r %n %%`` and tpuctl's ``%z``: an IAP tunnel targets a VM by instance name and
zone, not by address (docs/google-facts.md#iap-tcp-forwarding), so each :class:`SshHost` carries both.

Remote layout, relative to the login directory unless ``remote_root`` is absolute::

    <remote_root>/bundles/<sha256>/                     the bundle, .tpuctl-bundle marker last (cache)
    <remote_root>/runs/<run_id>/<attempt>/{out,pid,exit,supervisor}   one start (follow.py's layout)

``<attempt>`` is the spec's ``restart_count``. The program is detached from SSH: ``start`` runs
``follow.py launch --tail ...`` (imported from the bundle by the image's python3), which starts it in a
session of its own with output to ``out``, reports its pid and goes on tailing ``out`` from offset 0 in
the same SSH session; a follower per host turns those bytes into lines, and whenever that tail ends
without the program's exit status it runs ``follow.py tail DIR OFFSET`` anew. When a connection drops
(or goes silent: ``tail`` beats every second), the follower reconnects with the same backoff and resumes
at the offset just past the last complete line it emitted, so no line is lost or repeated. A host is
lost (exit event with returncode None) only when it cannot be reached for ``lost_after_s`` since the last
contact. ``stop`` signals the program's process group (its pid file) over SSH: SIGTERM, then SIGKILL
after the grace.

Quoting: every piece of every remote command that comes from a name, a path, an argument or an env value
goes through ``shlex.quote``; the only unquoted shell text is tpuctl's own constant syntax.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import secrets
import shlex
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tpuctl.errors import HostKeyMismatchError, RunFailedError, TpuctlError
from tpuctl.hosts.base import (
    REDACTED,
    CommandResult,
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
#: How a host runs follow.py (``tpuctl/hosts/follow.py`` in every bundle, see ``bundle._runtime_files``):
#: imported from the bundle (its first argument), not run as a script, so the bytecode Python caches in the
#: bundle serves every later start (a script is compiled anew each time: 5 ms of a 12 ms start, times
#: every host of a slice at once); ``-S``: it needs nothing from site-packages.
_FOLLOW_STUB = (
    "import sys;sys.path.insert(0,sys.argv.pop(1));"
    "from tpuctl.hosts.follow import main;sys.exit(main(sys.argv[1:]))"
)
SITECUSTOMIZE_DIR = "tpuctl/runtime/_sitecustomize"
#: How a plan shows what ``--tpu-worker-env`` adds on the host (known only there), unless the user set it.
_TPU_WORKER_ENV_SHOWN = {
    "TPU_WORKER_ID": "<tpu-env TPU_WORKER_ID, from the metadata server>",
    "TPU_WORKER_HOSTNAMES": "<worker-network-endpoints, from the metadata server>",
}
_SHIP_TIMEOUT_S = 300.0
_COMMAND_TIMEOUT_S = 15.0
_ATTEMPT_TIMEOUT_S = 20.0  # one connection attempt, inside the overall deadline
_BACKOFF_FIRST_S = 0.5
#: How often a command whose connection dropped is run again (launch, setup and the import check are
#: idempotent).
_COMMAND_TRIES = 3
#: How long a host may refuse tpuctl's key (the guest agent not yet done) before it counts as final.
_DENIED_DEADLINE_S = 30.0  # (unc.) how fast a guest agent applies ssh-keys after READY
_BACKOFF_MAX_S = 8.0
#: follow.py's tail beats every second; this long without a byte means the connection is dead.
_SILENCE_S = 10.0
_STOP_COMMAND_S = 3.0  # one signal command during stop(): stop must return in about grace + seconds
_STOP_REPORT_S = 5.0  # after SIGKILL, how long a host gets to report its exit before it is given up
TAIL_LINES = 20


@dataclass(frozen=True)
class _Command:
    """One ``run_command``: what every host runs, its standard input, where its lines go, how long."""

    text: str
    stdin: bytes
    on_line: Callable[[int, str], None]
    timeout_s: float


@dataclass(frozen=True)
class SshHost:
    """One worker: where its sshd listens, the OpenSSH public host keys it must present
    (``"ssh-ed25519 AAAA..."``; None: unknown, refused unless the executor skips verification), and the
    Compute Engine instance name and zone an IAP tunnel targets it by (None: not known; a ProxyCommand
    that needs one is refused before connecting)."""

    address: str
    port: int = 22
    host_keys: tuple[str, ...] | None = None
    instance_name: str | None = None
    zone: str | None = None


@dataclass(frozen=True)
class HostLogin:
    """Who tpuctl logs in as on a slice's hosts, and how the hosts came to accept its key."""

    username: str
    #: What authorized the key, for messages: "the slice's ssh-keys metadata", "OS Login (...)".
    authorized_by: str
    #: What to do when a host keeps refusing the key.
    refused_fix: str
    #: Called (off the event loop) before each new connection: re-authorizes a key whose authorization
    #: expires (OS Login's import carries an expiry); raises ``TpuctlError`` when it cannot.
    renew: Callable[[], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class KeyPair:
    """A client key: the private key in a file (``private_path``: the state dir's) or in memory only
    (``private_openssh``: a run's, decrypted from the ledger; never written anywhere in plain text)."""

    private_path: Path | None
    public_openssh: str  # "ssh-ed25519 AAAA... tpuctl"
    #: The private key in OpenSSH format, when it lives in memory only.
    private_openssh: bytes | None = field(default=None, repr=False)

    @classmethod
    def generate(cls, comment: str) -> KeyPair:
        """A fresh ed25519 key pair, in memory."""
        import asyncssh

        key = asyncssh.generate_private_key("ssh-ed25519", comment=comment)
        return cls.from_private_openssh(key.export_private_key())

    @classmethod
    def from_private_openssh(cls, data: bytes) -> KeyPair:
        """The key pair of an OpenSSH private key, in memory."""
        import asyncssh

        key = asyncssh.import_private_key(data)
        return cls(None, key.export_public_key().decode("ascii").strip(), data)

    def private_bytes(self) -> bytes:
        """The private key in OpenSSH format (read from its file when it has one)."""
        if self.private_openssh is not None:
            return self.private_openssh
        if self.private_path is None:
            raise ValueError("this key pair has no private key (a plan's placeholder)")
        return self.private_path.read_bytes()

    def client_key(self) -> asyncssh.SSHKey | str:
        """What asyncssh logs in with: the key object for an in-memory key, else its file's path."""
        import asyncssh

        if self.private_openssh is not None:
            return asyncssh.import_private_key(self.private_openssh)
        if self.private_path is None:
            raise ValueError("this key pair has no private key (a plan's placeholder)")
        return str(self.private_path)


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
            # Owner-only like everything in the state dir (the state's files are private, public or not).
            public_fd = os.open(public, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(public_fd, "wb") as fh:
                fh.write(key.export_public_key())
    os.chmod(private, 0o600)
    loaded = asyncssh.read_private_key(str(private))
    return KeyPair(private, loaded.export_public_key().decode("ascii").strip())


def ssh_keys_metadata(username: str, public_openssh: str) -> str:
    """The value of a TPU VM's ``ssh-keys`` metadata item: ``USER:KEYTYPE KEY COMMENT``."""
    return f"{username}:{public_openssh}"


def fingerprint(public_openssh: str) -> str:
    """The ``SHA256:...`` fingerprint of an OpenSSH public key line, as ``ssh-keygen -l`` prints it."""
    import asyncssh

    return str(asyncssh.import_public_key(public_openssh).get_fingerprint("sha256"))


#: ProxyCommand tokens whose value a host may lack, and where the value comes from (for the error).
_HOST_TOKENS = {
    "%n": "instance name (a TPU API worker's `hostname` guest attribute, a Compute Engine VM's own name)",
    "%z": "zone",
}


def expand_proxy_command(template: str, host: SshHost, *, user: str) -> str:
    """A ProxyCommand template for one host. OpenSSH's tokens (ssh_config(5), TOKENS): ``%h`` the
    address, ``%p`` the port, ``%r`` the remote user, ``%n`` "the original remote hostname, as given on
    the command line", here the worker's instance name (the name an IAP tunnel targets: what a user who
    runs ``ssh INSTANCE`` with an IAP ProxyCommand gives there), ``%%`` a percent; and tpuctl's ``%z``, the
    worker's zone, which OpenSSH does not know. Any other ``%x`` stays as written. Values are
    shell-quoted: the result runs through ``sh -c``. A token whose value the host lacks raises ValueError
    (:func:`missing_proxy_values` says which, before anything connects)."""
    values = {
        "h": host.address,
        "p": str(host.port),
        "r": user,
        "n": host.instance_name,
        "z": host.zone,
    }
    out: list[str] = []
    for token, text in _proxy_pieces(template):
        if token is None:
            out.append(text)
        elif token == "%":
            out.append("%")
        elif (value := values[token]) is None:
            raise ValueError(f"host {host.address} has no value for %{token} in the ProxyCommand")
        else:
            out.append(value if token == "p" else shlex.quote(value))
    return "".join(out)


def _proxy_pieces(template: str) -> list[tuple[str | None, str]]:
    """The template split into literal text (token None) and the tokens tpuctl expands."""
    pieces: list[tuple[str | None, str]] = []
    i = 0
    while i < len(template):
        nxt = template[i + 1] if i + 1 < len(template) else ""
        if template[i] == "%" and nxt in "hprnz%" and nxt:
            pieces.append((nxt, template[i : i + 2]))
            i += 2
        else:
            pieces.append((None, template[i]))
            i += 1
    return pieces


def proxy_command_tokens(template: str) -> frozenset[str]:
    """The tokens ``template`` uses, as written (``"%n"``, ``"%h"``, ...)."""
    return frozenset(f"%{token}" for token, _ in _proxy_pieces(template) if token is not None)


def missing_proxy_values(template: str, host: SshHost) -> list[str]:
    """The tokens of ``template`` (``"%n"``, ``"%z"``) this host has no value for."""
    have = {"%n": host.instance_name, "%z": host.zone}
    return sorted(t for t in proxy_command_tokens(template) if t in have and have[t] is None)


_NO_INSTANCE_NAME_FIX = (
    "an IAP tunnel targets the instance by name: wait until the slice is READY and HEALTHY and run "
    "again, and check that the organization policy constraint compute.disableGuestAttributesAccess is "
    "not enforced (a TPU VM created before 24 March 2022 publishes no `hostname` guest attribute: create "
    "it again); or drop %n from --ssh-proxy-command (ssh_proxy_command) and reach the host by its address "
    "(%h)"
)


def _check_proxy_values(template: str, hosts: Sequence[SshHost]) -> None:
    """Refuse, before anything connects, a ProxyCommand that needs a value some host lacks: the first
    such host, what is missing, where it comes from and what to do."""
    for worker, host in enumerate(hosts):
        missing = missing_proxy_values(template, host)
        if not missing:
            continue
        what = "; ".join(f"{token} is its {_HOST_TOKENS[token]}" for token in missing)
        raise RunFailedError(
            f"the ProxyCommand uses {' and '.join(missing)}, which host {worker} at {host.address} has no "
            f"value for ({what})",
            worker=worker,
            fix=_NO_INSTANCE_NAME_FIX if "%n" in missing else "drop %z from --ssh-proxy-command",
        )


def _q(value: str) -> str:
    return shlex.quote(value)


class _Unreachable(Exception):
    """Connecting gave up: every attempt until the deadline failed (``refused``: the host kept refusing
    tpuctl's key)."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass
class _Remote:
    worker: int
    host: SshHost
    conn: asyncssh.SSHClientConnection | None = None
    lock: asyncio.Lock | None = None
    run_dir: str = ""
    follower: asyncio.Future[None] | None = None
    finished: asyncio.Event | None = None
    presented: list[str] = field(default_factory=list)


@dataclass
class _FollowState:
    offset: int  # just past the last complete line emitted: where a reconnect resumes
    last_contact: float  # monotonic time of the last byte (data or heartbeat) from the host
    errors: int = 0  # consecutive tails that ended with an error on a live connection
    note: str = ""  # the last problem seen, for the lost message


def _client_factory(sink: list[str]) -> Callable[[], asyncssh.SSHClient]:
    """An asyncssh client that records the fingerprint of a host key it was asked to judge (one not in
    the trusted set) and refuses it, so a mismatch can name the key the host presented."""
    import asyncssh

    class _Recorder(asyncssh.SSHClient):
        def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
            sink.append(str(key.get_fingerprint("sha256")))
            return False

    return _Recorder


async def _each(coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``coros`` concurrently; the first failure cancels the rest (a host refused for its key must
    not wait for another host's connect deadline) and is raised once they are all done."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class SshExecutor:
    """Runs the program on every worker of a slice over SSH. See ``hosts.base.Executor``.

    ``python`` runs the program (the setup environment's interpreter); ``image_python`` runs follow.py
    (the stock image's python3). ``host_env(worker)`` adds environment for one host (after the contract's
    and the user's). ``tpu_worker_env`` (a Compute Engine slice): each host's program also gets the
    ``TPU_WORKER_ID`` and ``TPU_WORKER_HOSTNAMES`` its metadata server implies (``worker_identity``).
    Line events and ``run_command``'s ``on_line`` come from the executor's own thread.
    """

    def __init__(
        self,
        hosts: Sequence[SshHost],
        *,
        login: HostLogin,
        key: KeyPair,
        remote_root: str = ".tpuctl",
        python: str = "python3",
        image_python: str = "python3",
        host_env: Callable[[int], Mapping[str, str]] | None = None,
        tpu_worker_env: bool = False,
        proxy_command: str | None = None,
        verify_host_keys: bool = True,
        connect_deadline_s: float = 300.0,
        lost_after_s: float = 60.0,
    ) -> None:
        if not hosts:
            raise ValueError("SshExecutor needs at least one host")
        self._hosts = [_Remote(i, h) for i, h in enumerate(hosts)]
        self._login = login
        self._username = login.username
        self._key = key
        self._root = remote_root.rstrip("/") or "/"
        self._python = python
        self._image_python = image_python
        self._host_env = host_env
        self._tpu_worker_env = tpu_worker_env
        self._proxy_command = proxy_command
        if proxy_command:
            _check_proxy_values(proxy_command, hosts)
        self._verify = verify_host_keys
        self._connect_deadline_s = connect_deadline_s
        self._lost_after_s = lost_after_s
        self._events = EventQueue()
        self._digest: str | None = None
        # The event loop thread starts on first use, so that plan() (--dry-run) has no side effects.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._watchers: set[asyncio.Future[None]] = set()
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

    def _where(self, remote: _Remote) -> str:
        return f"{self._username}@{remote.host.address}:{remote.host.port}"

    def _plan_where(self, remote: _Remote) -> str:
        """Where a plan says a host is reached: with the ProxyCommand as it will run for that host."""
        if not self._proxy_command:
            return self._where(remote)
        proxy = expand_proxy_command(self._proxy_command, remote.host, user=self._username)
        return f"{self._where(remote)} via {proxy}"

    def _follow_words(self, bundle: str) -> str:
        """The shell words that run follow.py from ``bundle`` (already shell syntax: quoted, or "$b")
        with the image's python3; its subcommand and arguments follow."""
        return f"{_q(self._image_python)} -I -S -c {_q(_FOLLOW_STUB)} {bundle}"

    def _bundle_path(self, digest: str) -> str:
        return f"{self._root}/bundles/{digest}"

    def _run_dir(self, spec: LaunchSpec) -> str:
        return f"{self._root}/runs/{spec.run_id}/{spec.restart_count}"

    # --- connections -------------------------------------------------------------------------------

    async def _connect(self, remote: _Remote, give_up_at: float) -> asyncssh.SSHClientConnection:
        """The host's live connection, or a new one: attempts with a doubling pause (0.5 s to 8 s) until
        ``give_up_at`` (monotonic). Raises _Unreachable (what was tried) or HostKeyMismatchError (never
        retried: a wrong key does not become right)."""
        import asyncssh

        if remote.lock is None:
            remote.lock = asyncio.Lock()
        async with remote.lock:
            if remote.conn is not None:
                return remote.conn
            started, attempts, delay, last = time.monotonic(), 0, _BACKOFF_FIRST_S, ""
            denied_since: float | None = None
            while True:
                attempts += 1
                budget = min(_ATTEMPT_TIMEOUT_S, give_up_at - time.monotonic())
                try:
                    await self._renew_login()
                    conn = await asyncio.wait_for(self._open(remote), timeout=max(0.2, budget))
                except asyncssh.HostKeyNotVerifiable:
                    raise self._mismatch(remote) from None
                except asyncssh.PermissionDenied as exc:
                    # A guest agent writes the ssh-keys metadata into authorized_keys shortly after boot,
                    # so a refusal may pass; one that lasts is a key the host will never take.
                    last = _describe(exc)
                    denied_since = time.monotonic() if denied_since is None else denied_since
                    if time.monotonic() - denied_since >= _DENIED_DEADLINE_S:
                        raise _Unreachable(
                            f"the host refused tpuctl's key for {time.monotonic() - denied_since:.0f} s "
                            f"({attempts} attempts): {last} (the key was authorized through "
                            f"{self._login.authorized_by})",
                            refused=True,
                        ) from None
                except TpuctlError as exc:  # the login's renewal failed: tried again until the deadline
                    last, denied_since = exc.message, None
                except (OSError, asyncssh.Error, TimeoutError) as exc:
                    # A try the deadline cut short (a busy machine's handshake) says nothing new: a
                    # refusal before it stays what is reported, with its fix.
                    cut_short = isinstance(exc, TimeoutError) and budget < _ATTEMPT_TIMEOUT_S
                    if not (cut_short and denied_since is not None):
                        last, denied_since = _describe(exc), None
                else:
                    self._adopt(remote, conn)
                    return conn
                remaining = give_up_at - time.monotonic()
                if remaining <= 0:
                    refused = denied_since is not None
                    raise _Unreachable(
                        f"{attempts} connection attempts over {time.monotonic() - started:.1f} s, "
                        f"last error: {last}"
                        + (
                            f" (the key was authorized through {self._login.authorized_by})"
                            if refused
                            else ""
                        ),
                        refused=refused,
                    )
                await asyncio.sleep(min(delay, remaining))
                delay = min(delay * 2, _BACKOFF_MAX_S)

    async def _renew_login(self) -> None:
        """Re-authorize the key where its authorization expires (it may call the cloud: off the loop)."""
        if self._login.renew is not None:
            await asyncio.to_thread(self._login.renew)

    async def _open(self, remote: _Remote) -> asyncssh.SSHClientConnection:
        import asyncssh

        host = remote.host
        options: dict[str, Any] = {}
        if self._verify:
            trusted = [asyncssh.import_public_key(k) for k in host.host_keys or ()]
            options["known_hosts"] = (trusted, [], [])
        else:
            options["known_hosts"] = None
        if self._proxy_command:
            expanded = expand_proxy_command(self._proxy_command, host, user=self._username)
            options["proxy_command"] = ["/bin/sh", "-c", f"exec {expanded}"]
        remote.presented.clear()
        return await asyncssh.connect(
            host.address,
            host.port,
            username=self._username,
            client_keys=[self._key.client_key()],
            client_factory=_client_factory(remote.presented),
            agent_path=None,
            config=None,
            keepalive_interval=10,
            keepalive_count_max=3,
            **options,
        )

    def _adopt(self, remote: _Remote, conn: asyncssh.SSHClientConnection) -> None:
        remote.conn = conn

        async def forget_when_closed() -> None:
            await conn.wait_closed()
            if remote.conn is conn:
                remote.conn = None

        watcher = asyncio.ensure_future(forget_when_closed())
        self._watchers.add(watcher)  # the loop holds tasks weakly
        watcher.add_done_callback(self._watchers.discard)

    def _mismatch(self, remote: _Remote) -> HostKeyMismatchError:
        expected = tuple(fingerprint(k) for k in remote.host.host_keys or ())
        presented = remote.presented[-1] if remote.presented else None
        address = f"{remote.host.address}:{remote.host.port}"
        if expected:
            message = (
                f"host {remote.worker} at {address} presented SSH host key {presented}, not the key its "
                f"node published ({', '.join(expected)}); refusing to log in"
            )
        else:
            message = (
                f"no SSH host key is known for host {remote.worker} at {address} (it presented "
                f"{presented}); tpuctl does not trust a key on first use"
            )
        return HostKeyMismatchError(
            message,
            worker=remote.worker,
            address=address,
            expected=expected,
            presented=presented,
            fix="if the slice was re-created, run again so tpuctl reads its new host keys from the node's "
            "guest attributes; otherwise another machine answers at that address: do not connect to it",
        )

    async def _connect_or_fail(self, remote: _Remote) -> asyncssh.SSHClientConnection:
        """``_connect`` within the executor's connect deadline; giving up is a RunFailedError naming the
        host, its address and what was tried."""
        try:
            return await self._connect(remote, time.monotonic() + self._connect_deadline_s)
        except _Unreachable as exc:
            raise RunFailedError(
                f"cannot reach host {remote.worker} at {self._where(remote)}: {exc}",
                worker=remote.worker,
                fix=self._login.refused_fix if exc.refused else self._unreachable_fix(),
            ) from None

    def _unreachable_fix(self) -> str:
        return (
            "check that the slice is READY and that this machine can reach the address (or configure a "
            f"proxy command); tpuctl's key was authorized through {self._login.authorized_by}"
        )

    def close_connections(self) -> None:
        """Cut every SSH connection now (abruptly, as a network failure would); followers reconnect."""
        if self._loop is None or self._loop.is_closed():
            return

        async def cut() -> None:
            for remote in self._hosts:
                conn, remote.conn = remote.conn, None
                if conn is not None:
                    conn.abort()

        self._call(cut(), 10.0)

    # --- ship --------------------------------------------------------------------------------------

    def ship(self, bundle: Bundle) -> list[ShipResult]:
        payload = bundle.tar_gz()

        async def all_hosts() -> list[ShipResult]:
            return await _each([self._ship_one(r, bundle.digest, payload) for r in self._hosts])

        results = self._call(all_hosts(), _SHIP_TIMEOUT_S + self._connect_deadline_s)
        self._digest = bundle.digest
        return results

    async def _ship_one(self, remote: _Remote, digest: str, payload: bytes) -> ShipResult:
        started = time.monotonic()
        conn = await self._connect_or_fail(remote)
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
        """Per host: ``follow.py launch`` from the bundle, starting ``python -u PROGRAM`` in the bundle
        with the contract's env, the user's, the secrets (shown as ``REDACTED``), ``host_env(worker)``
        and PYTHONPATH (the bundle's absolute path, shown as ``<path>``: it is resolved on the host, then
        its sitecustomize directory). Every value but PYTHONPATH's reaches the follower on the SSH
        session's stdin (``--env-stdin``, see ``_host_env_input``), none in the command line."""
        if spec.num_workers != self.num_hosts:
            raise ValueError(f"spec is for {spec.num_workers} workers, the slice has {self.num_hosts}")
        bundle = self._bundle_path(digest or self._digest or "<bundle-sha256>")
        run_dir = self._run_dir(spec)
        argv = spec.argv(self._python)
        plans = []
        follow = self._follow_words('"$b"')
        shown_worker_env = _TPU_WORKER_ENV_SHOWN if self._tpu_worker_env else {}
        hidden = dict.fromkeys(spec.secret_env, REDACTED)
        command = (
            # The bundle's absolute path is known only on the host: "$b", expanded there (the login
            # shell starts in the home, which relative paths are relative to).
            f"b={_q(bundle) if bundle.startswith('/') else '$PWD/' + _q(bundle)} && "
            f'exec {follow} launch {_q(run_dir)} --tail --cwd "$b" --env-stdin '
            + ("--tpu-worker-env " if self._tpu_worker_env else "")
            + f'--env "PYTHONPATH=$b:$b/{SITECUSTOMIZE_DIR}" -- '
            + " ".join(_q(a) for a in argv)
        )
        for remote in self._hosts:
            env = {**self._host_program_env(spec, remote.worker), **hidden}
            plans.append(
                HostPlan(
                    worker=remote.worker,
                    where=self._plan_where(remote),
                    cwd=bundle,
                    argv=argv,
                    env={
                        **env,
                        **{k: v for k, v in shown_worker_env.items() if k not in env},
                        "PYTHONPATH": f"<{bundle}>:<{bundle}>/{SITECUSTOMIZE_DIR}",
                    },
                    shell_command=command,
                )
            )
        return plans

    def _host_program_env(self, spec: LaunchSpec, worker: int) -> dict[str, str]:
        """What host ``worker``'s program gets in its environment from tpuctl, PYTHONPATH aside: the
        spec's (secrets included) and ``host_env(worker)``."""
        env = spec.program_env(worker)
        if self._host_env is not None:
            env.update(self._host_env(worker))
        return env

    def _host_env_input(self, spec: LaunchSpec, worker: int) -> bytes:
        """The stdin of host ``worker``'s launch: its environment as ``NAME=VALUE`` records, each ended
        by a NUL (no name or value holds one), read by ``follow.py launch --env-stdin`` up to EOF. On
        stdin, not as ``--env`` words: a process's argv is readable by every user of the host for as
        long as it runs (``ps``), and the follower runs as long as the program."""
        env = self._host_program_env(spec, worker)
        return b"".join(
            f"{name}={value}".encode("utf-8", "surrogateescape") + b"\0" for name, value in env.items()
        )

    def start(self, spec: LaunchSpec) -> None:
        if self._digest is None:
            raise RuntimeError("ship() the bundle before start()")
        if self._started:
            raise RuntimeError("this executor already started its hosts")
        self._started = True
        plans = self.plan(spec)
        bundle, run_dir = self._bundle_path(self._digest), self._run_dir(spec)

        async def all_hosts() -> None:
            await _each(
                [
                    self._start_one(r, p, self._host_env_input(spec, r.worker), bundle, run_dir)
                    for r, p in zip(self._hosts, plans, strict=True)
                ]
            )

        try:
            self._call(all_hosts(), self._connect_deadline_s + 2 * _COMMAND_TIMEOUT_S)
        except BaseException:
            self.stop(grace_s=1.0)
            raise

    async def _start_one(
        self, remote: _Remote, plan: HostPlan, env_input: bytes, bundle: str, run_dir: str
    ) -> None:
        """Launch the program on one host, its environment ``env_input`` on the session's stdin; the
        launch's session goes on as its first tail, which the host's follower takes over."""
        assert plan.shell_command is not None
        pidfile = f"{run_dir}/pid"
        command = plan.shell_command
        for attempt in range(1, _COMMAND_TRIES + 1):
            conn = await self._connect_or_fail(remote)
            process, failure = await self._launch(conn, command, env_input)
            if process is not None:
                break
            if failure is not None or attempt == _COMMAND_TRIES:
                raise RunFailedError(
                    f"starting the program on host {remote.worker} ({self._where(remote)}) failed: "
                    f"{(failure or 'the connection dropped every time').strip()[-300:]}",
                    worker=remote.worker,
                    fix="check that the bundle reached the host and that its python3 runs",
                )
            # The connection dropped mid-launch: the program may have started. Launching is idempotent
            # through its pid file: where there is one, report it and follow from the start.
            self._drop(remote)
            follow = self._follow_words(_q(bundle))
            started = f'echo "pid $(cat {_q(pidfile)})" >&2 && exec {follow} tail {_q(run_dir)} 0'
            command = f"if [ -e {_q(pidfile)} ]; then {started}; else {plan.shell_command}; fi"
        assert process is not None  # the last try raised otherwise
        remote.run_dir = run_dir
        remote.finished = asyncio.Event()
        state = _FollowState(offset=0, last_contact=time.monotonic())
        # Keep a reference: the loop holds tasks only weakly, and a collected follower loses the host.
        remote.follower = asyncio.ensure_future(self._follow(remote, bundle, state, first=(conn, process)))

    async def _launch(
        self, conn: asyncssh.SSHClientConnection, command: str, env_input: bytes
    ) -> tuple[asyncssh.SSHClientProcess[bytes] | None, str | None]:
        """Run ``launch --tail`` with ``env_input`` on its stdin, then EOF: (the session, now tailing,
        None) once it reported ``pid N`` on stderr; (None, why) when the launch failed on the host;
        (None, None) when the connection dropped."""
        import asyncssh

        try:
            process = await conn.create_process(command, encoding=None)
        except (OSError, asyncssh.Error):
            return None, None
        with contextlib.suppress(OSError, asyncssh.Error):
            # A launch that failed at once may have closed its stdin already: what it said tells why.
            process.stdin.write(env_input)
            process.stdin.write_eof()
        try:
            first = await asyncio.wait_for(process.stderr.readline(), timeout=_COMMAND_TIMEOUT_S)
        except (OSError, asyncssh.Error, TimeoutError):
            process.close()
            return None, None
        if decode_line(first).startswith("pid "):
            return process, None
        try:  # the launch failed: what it said, and how it exited
            rest = await asyncio.wait_for(process.stderr.read(), timeout=_STOP_COMMAND_S)
            await asyncio.wait_for(process.wait_closed(), timeout=_STOP_COMMAND_S)
        except (OSError, asyncssh.Error, TimeoutError):
            rest = b""
        if not first and process.exit_status is None:
            return None, None  # the session ended without a word or a status: the connection dropped
        text = decode_line(first + rest)
        return None, f"(exit {process.exit_status}) {text}"

    def _drop(self, remote: _Remote) -> None:
        """Forget the host's connection (it dropped): the next command connects again."""
        conn, remote.conn = remote.conn, None
        if conn is not None:
            conn.abort()

    def next_event(self, timeout_s: float) -> HostEvent | None:
        return self._events.get(timeout_s)

    # --- following ---------------------------------------------------------------------------------

    def _line(self, remote: _Remote, text: str) -> None:
        if remote.finished is not None and not remote.finished.is_set():
            self._events.put(HostEvent(remote.worker, "line", text))

    def _finish(self, remote: _Remote, returncode: int | None) -> None:
        """The host's one exit event (later calls do nothing)."""
        if remote.finished is not None and not remote.finished.is_set():
            remote.finished.set()
            self._events.put(HostEvent(remote.worker, "exit", returncode=returncode))

    async def _follow(
        self,
        remote: _Remote,
        bundle: str,
        state: _FollowState,
        first: tuple[asyncssh.SSHClientConnection, asyncssh.SSHClientProcess[bytes]] | None = None,
    ) -> None:
        """Tail the host's output until its exit status comes, starting with ``first`` (the launch's
        session, already tailing from offset 0) if given; reconnect whenever a tail ends without one;
        give the host up after ``lost_after_s`` without contact, or after 3 failed tails in a row on a
        live connection."""
        delay = _BACKOFF_FIRST_S
        while not remote.finished or not remote.finished.is_set():
            silent_for = time.monotonic() - state.last_contact
            try:
                if silent_for > self._lost_after_s:
                    raise _Unreachable(state.note or "no contact")
                if first is not None:
                    conn = first[0]
                else:
                    conn = await self._connect(remote, state.last_contact + self._lost_after_s)
            except (_Unreachable, HostKeyMismatchError) as exc:
                self._line(
                    remote,
                    f"[tpuctl] host {remote.worker} ({self._where(remote)}) lost: not reached for "
                    f"{time.monotonic() - state.last_contact:.0f} s ({exc})",
                )
                self._finish(remote, None)
                return
            before = state.offset, state.last_contact
            outcome = await self._tail(remote, conn, bundle, state, first[1] if first else None)
            first = None
            if outcome is not None:
                kind, value = outcome
                if kind == "exit":
                    self._finish(remote, int(value))
                    return
                state.errors += 1
                state.note = value
                if kind == "lost" or state.errors >= 3:
                    self._line(remote, f"[tpuctl] host {remote.worker}: cannot follow its program: {value}")
                    self._finish(remote, None)
                    return
            if (state.offset, state.last_contact) != before:
                delay = _BACKOFF_FIRST_S
                continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX_S)

    async def _tail(
        self,
        remote: _Remote,
        conn: asyncssh.SSHClientConnection,
        bundle: str,
        state: _FollowState,
        process: asyncssh.SSHClientProcess[bytes] | None = None,
    ) -> tuple[str, str] | None:
        """One ``follow.py tail`` from ``state.offset`` (or ``process``, a session already tailing from
        there): emits complete lines, advancing the offset past each. Returns ("exit", status) once the
        program ended (its last unterminated line emitted too), ("lost", why) when the supervisor is
        gone, ("error", stderr) when tail failed on a live connection, None when the connection dropped
        or went silent (the caller reconnects)."""
        import asyncssh

        if process is None:
            command = f"exec {self._follow_words(_q(bundle))} tail {_q(remote.run_dir)} {state.offset}"
            try:
                process = await conn.create_process(command, stdin=asyncssh.DEVNULL, encoding=None)
            except (OSError, asyncssh.Error) as exc:
                state.note = _describe(exc)
                return None
        control: list[str] = []
        reader = asyncio.ensure_future(self._read_control(process, state, control))
        watchdog = asyncio.ensure_future(self._watch_silence(conn, state))
        pending = b""
        try:
            while chunk := await process.stdout.read(1 << 16):
                state.last_contact = time.monotonic()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    self._line(remote, decode_line(raw))
                    state.offset += len(raw) + 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), timeout=_STOP_COMMAND_S)
        except (OSError, asyncssh.Error) as exc:
            state.note = _describe(exc)
        finally:
            watchdog.cancel()
            reader.cancel()
        for text in control:
            word, _, rest = text.partition(" ")
            if word == "exit" and rest.lstrip("-").isdigit():
                if pending:
                    self._line(remote, decode_line(pending))
                    state.offset += len(pending)
                return "exit", rest
            if word == "lost":
                return "lost", rest
        if remote.conn is conn and process.exit_status is not None:
            return "error", " | ".join(control)[-300:] or f"tail exited {process.exit_status}"
        if remote.conn is conn:
            remote.conn = None
            conn.abort()  # half-open or silent: start afresh
        state.note = state.note or "the connection dropped"
        return None

    async def _read_control(
        self, process: asyncssh.SSHClientProcess[bytes], state: _FollowState, control: list[str]
    ) -> None:
        while raw := await process.stderr.readline():
            state.last_contact = time.monotonic()
            text = decode_line(raw)
            if text != "alive":
                control.append(text)

    async def _watch_silence(self, conn: asyncssh.SSHClientConnection, state: _FollowState) -> None:
        """Abort a connection that stays silent past the heartbeats (a half-open TCP connection)."""
        while True:
            await asyncio.sleep(1.0)
            if time.monotonic() - state.last_contact > _SILENCE_S:
                state.note = f"no byte for {_SILENCE_S:.0f} s"
                conn.abort()
                return

    # --- commands ----------------------------------------------------------------------------------

    def run_command(
        self,
        command: str,
        *,
        on_line: Callable[[int, str], None],
        timeout_s: float,
        workers: Sequence[int] | None = None,
        stdin: bytes = b"",
    ) -> dict[int, CommandResult]:
        """Run ``command`` (through the login shell, ``stdin`` its input) on every host at once, for
        setup: each output line (stdout and stderr merged) goes to ``on_line(worker, text)`` as it comes
        (from the executor's thread). A host that does not finish within ``timeout_s`` gets exit_status
        None. Raises RunFailedError when a host cannot be reached, HostKeyMismatchError when it is not
        the right one."""

        chosen = [r for r in self._hosts if workers is None or r.worker in workers]
        what = _Command(command, stdin, on_line, timeout_s)

        async def all_hosts() -> list[CommandResult]:
            return await _each([self._command_one(r, what) for r in chosen])

        results = self._call(all_hosts(), self._connect_deadline_s + timeout_s + _COMMAND_TIMEOUT_S)
        return {r.worker: r for r in results}

    async def _command_one(self, remote: _Remote, command: _Command) -> CommandResult:
        """One host's run of ``command``; a connection that drops mid-command is made again and the
        command run again (up to ``_COMMAND_TRIES`` times: setup and the import check are idempotent)."""
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        status: int | None = None
        for attempt in range(1, _COMMAND_TRIES + 1):
            status, lost = await self._command_try(remote, command, tail)
            if not lost or attempt == _COMMAND_TRIES:
                break
            self._drop(remote)
            command.on_line(
                remote.worker, f"[tpuctl] connection to host {remote.worker} lost; running the command again"
            )
        return CommandResult(remote.worker, status, tuple(tail))

    async def _command_try(
        self, remote: _Remote, command: _Command, tail: collections.deque[str]
    ) -> tuple[int | None, bool]:
        """(exit status, whether the connection was lost) of one run of ``command``."""
        import asyncssh

        conn = await self._connect_or_fail(remote)

        async def pump() -> int | None:
            process = await conn.create_process(
                command.text,
                stdin=asyncssh.PIPE if command.stdin else asyncssh.DEVNULL,
                stderr=asyncssh.STDOUT,
                encoding=None,
            )
            try:
                if command.stdin:
                    process.stdin.write(command.stdin)
                    process.stdin.write_eof()
                while raw := await process.stdout.readline():
                    tail.append(decode_line(raw))
                    command.on_line(remote.worker, tail[-1])
                completed = await process.wait()
            finally:
                process.close()  # on a timeout the channel closes: sshd hangs up the command's session
            if completed.exit_signal:
                return -_signal_number(completed.exit_signal[0])
            return completed.exit_status

        try:
            status = await asyncio.wait_for(pump(), timeout=command.timeout_s)
        except TimeoutError:
            tail.append(f"[tpuctl] timed out after {command.timeout_s:.0f} s")
            return None, False
        except (OSError, asyncssh.Error) as exc:
            tail.append(f"[tpuctl] connection lost: {_describe(exc)}")
            return None, True
        return status, status is None

    def stop_leftovers(self, run_id: str) -> int:
        """SIGKILL, on every host, each process group of run ``run_id`` still running (a pid file
        without an exit file), whoever started it: before another launcher takes the run over. Returns
        how many groups were signalled on all hosts together."""
        runs = f"{self._root}/runs/{run_id}"
        command = (
            f'n=0; for p in {_q(runs)}/*/pid; do [ -e "$p" ] || continue; d="${{p%/pid}}"; '
            f'[ -e "$d/exit" ] && continue; pid=$(cat "$p") && kill -KILL -- "-$pid" 2>/dev/null '
            f'&& n=$((n+1)) && for i in $(seq 40); do [ -e "$d/exit" ] && break; sleep 0.05; done; '
            f'done; echo "$n"'
        )  # (waits up to 2 s per group for its supervisor to record the exit: gone when this returns)

        async def one(remote: _Remote) -> int:
            conn = await self._connect_or_fail(remote)
            result = await conn.run(command, check=False, timeout=_COMMAND_TIMEOUT_S)
            text = str(result.stdout or "").strip()
            return int(text) if text.isdigit() else 0

        async def all_hosts() -> int:
            return sum(await _each([one(r) for r in self._hosts]))

        return self._call(all_hosts(), self._connect_deadline_s + 2 * _COMMAND_TIMEOUT_S)

    # --- stop and close ----------------------------------------------------------------------------

    def stop(self, grace_s: float = 5.0) -> None:
        if self._loop is None or self._loop.is_closed():
            return
        # Bounded: each step has its own timeout, and a host that never reports is given up. A stop
        # cut short by close() (the attempt ended meanwhile: every host finished) has nothing left to do.
        with contextlib.suppress(TimeoutError, TpuctlError, concurrent.futures.CancelledError):
            self._call(self._stop_all(grace_s), grace_s + 3 * _STOP_COMMAND_S + _STOP_REPORT_S + 2.0)

    async def _stop_all(self, grace_s: float) -> None:
        live = [r for r in self._hosts if r.finished is not None and not r.finished.is_set()]
        if not live:
            return
        # A host that cannot be reached for the SIGTERM (its VM is gone: a hard preemption, a deletion)
        # gets no grace and no SIGKILL: nothing would deliver them, and nothing will report from it.
        reached = await asyncio.gather(*(self._signal(r, "TERM") for r in live))
        await self._wait_finished([r for r, ok in zip(live, reached, strict=True) if ok], grace_s)
        still = [
            r
            for r, ok in zip(live, reached, strict=True)
            if ok and r.finished is not None and not r.finished.is_set()
        ]
        await asyncio.gather(*(self._signal(r, "KILL") for r in still))
        await self._wait_finished(still, _STOP_REPORT_S)
        for remote, ok in zip(live, reached, strict=True):
            if not ok and remote.finished is not None and not remote.finished.is_set():
                if remote.follower is not None:
                    remote.follower.cancel()
                self._line(remote, f"[tpuctl] host {remote.worker} could not be reached to stop it")
                self._finish(remote, None)
        for remote in still:
            if remote.finished is not None and not remote.finished.is_set():
                if remote.follower is not None:
                    remote.follower.cancel()
                self._line(remote, f"[tpuctl] host {remote.worker} did not report its exit after SIGKILL")
                self._finish(remote, None)

    async def _wait_finished(self, remotes: list[_Remote], timeout_s: float) -> None:
        waits = [r.finished.wait() for r in remotes if r.finished is not None]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), timeout=timeout_s)

    async def _signal(self, remote: _Remote, name: str) -> bool:
        """Signal the program's process group (pid == pgid, from its pid file) unless it has exited:
        after its exit the pid may belong to someone else. Returns whether the host was reached within
        ``_STOP_COMMAND_S`` (waiting for a follower's reconnection included: it may take a minute)."""
        pidfile, exitfile = f"{remote.run_dir}/pid", f"{remote.run_dir}/exit"
        command = (
            f"[ -e {_q(exitfile)} ] || {{ pid=$(cat {_q(pidfile)}) && "
            f'kill -{name} -- "-$pid"; }} 2>/dev/null; true'
        )
        deadline = time.monotonic() + _STOP_COMMAND_S
        try:
            conn = await asyncio.wait_for(self._connect(remote, deadline), timeout=_STOP_COMMAND_S)
        except Exception:
            return bool(remote.finished is not None and remote.finished.is_set())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.run(command, check=False), timeout=_STOP_COMMAND_S)
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loop is None:
            return
        self.stop(grace_s=1.0)
        self._disconnect()

    def abandon(self) -> None:
        """Drop every connection without signalling the programs: their supervisor lost the run, and
        whoever owns it now decides what becomes of them. Idempotent; ``close`` after it does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            self._disconnect()

    def _disconnect(self) -> None:
        assert self._loop is not None

        async def disconnect() -> None:
            # Whatever is left (a follower, a command cut short by a failure) ends before the loop does.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), timeout=2.0)
            for remote in self._hosts:
                conn, remote.conn = remote.conn, None
                if conn is not None:
                    conn.close()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(conn.wait_closed(), timeout=2.0)

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
