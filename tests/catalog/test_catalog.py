from __future__ import annotations

import dataclasses

import pytest

from tpuctl.catalog import CapacityType, Catalog, region_of_zone, validate_zone
from tpuctl.errors import UnknownAcceleratorError, UsageError


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


@pytest.mark.parametrize(
    ("name", "api_name", "topology", "chips", "hosts", "chips_per_host"),
    [
        ("v5e-64", "v5litepod-64", "8x8", 64, 16, 4),
        ("v5litepod-64", "v5litepod-64", "8x8", 64, 16, 4),
        ("V5LITE_POD-16", "v5litepod-16", "4x4", 16, 4, 4),
        ("v5e-8", "v5litepod-8", "2x4", 8, 1, 8),
        ("v5e-1", "v5litepod-1", "1x1", 1, 1, 1),
        ("v6e-8", "v6e-8", "2x4", 8, 1, 8),
        ("v6e-256", "v6e-256", "16x16", 256, 64, 4),
        ("v5p-128", "v5p-128", "4x4x4", 64, 16, 4),  # N counts TensorCores, 2 per chip
        ("v5p-8", "v5p-8", "2x2x1", 4, 1, 4),
        ("v4-32", "v4-32", "2x2x4", 16, 4, 4),
        ("v3-8", "v3-8", "2x2", 4, 1, 4),
        ("v2-32", "v2-32", "4x4", 16, 4, 4),
    ],
)
def test_resolve_friendly_and_api_names(
    catalog: Catalog, name: str, api_name: str, topology: str, chips: int, hosts: int, chips_per_host: int
) -> None:
    accel = catalog.resolve(name)
    assert (accel.api_name, accel.topology, accel.chips, accel.hosts, accel.chips_per_host) == (
        api_name,
        topology,
        chips,
        hosts,
        chips_per_host,
    )


def test_invalid_size_lists_valid_sizes(catalog: Catalog) -> None:
    with pytest.raises(UnknownAcceleratorError) as info:
        catalog.resolve("v5e-48")
    assert "48" in info.value.message
    assert info.value.fix is not None
    assert "v5e-64" in info.value.fix and "v5e-256" in info.value.fix
    assert info.value.exit_code == 2


@pytest.mark.parametrize("name", ["v9-8", "tpu", "v5e", "v5e-", "-8", "v5e-8x"])
def test_unknown_types_are_usage_errors(catalog: Catalog, name: str) -> None:
    with pytest.raises(UnknownAcceleratorError) as info:
        catalog.resolve(name)
    assert info.value.value == name


def test_every_generation_of_the_v2_api_is_present(catalog: Catalog) -> None:
    # TPU7x has no enum: the TPU API does not serve it.
    assert {g.api_enum for g in catalog.generations.values() if g.api_enum} == {
        "V2",
        "V3",
        "V4",
        "V5LITE_POD",
        "V5P",
        "V6E",
    }
    for gen in catalog.generations.values():
        assert gen.zones, gen.name
        assert gen.runtime_version
        assert gen.peak_bf16_tflops_per_chip > 0
        for accel in catalog.types(gen.name):
            # Topology and chips agree: the product of the topology's dimensions is the chip count.
            dims = [int(d) for d in accel.topology.split("x")]
            product = 1
            for d in dims:
                product *= d
            assert product == accel.chips, accel.api_name
            assert accel.hosts * accel.chips_per_host == accel.chips, accel.api_name


def test_prices_match_the_fact_sheet(catalog: Catalog) -> None:
    v5e64 = catalog.resolve("v5e-64")
    assert catalog.price_per_chip_hour(v5e64, "us-central1-a", CapacityType.SPOT) == pytest.approx(0.245)
    assert catalog.price_per_chip_hour(v5e64, "us-central1-a", CapacityType.PREEMPTIBLE) == pytest.approx(
        0.245
    )
    assert catalog.price_per_chip_hour(v5e64, "us-central1-a", CapacityType.ON_DEMAND) == pytest.approx(1.20)
    assert catalog.price_per_hour(v5e64, "us-central1-a", CapacityType.SPOT) == pytest.approx(64 * 0.245)
    v6e8 = catalog.resolve("v6e-8")
    assert catalog.price_per_hour(v6e8, "us-east5-b", CapacityType.SPOT, slices=2) == pytest.approx(
        2 * 8 * 1.215
    )
    assert catalog.price_per_chip_hour(v5e64, "us-west1-c", CapacityType.SPOT) is None
    assert catalog.prices.source and catalog.prices.date


def test_quota_ids_and_units(catalog: Catalog) -> None:
    v5e = catalog.resolve("v5e-64")
    assert (
        v5e.generation.quota_id(CapacityType.SPOT, "region")
        == "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI"
    )
    assert (
        v5e.generation.quota_id(CapacityType.ON_DEMAND, "zone") == "TPUV5sLitepodPerProjectPerZoneForTPUAPI"
    )
    assert v5e.generation.quota_id(CapacityType.RESERVED, "zone") is None
    assert v5e.quota_units == 64
    assert catalog.resolve("v5p-8").quota_units == 8  # counted in TensorCores
    assert catalog.resolve("v6e-8").generation.quota_id(CapacityType.PREEMPTIBLE, "region") == (
        "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI"
    )


@pytest.mark.parametrize("zone", ["us-central1-a", "europe-west4-b", "us-central1-ai1a", "asia-northeast1-b"])
def test_valid_zones(zone: str) -> None:
    assert validate_zone(zone) == zone


