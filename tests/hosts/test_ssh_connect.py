"""Reaching hosts: host keys checked against the expected ones (no trust on first use), an sshd that
comes up late waited for with a bounded backoff, a clear give-up, and a ProxyCommand path."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
import threading
import time
from pathlib import Path

import asyncssh
import pytest
from test_ssh_executor import LOGIN, LoopbackSsh, executor_for, key, servers

from tpuctl.errors import CloudError, HostKeyMismatchError, RunFailedError
from tpuctl.hosts.ssh import (
    DEFAULT_USERNAME,
    HostLogin,
    KeyPair,
    SshExecutor,
    SshHost,
    expand_proxy_command,
    fingerprint,
)

__all__ = ["key", "servers"]  # fixtures shared with test_ssh_executor


def _echo(executor: SshExecutor) -> dict[int, int | None]:
    results = executor.run_command("echo up", on_line=lambda w, t: None, timeout_s=10)
    return {w: r.exit_status for w, r in results.items()}


def test_wrong_host_key_is_refused_naming_worker_address_and_both_fingerprints(
    servers: LoopbackSsh, key: KeyPair
) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    real = servers.hosts[1]
    hosts = [servers.hosts[0].ssh_host(), SshHost(real.address, real.port, (impostor,))]
    executor = SshExecutor(hosts, login=LOGIN, key=key)
    started = time.monotonic()
    try:
        with pytest.raises(HostKeyMismatchError) as info:
            _echo(executor)
    finally:
        executor.close()
    assert time.monotonic() - started < 5  # refused at once, not retried until the deadline
    error = info.value
    assert error.worker == 1 and error.address == f"127.0.0.1:{real.port}"
    assert error.expected == (fingerprint(impostor),)
    assert error.presented == fingerprint(real.public_key) != fingerprint(impostor)
    assert error.message == (
        f"host 1 at 127.0.0.1:{real.port} presented SSH host key {fingerprint(real.public_key)}, not the "
        f"key its node published ({fingerprint(impostor)}); refusing to log in"
    )
    assert error.presented.startswith("SHA256:") and error.to_dict()["error"] == "host_key_mismatch"


def test_unknown_host_key_is_refused_unless_verification_is_off(servers: LoopbackSsh, key: KeyPair) -> None:
    unknown = [SshHost(h.address, h.port) for h in servers.hosts]
    strict = SshExecutor(unknown, login=LOGIN, key=key)
    try:
        with pytest.raises(HostKeyMismatchError, match="no SSH host key is known for host") as info:
            _echo(strict)
        assert info.value.expected == () and info.value.presented is not None
    finally:
        strict.close()
    trusting = SshExecutor(unknown, login=LOGIN, key=key, verify_host_keys=False)
    try:
        assert _echo(trusting) == {0: 0, 1: 0}
    finally:
        trusting.close()
    right = executor_for(servers, key)
    try:
        assert _echo(right) == {0: 0, 1: 0}
    finally:
        right.close()


def test_an_sshd_that_comes_up_late_is_waited_for(tmp_path: Path, key: KeyPair) -> None:
    (tmp_path / "vm").mkdir()
    late = LoopbackSsh([tmp_path / "vm"], key.public_openssh, start=False)
    timer = threading.Timer(1.2, late.start_host, args=(0,))
    executor = executor_for(late, key, connect_deadline_s=20)
    started = time.monotonic()
    try:
        timer.start()
        assert _echo(executor) == {0: 0}
        assert 1.2 <= time.monotonic() - started < 5  # retried (0.5 s, 1 s, 2 s pauses), not given up
    finally:
        timer.join()
        executor.close()
        late.close()


def test_giving_up_names_the_host_its_address_and_what_was_tried(tmp_path: Path, key: KeyPair) -> None:
    (tmp_path / "vm").mkdir()
    down = LoopbackSsh([tmp_path / "vm"], key.public_openssh, start=False)
    executor = executor_for(down, key, connect_deadline_s=1.6)
    port = down.hosts[0].port
    started = time.monotonic()
    try:
        with pytest.raises(RunFailedError) as info:
            _echo(executor)
    finally:
        executor.close()
        down.close()
    assert 1.6 <= time.monotonic() - started < 4
    message = info.value.message
    assert info.value.worker == 0
    assert message.startswith(f"cannot reach host 0 at tpuctl@127.0.0.1:{port}: ")
    match = re.search(r"(\d+) connection attempts over (\d+\.\d) s, last error: (.*)", message)
    assert match is not None, message
    # 0 s, 0.5 s, 1.5 s, then at the deadline: the pauses double from 0.5 s (a refused connection
    # takes longer on a busy machine, so one of the middle tries may not fit).
    assert 3 <= int(match[1]) <= 4 and float(match[2]) >= 1.6
    assert "ConnectionRefusedError" in match[3] or "OSError" in match[3]


def test_a_refused_key_names_what_authorized_it_and_the_logins_fix(servers: LoopbackSsh) -> None:
    stranger = KeyPair.generate("not-authorized")  # the hosts authorize another key
    login = HostLogin(
        "alice_example_com", authorized_by="OS Login (project p), as alice", refused_fix="grant the role"
    )
    hosts = [servers.hosts[0].ssh_host()]
    # A refusal is tried again until the deadline (a guest agent may not have written the key yet); 2 s
    # leaves a loaded machine time for one whole handshake (a clean-clone CI run timed out at 0.5 s).
    executor = SshExecutor(hosts, login=login, key=stranger, connect_deadline_s=2.0)
    try:
        with pytest.raises(RunFailedError) as info:
            _echo(executor)
    finally:
        executor.close()
    assert info.value.message.startswith(
        f"cannot reach host 0 at alice_example_com@127.0.0.1:{hosts[0].port}"
    )
    assert "PermissionDenied" in info.value.message
    assert "the key was authorized through OS Login (project p), as alice" in info.value.message
    assert info.value.fix == "grant the role"


def test_a_refusal_stays_the_reason_when_the_deadline_cuts_the_last_try_short(
    servers: LoopbackSsh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy machine's last handshake may still be under way at the deadline: the refusal the tries
    before it met is what the error names, with its fix, not the cut try's timeout."""
    login = HostLogin(
        "alice_example_com", authorized_by="OS Login (project p), as alice", refused_fix="grant the role"
    )
    executor = SshExecutor([servers.hosts[0].ssh_host()], login=login, key=KeyPair.generate("k"),
                           connect_deadline_s=1.0)  # fmt: skip
    tries: list[float] = []

    async def refused_then_stuck(remote: object) -> asyncssh.SSHClientConnection:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise asyncssh.PermissionDenied("permission denied")
        await asyncio.sleep(60)  # a handshake the deadline ends
        raise AssertionError("unreachable")

    monkeypatch.setattr(executor, "_open", refused_then_stuck)
    try:
        with pytest.raises(RunFailedError) as info:
            _echo(executor)
    finally:
        executor.close()
    assert len(tries) == 2
    assert "PermissionDenied" in info.value.message, info.value.message
    assert "the key was authorized through OS Login (project p), as alice" in info.value.message
    assert info.value.fix == "grant the role"


