"""Compute Engine slices as JSON: the bodies tpuctl sends (checked against docs/google-facts.md and the
compute v1 discovery schema's field names) and how instances and MIGs read back as Nodes."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import googleapiclient
import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.cloud import compute_shapes as shapes
from tpuctl.cloud.base import CLOUD_PLATFORM_SCOPE, HostNetwork, NodeRequest, VpcNetwork, VpcSubnetwork
from tpuctl.cloud.translate import error_from_compute_errors
from tpuctl.errors import CloudError, QuotaExceededError, StockoutError

ZONE = "us-central1-c"


@functools.cache
def _schemas() -> dict[str, Any]:
    path = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents" / "compute.v1.json"
    schemas: dict[str, Any] = json.loads(path.read_text())["schemas"]
    return schemas


def _unknown_fields(value: Any, schema_name: str, where: str = "") -> list[str]:
    """Every field of ``value`` that the compute v1 schema ``schema_name`` does not name."""
    schema = _schemas()[schema_name]
    out: list[str] = []
    for key, item in value.items():
        prop = schema.get("properties", {}).get(key)
        if prop is None:
            out.append(f"{where}{key}")
            continue
        ref = prop.get("$ref") or prop.get("items", {}).get("$ref")
        if ref is None or ref not in _schemas():
            continue
        for element in item if isinstance(item, list) else [item]:
            if isinstance(element, dict):
                out += _unknown_fields(element, ref, f"{where}{key}.")
    return out


def request(name: str = "s1", type_name: str = "tpu7x-8", **kw: Any) -> NodeRequest:
    accel = Catalog.load().resolve(type_name)
    defaults: dict[str, Any] = {
        "name": name,
        "zone": ZONE,
        "accelerator_type": accel.api_name,
        "runtime_version": accel.runtime_version,
        "labels": {"managed-by": "tpuctl"},
        "metadata": {"ssh-keys": "tpuctl:ssh-ed25519 AAAA"},
    }
    return NodeRequest(**{**defaults, **kw})


def test_a_one_host_tpu7x_slice_is_one_instance_as_the_facts_sheet_builds_it() -> None:
    accel = Catalog.load().resolve("tpu7x-8")
    body = shapes.instance_body(request(capacity=CapacityType.SPOT), accel, project="p")
    assert body["name"] == "s1"
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/tpu7x-standard-4t"
    assert "guestAccelerators" not in body  # the TPU comes with the machine type
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
        "instanceTerminationAction": "STOP",
    }
    (disk,) = body["disks"]
    assert disk["initializeParams"]["sourceImage"] == (
        "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"
    )
    assert body["serviceAccounts"][0]["scopes"] == [CLOUD_PLATFORM_SCOPE]
    assert body["labels"] == {"managed-by": "tpuctl", "tpuctl-slice": "s1"}
    # Guest attributes on, so that the VM publishes its SSH host keys (off unless enabled:
    # docs/google-facts.md#guest-attributes); tpuctl trusts no other host key.
    assert body["metadata"]["items"] == [
        {"key": "enable-guest-attributes", "value": "TRUE"},
        {"key": "ssh-keys", "value": "tpuctl:ssh-ed25519 AAAA"},
    ]
    assert "accessConfigs" not in body["networkInterfaces"][0]  # no external IP unless asked for
    assert _unknown_fields(body, "Instance") == []


def test_external_ips_and_a_reservation_are_asked_for_only_when_requested() -> None:
    accel = Catalog.load().resolve("v6e-4")
    body = shapes.instance_body(
        request(type_name="v6e-4", capacity=CapacityType.RESERVED, reservation="r1", external_ips=True),
        accel,
        project="p",
    )
    assert body["machineType"].endswith("/ct6e-standard-4t")
    assert body["networkInterfaces"][0]["accessConfigs"] == [
        {"type": "ONE_TO_ONE_NAT", "name": "External NAT"}
    ]
    assert body["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
    assert body["reservationAffinity"]["values"] == ["projects/p/reservations/r1"]
    assert "instanceTerminationAction" not in body["scheduling"]


def test_a_multi_host_slice_is_a_workload_policy_a_template_and_a_bulk_mig_of_every_host() -> None:
    accel = Catalog.load().resolve("tpu7x-32")
    req = request(type_name="tpu7x-32")
    policy = shapes.workload_policy_body("s1", accel.topology)
    assert policy == {
        "name": "s1",
        "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x4"},
    }
    template = shapes.template_body(req, accel, project="p")
    assert template["properties"]["machineType"] == "tpu7x-standard-4t"  # a template's is a bare name
    # Every VM the MIG makes from the template publishes its host keys.
    assert {"key": "enable-guest-attributes", "value": "TRUE"} in template["properties"]["metadata"]["items"]
    mig = shapes.mig_body(req, accel, template_url="T", policy_url="P")
    assert mig["targetSize"] == 4 and mig["targetSizePolicy"] == {"mode": "BULK"}
    assert mig["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}
    assert mig["resourcePolicies"] == {"workloadPolicy": "P"}
    assert shapes.parse_slice_description(mig["description"]) == {
        "accelerator_type": "tpu7x-32",
        "capacity": "on-demand",
        "labels": {"managed-by": "tpuctl", "tpuctl-slice": "s1"},
    }
    assert _unknown_fields(policy, "ResourcePolicy") == []
    assert _unknown_fields(template, "InstanceTemplate") == []
    assert _unknown_fields(mig, "InstanceGroupManager") == []


def _instance(name: str, status: str, ip: str, model: str = "SPOT") -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "machineType": f"zones/{ZONE}/machineTypes/tpu7x-standard-4t",
        "scheduling": {"provisioningModel": model},
        "networkInterfaces": [{"networkIP": ip}],
        "labels": {"tpuctl-slice": "s1"},
    }


@pytest.mark.parametrize(
    ("status", "model", "state"),
    [
        ("PROVISIONING", "SPOT", "CREATING"),
        ("STAGING", "STANDARD", "CREATING"),
        ("PENDING", "FLEX_START", "CREATING"),
        ("RUNNING", "SPOT", "READY"),
        ("TERMINATED", "SPOT", "PREEMPTED"),  # a spot VM tpuctl did not stop was preempted
        ("TERMINATED", "STANDARD", "TERMINATED"),  # never restarted, never stopped by tpuctl: dead
        ("STOPPING", "SPOT", "STOPPING"),
    ],
)
def test_an_instance_status_reads_as_the_node_state_the_services_know(
    status: str, model: str, state: str
) -> None:
    assert shapes.node_state(_instance("s1", status, "127.1.0.2", model)) == state


def test_a_mig_slice_is_ready_only_when_every_host_runs_and_the_topology_is_active() -> None:
    catalog = Catalog.load()
    accel = catalog.resolve("tpu7x-32")
    meta = {"accelerator_type": "tpu7x-32", "capacity": "spot", "labels": {"tpuctl-slice": "s1"}}
    running = [_instance(f"s1-{c}", "RUNNING", f"127.1.0.{i}") for i, c in enumerate("dcba", start=2)]
    mig = {"name": "s1", "status": {"appliedAcceleratorTopologies": [{"state": "ACTIVATING"}]}}
    assert shapes.node_from_mig(mig, running, ZONE, meta, accel).state == "CREATING"
    mig["status"] = {"appliedAcceleratorTopologies": [{"acceleratorTopology": "2x2x4", "state": "ACTIVE"}]}
    node = shapes.node_from_mig(mig, running, ZONE, meta, accel)
    assert node.state == "READY" and node.capacity is CapacityType.SPOT and node.topology == "2x2x4"
    # Worker order: by instance name.
    assert [e.ip_address for e in node.network_endpoints] == [
        "127.1.0.5",
        "127.1.0.4",
        "127.1.0.3",
        "127.1.0.2",
    ]
    assert shapes.node_from_mig(mig, running[:3], ZONE, meta, accel).state == "CREATING"
    lost = [*running[:3], _instance("s1-a", "TERMINATED", "127.1.0.5")]
    assert shapes.node_from_mig(mig, lost, ZONE, meta, accel).state == "PREEMPTED"  # one host is the slice
    # A host deleted by its termination action: the MIG (DO_NOTHING) stays stable with 3 VMs, and only
    # the topology's state says the slice is gone.
    mig["status"] = {
        "appliedAcceleratorTopologies": [{"acceleratorTopology": "2x2x4", "state": "INCOMPLETE"}]
    }
    assert shapes.node_from_mig(mig, running[:3], ZONE, meta, accel).state == "PREEMPTED"


def _op_error(code: str, message: str, **detail: Any) -> list[dict[str, Any]]:
    return [{"code": code, "message": message, "errorDetails": [detail] if detail else []}]


def test_a_compute_stockout_is_a_stockout_in_the_zone_so_placement_fails_over() -> None:
    err = error_from_compute_errors(
        what="create instance s1",
        errors=_op_error(
            "ZONE_RESOURCE_POOL_EXHAUSTED",
            f"The zone 'projects/p/zones/{ZONE}' does not have enough resources available to fulfill the "
            "request.  Try a different zone, or try again later.",
            errorInfo={"reason": "stockout", "domain": "compute.googleapis.com"},
        ),
        http_status=503,
        zone=ZONE,
    )
    assert isinstance(err, StockoutError) and err.zone == ZONE


def test_a_compute_quota_failure_names_the_quota_its_limit_and_region() -> None:
    err = error_from_compute_errors(
        what="create instance s1",
        errors=_op_error(
            "QUOTA_EXCEEDED",
            "Quota 'TPUS_PER_TPU_FAMILY' exceeded.  Limit: 0.0 in region us-central1.",
            quotaInfo={
                "metricName": "compute.googleapis.com/tpus_per_tpu_family",
                "limitName": "TPUS-PER-TPU-FAMILY-per-project-region",
                "dimensions": {"region": "us-central1", "tpu_family": "TPU7X"},
                "limit": 0,
            },
        ),
        http_status=403,
    )
    assert isinstance(err, QuotaExceededError) and err.exit_code == 4
    assert (err.quota_id, err.limit, err.location) == (
        "TPUS-PER-TPU-FAMILY-per-project-region",
        0.0,
        "us-central1",
    )
    # Without a quotaInfo detail, the message names it.
    bare = error_from_compute_errors(
        what="x",
        errors=_op_error(
            "QUOTA_EXCEEDED", "Quota 'TPUS_PER_TPU_FAMILY' exceeded.  Limit: 8.0 in region us-central1."
        ),
    )
    assert isinstance(bare, QuotaExceededError) and (bare.quota_id, bare.limit) == (
        "TPUS_PER_TPU_FAMILY",
        8.0,
    )


def test_any_other_failed_operation_keeps_its_code_in_the_message() -> None:
    err = error_from_compute_errors(
        what="create MIG s1", errors=_op_error("INVALID_FIELD_VALUE", "bad topology"), http_status=400
    )
    assert type(err) is CloudError and "bad topology [INVALID_FIELD_VALUE]" in str(err)


def test_a_flex_start_instance_waits_for_capacity_as_the_facts_sheet_asks() -> None:
    body = shapes.instance_body(request(flex_valid_for_s=1799.5), _tpu7x("tpu7x-8"), project="p")
    # docs/google-facts.md#flex-start: FLEX_START needs maxRunDuration (10 min to 7 days) and is deleted at
    # its end; the wait for capacity is the input-only params.requestValidForDuration, a Duration of whole
    # seconds.
    assert body["scheduling"] == {
        "provisioningModel": "FLEX_START",
        "maxRunDuration": {"seconds": "604800"},
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["params"] == {"requestValidForDuration": {"seconds": "1800"}}
    assert _unknown_fields(body, "Instance") == []
    assert shapes.capacity_of(body) is CapacityType.PREEMPTIBLE  # its quota and price class


def test_a_flex_start_mig_is_made_at_size_0_from_a_flex_start_template() -> None:
    req = request(type_name="tpu7x-16", flex_valid_for_s=600.0)
    accel = _tpu7x("tpu7x-16")
    template = shapes.template_body(req, accel, project="p")
    assert template["properties"]["scheduling"]["provisioningModel"] == "FLEX_START"
    assert "params" not in template and "params" not in template["properties"]  # insert-only
    mig = shapes.mig_body(req, accel, template_url="t", policy_url="w")
    assert mig["targetSize"] == 0 and mig["targetSizePolicy"] == {"mode": "BULK"}
    assert _unknown_fields(template, "InstanceTemplate") == []


def test_a_request_without_flex_start_is_sent_as_before() -> None:
    body = shapes.instance_body(request(capacity=CapacityType.SPOT), _tpu7x("tpu7x-8"), project="p")
    assert body["scheduling"]["provisioningModel"] == "SPOT" and "params" not in body
    mig = shapes.mig_body(request(type_name="tpu7x-16"), _tpu7x("tpu7x-16"), template_url="t", policy_url="w")
    assert mig["targetSize"] == 2


def _tpu7x(name: str) -> Any:
    return Catalog.load().resolve(name)


def test_an_instance_joins_the_named_network_with_its_tags_and_service_account() -> None:
    accel = Catalog.load().resolve("tpu7x-8")
    network = HostNetwork(VpcNetwork("shared", "host-proj"), VpcSubnetwork("tpu"), ("tpu-ssh",))
    req = request(network=network, service_account="trainer@p.iam.gserviceaccount.com")
    for props in (
        shapes.instance_body(req, accel, project="p"),
        shapes.template_body(req, accel, project="p")["properties"],
    ):
        (nic,) = props["networkInterfaces"]
        assert nic["network"] == "projects/host-proj/global/networks/shared"
        # A full path, in the host project and the zone's region: a global template needs one.
        assert nic["subnetwork"] == "projects/host-proj/regions/us-central1/subnetworks/tpu"
        assert props["tags"] == {"items": ["tpu-ssh"]}
        assert props["serviceAccounts"] == [
            {"email": "trainer@p.iam.gserviceaccount.com", "scopes": [CLOUD_PLATFORM_SCOPE]}
        ]
    assert _unknown_fields(shapes.instance_body(req, accel, project="p"), "Instance") == []


def test_an_instance_with_no_network_named_is_on_the_projects_default_one() -> None:
    body = shapes.instance_body(request(), Catalog.load().resolve("tpu7x-8"), project="p")
    (nic,) = body["networkInterfaces"]
    assert nic["network"] == "projects/p/global/networks/default" and "subnetwork" not in nic
    assert "tags" not in body and body["serviceAccounts"][0]["email"] == "default"


def test_a_one_host_slice_with_a_deadline_is_deleted_by_compute_engine_itself() -> None:
    """docs/google-facts.md#backstop: terminationTime (RFC 3339) with DELETE, on a one-host slice that is
    not spot (its one termination action is STOP, for preemptions) nor flex-start (maxRunDuration)."""
    at = 1_800_000_000.0
    body = shapes.instance_body(request(terminate_at=at), _tpu7x("tpu7x-8"), project="p")
    assert body["scheduling"]["terminationTime"] == "2027-01-15T08:00:00Z"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert _unknown_fields(body, "Instance") == []
    for other in (
        shapes.instance_body(
            request(terminate_at=at, capacity=CapacityType.SPOT), _tpu7x("tpu7x-8"), project="p"
        ),
        shapes.instance_body(
            request(terminate_at=at, flex_valid_for_s=600.0), _tpu7x("tpu7x-8"), project="p"
        ),
        shapes.template_body(request(type_name="tpu7x-16", terminate_at=at), _tpu7x("tpu7x-16"), project="p")[
            "properties"
        ],
    ):
        assert "terminationTime" not in other["scheduling"]
