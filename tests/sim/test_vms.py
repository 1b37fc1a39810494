"""The simulated hosts are VMs: a distinct loopback address each, a disk of their own (wiped when the
VM dies), an sshd authorizing exactly the node's ssh-keys, a login environment built from scratch, a
metadata server where google-auth finds it, host keys in the guest attributes, and preemption reaching
every process of the VM."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import asyncssh
import httpx
import pytest
from google.cloud import tpu_v2
from sim_helpers import AUTH, FAST_POLLING, PARENT, ZONE, make_world
from vm_helpers import USER, Vms, start_vms

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.iam import ADC_TOKEN, access_token, default_service_account
from tpuctl.sim.vms import procs
from tpuctl.sim.vms.layout import choose_port, disk_dir
from tpuctl.sim.vms.sshd import auth_log
from tpuctl.testing.clock import FakeClock, wait_for

MD = {"Metadata-Flavor": "Google"}
GOOGLE_AUTH_PROBE = (
    "from google.auth.compute_engine import _metadata\n"
    "from google.auth.transport.requests import Request\n"
    "r = Request()\n"
    "print(_metadata.get(r, 'instance/attributes/agent-worker-number'), _metadata.get_project_id(r))\n"
)
NETWORK_ENV = {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9", "PIP_NO_INDEX": "1"}


@pytest.fixture
def vms(start_server: Callable[..., SimServer]) -> Vms:
    server = start_server(make_world(), network_env=NETWORK_ENV)
    return start_vms(server, "vm")


def test_each_host_has_its_own_address_everywhere(vms: Vms) -> None:
    addresses = vms.addresses
    assert len(addresses) == 4 and len(set(addresses)) == 4
    for address in addresses:
        ip = ipaddress.ip_address(address)
        assert ip.is_loopback and int(address.split(".")[1]) >= 16
    # No external IP unless the create asked for one (the API's default).
    assert all(not e.access_config.external_ip for e in vms.node.network_endpoints)
    expected = ",".join(f"unknown:unknown:{a}" for a in addresses)
    for worker, address in enumerate(addresses):
        base = vms.metadata_base(worker) + "/computeMetadata/v1/instance"
        assert httpx.get(f"{base}/attributes/worker-network-endpoints", headers=MD).text == expected
        assert httpx.get(f"{base}/network-interfaces/0/ip", headers=MD).text == address


def test_external_ips_only_when_asked(start_server: Callable[..., SimServer]) -> None:
    server = start_server(make_world())
    vms = start_vms(
        server, "ext", "v5litepod-8", network_config=tpu_v2.NetworkConfig(enable_external_ips=True)
    )
    endpoint = vms.node.network_endpoints[0]
    assert endpoint.access_config.external_ip == endpoint.ip_address


def test_metadata_server_as_google_auth_finds_it(vms: Vms) -> None:
    for worker in range(4):
        host = str(vms.ssh(worker, "echo $GCE_METADATA_HOST").stdout).strip()
        answer = httpx.get(
            f"http://{host}/computeMetadata/v1/instance/attributes/agent-worker-number", headers=MD
        )
        assert answer.text == str(worker) and answer.headers["Metadata-Flavor"] == "Google"
    # Unmodified google-auth (it reads GCE_METADATA_HOST at import: a process of its own), the host
    # implied by the address, the standard path.
    for worker in (0, 3):
        host = str(vms.ssh(worker, "echo $GCE_METADATA_HOST").stdout).strip()
        probe = subprocess.run(
            [sys.executable, "-c", GOOGLE_AUTH_PROBE],
            env={**os.environ, "GCE_METADATA_HOST": host},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.stdout.strip() == f"{worker} tpuctl-sim", probe.stderr
    base = vms.metadata_base(0) + "/computeMetadata/v1"
    refused = httpx.get(f"{base}/instance/attributes/agent-worker-number")
    assert refused.status_code == 403
    assert httpx.get(f"{base}/instance/nope", headers=MD).status_code == 404
    tree = httpx.get(f"{base}/instance/", params={"recursive": "true"}, headers=MD).json()
    assert tree["networkInterfaces"][0]["ip"] == vms.addresses[0]
    assert tree["attributes"]["accelerator-type"] == "v5litepod-16"
    assert "WORKER_ID: '0'" in tree["attributes"]["tpu-env"]
    token = httpx.get(f"{base}/instance/service-accounts/default/token", headers=MD).json()
    # The host's own service account's token (the project's default account here), which the
    # simulator's APIs and bucket take as that account's, and the root answers as GCE's does.
    assert token == {
        "access_token": access_token(default_service_account("tpuctl-sim")),
        "expires_in": 3599,
        "token_type": "Bearer",
    }
    root = httpx.get(vms.metadata_base(0) + "/", headers=MD)
    assert root.status_code == 200 and root.headers["Metadata-Flavor"] == "Google"
    # As tensorstore asks (GCE's shape): the account with its scopes as a list, then its token by email.
    account = httpx.get(f"{base}/instance/service-accounts/default/", params={"recursive": "true"},
                        headers=MD).json()  # fmt: skip
    assert account["aliases"] == ["default"] and account["scopes"] == [
        "https://www.googleapis.com/auth/cloud-platform"
    ]
    by_email = httpx.get(f"{base}/instance/service-accounts/{account['email']}/token", headers=MD).json()
    assert by_email["access_token"] == token["access_token"]


def test_only_the_nodes_ssh_keys_log_in(vms: Vms) -> None:
    assert vms.ssh(0, "echo in").stdout == "in\n"
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(asyncssh.PermissionDenied):
        vms.ssh(0, "true", key=stranger)
    with pytest.raises(asyncssh.PermissionDenied):
        vms.ssh(0, "true", user="mallory")  # alice's key is alice's only
    result = vms.ssh(1, "echo out; echo err >&2; exit 7")
    assert (result.stdout, result.stderr, result.exit_status) == ("out\n", "err\n", 7)


def test_login_environment_is_built_from_scratch(vms: Vms) -> None:
    state_dir = str(vms.server.state_dir)
    env_text = vms.ssh(2, "env; echo CWD=$(pwd); command -v python3").stdout
    assert isinstance(env_text, str)
    assert state_dir not in env_text and "PYTEST" not in env_text and "VIRTUAL_ENV" not in env_text
    env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
    disk = disk_dir(vms.server.engine.ctx.vm_root, str(vms.node.id), 2)
    assert env["HOME"] == str(disk / "home" / USER) == env["CWD"]
    assert env["USER"] == env["LOGNAME"] == USER and env["SHELL"] == "/bin/bash"
    metadata = f"{vms.addresses[2]}:{vms.server.metadata_port}"
    assert env["GCE_METADATA_HOST"] == env["GCE_METADATA_IP"] == env["GCE_METADATA_ROOT"] == metadata
    assert env["STORAGE_EMULATOR_HOST"] == NETWORK_ENV["STORAGE_EMULATOR_HOST"] and env["PIP_NO_INDEX"] == "1"
    image_python = str(vms.server.engine.ctx.vm_root / "image" / "bin" / "python3")
    assert env_text.splitlines()[-1] == image_python
    assert not str(vms.server.engine.ctx.vm_root).startswith(state_dir)


#: Run on a host: each command the stock image lacks answers "no-<name>", each it has "has-<name>".
_TOOLS_PROBE = (
    "for c in pip pip3 uv uvx tar sha256sum mktemp; do "
    "if command -v $c >/dev/null; then echo has-$c; else echo no-$c; fi; done; "
    "python3 -m pip --version >/dev/null 2>&1 && echo has-python3-pip || echo no-python3-pip; "
    "bash -lc 'command -v pip uv' >/dev/null 2>&1 && echo login-has-tooling || echo login-no-tooling"
)


def test_a_host_has_a_stock_image_without_python_tooling(vms: Vms) -> None:
    """Neither pip (not even the image python3's own) nor uv of this machine: only the
    shell, system tools and the image's python3, as in a login shell too (which reads .profile)."""
    answers = str(vms.ssh(0, _TOOLS_PROBE).stdout).split()
    assert answers == [
        "no-pip", "no-pip3", "no-uv", "no-uvx",
        "has-tar", "has-sha256sum", "has-mktemp", "no-python3-pip", "login-no-tooling",
    ]  # fmt: skip


def test_each_disk_is_private_and_goes_with_the_node(vms: Vms) -> None:
    vms.ssh(0, "echo mine > ~/file")
    assert vms.ssh(0, "cat ~/file").stdout == "mine\n"
    assert vms.ssh(1, "test -e ~/file").exit_status == 1
    disk = disk_dir(vms.server.engine.ctx.vm_root, str(vms.node.id), 0)
    assert (disk / "home" / USER / "file").exists()
    vms.client.delete_node(name=f"{PARENT}/nodes/vm").result(polling=FAST_POLLING)
    wait_for(lambda: not disk.exists(), what="the deleted node's disk wiped")
    # Renamed away at once, its files removed by the fleet's reaper, off the API's transaction.
    wait_for(
        lambda: not [p for p in disk.parent.iterdir() if p.name.startswith(disk.name)],
        what="the wiped disk's files removed",
    )
    wait_for(lambda: not vms.server.fleet.served(), what="the deleted node's hosts no longer served")
    with pytest.raises(OSError):
        vms.ssh(0, "true")


def test_guest_attributes_publish_the_host_keys_clients_see(vms: Vms) -> None:
    answer = vms.client.get_guest_attributes(
        request=tpu_v2.GetGuestAttributesRequest(name=f"{PARENT}/nodes/vm", query_path="hostkeys/")
    )
    assert len(answer.guest_attributes) == 4
    for worker, attributes in enumerate(answer.guest_attributes):
        (item,) = attributes.query_value.items
        assert (item.namespace, item.key) == ("hostkeys", "ssh-ed25519")
        assert item.value == vms.server_host_key(worker)
    assert len({a.query_value.items[0].value for a in answer.guest_attributes}) == 4


def test_os_login_keys_replace_ssh_keys(start_server: Callable[..., SimServer]) -> None:
    email = "alice.b@example.com"
    clock = FakeClock(time.time(), ticking=True)
    server = start_server(make_world(os_login=True, principal=email), clock=clock)
    vms = start_vms(server, "osl", "v5litepod-8")
    with pytest.raises(asyncssh.PermissionDenied):
        vms.ssh(0, "true")  # ssh-keys metadata is ignored under OS Login
    public = vms.key.export_public_key().decode().strip()
    # The project's metadata says so, and tokeninfo names the caller.
    project = httpx.get(f"{server.url}/compute/v1/projects/tpuctl-sim", headers=AUTH).json()
    assert project["commonInstanceMetadata"]["items"] == [{"key": "enable-oslogin", "value": "TRUE"}]
    assert httpx.get(f"{server.url}/tokeninfo", params={"access_token": ADC_TOKEN}).json()["email"] == email
    # Only into the caller's own profile.
    other = httpx.post(
        f"{server.url}/v1/users/bob@example.com:importSshPublicKey", json={"key": public}, headers=AUTH
    )
    assert other.status_code == 403 and other.json()["error"]["status"] == "PERMISSION_DENIED"
    expires_usec = int((clock.now() + 3600) * 1_000_000)
    imported = httpx.post(
        f"{server.url}/v1/users/{email}:importSshPublicKey",
        params={"projectId": "tpuctl-sim"},
        json={"key": public, "expirationTimeUsec": str(expires_usec)},
        headers=AUTH,
    ).json()
    (account,) = imported["loginProfile"]["posixAccounts"]
    assert account["username"] == "alice_b_example_com" and account["primary"] is True
    ((fingerprint, entry),) = imported["loginProfile"]["sshPublicKeys"].items()
    assert entry["expirationTimeUsec"] == str(expires_usec)
    profile = httpx.get(f"{server.url}/v1/users/{email}/loginProfile", headers=AUTH).json()
    assert profile["sshPublicKeys"][fingerprint]["key"] == " ".join(public.split()[:2])
    assert (
        vms.ssh(0, "whoami >/dev/null; echo $USER", user="alice_b_example_com").stdout
        == "alice_b_example_com\n"
    )
    # The host records the login under the POSIX name, with the key's fingerprint.
    disk = disk_dir(server.engine.ctx.vm_root, str(vms.node.id), 0)
    (line,) = auth_log(disk).read_text().splitlines()
    assert line.startswith("Accepted publickey for alice_b_example_com from 127.0.0.1 port ")
    assert line.endswith(f"ssh2: ssh-ed25519 {vms.key.get_fingerprint('sha256')}")
    # An expired key lets no one in; a patch of its expiry lets it in again.
    clock.advance(3601)
    with pytest.raises(asyncssh.PermissionDenied):
        vms.ssh(0, "true", user="alice_b_example_com")
    patched = httpx.patch(
        f"{server.url}/v1/users/{email}/sshPublicKeys/{fingerprint}",
        params={"updateMask": "expirationTimeUsec"},
        json={"key": public, "expirationTimeUsec": str(int((clock.now() + 60) * 1_000_000))},
        headers=AUTH,
    )
    assert patched.status_code == 200 and patched.json()["fingerprint"] == fingerprint
    assert vms.ssh(0, "true", user="alice_b_example_com").exit_status == 0


def test_preemption_with_notice_reaches_every_process_of_the_vm(
    start_server: Callable[..., SimServer],
) -> None:
    clock = FakeClock(time.time(), ticking=True)
    server = start_server(make_world(durations={"preemption_grace_s": 30}), clock=clock)
    vms = start_vms(server, "pre", "v5litepod-8")
    disk = disk_dir(server.engine.ctx.vm_root, str(vms.node.id), 0)
    home = disk / "home" / USER
    program = (
        "import os, pathlib, signal, time\n"
        "home = pathlib.Path.home()\n"
        "signal.signal(signal.SIGTERM, lambda *_: (home / 'term').write_text('TERM'))\n"
        "(home / 'pid').write_text(str(os.getpid()))\n"
        "while True: time.sleep(0.05)\n"
    )
    vms.ssh(0, "true")  # creates the home
    (home / "prog.py").write_text(program)
    # Detached from the SSH session, as a real launcher starts it: only the VM's fate reaches it.
    vms.ssh(0, "setsid python3 prog.py </dev/null >/dev/null 2>&1 &")
    pid = int(wait_for(lambda: (home / "pid").exists() and (home / "pid").read_text(), what="program up"))
    assert pid in procs.vm_pids(str(vms.node.id), 0, disk)

    url = vms.metadata_base(0) + "/computeMetadata/v1/instance/preempted"
    before = httpx.get(url, headers=MD)
    assert before.text == "FALSE"
    # From the ETag of FALSE: TRUE whether the long poll reaches the VM before the preemption or after.
    params = {"wait_for_change": "true", "last_etag": before.headers["ETag"]}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        watch = pool.submit(httpx.get, url, params=params, headers=MD, timeout=30)
        with SimAdminClient(server.url) as admin:
            assert admin.preempt(ZONE, "pre", notice=True)["state"] == "READY"
        assert watch.result(timeout=20).text == "TRUE"
    wait_for(lambda: (home / "term").exists(), what="SIGTERM seen by the program")
    assert _alive(pid) and disk.exists()  # the grace period: it may checkpoint

    clock.advance(30)  # the grace is REAL seconds; the injected clock stands for them
    wait_for(lambda: not _alive(pid), what="SIGKILL after the grace")
    wait_for(lambda: not disk.exists(), what="the preempted VM's disk wiped")
    wait_for(lambda: not server.fleet.served(), what="its sshd gone")
    with pytest.raises(OSError):
        vms.ssh(0, "true")


def test_processes_are_found_by_marker_or_by_cwd(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    marked = _spawn(["sleep", "60"], env={"TPUCTL_SIM_VM": "42/0"}, cwd=tmp_path)
    scrubbed = _spawn(["sleep", "60"], env={}, cwd=disk)
    other = _spawn(["sleep", "60"], env={"TPUCTL_SIM_VM": "42/01"}, cwd=tmp_path)
    try:
        found = procs.vm_pids("42", 0, disk)
        assert marked in found and scrubbed in found and other not in found
        assert procs.signal_vm("42", 0, disk, signal.SIGKILL) == 2
        wait_for(lambda: not _alive(marked) and not _alive(scrubbed))
        assert _alive(other)
    finally:
        os.kill(other, signal.SIGKILL)
        for pid in (marked, scrubbed, other):
            _reap(pid)


def test_ports_fall_back_when_the_first_choice_cannot_be_bound() -> None:
    with socket.socket() as held:
        held.bind(("127.16.0.0", 0))
        taken = held.getsockname()[1]
        assert choose_port((taken, 2222)) == 2222
    assert choose_port((0, 2222)) == 0


def test_admin_status_names_the_ports(vms: Vms) -> None:
    with SimAdminClient(vms.server.url) as admin:
        status = admin.status()
        assert (status["ssh_port"], status["metadata_port"]) == (
            vms.server.ssh_port,
            vms.server.metadata_port,
        )
        assert status["nodes"][0]["host_addresses"] == vms.addresses
        assert admin.metadata(ZONE, "vm", 3, "instance/attributes/agent-worker-number") == "3"


def _spawn(argv: list[str], *, env: dict[str, str], cwd: Path) -> int:
    return subprocess.Popen(argv, env={**env, "PATH": "/usr/bin:/bin"}, cwd=cwd, start_new_session=True).pid


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def test_a_wiped_disk_is_gone_at_once_and_its_files_go_with_the_reaper(tmp_path: Path) -> None:
    disks = tmp_path / "disks"
    disk = disks / "1234-0"
    (disk / "home" / USER).mkdir(parents=True)
    (disk / "home" / USER / "checkpoint").write_text("state")
    (disks / "1234-1").mkdir()
    procs.wipe_disk(disk)
    assert not disk.exists()
    (doomed,) = [p for p in disks.iterdir() if p.name.startswith("1234-0")]
    assert procs.WIPING in doomed.name and (doomed / "home" / USER / "checkpoint").exists()
    procs.wipe_disk(disk)  # a second wipe of the same disk (a preemption and a delete at once)
    assert procs.reap_wiped_disks(disks) == 1
    assert [p.name for p in disks.iterdir()] == ["1234-1"]  # another host's disk is left alone


def test_a_local_port_forward_reaches_the_vms_loopback_only(vms: Vms) -> None:
    """``ssh -L`` as OpenSSH allows it by default: how a laptop reaches the team server on its VM's
    loopback; a forward to any other address is refused (stricter than a real sshd)."""

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        async def forward(dest: str) -> bytes:
            async with asyncssh.connect(
                vms.addresses[0], vms.server.ssh_port, username="alice", client_keys=[vms.key],
                known_hosts=None,
            ) as conn:  # fmt: skip
                reader, writer = await conn.open_connection(dest, port)
                writer.write(b"ping")
                writer.write_eof()
                return bytes(await reader.read())

        async def answer() -> None:
            loop = asyncio.get_running_loop()
            peer, _ = await loop.sock_accept(listener)
            with peer:
                await loop.sock_sendall(peer, b"pong:" + await loop.sock_recv(peer, 4))

        async def both() -> bytes:
            listener.setblocking(False)
            served = asyncio.create_task(answer())
            got = await forward("127.0.0.1")
            await served
            return got

        assert asyncio.run(both()) == b"pong:ping"
        with pytest.raises(asyncssh.ChannelOpenError):
            asyncio.run(forward(vms.addresses[1]))
