"""Cloud Billing Catalog client (httpx) against respx with recorded-shape SKU pages, and the mapping of
SKUs to (generation, region, capacity) per chip-hour, and the cache a refresh writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
import yaml

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.cloud.billing import (
    COMPUTE_SERVICE_ID,
    TPU_SERVICE_ID,
    CloudBillingCatalogClient,
    money,
    parse_sku,
)
from tpuctl.cloud.retry import RetryPolicy
from tpuctl.errors import CloudError, PermissionDeniedError, TransientError
from tpuctl.services.prices import (
    cache_path,
    generation_of_description,
    load_catalog,
    map_skus,
    refresh_from_billing,
)

BASE = "https://billing.example.test"
FAST = RetryPolicy(max_attempts=3, initial_wait_s=0.0, max_wait_s=0.0, deadline_s=5.0)
NOW = 1_800_000_000.0  # 2027-01-15


def sku(
    description: str,
    regions: list[str],
    units: str,
    nanos: int,
    *,
    usage_type: str = "OnDemand",
    sku_id: str = "AAAA-BBBB-CCCC",
    service: str = COMPUTE_SERVICE_ID,
    unit: str = "h",
) -> dict[str, Any]:
    """A SKU as services.skus.list returns it (Cloud Billing Catalog API v1); proto3 JSON drops zero nanos."""
    price: dict[str, Any] = {"currencyCode": "USD", "units": units}
    if nanos:
        price["nanos"] = nanos
    return {
        "name": f"services/{service}/skus/{sku_id}",
        "skuId": sku_id,
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": "TPU",
            "usageType": usage_type,
        },
        "serviceRegions": regions,
        "pricingInfo": [
            {
                "effectiveTime": "2027-01-01T00:00:00Z",
                "summary": "",
                "pricingExpression": {
                    "usageUnit": unit,
                    "usageUnitDescription": "hour",
                    "baseUnit": "s",
                    "baseUnitDescription": "second",
                    "baseUnitConversionFactor": 3600,
                    "displayQuantity": 1,
                    "tieredRates": [{"startUsageAmount": 0, "unitPrice": price}],
                },
                "aggregationInfo": {"aggregationLevel": "ACCOUNT", "aggregationInterval": "DAILY"},
                "currencyConversionRate": 1,
            }
        ],
        "serviceProviderName": "Google",
    }


COMPUTE_PAGE_1: dict[str, Any] = {
    "skus": [
        sku("TpuV5e chip usage in Americas", ["us-central1", "us-east1"], "1", 300_000_000, sku_id="V5E-OD"),
        sku("Preemptible TpuV5e chip usage", ["us-central1"], "0", 200_000_000, sku_id="V5E-SPOT"),
        sku("N1 Predefined Instance Core running in Americas", ["us-central1"], "0", 31_611_000),
    ],
    "nextPageToken": "page-2",
}
COMPUTE_PAGE_2: dict[str, Any] = {
    "skus": [
        sku("TpuV6e chip usage", ["europe-west4"], "3", 0, sku_id="V6E-OD"),
        sku("Commitment v1: TpuV6e in Europe for 1 year", ["europe-west4"], "2", 0, usage_type="Commit1Yr"),
        sku("TpuV5p chip usage", ["us-east5", "global"], "4", 500_000_000, sku_id="V5P-OD"),
    ],
    "nextPageToken": "",
}
TPU_PAGE: dict[str, Any] = {
    "skus": [
        # v2/v3/v4 are priced per 8 TensorCores = 4 chips.
        sku("Tpu-v3 device usage", ["us-central1"], "8", 0, service=TPU_SERVICE_ID, sku_id="V3-OD"),
        sku("Tpu-v3 Pod device usage", ["us-central1"], "12", 0, service=TPU_SERVICE_ID, sku_id="V3-POD"),
        sku("Preemptible Tpu-v3 device usage", ["us-central1"], "2", 400_000_000, service=TPU_SERVICE_ID),
        sku("Tpu-v4 Pod chip usage", ["us-central2"], "12", 880_000_000, service=TPU_SERVICE_ID, sku_id="V4"),
    ],
}


def client() -> CloudBillingCatalogClient:
    return CloudBillingCatalogClient(base_url=BASE, api_key="k-123", retry=FAST, sleep=lambda s: None)


def mock_pages(router: respx.MockRouter) -> respx.Route:
    compute = router.get(f"{BASE}/v1/services/{COMPUTE_SERVICE_ID}/skus")
    compute.side_effect = lambda request: httpx.Response(
        200, json=COMPUTE_PAGE_2 if request.url.params.get("pageToken") == "page-2" else COMPUTE_PAGE_1
    )
    router.get(f"{BASE}/v1/services/{TPU_SERVICE_ID}/skus").respond(200, json=TPU_PAGE)
    return compute


# --- the client ----------------------------------------------------------------------------------------


@respx.mock
def test_lists_every_page_with_the_api_key_and_parses_prices() -> None:
    route = mock_pages(respx.mock)
    with client() as c:
        skus = c.list_skus(COMPUTE_SERVICE_ID)
    assert [s.sku_id for s in skus][:2] == ["V5E-OD", "V5E-SPOT"]
    assert len(skus) == 6
    assert route.call_count == 2
    first, second = route.calls[0].request, route.calls[1].request
    assert first.url.params["key"] == "k-123"
    assert first.url.params["pageSize"] == "5000"
    assert "pageToken" not in first.url.params
    assert second.url.params["pageToken"] == "page-2"
    assert skus[0].unit_price == pytest.approx(1.3)
    assert skus[0].regions == ("us-central1", "us-east1")
    assert skus[3].unit_price == 3.0  # no nanos field: 0


def test_money_is_units_plus_nanos() -> None:
    assert money({"units": "1", "nanos": 200_000_000}) == pytest.approx(1.2)
    assert money({"nanos": 245_000_000}) == pytest.approx(0.245)
    assert money({}) == 0.0
    with pytest.raises(CloudError):
        money({"units": "x"})
    with pytest.raises(CloudError):
        money({"units": "-1"})


def test_a_sku_without_pricing_parses_with_no_price() -> None:
    parsed = parse_sku({"skuId": "X", "description": "TpuV5e chip", "serviceRegions": ["us-central1"]}, "S")
    assert parsed.unit_price is None
    assert parsed.usage_type == ""


@respx.mock
def test_errors_are_translated_and_the_key_never_leaks() -> None:
    respx.get(f"{BASE}/v1/services/{COMPUTE_SERVICE_ID}/skus").respond(
        403,
        json={"error": {"code": 403, "status": "PERMISSION_DENIED", "message": "API key not valid."}},
    )
    with pytest.raises(PermissionDeniedError) as err, client() as c:
        c.list_skus(COMPUTE_SERVICE_ID)
    assert "API key not valid" in err.value.message
    assert "k-123" not in str(err.value)
    assert "k-123" not in repr(client())


@respx.mock
def test_transient_errors_are_retried_then_reported() -> None:
    route = respx.get(f"{BASE}/v1/services/{COMPUTE_SERVICE_ID}/skus")
    route.side_effect = [
        httpx.Response(503, json={"error": {"status": "UNAVAILABLE", "message": "busy"}})
    ] * 2 + [httpx.Response(200, json={"skus": []})]
    with client() as c:
        assert c.list_skus(COMPUTE_SERVICE_ID) == []
    assert route.call_count == 3
    route.side_effect = None
    route.respond(503, json={"error": {"status": "UNAVAILABLE", "message": "busy"}})
    with pytest.raises(TransientError), client() as c:
        c.list_skus(COMPUTE_SERVICE_ID)


@respx.mock
def test_a_repeated_page_token_stops_the_loop() -> None:
    respx.get(f"{BASE}/v1/services/{COMPUTE_SERVICE_ID}/skus").respond(
        200, json={"skus": [], "nextPageToken": "again"}
    )
    with pytest.raises(CloudError, match="repeated page token"), client() as c:
        c.list_skus(COMPUTE_SERVICE_ID)


@respx.mock
def test_not_json_is_a_clear_error() -> None:
    respx.get(f"{BASE}/v1/services/{COMPUTE_SERVICE_ID}/skus").respond(200, text="<html>")
    with pytest.raises(CloudError, match="not valid JSON"), client() as c:
        c.list_skus(COMPUTE_SERVICE_ID)


# --- mapping -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("description", "generation"),
    [
        ("TpuV5e chip usage in Americas", "v5e"),
        ("Preemptible TpuV5p chip", "v5p"),
        ("TpuV6e chip usage", "v6e"),
        ("Tpu-v2 device usage", "v2"),
        ("Tpu-v3 Pod device usage", "v3"),
        ("Tpu-v4 Pod chip usage", "v4"),
        ("N1 Predefined Instance Core", None),
        ("Nvidia Tesla V100 GPU", None),
    ],
)
def test_generation_from_description(description: str, generation: str | None) -> None:
    assert generation_of_description(description) == generation


def test_map_skus_to_per_chip_prices() -> None:
    from tpuctl.cloud.billing import parse_sku as parse

    skus = [parse(s, COMPUTE_SERVICE_ID) for s in COMPUTE_PAGE_1["skus"] + COMPUTE_PAGE_2["skus"]]
    skus += [parse(s, TPU_SERVICE_ID) for s in TPU_PAGE["skus"]]

    mapping = map_skus(skus, Catalog.load())

    assert mapping.prices == {
        "v5e": {"us-central1": {"on_demand": 1.3, "spot": 0.2}, "us-east1": {"on_demand": 1.3}},
        "v6e": {"europe-west4": {"on_demand": 3.0}},
        "v5p": {"us-east5": {"on_demand": 4.5}},
        # 8 USD per 8 cores = 4 chips; spot 2.4 / 4; the pod SKU (12 / 4) prices v3 pod slices apart.
        "v3": {"us-central1": {"on_demand": 2.0, "spot": 0.6, "pod_on_demand": 3.0}},
        "v4": {"us-central2": {"on_demand": 3.22}},
    }
    # The N1 core and the commitment are not TPU list prices.
    assert mapping.skipped == 2


def test_conflicting_skus_keep_the_first_and_say_so() -> None:
    skus = [
        parse_sku(sku("TpuV5e chip", ["us-central1"], "1", 0, sku_id="A"), COMPUTE_SERVICE_ID),
        parse_sku(sku("TpuV5e chip", ["us-central1"], "2", 0, sku_id="B"), COMPUTE_SERVICE_ID),
    ]
    mapping = map_skus(skus, Catalog.load())
    assert mapping.prices["v5e"]["us-central1"]["on_demand"] == 1.0
    assert any("disagree" in w for w in mapping.warnings)


# --- refresh and cache ------------------------------------------------------------------------------


@respx.mock
def test_refresh_caches_atomically_with_date_and_fills_gaps(tmp_path: Path) -> None:
    mock_pages(respx.mock)
    state = tmp_path / "state"
    with client() as c:
        result = refresh_from_billing(c, state_dir=state, backend="gcp", now=NOW)

    path = cache_path(state, "gcp")
    assert result.path == path
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    data = yaml.safe_load(path.read_text())
    assert data["date"] == "2027-01-15"
    assert data["fetched_at"] == "2027-01-15T08:00:00Z"
    assert data["source"].startswith("Cloud Billing Catalog API (services 6F81-5844-456A, E000-3F24-B8AA)")
    assert data["billing_url"] == BASE
    assert "k-123" not in path.read_text()
    assert data["prices"]["v5e"]["us-central1"] == {"on_demand": 1.3, "spot": 0.2}
    # What the SKUs did not list comes from the bundled table, and says so.
    assert data["prices"]["v5e"]["us-east1"] == {"on_demand": 1.3, "spot": 0.245}
    assert "v5e/us-east1/spot" in result.filled_from_bundled
    assert [p.name for p in path.parent.iterdir()] == ["gcp.yaml"]  # no temp file left behind

    catalog, source = load_catalog(state, "gcp")
    assert source.cached and source.date == "2027-01-15"
    assert catalog.prices.per_chip_hour("v5e", "us-central1", CapacityType.SPOT) == 0.2
    # The simulator's prices are not Google's: another backend still reads the bundled table.
    assert load_catalog(state, "sim")[1].cached is False


@respx.mock
def test_refresh_with_no_tpu_sku_leaves_the_cache_alone(tmp_path: Path) -> None:
    respx.get(url__regex=rf"{BASE}/v1/services/.*/skus").respond(200, json={"skus": []})
    with pytest.raises(CloudError, match="none is a TPU price"), client() as c:
        refresh_from_billing(c, state_dir=tmp_path, backend="gcp", now=NOW)
    assert not cache_path(tmp_path, "gcp").exists()


def test_a_corrupt_cache_falls_back_to_the_bundled_prices_with_a_warning(tmp_path: Path) -> None:
    path = cache_path(tmp_path, "gcp")
    path.parent.mkdir(parents=True)
    path.write_text("prices: [not, a, mapping")
    catalog, source = load_catalog(tmp_path, "gcp")
    assert source.cached is False
    assert source.date == Catalog.load().prices.date
    assert "--refresh" in source.warnings[0]
    assert catalog.prices.per_chip_hour("v5e", "us-central1", CapacityType.SPOT) == 0.245
