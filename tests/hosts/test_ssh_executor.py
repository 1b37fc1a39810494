"""SshExecutor for real: asyncssh servers on loopback, started by the test, each standing in for one TPU
VM (its own home directory and host key), running commands through bash in a session of their own and
hanging that session up when its channel goes, as sshd does. A 2-host program is shipped, started,
streamed and stopped over SSH; hostile names, args and env values stay inert.

The other test_ssh_*.py modules import the loopback servers and helpers from here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from tpuctl.hosts.base import HostEvent, LaunchSpec
from tpuctl.hosts.bundle import build_bundle
from tpuctl.hosts.ssh import (
    DEFAULT_USERNAME,
    HostLogin,
    KeyPair,
    SshExecutor,
    SshHost,
    ensure_key_pair,
    ssh_keys_metadata,
)
from tpuctl.testing.ports import unused_port

#: How the loopback hosts take tpuctl's key: their one authorized key, for the default user.
LOGIN = HostLogin(DEFAULT_USERNAME, authorized_by="the test's authorized key", refused_fix="(test fix)")


@dataclass
class LoopbackHost:
    address: str
    port: int
    home: Path
    host_key: asyncssh.SSHKey
    commands: list[str] = field(default_factory=list)
    server: asyncssh.SSHAcceptor | None = None
    connections: list[asyncssh.SSHServerConnection] = field(default_factory=list)

    @property
    def public_key(self) -> str:
        """The OpenSSH public host key, as a node's guest attributes publish it."""
        return self.host_key.export_public_key().decode("ascii").strip()

    def ssh_host(self) -> SshHost:
        return SshHost(self.address, self.port, (self.public_key,))


