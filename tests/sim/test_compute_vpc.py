"""The simulated VPC's internal DNS (``tpuctl.sim.vpc_dns``): a Compute Engine slice's hosts reach each
other by the bare instance names of ``worker-network-endpoints`` (docs/google-facts.md#metadata-server), and
an unmodified ``jax.distributed.initialize()`` joins a real 2-host CE slice of the simulator."""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncssh
import httpx
from api_schema import schema_problems
from compute_helpers import ZONE, Clients, compute, compute_world, mig_body, setup_slice_records
from google.cloud import compute_v1
from sim_helpers import PROJECT
from vm_helpers import USER, ssh_run

from tpuctl.runtime.hostenv import sim_host_env
from tpuctl.sim import SimServer
from tpuctl.sim.vpc_dns import PREFIX, lookup_key
from tpuctl.testing.clock import wait_for
from tpuctl.testing.ports import unused_port

__all__ = ["compute", "schema_problems"]  # fixtures

REPO = Path(__file__).resolve().parents[2]
PSUM = REPO / "tests" / "runtime" / "scripts" / "psum_user.py"
MD = {"Metadata-Flavor": "Google"}


def test_lookup_keys_follow_zonal_dns() -> None:
    assert lookup_key("m-1abc", "p", "us-central1-c") == ("p", "us-central1-c", "m-1abc")
    assert lookup_key("m-1abc.us-east5-b.c.p.internal", "p", "us-central1-c") == ("p", "us-east5-b", "m-1abc")
    assert lookup_key("m-1abc.us-central1-c.c.other.internal", "p", "us-central1-c") is None  # another VPC
    assert lookup_key("m-1abc.c.p.internal", "p", "us-central1-c") is None  # global DNS: not here
    assert lookup_key("example.com", "p", "us-central1-c") is None


def _slice(
    server: SimServer, c: Clients, topology: str = "2x2x2", hosts: int = 2
) -> tuple[list[str], list[str], asyncssh.SSHKey]:
    """A running tpu7x MIG slice whose ssh-keys let ``alice`` in: (names, addresses, key), worker order."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    public = key.export_public_key().decode().strip()
    setup_slice_records(c, metadata={"ssh-keys": f"{USER}:{public}"}, topology=topology)
    body = mig_body("m", hosts, topology=topology)
    c.done(c.migs.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=body))
    wait_for(
        lambda: c.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="m").status.is_stable,
        timeout=20,
    )
    vms = [c.instances.get(project=PROJECT, zone=ZONE, instance=m.name) for m in _managed(c)]
    addresses = [vm.network_interfaces[0].network_i_p for vm in vms]
    wait_for(lambda: {h.address for h in server.fleet.served()} >= set(addresses), timeout=60)
    base = f"http://{addresses[0]}:{server.metadata_port}/computeMetadata/v1/instance/attributes/"
    names = httpx.get(base + "worker-network-endpoints", headers=MD).text.split(",")
    assert sorted(names) == sorted(vm.name for vm in vms)
    by_name = {vm.name: a for vm, a in zip(vms, addresses, strict=True)}
    return names, [by_name[n] for n in names], key


def _managed(c: Clients) -> list[compute_v1.ManagedInstance]:
    return list(c.migs.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager="m"))


def test_hosts_resolve_their_peers_by_instance_name(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    names, addresses, _ = _slice(server, c)
    resolver = f"http://{addresses[1]}:{server.metadata_port}{PREFIX}"
    assert httpx.get(resolver + names[0], headers=MD).text.strip() == addresses[0]
    assert (
        httpx.get(resolver + f"{names[0]}.{ZONE}.c.{PROJECT}.internal", headers=MD).text.strip()
        == addresses[0]
    )
    other = httpx.get(resolver + f"{names[0]}.{ZONE}.c.someone-else.internal", headers=MD)
    assert other.status_code == 404 and "NXDOMAIN" in other.text
    unknown = httpx.get(resolver + "nobody", headers=MD)
    assert unknown.status_code == 404
    assert unknown.text.strip() == (
        f"NXDOMAIN: 'nobody' does not resolve from project '{PROJECT}', zone '{ZONE}' (search domain "
        f"{ZONE}.c.{PROJECT}.internal): no running Compute Engine instance of that name there"
    )
    assert httpx.get(resolver + names[0]).status_code == 403  # as the metadata server: the header


#: What tpuctl's launcher does on a Compute Engine host (follow.py --tpu-worker-env), as shell words: JAX's
#: GKE variables, read from the host's own metadata server.
DERIVE = (
    "export $(PYTHONPATH={repo} {python} -c 'import os; from tpuctl.hosts.worker_identity import "
    'tpu_worker_env as t; print(" ".join(f"{{k}}={{v}}" for k, v in t(dict(os.environ)).items()))\') && '
)


def _psum_on_every_host(
    server: SimServer, c: Clients, accel: str, topology: str, hosts: int, prefix: str = ""
) -> list[asyncssh.SSHCompletedProcess]:
    _, addresses, key = _slice(server, c, topology, hosts)
    port = unused_port()
    commands = []
    for worker in range(hosts):
        # Two CPU devices a host stand in for its chips (fewer than 4: the test machine is small).
        env = sim_host_env("r", worker, hosts, 2, port, accel, topology, "/ck", 0, REPO)
        # The session's own GCE_METADATA_HOST (its VM's metadata server) is the one to keep.
        assignments = " ".join(f"{k}={v}" for k, v in env.items() if not k.startswith("GCE_METADATA"))
        commands.append(
            f"{prefix}env {assignments} XLA_FLAGS=--xla_backend_optimization_level=0 {sys.executable} {PSUM}"
        )
    with ThreadPoolExecutor(hosts) as pool:
        port = server.ssh_port
        return list(pool.map(lambda w: ssh_run(addresses[w], port, key, commands[w]), range(hosts)))


def _assert_joined(runs: list[asyncssh.SSHCompletedProcess], hosts: int) -> None:
    seen = set()
    for done in runs:
        assert done.exit_status == 0, done.stderr
        line = next(ln for ln in str(done.stdout).splitlines() if ln.startswith("RESULT "))
        _, pid, pcount, dcount, local, total = line.split()
        seen.add(int(pid))
        n = 2 * hosts
        assert (int(pcount), int(dcount), int(local), float(total)) == (hosts, n, 2, n * (n + 1) / 2)
    assert seen == set(range(hosts))


def test_unmodified_jax_joins_a_compute_engine_slice_through_the_variables_tpuctl_derives(
    compute: tuple[SimServer, Clients],
) -> None:
    server, c = compute
    runs = _psum_on_every_host(
        server, c, "tpu7x-32", "2x2x4", 4, DERIVE.format(repo=REPO, python=sys.executable)
    )
    _assert_joined(runs, 4)


def test_without_them_unmodified_jax_finds_no_slice_where_agent_worker_number_is_not_published(
    compute: tuple[SimServer, Clients],
) -> None:
    server, c = compute
    runs = _psum_on_every_host(server, c, "tpu7x-16", "2x2x2", 2)
    for done in runs:
        assert done.exit_status != 0
        assert "coordinator_address should be defined" in str(done.stderr)


def test_unmodified_jax_joins_on_its_own_where_the_world_publishes_agent_worker_number(
    start_server: Callable[..., SimServer], schema_problems: list[str]
) -> None:
    server = start_server(compute_world(compute_agent_worker_number=True))
    _assert_joined(_psum_on_every_host(server, Clients(server.url), "tpu7x-16", "2x2x2", 2), 2)
