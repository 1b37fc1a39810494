"""Each host's expected SSH host key and instance name, read from the slice's guest attributes before
tpuctl connects: when a host published no key, the error says why that happens and what to do (Compute
Engine publishes nothing unless guest attributes are enabled); the instance names reach the executor on
both surfaces, for a ProxyCommand's ``%n`` (an IAP tunnel)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from tpuctl.backends.base import HostAddress
from tpuctl.catalog import CapacityType, Surface
from tpuctl.cloud.base import HostIdentity, NetworkEndpoint, Node, NodeRequest
from tpuctl.errors import RunFailedError
from tpuctl.hosts.base import LaunchSpec
from tpuctl.hosts.ssh import DEFAULT_USERNAME, HostLogin, KeyPair, SshExecutor
from tpuctl.services.run import hosts as run_hosts
from tpuctl.services.run.hosts import expected_host_identities, node_ssh_hosts
from tpuctl.sim.compute import store
from tpuctl.sim.vms.layout import disk_dir, host_key_path

if TYPE_CHECKING:
    from tpuctl.services.session import Session
    from tpuctl.testing.backend import InProcessCli
    from tpuctl.testing.cloud import InProcessSim

LOGIN = HostLogin(DEFAULT_USERNAME, authorized_by="(a plan logs in nowhere)", refused_fix="")

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOnehost"


def _session(published: list[tuple[str, ...]], names: list[str | None] | None = None) -> Session:
    identities = [
        HostIdentity(k, n) for k, n in zip(published, names or [None] * len(published), strict=True)
    ]
    cloud = SimpleNamespace(host_identities=lambda zone, name: identities)
    return cast("Session", SimpleNamespace(cloud=cloud))


def _node(surface: Surface, metadata: dict[str, str]) -> Node:
    return Node(
        name="s1",
        zone="us-central1-c",
        accelerator_type="tpu7x-16",
        state="READY",
        capacity=CapacityType.SPOT,
        metadata=metadata,
        network_endpoints=(NetworkEndpoint("10.0.0.2", 22), NetworkEndpoint("10.0.0.3", 22)),
        surface=surface,
    )


def test_every_hosts_published_keys_are_returned_in_worker_order() -> None:
    published: list[tuple[str, ...]] = [(KEY,), (KEY.replace("one", "two"),)]
    node = _node(Surface.COMPUTE, {"enable-guest-attributes": "TRUE"})
    names: list[str | None] = ["s1-aaaa", "s1-bbbb"]
    found = expected_host_identities(_session(published, names), node, deadline_s=0)
    assert found == [HostIdentity(published[0], "s1-aaaa"), HostIdentity(published[1], "s1-bbbb")]


def test_hosts_with_keys_but_no_instance_name_are_returned_for_the_executor_to_refuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that never publishes a name (made before TPU VMs did) is waited on only for a grace once
    its keys are there, not for the whole wait, nor failed here: only a ProxyCommand that uses %n needs
    the name, and the executor says so."""
    monkeypatch.setattr(run_hosts, "NAMES_AFTER_KEYS_S", 0.0)
    published: list[tuple[str, ...]] = [(KEY,), (KEY,)]
    node = _node(Surface.TPU_API, {})
    started = time.monotonic()
    found = expected_host_identities(_session(published), node, deadline_s=300, need_names=True)
    assert [i.instance_name for i in found] == [None, None]
    assert time.monotonic() - started < 1


def test_instance_names_published_after_the_keys_are_waited_for_when_needed() -> None:
    node = _node(Surface.TPU_API, {})
    answers = [
        [HostIdentity((KEY,)), HostIdentity((KEY,))],
        [HostIdentity((KEY,), "t1v-n-0123abcd-w-0"), HostIdentity((KEY,), "t1v-n-0123abcd-w-1")],
    ]
    calls: list[int] = []

    def host_identities(zone: str, name: str) -> list[HostIdentity]:
        calls.append(1)
        return answers[min(len(calls), 2) - 1]

    session = cast("Session", SimpleNamespace(cloud=SimpleNamespace(host_identities=host_identities)))
    found = expected_host_identities(session, node, deadline_s=10, need_names=True)
    assert [i.instance_name for i in found] == ["t1v-n-0123abcd-w-0", "t1v-n-0123abcd-w-1"]
    assert len(calls) == 2
    calls.clear()
    found = expected_host_identities(session, node, deadline_s=10)  # no ProxyCommand needs them
    assert len(calls) == 1 and found == answers[0]


def test_a_compute_slice_without_guest_attributes_is_named_as_the_cause_with_the_fix() -> None:
    node = _node(Surface.COMPUTE, {"ssh-keys": "tpuctl:" + KEY})  # made elsewhere, without the key
    with pytest.raises(RunFailedError) as raised:
        expected_host_identities(_session([(KEY,), ()]), node, deadline_s=0)
    error = raised.value
    assert "workers without keys: 1" in error.message
    assert "guest attributes" in error.message and "enable-guest-attributes" in error.message
    assert error.fix is not None
    assert "enable-guest-attributes=TRUE" in error.fix and "tpuctl pod create" in error.fix