def test_the_login_is_renewed_before_each_new_connection_and_a_failed_renewal_is_retried(
    servers: LoopbackSsh, key: KeyPair
) -> None:
    calls: list[float] = []

    def renew() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise CloudError("OS Login unavailable")  # the next attempt tries again

    login = HostLogin(DEFAULT_USERNAME, authorized_by="a renewing test", refused_fix="", renew=renew)
    executor = SshExecutor([servers.hosts[0].ssh_host()], login=login, key=key)
    try:
        assert _echo(executor) == {0: 0}
        assert len(calls) == 2  # the failed renewal, then the one before the connection that held
        assert _echo(executor) == {0: 0}
        assert len(calls) == 2  # the live connection is reused: nothing to renew
        executor.close_connections()
        assert _echo(executor) == {0: 0}
        assert len(calls) == 3  # a new connection renews first
    finally:
        executor.close()


#: How both relays below pass bytes between their stdin/stdout and ``sock``, the host's sshd.
_PIPE = """def up():
    while data := sys.stdin.buffer.read1(65536):
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := sock.recv(65536):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"""


RELAY = (
    """\
import json, socket, sys, threading
table, name, port, user = sys.argv[1:]
with open(table + ".log", "a") as log:
    log.write(json.dumps([name, port, user]) + "\\n")
address, real_port = json.load(open(table))[name]
sock = socket.create_connection((address, real_port))
"""
    + _PIPE
)


