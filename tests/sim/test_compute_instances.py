"""Compute Engine's single-host TPU VMs (docs/google-facts.md#instance-requests), with the REAL
google-cloud-compute client."""

from __future__ import annotations

from typing import Any

import asyncssh
import google.auth.transport.requests
import httpx
import pytest
from api_schema import schema_problems
from compute_helpers import REGION, V6E_ZONE, ZONE, Clients, compute, compute_world, instance_body
from google.api_core import exceptions
from google.cloud import compute_v1
from google.oauth2 import id_token
from sim_helpers import AUTH, PROJECT, tpu_client

from tpuctl.backends.sim import sim_credentials
from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.testing.clock import wait_for

__all__ = ["compute", "schema_problems"]  # fixtures


def test_insert_runs_through_provisioning_staging_running(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    key = asyncssh.generate_private_key("ssh-ed25519")
    public = key.export_public_key().decode().strip()
    op = c.instances.insert(
        project=PROJECT,
        zone=ZONE,
        instance_resource=instance_body("vm-1", metadata={"ssh-keys": f"alice:{public}"}),
    )
    assert op.status != compute_v1.Operation.Status.DONE  # the work takes the world's node_create_s
    first = c.instances.get(project=PROJECT, zone=ZONE, instance="vm-1")
    # PROVISIONING for the first half of node_create_s (0.3 s here: a busy machine may miss it), then
    # STAGING, then RUNNING.
    assert first.status in ("PROVISIONING", "STAGING")
    done = c.done(op)
    assert done.operation_type == "insert" and not done.http_error_status_code
    assert done.target_link.endswith(f"/projects/{PROJECT}/zones/{ZONE}/instances/vm-1")
    vm = c.instances.get(project=PROJECT, zone=ZONE, instance="vm-1")
    assert vm.status == "RUNNING"
    assert vm.machine_type.endswith(f"zones/{ZONE}/machineTypes/tpu7x-standard-4t")
    assert vm.scheduling.provisioning_model == "STANDARD" and vm.scheduling.on_host_maintenance == "TERMINATE"
    assert vm.labels == {"owner": "tests"} and vm.metadata.fingerprint
    nic = vm.network_interfaces[0]
    assert nic.network_i_p.startswith("127.") and nic.access_configs[0].nat_i_p == nic.network_i_p
    # Not a TPU API node (docs/google-facts.md#two-surfaces).
    tpu = tpu_client(server.url)
    assert list(tpu.list_nodes(parent=f"projects/{PROJECT}/locations/{ZONE}")) == []
    # The host is a VM: its metadata server answers the Compute Engine way, its sshd takes ssh-keys.
    wait_for(lambda: any(h.address == nic.network_i_p for h in server.fleet.served()), timeout=30)
    base = f"http://{nic.network_i_p}:{server.metadata_port}/computeMetadata/v1/instance/"
    headers = {"Metadata-Flavor": "Google"}
    with httpx.Client(headers=headers) as http:
        assert http.get(base + "attributes/accelerator-type").text == "tpu7x-8"
        assert http.get(base + "attributes/worker-network-endpoints").text == "vm-1"
        # Whether Compute Engine publishes agent-worker-number is unconfirmed: by default it does not.
        assert http.get(base + "attributes/agent-worker-number").status_code == 404
        assert "TPU_WORKER_ID: '0'" in http.get(base + "attributes/tpu-env").text
        env = http.get(base + "attributes/tpu-env").text
        assert "TPU_ACCELERATOR_TYPE: 'tpu7x-8'" in env and "TOPOLOGY: '2x2x1'" in env
        assert "HOST_BOUNDS: '1,1,1'" in env and "CHIPS_PER_HOST_BOUNDS: '2,2,1'" in env
        assert http.get(base + "name").text == "vm-1"
        assert http.get(base + "zone").text == f"projects/{PROJECT}/zones/{ZONE}"
        assert http.get(base + "network-interfaces/0/ip").text == nic.network_i_p
        assert http.get(base + "preempted").text == "FALSE"
        # The VM's service account's ID token, asked as google-auth's compute_engine.IDTokenCredentials
        # asks (format=full: with the email), verified as a server verifies one.
        email = http.get(base + "service-accounts/default/email").text
        identity = base + "service-accounts/default/identity"
        token = http.get(identity, params={"audience": "https://srv", "format": "full"}).text
        request = google.auth.transport.requests.Request()
        claims = id_token.verify_token(
            token, request, "https://srv", certs_url=f"{server.url}/oauth2/v1/certs"
        )
        assert (claims["email"], claims["email_verified"]) == (email, True)
        standard = http.get(identity, params={"audience": "https://srv"}).text  # no email claims
        assert "email" not in id_token.verify_token(
            standard, request, certs_url=f"{server.url}/oauth2/v1/certs"
        )
        assert http.get(identity).status_code == 400  # an audience is required

    async def ssh() -> str:
        async with asyncssh.connect(
            nic.network_i_p, server.ssh_port, username="alice", client_keys=[key], known_hosts=None
        ) as conn:
            return str((await conn.run("echo hi", timeout=30)).stdout)

    import asyncio

    assert asyncio.run(ssh()).strip() == "hi"
    delete = c.instances.delete(project=PROJECT, zone=ZONE, instance="vm-1")
    assert c.done(delete).operation_type == "delete"
    with pytest.raises(
        exceptions.NotFound, match=f"projects/{PROJECT}/zones/{ZONE}/instances/vm-1' was not found"
    ):
        c.instances.get(project=PROJECT, zone=ZONE, instance="vm-1")
    wait_for(lambda: not any(h.address == nic.network_i_p for h in server.fleet.served()), timeout=10)


def test_the_world_can_say_compute_engine_publishes_agent_worker_number(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(compute_world(compute_agent_worker_number=True))
    c = Clients(server.url)
    c.done(c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body("vm-2")))
    address = c.instances.get(project=PROJECT, zone=ZONE, instance="vm-2").network_interfaces[0].network_i_p
    wait_for(lambda: any(h.address == address for h in server.fleet.served()), timeout=30)
    url = (
        f"http://{address}:{server.metadata_port}/computeMetadata/v1/instance/attributes/agent-worker-number"
    )
    assert httpx.get(url, headers={"Metadata-Flavor": "Google"}).text == "0"


def test_insert_validation(compute: tuple[SimServer, Clients]) -> None:
    _, c = compute

    def refused(body: compute_v1.Instance, zone: str = ZONE) -> str:
        with pytest.raises(exceptions.BadRequest) as caught:
            c.instances.insert(project=PROJECT, zone=zone, instance_resource=body)
        # The library prefixes the request line; Compute's own message is what follows.
        return str(caught.value.message).split(": ", 1)[1]

    assert "live migration" in refused(instance_body("a", on_host_maintenance="MIGRATE"))
    accel = instance_body("a")
    accel.guest_accelerators = [compute_v1.AcceleratorConfig(accelerator_type="x", accelerator_count=4)]
    assert "guestAccelerators" in refused(accel)
    assert (
        refused(instance_body("a", "ct5lp-hightpu-4t", V6E_ZONE), V6E_ZONE)
        == "This user agent is not allowed to use the machine type [ct5lp-hightpu-4t]."
    )
    assert "Machine type with name 'nope-4t' does not exist in zone 'us-central1-c'." in refused(
        instance_body("a", "nope-4t")
    )
    assert "Max run duration" in refused(instance_body("a", model="FLEX_START"))
    op = c.policies.insert(
        project=PROJECT,
        region=REGION,
        resource_policy_resource=compute_v1.ResourcePolicy(
            name="wp",
            workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
                type_="HIGH_THROUGHPUT", accelerator_topology="2x2x1"
            ),
        ),
    )
    c.region_done(op)
    with_policy = instance_body("a")
    with_policy.resource_policies = [f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/wp"]
    assert refused(with_policy) == (
        "Resource policy must have one of [VmMaintenancePolicy, GroupPlacementPolicy, InstanceSchedulePolicy]"
    )
    c.done(c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body("b", nat=False)))
    with pytest.raises(exceptions.Conflict, match="already exists"):
        c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body("b"))
    # No accessConfig asked: no natIP.
    assert not c.instances.get(project=PROJECT, zone=ZONE, instance="b").network_interfaces[0].access_configs