class LoopbackSsh:
    """asyncssh servers in a thread of their own, one per home: public-key auth with one authorized key,
    each its own ed25519 host key; each command runs as ``bash -c CMD`` in the host's home in a new
    session, and the session gets SIGHUP when its channel closes first (as sshd does)."""

    def __init__(self, homes: list[Path], authorized_public_key: str, *, start: bool = True) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._children: list[asyncio.subprocess.Process] = []
        self._authorized = asyncssh.import_authorized_keys(authorized_public_key + "\n")
        self.hosts = [
            LoopbackHost("127.0.0.1", unused_port(), home, asyncssh.generate_private_key("ssh-ed25519"))
            for home in homes
        ]
        if start:
            for worker in range(len(self.hosts)):
                self.start_host(worker)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def start_host(self, worker: int) -> None:
        """Listen on the host's (fixed) address and port."""
        host = self.hosts[worker]

        def make_server() -> asyncssh.SSHServer:
            class Server(asyncssh.SSHServer):
                def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
                    host.connections.append(conn)

            return Server()

        async def start() -> asyncssh.SSHAcceptor:
            return await asyncssh.create_server(
                make_server,
                host.address,
                host.port,
                server_host_keys=[host.host_key],
                authorized_client_keys=self._authorized,
                process_factory=lambda process: self._handle(process, host),
                encoding=None,
                reuse_address=True,
            )

        host.server = self._run(start())

    def stop_host(self, worker: int) -> None:
        """Stop listening and drop every connection (the machine is gone from the network)."""
        host = self.hosts[worker]

        async def stop() -> None:
            if host.server is not None:
                host.server.close()
                await host.server.wait_closed()
                host.server = None
            for conn in host.connections:
                conn.abort()
            host.connections.clear()

        self._run(stop())

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes], host: LoopbackHost) -> None:
        command = str(process.command)
        host.commands.append(command)
        child = await asyncio.create_subprocess_exec(
            "/bin/bash",
            "-c",
            command,
            cwd=host.home,
            env={**os.environ, "HOME": str(host.home)},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._children.append(child)
        feeder = asyncio.ensure_future(self._feed(process, child))  # stdin may never see EOF
        pumps: asyncio.Future[Any] = asyncio.gather(
            self._drain(child.stdout, process.stdout),
            self._drain(child.stderr, process.stderr),
        )
        closed: asyncio.Future[Any] = asyncio.ensure_future(process.wait_closed())
        await asyncio.wait({pumps, closed}, return_when=asyncio.FIRST_COMPLETED)
        feeder.cancel()
        if not pumps.done():  # the channel went first: hang up the session, as sshd does
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGHUP)
            pumps.cancel()
            await asyncio.gather(pumps, return_exceptions=True)
            return
        closed.cancel()
        returncode = await child.wait()
        with contextlib.suppress(Exception):
            if returncode < 0:
                process.exit_with_signal(signal.Signals(-returncode).name.removeprefix("SIG"))
            else:
                process.exit(returncode)

    async def _feed(
        self, process: asyncssh.SSHServerProcess[bytes], child: asyncio.subprocess.Process
    ) -> None:
        assert child.stdin is not None
        try:
            while data := await process.stdin.read(65536):
                child.stdin.write(data)
                await child.stdin.drain()
        except (asyncssh.Error, ConnectionError, BrokenPipeError):
            pass
        finally:
            child.stdin.close()

    async def _drain(self, source: asyncio.StreamReader | None, sink: asyncssh.SSHWriter[bytes]) -> None:
        assert source is not None
        with contextlib.suppress(asyncssh.Error, ConnectionError, BrokenPipeError):
            while chunk := await source.read(65536):
                sink.write(chunk)

    def close(self) -> None:
        async def shutdown() -> None:
            for child in self._children:
                if child.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(child.pid, 9)
            # SIGKILLed, so they are gone; their reaping is the event loop's, and one slow to be reaped
            # on a loaded machine (a CI run once timed out here after the test had passed) is not the
            # test's failure.
            waits = [child.wait() for child in self._children if child.returncode is None]
            if waits:
                await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=10)
            for host in self.hosts:
                if host.server is not None:
                    host.server.close()
                    await host.server.wait_closed()

        self._run(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def kill_detached(homes: list[Path]) -> None:
    """SIGKILL every detached program group still running under these homes (their pid files)."""
    for home in homes:
        for pidfile in home.glob("**/runs/*/*/pid"):
            if not (pidfile.parent / "exit").exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.killpg(int(pidfile.read_text()), signal.SIGKILL)


@pytest.fixture
def key(tmp_path: Path) -> KeyPair:
    return ensure_key_pair(tmp_path / "state")


@pytest.fixture
def servers(tmp_path: Path, key: KeyPair) -> Iterator[LoopbackSsh]:
    homes = [tmp_path / f"vm-{i}" for i in range(2)]
    for home in homes:
        home.mkdir()
    loopback = LoopbackSsh(homes, key.public_openssh)
    try:
        yield loopback
    finally:
        loopback.close()
        kill_detached(homes)


def executor_for(servers: LoopbackSsh, key: KeyPair, **options: Any) -> SshExecutor:
    """An executor for the loopback hosts, trusting exactly their host keys."""
    options.setdefault("python", sys.executable)
    return SshExecutor([h.ssh_host() for h in servers.hosts], login=LOGIN, key=key, **options)


def collect(executor: SshExecutor, hosts: int, timeout_s: float = 30.0) -> list[HostEvent]:
    events: list[HostEvent] = []
    deadline = time.monotonic() + timeout_s
    while sum(1 for e in events if e.kind == "exit") < hosts:
        assert time.monotonic() < deadline, f"hosts did not all exit: {events}"
        event = executor.next_event(0.2)
        if event is not None:
            events.append(event)
    return events


def spec(
    program: tuple[str, ...], env: dict[str, str], run_id: str = "run-ssh-0001", workers: int = 2
) -> LaunchSpec:
    return LaunchSpec(
        run_id=run_id,
        program=program,
        num_workers=workers,
        chips_per_host=4,
        accelerator_type="v4-16",
        topology="2x2x2",
        checkpoint_dir="gs://bucket/ckpt",
        user_env=env,
    )


def test_key_pair_is_generated_once_private_and_goes_into_ssh_keys_metadata(tmp_path: Path) -> None:
    first = ensure_key_pair(tmp_path / "s")
    again = ensure_key_pair(tmp_path / "s")
    assert first == again
    assert first.private_path is not None
    assert first.private_path.stat().st_mode & 0o777 == 0o600
    assert first.private_path.parent.stat().st_mode & 0o777 == 0o700
    assert first.public_openssh.startswith("ssh-ed25519 ")
    assert ssh_keys_metadata(DEFAULT_USERNAME, first.public_openssh) == f"tpuctl:{first.public_openssh}"


PROGRAM = """\
import json, os, sys
import tpuctl.runtime.hostenv as hostenv  # shipped with the bundle, found through PYTHONPATH
worker = int(os.environ[hostenv.WORKER_ID])
print(json.dumps({"worker": worker, "workers": os.environ[hostenv.NUM_WORKERS],
                  "type": os.environ[hostenv.ACCELERATOR_TYPE], "ckpt": os.environ[hostenv.CHECKPOINT_DIR],
                  "argv": sys.argv[1:], "evil": os.environ["EVIL"], "quote": os.environ["QUOTE"],
                  "cwd_ok": os.path.exists("prog.py")}), flush=True)
print("partial sum", sum(range(worker * 10, worker * 10 + 10)), flush=True)
sys.exit(0)
"""


def test_two_host_program_runs_over_ssh_and_hostile_values_stay_inert(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair
) -> None:
    pwned = tmp_path / "pwned"
    evil = f"$(touch {pwned})"
    quote = "'; rm -rf ~'; touch " + str(pwned)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "prog.py").write_text(PROGRAM)
    bundle = build_bundle(work)
    executor = executor_for(
        servers,
        key,
        # A root with a space and shell syntax in it: quoting must hold for paths too.
        remote_root=f"tpuctl root $(touch {pwned})",
    )
    try:
        shipped = executor.ship(bundle)
        assert [s.shipped for s in shipped] == [True, True]
        executor.start(spec(("prog.py", evil, quote, "a b"), {"EVIL": evil, "QUOTE": quote}))
        events = collect(executor, 2)
    finally:
        executor.close()

    for worker in (0, 1):
        mine = [e for e in events if e.worker == worker]
        assert [e.kind for e in mine] == ["line", "line", "exit"], mine
        report = json.loads(mine[0].text)
        assert report == {
            "worker": worker,
            "workers": "2",
            "type": "v4-16",
            "ckpt": "gs://bucket/ckpt",
            "argv": [evil, quote, "a b"],
            "evil": evil,
            "quote": quote,
            "cwd_ok": True,
        }
        assert mine[1].text == f"partial sum {sum(range(worker * 10, worker * 10 + 10))}"
        assert mine[2].returncode == 0
        bundle_dir = servers.hosts[worker].home / f"tpuctl root $(touch {pwned})" / "bundles" / bundle.digest
        assert (bundle_dir / "prog.py").read_text() == PROGRAM
    assert not pwned.exists()
    assert not (tmp_path / "~").exists()

    # Same bundle again: each host already has it, nothing is sent.
    again = executor_for(servers, key, remote_root=f"tpuctl root $(touch {pwned})")
    try:
        assert [s.shipped for s in again.ship(bundle)] == [False, False]
        assert [s.bytes for s in again.ship(bundle)] == [0, 0]
    finally:
        again.close()