def test_proxy_command_reaches_hosts_that_have_no_direct_route(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair
) -> None:
    # Names no resolver knows: only the relay (an IAP tunnel's stand-in) can reach them.
    table = tmp_path / "routes.json"
    table.write_text(json.dumps({f"tpu-worker-{h.port}": [h.address, h.port] for h in servers.hosts}))
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    hosts = [SshHost(f"tpu-worker-{h.port}", 22, (h.public_key,)) for h in servers.hosts]
    executor = SshExecutor(
        hosts,
        login=LOGIN,
        key=key,
        proxy_command=f"{sys.executable} {relay} {table} %h %p %r",
        connect_deadline_s=5,
    )
    try:
        assert _echo(executor) == {0: 0, 1: 0}
    finally:
        executor.close()
    log = [json.loads(line) for line in (tmp_path / "routes.json.log").read_text().splitlines()]
    assert sorted(log) == sorted([f"tpu-worker-{h.port}", "22", "tpuctl"] for h in servers.hosts)
    direct = SshExecutor(hosts[:1], login=LOGIN, key=key, connect_deadline_s=0.5)
    try:
        with pytest.raises(RunFailedError, match="cannot reach host 0 at tpuctl@tpu-worker-"):
            _echo(direct)
    finally:
        direct.close()


def test_proxy_command_tokens_expand_as_openssh_does() -> None:
    host = SshHost("10.0.0.2", 22, instance_name="t1v-n-0123abcd-w-1", zone="us-east5-b")
    assert (
        expand_proxy_command("gcloud x %h --port=%p -u %r 100%% %n --zone=%z %q %%n", host, user="me")
        == "gcloud x 10.0.0.2 --port=22 -u me 100% t1v-n-0123abcd-w-1 --zone=us-east5-b %q %n"
    )
    assert expand_proxy_command("nc %h %p", SshHost("a b", 2222), user="u") == "nc 'a b' 2222"


def test_every_host_value_is_one_shell_word_whatever_it_holds() -> None:
    hostile = SshHost("a b", 2222, instance_name="vm; touch pwned", zone="z'$(id)")
    expanded = expand_proxy_command("relay %h %p %r %n %z", hostile, user="u v")
    assert shlex.split(expanded) == ["relay", "a b", "2222", "u v", "vm; touch pwned", "z'$(id)"]


def test_a_template_needing_an_instance_name_a_host_lacks_is_refused_before_connecting(key: KeyPair) -> None:
    """A TPU API worker names its instance only in its ``hostname`` guest attribute: a node that did not
    publish it cannot be reached through IAP, which the error says (worker, attribute, fix) up front."""
    named = SshHost("10.0.0.2", 22, ("ssh-ed25519 AAAA",), "t1v-n-0123abcd-w-0", "us-east5-b")
    unnamed = SshHost("10.0.0.3", 22, ("ssh-ed25519 AAAA",), None, "us-east5-b")
    with pytest.raises(RunFailedError) as info:
        SshExecutor([named, unnamed], login=LOGIN, key=key, proxy_command=IAP_TEMPLATE)
    error = info.value
    assert error.worker == 1
    assert error.message.startswith("the ProxyCommand uses %n, which host 1 at 10.0.0.3 has no value for")
    assert "`hostname` guest attribute" in error.message
    assert error.fix is not None and "compute.disableGuestAttributesAccess" in error.fix
    assert "--ssh-proxy-command" in error.fix and "%h" in error.fix
    # The same hosts are fine where the template does not ask for the name, or there is none.
    SshExecutor([named, unnamed], login=LOGIN, key=key, proxy_command="nc %h %p").close()
    SshExecutor([named, unnamed], login=LOGIN, key=key).close()
    with pytest.raises(RunFailedError, match="uses %z, which host 0") as zoneless:
        SshExecutor([SshHost("10.0.0.2", 22)], login=LOGIN, key=key, proxy_command="x --zone=%z")
    assert zoneless.value.fix == "drop %z from --ssh-proxy-command"