def test_stockout_and_quota_fail_the_operation(start_server, schema_problems: list[str]) -> None:  # type: ignore[no-untyped-def]
    server = start_server(
        compute_world(
            compute_quotas=[
                {"quota_id": "TPUS-PER-TPU-FAMILY-per-project-region", "limit": 4},
                {"quota_id": "PREEMPTIBLE-TPU7X-per-project-region", "limit": -1},
            ]
        )
    )
    c = Clients(server.url)
    c.done(c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body("q1")))
    quota = c.done(c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body("q2")))
    assert quota.http_error_status_code == 403 and quota.http_error_message == "FORBIDDEN"
    (error,) = quota.error.errors
    assert error.code == "QUOTA_EXCEEDED"
    assert error.message == "Quota 'TPUS_PER_TPU_FAMILY' exceeded.  Limit: 4.0 in region us-central1."
    info = error.error_details[0].quota_info
    assert info.limit_name == "TPUS-PER-TPU-FAMILY-per-project-region" and info.limit == 4.0
    assert info.dimensions == {"region": REGION, "tpu_family": "TPU7X"}
    with pytest.raises(exceptions.NotFound):
        c.instances.get(project=PROJECT, zone=ZONE, instance="q2")
    # Spot: its own quota; the zone's pool is stocked out.
    with SimAdminClient(server.url) as admin:
        admin.stockout(ZONE)
    op = c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body("s1", model="SPOT"))
    stock = c.done(op)
    assert stock.http_error_status_code == 503 and stock.http_error_message == "SERVICE UNAVAILABLE"
    assert stock.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    details = stock.error.errors[0].error_details[0].error_info
    assert details.reason == "stockout" and details.metadatas == {
        "vmType": "tpu7x-standard-4t",
        "zone": ZONE,
        "zonesAvailable": "",
    }
    raw = httpx.get(
        f"{server.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/none", headers=AUTH
    ).json()
    assert raw["error"]["errors"][0]["reason"] == "notFound"
    quotas = httpx.get(
        f"{server.url}/v1/projects/{PROJECT}/locations/global/services/compute.googleapis.com/quotaInfos",
        headers=AUTH,
    ).json()["quotaInfos"]
    family = next(q for q in quotas if q["quotaId"] == "TPUS-PER-TPU-FAMILY-per-project-region")
    assert family["dimensions"] == ["region", "tpu_family"]
    assert family["dimensionsInfos"][-1]["details"]["value"] == "4"