def test_region_of_zone() -> None:
    assert region_of_zone("us-central1-a") == "us-central1"


@pytest.mark.parametrize(
    "zone", ["us-central1", "uscentral1-a", "US-CENTRAL1-A", "us-central1-", "", "a-b-c-d"]
)
def test_malformed_zones(zone: str) -> None:
    with pytest.raises(UsageError) as info:
        validate_zone(zone)
    assert info.value.value == zone
    assert "us-central1-a" in (info.value.fix or "")


def test_capacity_parse() -> None:
    assert CapacityType.parse("ON_DEMAND") is CapacityType.ON_DEMAND
    assert CapacityType.parse("spot") is CapacityType.SPOT
    with pytest.raises(UsageError) as info:
        CapacityType.parse("cheap")
    assert "spot" in (info.value.fix or "")


def test_tpu7x_is_a_compute_engine_type_named_by_tensorcores_as_xpk_names_it() -> None:
    from tpuctl.catalog import Surface

    catalog = Catalog.load()
    accel = catalog.resolve("tpu7x-32")
    assert (accel.chips, accel.hosts, accel.chips_per_host, accel.topology) == (16, 4, 4, "2x2x4")
    assert accel.machine_type == "tpu7x-standard-4t"
    assert accel.generation.surfaces == (Surface.COMPUTE,)
    assert catalog.resolve("v6e-8").machine_type == "ct6e-standard-8t"  # one 8-chip host
    assert catalog.resolve("v6e-16").machine_type == "ct6e-standard-4t"
    assert catalog.resolve("v5p-8").machine_type == "ct5p-hightpu-4t"
    assert catalog.resolve("v5e-8").machine_type is None
    assert catalog.resolve("v6e-8").generation.default_surface is Surface.TPU_API
    assert accel.generation.quota_families() == []  # no TPU API quota for a type the TPU API lacks


def test_a_generation_refuses_a_surface_that_does_not_serve_it_naming_the_ones_that_do() -> None:
    from tpuctl.catalog import Surface

    catalog = Catalog.load()
    with pytest.raises(UsageError, match="v5e has no Compute Engine path") as err:
        catalog.resolve("v5e-8").generation.check_surface(Surface.COMPUTE)
    assert err.value.exit_code == 2 and "--api tpu" in str(err.value.fix)
    with pytest.raises(UsageError, match="tpu7x has no Cloud TPU API path"):
        catalog.resolve("tpu7x-8").generation.check_surface(Surface.TPU_API)


def test_the_tpu7x_price_is_per_chip_with_its_unit_flagged_as_unconfirmed() -> None:
    catalog = Catalog.load()
    accel = catalog.resolve("tpu7x-8")
    assert catalog.price_per_hour(accel, "us-central1-c", CapacityType.ON_DEMAND) == 12.0 * 4
    assert catalog.price_per_chip_hour(accel, "us-central1-c", CapacityType.SPOT) is None  # none published
    assert "per chip or per host" in catalog.prices.notes["tpu7x"]


def test_a_v2_or_v3_pod_slice_is_priced_by_its_pod_sku_never_the_single_devices() -> None:
    """v2/v3 slices of several hosts bill their own, dearer, "Pod" SKU
    (docs/google-facts.md#prices-for-budgets); the bundled table has no figure for it, so they are
    unpriced until a refresh finds one."""
    catalog = Catalog.load()
    device, pod = catalog.resolve("v3-8"), catalog.resolve("v3-32")
    assert (device.hosts, pod.hosts) == (1, 4)
    assert catalog.price_per_chip_hour(device, "us-central1-a", CapacityType.ON_DEMAND) == 2.00
    assert catalog.price_per_chip_hour(pod, "us-central1-a", CapacityType.ON_DEMAND) is None
    assert catalog.price_per_chip_hour(pod, "us-central1-a", CapacityType.SPOT) is None
    refreshed = dataclasses.replace(
        catalog,
        prices=dataclasses.replace(
            catalog.prices, prices={"v3": {"us-central1": {"on_demand": 2.0, "pod_on_demand": 3.0}}}
        ),
    )
    assert refreshed.price_per_chip_hour(pod, "us-central1-a", CapacityType.ON_DEMAND) == 3.0
    assert refreshed.price_per_hour(pod, "us-central1-a", CapacityType.ON_DEMAND) == 3.0 * 16


def test_flex_start_has_a_price_of_its_own_never_the_spot_one() -> None:
    catalog = Catalog.load()
    v6e = catalog.resolve("v6e-8")
    # Observed on the Billing Catalog (docs/google-facts.md#prices-for-budgets): 1.35 in two regions.
    flex = catalog.price_per_chip_hour(v6e, "europe-west4-a", CapacityType.PREEMPTIBLE, flex_start=True)
    assert flex == 1.35
    assert catalog.price_per_chip_hour(v6e, "europe-west4-a", CapacityType.PREEMPTIBLE) == 1.0375  # spot
    # Where no flex-start figure was found it is unknown, not the spot price.
    assert (
        catalog.price_per_chip_hour(v6e, "us-central1-b", CapacityType.PREEMPTIBLE, flex_start=True) is None
    )
    tpu7x = catalog.resolve("tpu7x-8")
    assert catalog.price_per_hour(tpu7x, "us-central1-c", CapacityType.PREEMPTIBLE, flex_start=True) is None
