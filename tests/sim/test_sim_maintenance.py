"""Host maintenance as the simulator plays it (``tpuctl sim maintenance``): the notice on the metadata
server, the VMs' stop when it runs out, then REPAIRING and READY again (the same node) for an on-demand
TPU API node, TERMINATED for a spot one. The processes killed are the VM's, found by the marker its sshd
sets (a process here carries it itself)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import httpx
import pytest
from google.cloud import tpu_v2
from sim_helpers import AUTH, PARENT, PROJECT, ZONE, create_ready, make_world, node, spot_node, tpu_client

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.admin import SimAdminError
from tpuctl.sim.vms.layout import VM_MARKER
from tpuctl.testing.cli import invoke
from tpuctl.testing.clock import wait_for

Spawn = Callable[..., "subprocess.Popen[bytes]"]

#: Half a real second of notice, and 0.5 s away (500 simulated seconds at the test world's 1000x).
QUICK = {"durations": {"maintenance_notice_s": 0.5, "maintenance_s": 500}}
KEY = "instance/maintenance-event"


def _vm_process(spawn: Spawn, client: tpu_v2.TpuClient, node_id: str) -> subprocess.Popen[bytes]:
    """A process of host 0 of the node's VM, that ignores SIGTERM (only the stop's SIGKILL ends it)."""
    uid = client.get_node(name=f"{PARENT}/nodes/{node_id}").id
    script = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.01)\n"
    )
    return spawn(script, env={"PATH": "/usr/bin:/bin", VM_MARKER: f"{uid}/0"})


def _state(client: tpu_v2.TpuClient, node_id: str) -> tpu_v2.Node:
    return client.get_node(name=f"{PARENT}/nodes/{node_id}")


def test_an_on_demand_node_is_noticed_stopped_repaired_and_back_as_itself(
    start_server: Callable[..., SimServer],
    connect_admin: Callable[[SimServer], SimAdminClient],
    children: Spawn,
) -> None:
    server = start_server(make_world(**QUICK))
    client, admin = tpu_client(server.url), connect_admin(server)
    create_ready(client, "od", node("v5litepod-8"))
    proc = _vm_process(children, client, "od")
    assert admin.metadata(ZONE, "od", 0, KEY) == "NONE"

    answer = admin.maintenance(ZONE, "od")
    assert answer["state"] == "READY" and answer["upcomingMaintenance"]["maintenanceStatus"] == "PENDING"
    assert admin.metadata(ZONE, "od", 0, KEY) == "TERMINATE_ON_HOST_MAINTENANCE"
    assert proc.poll() is None  # the notice: the program has the window to checkpoint

    assert proc.wait(timeout=10) == -signal.SIGKILL  # the stop
    wait_for(lambda: _state(client, "od").state == tpu_v2.Node.State.REPAIRING, 5, what="REPAIRING")
    during = httpx.get(
        f"{server.url}/v2/{PARENT}/nodes/od", headers=AUTH
    ).json()  # the client's proto lacks the field
    assert during["health"] == "UNHEALTHY_MAINTENANCE"
    assert during["upcomingMaintenance"]["maintenanceStatus"] == "ONGOING"

    wait_for(lambda: _state(client, "od").state == tpu_v2.Node.State.READY, 10, what="READY again")
    assert admin.metadata(ZONE, "od", 0, KEY) == "NONE"
    assert "upcomingMaintenance" not in httpx.get(f"{server.url}/v2/{PARENT}/nodes/od", headers=AUTH).json()
    # Kept, not replaced: the same node (its id), not preempted.
    assert str(_state(client, "od").id) == answer["id"] and not admin.status()["nodes"][0]["preempted"]


def test_a_spot_node_is_terminated_and_not_restarted(
    start_server: Callable[..., SimServer],
    connect_admin: Callable[[SimServer], SimAdminClient],
    children: Spawn,
) -> None:
    server = start_server(make_world(**QUICK))
    client, admin = tpu_client(server.url), connect_admin(server)
    create_ready(client, "sp", spot_node("v5litepod-8"))
    proc = _vm_process(children, client, "sp")
    admin.maintenance(ZONE, "sp")
    assert proc.wait(timeout=10) == -signal.SIGKILL
    wait_for(lambda: _state(client, "sp").state == tpu_v2.Node.State.TERMINATED, 5, what="TERMINATED")


def test_only_a_ready_node_is_maintained_and_only_once_at_a_time(
    start_server: Callable[..., SimServer], connect_admin: Callable[[SimServer], SimAdminClient]
) -> None:
    server = start_server(make_world(durations={"maintenance_notice_s": 60}))
    client, admin = tpu_client(server.url), connect_admin(server)
    create_ready(client, "m", node("v5litepod-8"))
    noticed = invoke(["sim", "maintenance", "m"], env={"TPUCTL_SIM_URL": server.url})  # the operator's way
    assert noticed.code == 0 and "host maintenance of m in us-central1-a noticed" in noticed.stderr
    assert admin.metadata(ZONE, "m", 0, KEY) == "TERMINATE_ON_HOST_MAINTENANCE"
    with pytest.raises(SimAdminError) as again:
        admin.maintenance(ZONE, "m")
    assert again.value.http_status == 400 and "already noticed" in again.value.message


@pytest.mark.slow  # seconds of Compute Engine client start-up; the TPU API spot case covers "not kept"
def test_a_compute_engine_instance_is_terminated_for_maintenance_and_not_restarted(
    start_server: Callable[..., SimServer], connect_admin: Callable[[SimServer], SimAdminClient]
) -> None:
    from compute_helpers import ZONE as COMPUTE_ZONE
    from compute_helpers import Clients, compute_world, instance_body

    server = start_server(
        compute_world(durations={"compute_op_s": 10, "node_create_s": 60, **QUICK["durations"]})
    )
    c, admin = Clients(server.url), connect_admin(server)
    c.done(c.instances.insert(project=PROJECT, zone=COMPUTE_ZONE, instance_resource=instance_body("vm")))
    wait_for(
        lambda: c.instances.get(project=PROJECT, zone=COMPUTE_ZONE, instance="vm").status == "RUNNING", 10
    )
    admin.maintenance(COMPUTE_ZONE, "vm")  # by the instance's own name
    wait_for(
        lambda: c.instances.get(project=PROJECT, zone=COMPUTE_ZONE, instance="vm").status == "TERMINATED",
        10,
        what="TERMINATED",
    )
    ops = c.operations.list(project=PROJECT, zone=COMPUTE_ZONE)
    (op,) = [o for o in ops if o.operation_type == "compute.instances.terminateOnHostMaintenance"]
    assert op.target_link.endswith("/instances/vm") and op.status == op.Status.DONE