def test_spot_preemption_stop_and_delete(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    for name, action in (("stop-vm", "STOP"), ("del-vm", "DELETE")):
        body = instance_body(name, model="SPOT", instance_termination_action=action)
        c.done(c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=body))
    with SimAdminClient(server.url) as admin:
        admin.preempt_compute(ZONE, "stop-vm")
        admin.preempt_compute(ZONE, "del-vm", notice=False)
    wait_for(lambda: c.instances.get(project=PROJECT, zone=ZONE, instance="stop-vm").status == "TERMINATED")
    stopped = c.instances.get(project=PROJECT, zone=ZONE, instance="stop-vm")
    assert stopped.last_stop_timestamp and not stopped.network_interfaces[0].access_configs[0].nat_i_p
    with pytest.raises(exceptions.NotFound):
        c.instances.get(project=PROJECT, zone=ZONE, instance="del-vm")
    ops = c.operations.list(
        request=compute_v1.ListZoneOperationsRequest(
            project=PROJECT, zone=ZONE, filter='operationType="compute.instances.preempted"'
        )
    )
    preempted = {o.target_link.rsplit("/", 1)[-1]: o for o in ops}
    assert set(preempted) == {"stop-vm", "del-vm"}
    assert all(
        o.status == compute_v1.Operation.Status.DONE and o.status_message == "Instance was preempted."
        for o in preempted.values()
    )


