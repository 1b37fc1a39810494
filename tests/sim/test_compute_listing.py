"""Compute Engine's aggregated lists and list filters, through the REAL google-cloud-compute pagers:
``instances.aggregated_list`` and ``instance_group_managers.aggregated_list`` (the two calls that list
every CE slice of a project, whatever its zones), and ``zoneOperations.list`` filtered as gcloud does."""

from __future__ import annotations

import httpx
import pytest
from api_schema import schema_problems
from compute_helpers import ZONE, Clients, compute, instance_body, mig_body, setup_slice_records
from google.api_core import exceptions
from google.cloud import compute_v1
from sim_helpers import AUTH, PROJECT

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.compute.listing import matches
from tpuctl.testing.clock import wait_for

__all__ = ["compute", "schema_problems"]  # fixtures

ZONES = ["zones/us-central1-a", "zones/us-central1-b", "zones/us-central1-c", "zones/us-east5-b"]
REGIONS = ["regions/us-central1", "regions/us-east5"]


def _scoped(pairs: object, field: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(scope -> resource names, scope -> warning code) of an aggregated pager's (scope, list) pairs."""
    names: dict[str, list[str]] = {}
    warnings: dict[str, str] = {}
    for scope, scoped in pairs:  # type: ignore[attr-defined]
        found = [r.name for r in getattr(scoped, field)]
        if found:
            names.setdefault(scope, []).extend(found)
        elif scoped.warning.code:
            warnings[scope] = scoped.warning.code
    return names, warnings


def test_aggregated_instances_and_migs(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    c.done(c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body("solo")))
    setup_slice_records(c)
    c.done(c.migs.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=mig_body("m", 2)))

    names, warnings = _scoped(c.instances.aggregated_list(project=PROJECT), "instances")
    assert list(names) == [f"zones/{ZONE}"]
    members = sorted(n for n in names[f"zones/{ZONE}"] if n != "solo")
    assert "solo" in names[f"zones/{ZONE}"] and len(members) == 2 and all(n.startswith("m-") for n in members)
    # Every other zone is there with Google's warning; instances are zonal: no region scopes.
    assert warnings == {z: "NO_RESULTS_ON_PAGE" for z in ZONES if z != f"zones/{ZONE}"}

    migs, mig_warnings = _scoped(c.migs.aggregated_list(project=PROJECT), "instance_group_managers")
    assert migs == {f"zones/{ZONE}": ["m"]}
    assert mig_warnings == {s: "NO_RESULTS_ON_PAGE" for s in [*REGIONS, *ZONES] if s != f"zones/{ZONE}"}
    mig = next(iter(dict(c.migs.aggregated_list(project=PROJECT))[f"zones/{ZONE}"].instance_group_managers))
    assert (
        mig.target_size == 2 and mig.status.applied_accelerator_topologies[0].accelerator_topology == "2x2x2"
    )

    # Pages run across scopes: one instance a page, every instance once over the pager's pages.
    paged = c.instances.aggregated_list(
        request=compute_v1.AggregatedListInstancesRequest(
            project=PROJECT, max_results=1, include_all_scopes=True
        )
    )
    seen, _ = _scoped(paged, "instances")
    assert sorted(seen[f"zones/{ZONE}"]) == sorted(["solo", *members])
    # A filter keeps what it matches, Compute's way (the client passes it as written).
    filtered = c.instances.aggregated_list(
        request=compute_v1.AggregatedListInstancesRequest(project=PROJECT, filter='name = "solo"')
    )
    assert _scoped(filtered, "instances")[0] == {f"zones/{ZONE}": ["solo"]}
    raw = httpx.get(
        f"{server.url}/compute/v1/projects/{PROJECT}/aggregated/instanceGroupManagers",
        params={"filter": "name eq m-.*", "returnPartialSuccess": "true"},
        headers=AUTH,
    ).json()
    assert all("warning" in v for v in raw["items"].values())  # no MIG is named m-...
    assert raw["items"]["regions/us-east5"]["warning"] == {
        "code": "NO_RESULTS_ON_PAGE",
        "message": "There are no results for scope 'regions/us-east5' on this page.",
        "data": [{"key": "scope", "value": "regions/us-east5"}],
    }
    with pytest.raises(exceptions.BadRequest, match="Invalid list filter expression"):
        list(c.instances.aggregated_list(request={"project": PROJECT, "filter": "name:solo OR name:x"}))


def _ops(c: Clients, filter_text: str) -> list[compute_v1.Operation]:
    request = compute_v1.ListZoneOperationsRequest(project=PROJECT, zone=ZONE, filter=filter_text)
    return list(c.operations.list(request=request))


def test_gcloud_filter_finds_the_preempted_operation(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    c.done(
        c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body("vm", model="SPOT"))
    )
    with SimAdminClient(server.url) as admin:
        admin.preempt_compute(ZONE, "vm")
    wait_for(lambda: c.instances.get(project=PROJECT, zone=ZONE, instance="vm").status == "TERMINATED")
    # gcloud compute operations list --filter="operationType=compute.instances.preempted" sends its
    # rewrite of '=' (googlecloudsdk/api_lib/compute/filter_rewrite.py): an RE2 full match.
    for sent in (
        r'operationType eq ".*\bcompute\.instances\.preempted\b.*"',
        'operationType="compute.instances.preempted"',
        "(operationType eq compute.instances.preempted) (status eq DONE)",
    ):
        ops = _ops(c, sent)
        assert [o.operation_type for o in ops] == ["compute.instances.preempted"], sent
        assert ops[0].target_link.endswith(f"/zones/{ZONE}/instances/vm")
    others = _ops(c, "operationType ne .*preempted")
    assert others and "compute.instances.preempted" not in {o.operation_type for o in others}


def test_filter_forms() -> None:
    op = {"operationType": "compute.instances.preempted", "status": "DONE", "error": {"code": "X"}}
    assert matches(op, "")
    assert matches(op, 'operationType = "compute.instances.preempted"')
    assert not matches(op, 'operationType = "compute.instances.preempte"')
    assert matches(op, 'operationType != "insert"')
    assert matches(op, "error.code eq X")
    assert matches(op, r'(operationType eq ".*\bpreempted\b.*")(status = DONE)')
    assert not matches(op, r'(operationType eq ".*\bpreempted\b.*")(status = RUNNING)')
    # eq is a whole-value match, not a search.
    assert not matches(op, "operationType eq preempted")
