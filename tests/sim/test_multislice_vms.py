"""A multislice queued resource's VMs (docs/multislice-facts.md): each host's tpu-env carries the Megascale
keys Google's queued resources publish (slice 0's worker 0 as coordinator, the slice count, the node's slice
id), an unmodified ``jax.distributed.initialize()`` on every host of every slice joins ONE job through them,
and losing one slice suspends the queued resource while the other slice's node stays READY."""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncssh
import httpx
from google.cloud import tpu_v2
from sim_helpers import FAST_POLLING, PARENT, ZONE, make_world, node, tpu_client
from vm_helpers import USER, ssh_run

from tpuctl.runtime.hostenv import sim_host_env
from tpuctl.runtime.simcluster import parse_tpu_env
from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.testing.clock import wait_for
from tpuctl.testing.ports import unused_port

REPO = Path(__file__).resolve().parents[2]
PSUM = REPO / "tests" / "runtime" / "scripts" / "psum_user.py"
MD = {"Metadata-Flavor": "Google"}

QR = tpu_v2.QueuedResource
QRState = tpu_v2.QueuedResourceState.State
HOSTS, CHIPS = 4, 4  # a v5litepod-16: 4 hosts of 4 chips
MEGASCALE = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_PORT")


def _multislice(
    client: tpu_v2.TpuClient,
    qr_id: str,
    prefix: str,
    count: int,
    accelerator_type: str,
    metadata: dict[str, str] | None = None,
    *,
    before: list[QR.Tpu.NodeSpec] | None = None,
) -> dict[str, tpu_v2.Node]:
    """Create a spot multislice queued resource of ``count`` nodes ``<prefix>-<i>`` (after the node specs
    ``before``), wait until it is ACTIVE; its nodes by id."""
    spec = QR.Tpu.NodeSpec(
        parent=PARENT,
        node=node(accelerator_type, metadata=metadata or {}),
        multislice_params=QR.Tpu.NodeSpec.MultisliceParams(node_count=count, node_id_prefix=prefix),
    )
    body = QR(tpu=QR.Tpu(node_spec=[*(before or []), spec]), spot=QR.Spot())
    client.create_queued_resource(parent=PARENT, queued_resource_id=qr_id, queued_resource=body).result(
        polling=FAST_POLLING
    )
    wait_for(lambda: _qr_state(client, qr_id) == QRState.ACTIVE, timeout=20)
    return {n.name.rsplit("/", 1)[-1]: n for n in client.list_nodes(parent=PARENT)}


def _qr_state(client: tpu_v2.TpuClient, qr_id: str) -> Any:
    return client.get_queued_resource(name=f"{PARENT}/queuedResources/{qr_id}").state.state


def _node_state(client: tpu_v2.TpuClient, node_id: str) -> Any:
    return client.get_node(name=f"{PARENT}/nodes/{node_id}").state


def _megascale(tpu_env: str) -> dict[str, str]:
    return {k: v for k, v in parse_tpu_env(tpu_env).items() if k.startswith("MEGASCALE_")}