def test_flex_start_waits_then_runs_or_gives_up(start_server, schema_problems: list[str]) -> None:  # type: ignore[no-untyped-def]
    server = start_server(compute_world())
    c = Clients(server.url)
    with SimAdminClient(server.url) as admin:
        admin.stockout(ZONE)

        def flex(name: str, wait_s: int) -> Any:
            # The longest run (7 days): a shorter one ends within seconds at this world's speed.
            body = instance_body(
                name, model="FLEX_START", max_run_duration=compute_v1.Duration(seconds=604800)
            )
            body.params = compute_v1.InstanceParams(
                request_valid_for_duration=compute_v1.Duration(seconds=wait_s)
            )
            return c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=body)

        lost = flex("flex-lost", 60)  # 60 ms at 1000x
        kept = flex("flex-kept", 7200)
        assert c.instances.get(project=PROJECT, zone=ZONE, instance="flex-kept").status == "PENDING"
        gave_up = c.done(lost)
        assert (
            gave_up.http_error_status_code == 503
            and gave_up.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
        )
        with pytest.raises(exceptions.NotFound):
            c.instances.get(project=PROJECT, zone=ZONE, instance="flex-lost")
        admin.stockout(ZONE, clear=True)
    assert not c.done(kept).http_error_status_code
    vm = c.instances.get(project=PROJECT, zone=ZONE, instance="flex-kept")
    assert vm.status == "RUNNING" and vm.scheduling.max_run_duration.seconds == 604800
    assert vm.scheduling.instance_termination_action == "DELETE"
    with pytest.raises(exceptions.BadRequest, match="2 hours"):
        body = instance_body("x", model="FLEX_START", max_run_duration=compute_v1.Duration(seconds=3600))
        body.params = compute_v1.InstanceParams(request_valid_for_duration=compute_v1.Duration(seconds=7201))
        c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=body)


def test_zones_and_machine_types(compute: tuple[SimServer, Clients]) -> None:
    server, _ = compute
    options: dict[str, Any] = {
        "client_options": {"api_endpoint": server.url},
        "credentials": sim_credentials(),
    }
    zones = compute_v1.ZonesClient(**options)
    assert {ZONE, V6E_ZONE} <= {z.name for z in zones.list(project=PROJECT)}
    types = compute_v1.MachineTypesClient(**options)
    listed = list(types.list(project=PROJECT, zone=V6E_ZONE))
    # Every zone lists the general-purpose types too (tests/sim/test_compute_general_vms.py).
    assert {m.name for m in listed if not m.accelerators} >= {"e2-small", "e2-standard-2"}
    names = {m.name for m in listed if m.accelerators}
    assert names == {
        "ct6e-standard-1t",
        "ct6e-standard-4t",
        "ct6e-standard-8t",
        "ct5lp-hightpu-1t",
        "ct5lp-hightpu-4t",
        "ct5lp-hightpu-8t",
    }
    seven = types.get(project=PROJECT, zone=ZONE, machine_type="tpu7x-standard-4t")
    assert seven.guest_cpus == 224 and seven.accelerators[0].guest_accelerator_count == 4
    with pytest.raises(exceptions.NotFound):
        types.get(project=PROJECT, zone=ZONE, machine_type="ct6e-standard-4t")
