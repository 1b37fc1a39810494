"""Each surface's quota rules in one object: the TPU API's quotas per zone and region in the generation's
unit, with queued resources; Compute Engine's per family in chips, with none. ``QuotaBook`` asks them."""

from __future__ import annotations

import pytest

from tpuctl.catalog import CapacityType, Catalog, Surface
from tpuctl.cloud.base import QueuedResource, QuotaLimit
from tpuctl.services.quota import QuotaBook
from tpuctl.services.quota_rules import RULES, QuotaKey, queued_resource_rules, quota_rules

ZONE = "us-central1-c"


def test_there_are_rules_for_every_surface_and_each_knows_its_own() -> None:
    assert set(RULES) == set(Surface)
    assert all(quota_rules(surface).surface is surface for surface in Surface)


def test_only_the_tpu_api_has_queued_resources() -> None:
    assert quota_rules(Surface.TPU_API).queued_resources
    assert not quota_rules(Surface.COMPUTE).queued_resources
    assert queued_resource_rules().surface is Surface.TPU_API


@pytest.mark.parametrize(
    ("type_name", "surface", "unit", "units"),
    [
        ("v5p-8", Surface.TPU_API, "cores", 8),  # the TPU API counts v5p in TensorCores: 4 chips x 2
        ("v5p-8", Surface.COMPUTE, "chips", 4),  # Compute Engine counts every generation in chips
        ("v6e-8", Surface.TPU_API, "chips", 8),
        ("tpu7x-64", Surface.COMPUTE, "chips", 32),
    ],
)
def test_each_surface_counts_in_its_own_unit(type_name: str, surface: Surface, unit: str, units: int) -> None:
    accel = Catalog.load().resolve(type_name)
    rules = quota_rules(surface)
    assert (rules.unit(accel), rules.units(accel)) == (unit, units)


def test_the_same_slice_draws_on_each_surfaces_own_quotas() -> None:
    v6e = Catalog.load().resolve("v6e-8")
    assert quota_rules(Surface.TPU_API).keys(v6e, ZONE, CapacityType.ON_DEMAND) == [
        QuotaKey("TPUV6EPerProjectPerZoneForTPUAPI", ZONE),
        QuotaKey("TPUV6EPerProjectPerRegionForTPUAPI", "us-central1"),
    ]
    assert quota_rules(Surface.COMPUTE).keys(v6e, ZONE, CapacityType.ON_DEMAND) == [
        QuotaKey("TPUS-PER-TPU-FAMILY-per-project-region", "us-central1", "CT6E")
    ]
    for surface in Surface:  # reserved capacity draws on its reservation, on either surface
        assert quota_rules(surface).keys(v6e, ZONE, CapacityType.RESERVED) == []


def test_the_catalogs_quota_ids_are_split_between_the_surfaces() -> None:
    catalog = Catalog.load()
    tpu_api = quota_rules(Surface.TPU_API).catalog_quotas(catalog)
    compute = quota_rules(Surface.COMPUTE).catalog_quotas(catalog)
    assert not set(tpu_api) & set(compute)
    assert tpu_api["TPUV5PPerProjectPerZoneForTPUAPI"] == "cores"
    assert compute["PREEMPTIBLE-TPU7X-per-project-region"] == "chips"
    assert set(compute.values()) == {"chips"}


@pytest.mark.parametrize(
    ("limit", "surface"),
    [
        (QuotaLimit("X", "compute.googleapis.com/anything", 1, region="r"), Surface.COMPUTE),
        (QuotaLimit("X", "", 1, region="r", tpu_family="CT6E"), Surface.COMPUTE),
        (QuotaLimit("X", "tpu.googleapis.com/tpu-v6e", 1, zone=ZONE), Surface.TPU_API),
    ],
)
def test_a_listed_quota_belongs_to_the_surface_whose_row_it_is(limit: QuotaLimit, surface: Surface) -> None:
    assert [s for s in Surface if quota_rules(s).owns(limit)] == [surface]
    assert QuotaBook(Catalog.load(), [limit], []).all_uses()[0].surface is surface


def test_a_dead_queued_resource_holds_the_tpu_apis_quota_in_its_unit() -> None:
    # v5p-8 through a queued resource: 8 TensorCores of the TPU API's v5p quota, never Compute Engine's.
    qr = QueuedResource("q1", ZONE, "FAILED", tier="spot", accelerator_type="v5p-8", node_count=1)
    book = QuotaBook(Catalog.load(), [], [], [qr])
    used = {(u.quota_id, u.location): (u.in_use, u.reclaimable, u.surface) for u in book.all_uses()}
    assert used == {
        ("TPUV5PPreemptiblePerProjectPerZoneForTPUAPI", ZONE): (8, 8, Surface.TPU_API),
        ("TPUV5PPreemptiblePerProjectPerRegionForTPUAPI", "us-central1"): (8, 8, Surface.TPU_API),
    }