SLEEPER = """\
import os, sys, time
print("pid", os.getpid(), flush=True)
if os.environ["TPUCTL_WORKER_ID"] == "1":
    sys.exit(7)
time.sleep(300)
"""


def test_failed_host_exit_status_and_stop_kills_the_remote_program(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair
) -> None:
    work = tmp_path / "proj"
    work.mkdir()
    (work / "sleeper.py").write_text(SLEEPER)
    executor = executor_for(servers, key)
    try:
        executor.ship(build_bundle(work))
        executor.start(spec(("sleeper.py",), {}, run_id="run-ssh-0002"))
        pids: dict[int, int] = {}
        exits: dict[int, int | None] = {}
        deadline = time.monotonic() + 30
        while len(pids) < 2 or 1 not in exits:
            assert time.monotonic() < deadline
            event = executor.next_event(0.2)
            if event is None:
                continue
            if event.kind == "line" and event.text.startswith("pid "):
                pids[event.worker] = int(event.text.split()[1])
            elif event.kind == "exit":
                exits[event.worker] = event.returncode
        assert exits == {1: 7}
        assert Path(f"/proc/{pids[0]}").exists()
        started = time.monotonic()
        executor.stop(grace_s=2.0)
        assert time.monotonic() - started < 2.0 + 5.0
        rest = collect(executor, 1, timeout_s=10)
        # The detached program's own status, from its supervisor: killed by SIGTERM.
        assert [e.returncode for e in rest if e.kind == "exit"] == [-15]
        deadline = time.monotonic() + 5
        while Path(f"/proc/{pids[0]}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{pids[0]}").exists(), (Path(f"/proc/{pids[0]}/stat").read_text(), rest)
        # The stop went through the pid file, unless the exit file says the group is gone (a path of
        # safe characters needs no quotes).
        stops = [c for c in servers.hosts[0].commands if "kill -TERM" in c]
        assert stops == [
            "[ -e .tpuctl/runs/run-ssh-0002/0/exit ] || { pid=$(cat .tpuctl/runs/run-ssh-0002/0/pid) && "
            'kill -TERM -- "-$pid"; } 2>/dev/null; true'
        ]
    finally:
        executor.close()


# --- through the launcher: the simulator reports endpoints that point at the loopback servers ------------