def test_unmodified_jax_joins_two_slices_into_one_job(start_server: Callable[..., SimServer]) -> None:
    server = start_server(make_world())
    client = tpu_client(server.url)
    key = asyncssh.generate_private_key("ssh-ed25519")
    ssh_keys = {"ssh-keys": f"{USER}:{key.export_public_key().decode().strip()}"}
    nodes = _multislice(client, "ms", "slice", 2, "v5litepod-16", ssh_keys)
    assert sorted(nodes) == ["slice-0", "slice-1"]
    # Slice by slice, worker by worker: the order tpuctl's executor lists the hosts in (job-wide ids).
    addresses = [e.ip_address for s in range(2) for e in nodes[f"slice-{s}"].network_endpoints]
    assert len(addresses) == 2 * HOSTS and len(set(addresses)) == 2 * HOSTS
    uids = {str(n.id) for n in nodes.values()}
    wait_for(
        lambda: sum(h.uid in uids for h in server.fleet.served()) == 2 * HOSTS,
        timeout=60,
        what=f"the 8 hosts served (fleet error: {server.fleet.last_error!r})",
    )

    for host, address in enumerate(addresses):
        base = f"http://{address}:{server.metadata_port}/computeMetadata/v1/instance/attributes/"
        tpu_env = httpx.get(base + "tpu-env", headers=MD).text
        assert _megascale(tpu_env) == {
            "MEGASCALE_COORDINATOR_ADDRESS": addresses[0],  # slice 0's worker 0
            "MEGASCALE_NUM_SLICES": "2",
            "MEGASCALE_SLICE_ID": str(host // HOSTS),
            "MEGASCALE_PORT": "8080",
        }
        assert httpx.get(base + "tpu-env", headers=MD).text == tpu_env  # the same on every read
        # Within its slice a host is still numbered as on one slice (JAX adds the slices itself).
        assert httpx.get(base + "agent-worker-number", headers=MD).text == str(host % HOSTS)

    port = unused_port()
    commands = []
    for host in range(2 * HOSTS):
        env = sim_host_env("r", host, 2 * HOSTS, CHIPS, port, "v5litepod-16", "4x4", "/ck", 0, REPO)
        # The session's own GCE_METADATA_HOST (its VM's metadata server) is the one to keep.
        assignments = " ".join(f"{k}={v}" for k, v in env.items() if not k.startswith("GCE_METADATA"))
        commands.append(
            f"env {assignments} XLA_FLAGS=--xla_backend_optimization_level=0 {sys.executable} {PSUM}"
        )
    with ThreadPoolExecutor(2 * HOSTS) as pool:
        runs = list(
            pool.map(lambda h: ssh_run(addresses[h], server.ssh_port, key, commands[h]), range(2 * HOSTS))
        )

    devices = 2 * HOSTS * CHIPS
    for host, done in enumerate(runs):
        assert done.exit_status == 0, done.stderr
        line = next(ln for ln in str(done.stdout).splitlines() if ln.startswith("RESULT "))
        _, pid, pcount, dcount, local, total = line.split()
        slice_id, worker = divmod(host, HOSTS)
        # Device k of the job adds k + 1 (psum_user.py): the sum of 1..32 is every device, each once.
        assert (int(pid), int(pcount), int(dcount), int(local), float(total)) == (
            slice_id * HOSTS + worker,
            2 * HOSTS,
            devices,
            CHIPS,
            devices * (devices + 1) / 2,
        )


def test_the_slice_id_is_the_place_among_the_multislice_nodes_of_the_plan(
    start_server: Callable[..., SimServer],
) -> None:
    server = start_server(make_world())
    client = tpu_client(server.url)
    # A single node before the slices takes host numbers first; the slices still count from 0.
    solo = QR.Tpu.NodeSpec(parent=PARENT, node_id="solo", node=node("v5litepod-8"))
    nodes = _multislice(client, "mix", "part", 3, "v5litepod-4", before=[solo])
    with SimAdminClient(server.url) as admin:
        assert _megascale(admin.metadata(ZONE, "solo", 0, "instance/attributes/tpu-env")) == {}
        coordinator = nodes["part-0"].network_endpoints[0].ip_address
        for index in range(3):
            tpu_env = admin.metadata(ZONE, f"part-{index}", 0, "instance/attributes/tpu-env")
            assert _megascale(tpu_env) == {
                "MEGASCALE_COORDINATOR_ADDRESS": coordinator,
                "MEGASCALE_NUM_SLICES": "3",
                "MEGASCALE_SLICE_ID": str(index),
                "MEGASCALE_PORT": "8080",
            }


def test_losing_one_slice_suspends_the_queued_resource_and_leaves_the_other_ready(
    start_server: Callable[..., SimServer],
) -> None:
    # 1 real second of grace: room to look at the queued resource while the slice is going down.
    server = start_server(make_world(durations={"preemption_grace_s": 1}))
    client = tpu_client(server.url)
    nodes = _multislice(client, "ms", "s", 2, "v5litepod-4")
    tpu_env_key = "instance/attributes/tpu-env"
    with SimAdminClient(server.url) as admin:
        before = admin.metadata(ZONE, "s-1", 0, tpu_env_key)
        admin.preempt(ZONE, "s-0", notice=True)  # the coordinator's slice
        assert _qr_state(client, "ms") == QRState.SUSPENDING
        assert admin.metadata(ZONE, "s-0", 0) == "TRUE" and admin.metadata(ZONE, "s-1", 0) == "FALSE"
        wait_for(lambda: _qr_state(client, "ms") == QRState.SUSPENDED, timeout=20)
        assert _node_state(client, "s-0") == tpu_v2.Node.State.PREEMPTED
        # Only the preempted slice goes: the other keeps running, READY, its VMs up, its tpu-env as written
        # at creation (still naming the lost coordinator).
        assert _node_state(client, "s-1") == tpu_v2.Node.State.READY
        assert admin.metadata(ZONE, "s-1", 0) == "FALSE"
        assert admin.metadata(ZONE, "s-1", 0, tpu_env_key) == before
        assert (
            _megascale(before)["MEGASCALE_COORDINATOR_ADDRESS"]
            == nodes["s-0"].network_endpoints[0].ip_address
        )
        survivor = str(nodes["s-1"].id)
        # The fleet serves a READY node's VMs on a ticker tick once the image is built (its own thread):
        # under load that can trail the node's READY, so wait for it rather than read it once.
        wait_for(lambda: any(h.uid == survivor for h in server.fleet.served()), timeout=20)

        # A reset makes both slices anew, on new addresses: the coordinator is the new slice 0's.
        client.reset_queued_resource(name=f"{PARENT}/queuedResources/ms").result(polling=FAST_POLLING)
        wait_for(lambda: _qr_state(client, "ms") == QRState.ACTIVE, timeout=20)
        fresh = client.get_node(name=f"{PARENT}/nodes/s-0").network_endpoints[0].ip_address
        assert fresh != nodes["s-0"].network_endpoints[0].ip_address
        assert (
            _megascale(admin.metadata(ZONE, "s-1", 0, tpu_env_key))["MEGASCALE_COORDINATOR_ADDRESS"] == fresh
        )