def test_a_slice_with_guest_attributes_on_that_published_nothing_points_at_its_health() -> None:
    node = _node(Surface.COMPUTE, {"enable-guest-attributes": "TRUE"})
    with pytest.raises(RunFailedError) as raised:
        expected_host_identities(_session([(), ()]), node, deadline_s=0)
    assert "workers without keys: 0, 1" in raised.value.message
    assert "enable-guest-attributes" not in raised.value.message  # not the cause here
    assert raised.value.fix is not None and "tpuctl pod describe" in raised.value.fix


def _boot_disks(sim: InProcessSim) -> None:
    """Give every simulated VM the disk its sshd's host key lives on, as a booted VM has (the in-process
    simulator runs no VMs): its guest attributes then publish, as a booted VM's agent does."""
    with sim.engine.ctx.db.read() as conn:
        nodes = [(str(r["uid"]), int(r["hosts"])) for r in conn.execute("SELECT uid, hosts FROM nodes")]
    for uid, hosts in nodes:
        for worker in range(hosts):
            public = host_key_path(disk_dir(sim.engine.ctx.vm_root, uid, worker)).with_suffix(".pub")
            public.parent.mkdir(parents=True)
            public.write_text(f"ssh-ed25519 AAAA{uid}w{worker}\n")


def _instance_workers(sim: InProcessSim, zone: str) -> dict[str, int]:
    """Each simulated Compute Engine instance's name and the worker of its slice it is, as stored."""
    with sim.engine.ctx.db.read() as conn:
        found = store.rows(conn, sim.world.project, f"zones/{zone}", store.INSTANCES)
    return {str(r["name"]): int(r["worker"]) for r in found}


IAP = "gcloud compute start-iap-tunnel %n %p --listen-on-stdin --zone=%z --project=p"


@pytest.mark.parametrize(
    ("accelerator", "zone", "surface"),
    [("v5litepod-16", "us-east5-b", Surface.TPU_API), ("tpu7x-16", "us-central1-c", Surface.COMPUTE)],
)
def test_each_hosts_instance_name_and_zone_reach_the_executors_proxy_command(
    sim_cli: InProcessCli, accelerator: str, zone: str, surface: Surface
) -> None:
    """On both surfaces, the instance an IAP tunnel targets for each worker (a TPU API worker's
    ``hostname`` guest attribute, a Compute Engine VM's own name) comes with its keys and lands in the
    ProxyCommand of that worker, with the node's zone."""
    cloud = sim_cli.cloud()
    request = NodeRequest(
        name="s1",
        zone=zone,
        accelerator_type=accelerator,
        runtime_version="v2-alpha-tpuv5-lite" if surface is Surface.TPU_API else "",
        surface=surface,
    )
    node = cloud.create_node(request)
    _boot_disks(sim_cli.sim)
    session = cast("Session", SimpleNamespace(cloud=cloud))
    addresses = [HostAddress(e.ip_address, 22) for e in node.network_endpoints]
    hosts = node_ssh_hosts(session, node, addresses, deadline_s=0, need_names=True)
    names = [str(h.instance_name) for h in hosts]
    if surface is Surface.TPU_API:
        uid = sim_cli.sim.engine.get_node(sim_cli.world.project, zone, "s1")["id"]
        assert names == [f"t1v-n-{int(uid) % 16**8:08x}-w-{w}" for w in range(4)]
    else:  # each worker's own VM: the instance of that name is that worker
        assert len(names) == 2 and all(n.startswith("s1-") for n in names)
        assert [_instance_workers(sim_cli.sim, zone)[n] for n in names] == [0, 1]
    assert all(h.zone == zone and h.host_keys for h in hosts)
    executor = SshExecutor(hosts, login=LOGIN, key=KeyPair(None, "ssh-ed25519 AAAA plan"), proxy_command=IAP)
    spec = LaunchSpec("r", ("x.py",), len(hosts), 4, accelerator, "4x4", "gs://b/r")
    plans = executor.plan(spec)
    assert [p.where.split(" via ", 1)[1] for p in plans] == [
        f"gcloud compute start-iap-tunnel {n} 22 --listen-on-stdin --zone={zone} --project=p" for n in names
    ]


def test_a_plan_shows_each_hosts_proxy_command_with_its_instance_name_to_come(
    sim_cli: InProcessCli, tmp_path: Path
) -> None:
    """No slice yet, no names: the dry run shows where each worker's name will go, and the zone."""
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    result = sim_cli(
        "run", str(script), "--type", "v5e-16", "--dry-run", "-o", "json", "--ssh-proxy-command", IAP
    )
    assert result.code == 0, result.stderr
    wheres = [host["where"] for host in _host_plans(result.json)]
    zone = wheres[0].split("--zone=")[1].split()[0]
    assert wheres == [
        f"tpuctl@<worker-{w} address>:22 via gcloud compute start-iap-tunnel '<worker-{w} instance name>' 22 "
        f"--listen-on-stdin --zone={zone} --project=p"
        for w in range(4)
    ]


def _host_plans(data: Any) -> list[dict[str, Any]]:
    """Every host plan (a mapping with a ``where``) anywhere in a JSON answer, in order."""
    if isinstance(data, dict):
        if "where" in data:
            return [data]
        return [plan for value in data.values() for plan in _host_plans(value)]
    if isinstance(data, list):
        return [plan for value in data for plan in _host_plans(value)]
    return []
