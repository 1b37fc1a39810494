"""Helpers for the Compute Engine surface's tests: a fast world with TPU7x and v6e on Compute Engine,
the REAL google-cloud-compute clients pointed at the simulator, operation polling with our own
ZoneOperationsClient (the library's poller ignores the custom endpoint:
docs/google-facts.md#compute-engine-client), request bodies, and a check of every Compute answer against
Google's compute.v1 discovery document."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1
from sim_helpers import PROJECT, make_world

from tpuctl.sim import SimServer
from tpuctl.sim.world import World
from tpuctl.testing.clock import wait_for

ZONE = "us-central1-c"
V6E_ZONE = "us-central1-b"
REGION = "us-central1"

COMPUTE_WORLD: dict[str, Any] = {
    "zones": {
        ZONE: {"tpu7x": {"on_demand": 16, "preemptible": 16}},
        V6E_ZONE: {"v6e": {"on_demand": 32, "preemptible": 32}, "v5e": {"on_demand": 8, "preemptible": 8}},
    },
    "compute_quotas": [
        {"quota_id": "TPUS-PER-TPU-FAMILY-per-project-region", "limit": 64},
        {"quota_id": "PREEMPTIBLE-TPU7X-per-project-region", "limit": 64},
        {"quota_id": "PREEMPTIBLE-TPU-V6E-per-project-region", "limit": 64},
    ],
    # 0.6 real seconds to create: long enough to see PROVISIONING, then STAGING, then RUNNING.
    "durations": {"compute_op_s": 10, "node_create_s": 600},
}


def compute_world(**overrides: Any) -> World:
    merged = {**COMPUTE_WORLD, **overrides}
    return make_world(**merged)


@dataclass
class Clients:
    url: str
    instances: compute_v1.InstancesClient = field(init=False)
    operations: compute_v1.ZoneOperationsClient = field(init=False)
    region_operations: compute_v1.RegionOperationsClient = field(init=False)
    global_operations: compute_v1.GlobalOperationsClient = field(init=False)
    migs: compute_v1.InstanceGroupManagersClient = field(init=False)
    templates: compute_v1.InstanceTemplatesClient = field(init=False)
    policies: compute_v1.ResourcePoliciesClient = field(init=False)

    def __post_init__(self) -> None:
        options = {"client_options": {"api_endpoint": self.url}, "credentials": AnonymousCredentials()}
        self.instances = compute_v1.InstancesClient(**options)  # type: ignore[arg-type]
        self.operations = compute_v1.ZoneOperationsClient(**options)  # type: ignore[arg-type]
        self.region_operations = compute_v1.RegionOperationsClient(**options)  # type: ignore[arg-type]
        self.global_operations = compute_v1.GlobalOperationsClient(**options)  # type: ignore[arg-type]
        self.migs = compute_v1.InstanceGroupManagersClient(**options)  # type: ignore[arg-type]
        self.templates = compute_v1.InstanceTemplatesClient(**options)  # type: ignore[arg-type]
        self.policies = compute_v1.ResourcePoliciesClient(**options)  # type: ignore[arg-type]

    def done(self, op: Any, zone: str = ZONE, timeout: float = 10.0) -> compute_v1.Operation:
        """Poll a zonal operation with our own client until DONE (never ``op.result()``)."""
        return _op(
            wait_for(
                lambda: (
                    (got := self.operations.get(project=PROJECT, zone=zone, operation=op.name)).status
                    == compute_v1.Operation.Status.DONE
                    and got
                ),
                timeout=timeout,
                what=f"operation {op.name}",
            )
        )

    def region_done(self, op: Any) -> compute_v1.Operation:
        return _op(
            wait_for(
                lambda: (
                    (
                        got := self.region_operations.get(project=PROJECT, region=REGION, operation=op.name)
                    ).status
                    == compute_v1.Operation.Status.DONE
                    and got
                ),
                what=f"operation {op.name}",
            )
        )

    def global_done(self, op: Any) -> compute_v1.Operation:
        return _op(
            wait_for(
                lambda: (
                    (got := self.global_operations.get(project=PROJECT, operation=op.name)).status
                    == compute_v1.Operation.Status.DONE
                    and got
                ),
                what=f"operation {op.name}",
            )
        )


def _op(value: object) -> compute_v1.Operation:
    assert isinstance(value, compute_v1.Operation)
    return value


def instance_body(
    name: str,
    machine_type: str = "tpu7x-standard-4t",
    zone: str = ZONE,
    *,
    model: str = "STANDARD",
    nat: bool = True,
    metadata: dict[str, str] | None = None,
    **scheduling: Any,
) -> compute_v1.Instance:
    nic = compute_v1.NetworkInterface(network="global/networks/default", nic_type="GVNIC")
    if nat:
        nic.access_configs = [compute_v1.AccessConfig(type_="ONE_TO_ONE_NAT", name="External NAT")]
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{machine_type}",
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image="projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x",
                    disk_size_gb=100,
                ),
            )
        ],
        network_interfaces=[nic],
        scheduling=compute_v1.Scheduling(
            provisioning_model=model, **{"on_host_maintenance": "TERMINATE", **scheduling}
        ),
        metadata=compute_v1.Metadata(
            items=[compute_v1.Items(key=k, value=v) for k, v in (metadata or {}).items()]
        ),
        labels={"owner": "tests"},
    )


def policy_link(topology: str) -> str:
    return f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/wp-{topology}"


TEMPLATE = f"projects/{PROJECT}/global/instanceTemplates/tpl"


def setup_slice_records(
    c: Clients,
    model: str = "SPOT",
    *,
    action: str = "STOP",
    metadata: dict[str, str] | None = None,
    topology: str = "2x2x2",
) -> None:
    """The workload policy (``wp-<topology>``, default 2x2x2: 2 hosts) and the tpu7x instance template
    (``tpl``) a MIG slice uses."""
    policy = compute_v1.ResourcePolicy(
        name=f"wp-{topology}",
        workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
            type_="HIGH_THROUGHPUT", accelerator_topology=topology
        ),
    )
    c.region_done(c.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=policy))
    vm = instance_body("unused", model=model, metadata=metadata, instance_termination_action=action)
    if model == "FLEX_START":
        # A time limit, deleted at its end (as every documented flex-start flow asks).
        vm.scheduling.max_run_duration = compute_v1.Duration(seconds=3600)
        vm.scheduling.instance_termination_action = "DELETE"
    props = compute_v1.InstanceProperties(
        machine_type="tpu7x-standard-4t",
        disks=vm.disks,
        network_interfaces=vm.network_interfaces,
        scheduling=vm.scheduling,
        metadata=vm.metadata,
    )
    template = compute_v1.InstanceTemplate(name="tpl", properties=props)
    c.global_done(c.templates.insert(project=PROJECT, instance_template_resource=template))


def mig_body(
    name: str, size: int, mode: str = "BULK", topology: str = "2x2x2"
) -> compute_v1.InstanceGroupManager:
    return compute_v1.InstanceGroupManager(
        name=name,
        base_instance_name=name,
        versions=[compute_v1.InstanceGroupManagerVersion(instance_template=TEMPLATE)],
        target_size=size,
        target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(mode=mode),
        instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure="DO_NOTHING"
        ),
        resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy=policy_link(topology)
        ),
    )


@pytest.fixture
def compute(
    start_server: Callable[..., SimServer], schema_problems: list[str]
) -> Iterator[tuple[SimServer, Clients]]:
    server = start_server(compute_world())
    yield server, Clients(server.url)