#: The form docs/runs.md documents for hosts without external IPs.
IAP_TEMPLATE = "gcloud compute start-iap-tunnel %n %p --listen-on-stdin --zone=%z --project=tpuctl-test"

#: A stand-in for ``gcloud compute start-iap-tunnel INSTANCE PORT --listen-on-stdin --zone=Z --project=P``:
#: it finds INSTANCE in the table the test wrote (instance name -> zone, project, loopback address and
#: port) and relays stdin/stdout to it; an unknown instance, another zone or project, or any other
#: command fails as gcloud would, before relaying anything.
GCLOUD = (
    """import json, socket, sys, threading
args = sys.argv[1:]
table_path = TABLE
with open(table_path + ".log", "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:2] != ["compute", "start-iap-tunnel"] or len(args) != 7 or args[4] != "--listen-on-stdin":
    sys.exit("ERROR: (gcloud) not a command this stand-in knows: " + " ".join(args))
instance, port = args[2], args[3]
flags = dict(a[2:].split("=", 1) for a in args[5:] if a.startswith("--") and "=" in a)
target = json.load(open(table_path)).get(instance)
if target is None or port != "22" or flags != {"zone": target["zone"], "project": target["project"]}:
    sys.exit(f"ERROR: (gcloud.compute.start-iap-tunnel) instance {instance} not found in {flags}")
sock = socket.create_connection((target["address"], target["port"]))
"""
    + _PIPE
)


def test_the_documented_iap_template_reaches_each_host_by_instance_name_through_gcloud(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hosts' addresses lead nowhere (internal IPs): only the tunnel reaches them, by instance name
    and zone, as IAP does. A wrong zone, or the address where the instance name belongs, is refused."""
    names = [f"t1v-n-0123abcd-w-{w}" for w in range(len(servers.hosts))]
    table = tmp_path / "instances.json"
    table.write_text(
        json.dumps(
            {
                name: {"zone": "us-east5-b", "project": "tpuctl-test", "address": h.address, "port": h.port}
                for name, h in zip(names, servers.hosts, strict=True)
            }
        )
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f"#!{sys.executable}\nTABLE = {str(table)!r}\n" + GCLOUD)
    gcloud.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    hosts = [
        SshHost(f"10.128.0.{w + 2}", 22, (h.public_key,), name, "us-east5-b")
        for w, (name, h) in enumerate(zip(names, servers.hosts, strict=True))
    ]
    executor = SshExecutor(hosts, login=LOGIN, key=key, proxy_command=IAP_TEMPLATE, connect_deadline_s=5)
    try:
        assert _echo(executor) == {0: 0, 1: 0}
    finally:
        executor.close()
    flags = ["--listen-on-stdin", "--zone=us-east5-b", "--project=tpuctl-test"]
    assert sorted(_calls(tmp_path)) == [["compute", "start-iap-tunnel", n, "22", *flags] for n in names]
    for template, asked in (
        (IAP_TEMPLATE.replace("%z", "us-central1-a"), names[0]),  # another zone: no such instance there
        (IAP_TEMPLATE.replace("%n", "%h"), "10.128.0.2"),  # an address is not an instance name
    ):
        wrong = SshExecutor(hosts[:1], login=LOGIN, key=key, proxy_command=template, connect_deadline_s=0.5)
        try:
            with pytest.raises(RunFailedError, match=r"cannot reach host 0 at tpuctl@10\.128\.0\.2:22"):
                _echo(wrong)
        finally:
            wrong.close()
        assert _calls(tmp_path)[-1][2] == asked  # the stand-in was asked, and refused


def _calls(tmp_path: Path) -> list[list[str]]:
    """The stand-in gcloud's argument lists, in the order it was run."""
    return [json.loads(line) for line in (tmp_path / "instances.json.log").read_text().splitlines()]
