"""Compute Engine's multi-host TPU slices: workload policy + instance template + BULK MIG
(docs/google-facts.md#workload-policies and after)."""

from __future__ import annotations

import httpx
import pytest
from api_schema import schema_problems
from compute_helpers import REGION, ZONE, Clients, compute, mig_body, setup_slice_records
from google.api_core import exceptions
from google.cloud import compute_v1
from sim_helpers import AUTH, PROJECT

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.testing.clock import wait_for

__all__ = ["compute", "schema_problems"]  # fixtures


def test_mig_slice_lifecycle(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    setup_slice_records(c)
    with pytest.raises(exceptions.BadRequest, match="require BULK mode"):
        c.migs.insert(
            project=PROJECT, zone=ZONE, instance_group_manager_resource=mig_body("m", 2, "INDIVIDUAL")
        )
    with pytest.raises(exceptions.BadRequest, match="gang mode of size '2'"):
        c.migs.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=mig_body("m", 3))
    c.done(c.migs.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=mig_body("m", 2)))
    # resourcePolicies.list serves the region's policies, as Google's does (filtered like its lists).
    [policy] = c.policies.list(project=PROJECT, region=REGION)
    assert policy.name == "wp-2x2x2" and policy.workload_policy.accelerator_topology == "2x2x2"
    named = compute_v1.ListResourcePoliciesRequest(project=PROJECT, region=REGION, filter="name = other")
    assert list(c.policies.list(request=named)) == []

    def ready() -> compute_v1.InstanceGroupManager | None:
        mig = c.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="m")
        topology = mig.status.applied_accelerator_topologies[0]
        if mig.status.is_stable and topology.state == "ACTIVE":
            return mig
        assert topology.state == "ACTIVATING"
        return None

    mig = wait_for(ready, timeout=10)
    assert mig is not None
    assert mig.status.current_instance_statuses.running == 2
    assert mig.status.applied_accelerator_topologies[0].accelerator_topology == "2x2x2"
    managed = list(c.migs.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager="m"))
    names = [m.name for m in managed]
    assert len(names) == 2 and all(n.startswith("m-") and len(n) == 6 for n in names)
    assert {m.instance_status for m in managed} == {"RUNNING"} and {m.current_action for m in managed} == {
        "NONE"
    }
    vms = [c.instances.get(project=PROJECT, zone=ZONE, instance=n) for n in names]
    address = vms[1].network_interfaces[0].network_i_p
    wait_for(lambda: any(h.address == address for h in server.fleet.served()), timeout=30)
    base = f"http://{address}:{server.metadata_port}/computeMetadata/v1/instance/attributes/"
    with httpx.Client(headers={"Metadata-Flavor": "Google"}) as http:
        assert http.get(base + "worker-network-endpoints").text == ",".join(names)
        assert http.get(base + "accelerator-type").text == "tpu7x-16"
        env = http.get(base + "tpu-env").text
        assert "TPU_WORKER_ID: '1'" in env and "HOST_BOUNDS: '1,1,2'" in env
    # google-cloud-compute's resize-request client would send this body (raw wire:
    # docs/google-facts.md#flex-start).
    refused = httpx.post(
        f"{server.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/m/resizeRequests",
        json={"name": "r", "resizeBy": 2},
        headers=AUTH,
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "Creating resize requests for managed instance group with TPU is not allowed"
    )
    # One host lost is the whole slice lost: STOP + DO_NOTHING keeps TERMINATED VMs, topology INCOMPLETE.
    with SimAdminClient(server.url) as admin:
        admin.preempt_compute(ZONE, "m")
    wait_for(
        lambda: (
            {c.instances.get(project=PROJECT, zone=ZONE, instance=n).status for n in names} == {"TERMINATED"}
        )
    )
    lost = c.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="m")
    assert lost.status.applied_accelerator_topologies[0].state == "INCOMPLETE"
    c.done(c.migs.delete(project=PROJECT, zone=ZONE, instance_group_manager="m"))
    for name in names:
        with pytest.raises(exceptions.NotFound):
            c.instances.get(project=PROJECT, zone=ZONE, instance=name)


def test_mig_stockout_and_flex_resize(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    setup_slice_records(c, model="FLEX_START")
    with pytest.raises(exceptions.BadRequest, match="target size 0"):
        c.migs.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=mig_body("f", 2))
    c.done(c.migs.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=mig_body("f", 0)))
    with SimAdminClient(server.url) as admin:
        admin.stockout(ZONE)
        c.done(c.migs.resize(project=PROJECT, zone=ZONE, instance_group_manager="f", size=2))
        managed = list(c.migs.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager="f"))
        assert {m.instance_status for m in managed} == {"PENDING"} and len(managed) == 2
        assert not c.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="f").status.is_stable
        admin.stockout(ZONE, clear=True)
    wait_for(
        lambda: c.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="f").status.is_stable,
        timeout=10,
    )
    c.done(c.migs.delete(project=PROJECT, zone=ZONE, instance_group_manager="f"))


def test_bulk_mig_stockout_creates_nothing(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    setup_slice_records(c)
    with SimAdminClient(server.url) as admin:
        admin.stockout(ZONE)
        c.done(c.migs.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=mig_body("s", 2)))
        managed = list(c.migs.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager="s"))
        assert len(managed) == 2 and {m.current_action for m in managed} == {"CREATING"}
        assert not any(m.instance_status for m in managed)
        error = managed[0].last_attempt.errors.errors[0]
        assert error.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
        assert not c.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="s").status.is_stable
        assert list(c.instances.list(project=PROJECT, zone=ZONE)) == []
        # Deleting the MIG that never got its VMs finishes (nothing to take down), and frees the
        # template and workload policy it used.
        c.done(c.migs.delete(project=PROJECT, zone=ZONE, instance_group_manager="s"))
        assert list(c.migs.list(project=PROJECT, zone=ZONE)) == []