def test_launcher_runs_a_2_host_slice_over_ssh_via_the_nodes_endpoints(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The launcher does not pass the nodes' host keys yet (services/run/hosts.py reads no guest
    # attributes); until it does, this test trusts whatever the loopback hosts present.
    import functools

    import tpuctl.hosts.ssh
    from tpuctl.services.placement_choices import PlacementChoices
    from tpuctl.services.run.launcher import Launcher
    from tpuctl.services.run.model import PhaseUpdate, RecoveryPolicy, RunRequest
    from tpuctl.services.run.service import Runs
    from tpuctl.services.session import open_session
    from tpuctl.settings import load_settings
    from tpuctl.sim import SimAdminClient, SimServer
    from tpuctl.sim.world import world_from_data

    monkeypatch.setattr(
        tpuctl.hosts.ssh,
        "SshExecutor",
        functools.partial(tpuctl.hosts.ssh.SshExecutor, verify_host_keys=False),
    )
    world = world_from_data(
        {
            "speed": 1000,
            "zones": {"us-central2-b": {"v4": {"on_demand": 64, "preemptible": 64}}},
            "quotas": {"default": {"on_demand": {"zone": -1, "region": -1}}},
            "latency": {"base_ms": 0, "jitter_ms": 0},
        },
        "test world",
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    server = SimServer(state_dir, world)
    url = server.start()
    key = ensure_key_pair(state_dir)  # the key the launcher will use: tpuctl's own, in the state dir
    admin = SimAdminClient(url)
    session = open_session(load_settings({"backend": "sim", "sim_url": url, "state_dir": state_dir}))
    try:
        from tpuctl.services.access import ssh_key_metadata
        from tpuctl.services.allocator import Allocator, build_request

        placement = build_request(
            session.catalog,
            session.settings,
            "v4-16",
            name="ssh-pod",
            zones=["us-central2-b"],
            metadata=ssh_key_metadata(session, plan=False),
        )
        placed = Allocator(session).place(placement).nodes[0]
        work = tmp_path / "proj"
        work.mkdir()
        (work / "prog.py").write_text(PROGRAM)
        lines: list[tuple[int, str]] = []

        class Observer:
            def line(self, worker: int, text: str) -> None:
                lines.append((worker, text))

            def status(self, text: str) -> None:
                pass

            def phase(self, update: PhaseUpdate) -> None:
                pass

            def detail(self, worker: int | None, text: str) -> None:
                pass

        evil = f"$(touch {tmp_path / 'pwned'})"
        runs = Runs(session)
        prepared = runs.prepare(
            RunRequest(
                script=str(work / "prog.py"),
                args=(evil,),
                pod="ssh-pod",
                executor="ssh",
                env=(f"EVIL={evil}", "QUOTE='; rm -rf ~'"),
                runtime_deps=False,  # a stdlib program: the image's python3
            )
        )
        result = runs.start(prepared, observer=Observer(), policy=RecoveryPolicy.off()).run
        assert result.exit_code == 0 and result.hosts == 2 and result.shipped_hosts == 2
        reports = {w: json.loads(t) for w, t in lines if t.startswith("{")}
        assert sorted(reports) == [0, 1]
        for worker, report in reports.items():
            assert report["worker"] == worker and report["workers"] == "2" and report["type"] == "v4-16"
            assert report["argv"] == [evil] and report["evil"] == evil and report["quote"] == "'; rm -rf ~'"
        assert not (tmp_path / "pwned").exists()
        # Each VM got the bundle on its own disk, and the run's logs are in the state dir.
        from tpuctl.sim.vms.layout import disk_dir

        for worker in (0, 1):
            home = disk_dir(server.engine.ctx.vm_root, placed.id, worker) / "home" / "tpuctl"
            assert (home / ".tpuctl" / "bundles" / result.bundle_sha256 / "prog.py").is_file()
        log = (state_dir / "runs" / result.run_id / "worker-1.log").read_text()
        assert "partial sum 145" in log
        record = session.ledger.get_run(result.run_id)
        assert record is not None and record.status == "succeeded" and record.exit_code == 0

        # A slice the launcher creates for an SSH run carries tpuctl's public key in its metadata.
        launcher = Launcher(session)
        prepared = launcher.prepare(
            RunRequest(
                script=str(work / "prog.py"),
                accelerator_type="v4-16",
                placement=PlacementChoices(zones=("us-central2-b",)),
                executor="ssh",
            )
        )
        session.ledger.create_run(prepared.run_id, script="prog.py")
        node = launcher.provision(prepared)
        ssh_keys = admin.metadata("us-central2-b", node.name, 1, "instance/attributes/ssh-keys")
        assert ssh_keys == f"tpuctl:{key.public_openssh}"
    finally:
        session.close()
        admin.close()
        server.stop()
