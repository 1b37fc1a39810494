"""Reading quotas as Google serves them: default entries honoured, an unlisted or unreadable quota unknown
(tried, never 0), the v5e serving family for single-host shapes; Compute Engine slices on Compute Engine's
own quotas, per TPU family, in chips."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from allocator_helpers import SimEnv

from tpuctl.catalog import CapacityType, Catalog, Surface
from tpuctl.cloud.base import Node, QuotaLimit
from tpuctl.cloud.quotas import parse_quota_infos
from tpuctl.errors import PermissionDeniedError
from tpuctl.services.placement import QuotaCheck
from tpuctl.services.quota import QuotaBook, generation_uses
from tpuctl.services.quota_rules import QuotaKey

V5E_SPOT_Z = "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"

#: A QuotaInfo shaped as Cloud Quotas answers: per-zone overrides plus one entry without dimensions,
#: the project default for every zone it lists.
REALISTIC: dict[str, Any] = {
    "name": f"projects/123/locations/global/services/tpu.googleapis.com/quotaInfos/{V5E_SPOT_Z}",
    "quotaId": V5E_SPOT_Z,
    "metric": "tpu.googleapis.com/tpu-v5s-litepod-preemptible",
    "service": "tpu.googleapis.com",
    "isPrecise": True,
    "containerType": "PROJECT",
    "dimensions": ["zone"],
    "dimensionsInfos": [
        {
            "dimensions": {"zone": "us-east5-b"},
            "details": {"value": "0"},
            "applicableLocations": ["us-east5-b"],
        },
        {"details": {"value": "64"}, "applicableLocations": ["us-central1-a", "us-west4-a", "us-east5-b"]},
    ],
}


def _book(limits: list[QuotaLimit] | None) -> QuotaBook:
    return QuotaBook(Catalog.load(), limits, nodes=[], queued_resources=[])


@pytest.mark.parametrize(
    ("quota_id", "location", "limit"),
    [
        (V5E_SPOT_Z, "us-central1-a", 64),  # the default entry's zones
        (V5E_SPOT_Z, "us-west4-a", 64),
        (V5E_SPOT_Z, "us-east5-b", 0),  # the override wins over the default that also lists it
        (V5E_SPOT_Z, "europe-west4-b", None),  # not listed anywhere: unknown, not 0
        ("TPUV6EPerProjectPerZoneForTPUAPI", "us-central1-b", None),  # an id Cloud Quotas did not list
    ],
)
def test_default_entries_are_honoured(quota_id: str, location: str, limit: int | None) -> None:
    use = _book(parse_quota_infos([REALISTIC])).use(quota_id, location)
    assert use.limit == limit


def test_a_default_without_locations_applies_everywhere() -> None:
    info = {**REALISTIC, "dimensionsInfos": [{"details": {"value": "32"}}]}
    assert _book(parse_quota_infos([info])).use(V5E_SPOT_Z, "us-south1-a").limit == 32


@pytest.mark.parametrize("limits", [[], None], ids=["not listed", "unreadable"])
def test_an_unknown_quota_fits_and_says_so(limits: list[QuotaLimit] | None) -> None:
    accel = Catalog.load().resolve("v5e-16")
    uses = _book(limits).uses_for(accel, "us-central1-a", CapacityType.SPOT)
    assert [u.limit for u in uses] == [None, None]
    check = QuotaCheck.from_use(uses[0], needed=16)
    assert check.fits and check.available is None
    assert check.shortfall().endswith("unknown — try and let the create answer")


@pytest.mark.parametrize(
    ("type_name", "capacity", "quota_ids"),
    [
        ("v5e-8", CapacityType.ON_DEMAND, ["TPUV5sLitepodServingPerProjectPerZoneForTPUAPI"]),
        ("v5e-1", CapacityType.SPOT, ["TPUV5sPreemptibleLitepodServingPerProjectPerZoneForTPUAPI"]),
        ("v5e-16", CapacityType.ON_DEMAND, ["TPUV5sLitepodPerProjectPerZoneForTPUAPI",
                                            "TPUV5sLitepodPerProjectPerRegionForTPUAPI"]),
        ("v6e-8", CapacityType.SPOT, ["TPUV6EPreemptiblePerProjectPerZoneForTPUAPI",
                                      "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI"]),
        ("v5e-8", CapacityType.RESERVED, []),
    ],
)  # fmt: skip
def test_single_host_v5e_is_checked_against_the_serving_family(
    type_name: str, capacity: CapacityType, quota_ids: list[str]
) -> None:
    accel = Catalog.load().resolve(type_name)
    assert [k.quota_id for k in QuotaBook.keys_for(accel, "us-central1-a", capacity)] == quota_ids


def test_cloud_quotas_403_lets_placement_go_on_with_a_warning(
    sim: Callable[..., SimEnv], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = sim()
    session = env.session()

    def refused() -> list[QuotaLimit]:
        raise PermissionDeniedError("Cloud Quotas API has not been used in project tpuctl-sim", code=7)

    monkeypatch.setattr(session.cloud, "quota_limits", refused)
    allocator = env.allocator(session)
    plan = allocator.plan(env.request("v5e-16", session, spot=True, zones=["us-central1-a"]))
    assert plan.feasible
    assert [c.quota[0].limit for c in plan.candidates] == [None]
    (warning,) = plan.warnings  # said once, not once per quota
    assert "could not read quota limits from Cloud Quotas" in warning
    assert "lets the create answer" in warning
    placed = allocator.place(env.request("v5e-16", session, spot=True, zones=["us-central1-a"], name="q403"))
    assert [n.state for n in placed.nodes] == ["READY"]


def test_an_unlisted_quota_is_unknown_in_the_dry_run_plan(
    sim: Callable[..., SimEnv], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = sim()
    session = env.session()
    monkeypatch.setattr(session.cloud, "quota_limits", lambda: [])
    plan = env.allocator(session).plan(env.request("v5e-16", session, spot=True, zones=["us-central1-a"]))
    assert plan.feasible
    assert any(
        w.endswith("unknown — try and let the create answer") and V5E_SPOT_Z in w for w in plan.warnings
    )
    assert plan.to_dict()["warnings"] == plan.warnings


# --- Compute Engine slices draw on Compute Engine's quotas (disjoint from the TPU API's) ----------------

FAMILY_Q = "TPUS-PER-TPU-FAMILY-per-project-region"
TPU7X_SPOT_Q = "PREEMPTIBLE-TPU7X-per-project-region"
CE_ZONE = "us-central1-c"


@pytest.mark.parametrize(
    ("type_name", "capacity", "surface", "keys"),
    [
        ("tpu7x-64", CapacityType.SPOT, Surface.COMPUTE, [QuotaKey(TPU7X_SPOT_Q, "us-central1")]),
        ("tpu7x-64", CapacityType.ON_DEMAND, Surface.COMPUTE, [QuotaKey(FAMILY_Q, "us-central1", "TPU7X")]),
        ("v6e-8", CapacityType.ON_DEMAND, Surface.COMPUTE, [QuotaKey(FAMILY_Q, "us-central1", "CT6E")]),
        ("v6e-8", CapacityType.SPOT, Surface.COMPUTE,
         [QuotaKey("PREEMPTIBLE-TPU-V6E-per-project-region", "us-central1")]),
        ("v5p-8", CapacityType.ON_DEMAND, Surface.COMPUTE, [QuotaKey("TPU-V5P-per-project-zone", CE_ZONE)]),
        ("tpu7x-64", CapacityType.RESERVED, Surface.COMPUTE, []),
        # The same v6e through the TPU API: the TPU API's own ids, per zone and per region.
        ("v6e-8", CapacityType.ON_DEMAND, Surface.TPU_API,
         [QuotaKey("TPUV6EPerProjectPerZoneForTPUAPI", CE_ZONE),
          QuotaKey("TPUV6EPerProjectPerRegionForTPUAPI", "us-central1")]),
    ],
)  # fmt: skip
def test_a_slice_draws_on_its_surfaces_quotas(
    type_name: str, capacity: CapacityType, surface: Surface, keys: list[QuotaKey]
) -> None:
    accel = Catalog.load().resolve(type_name)
    assert QuotaBook.keys_for(accel, CE_ZONE, capacity, surface) == keys


def _ce_node(name: str, type_name: str, capacity: CapacityType, state: str = "READY") -> Node:
    return Node(name, CE_ZONE, type_name, state, capacity, surface=Surface.COMPUTE)


def _ce_limits() -> list[QuotaLimit]:
    metric = "compute.googleapis.com/tpus_per_tpu_family"
    return [
        QuotaLimit(FAMILY_Q, metric, 0, region="us-central1"),  # every family without its own row
        QuotaLimit(FAMILY_Q, metric, 128, region="us-central1", tpu_family="TPU7X"),
        QuotaLimit(FAMILY_Q, metric, 256, region="us-central1", tpu_family="CT6E"),
        QuotaLimit(TPU7X_SPOT_Q, "compute.googleapis.com/preemptible_tpu7x", 64, region="us-central1"),
        QuotaLimit("TPUV6EPerProjectPerZoneForTPUAPI", "tpu.googleapis.com/tpu-v6e", 64, zone=CE_ZONE),
    ]


def test_compute_engine_slices_are_counted_per_family_in_chips() -> None:
    catalog = Catalog.load()
    nodes = [
        _ce_node("spot-7x", "tpu7x-64", CapacityType.SPOT),  # 32 chips
        _ce_node("od-7x", "tpu7x-32", CapacityType.ON_DEMAND),  # 16 chips
        _ce_node("dead-7x", "tpu7x-8", CapacityType.ON_DEMAND, state="TERMINATED"),  # 4 chips, held
        _ce_node("od-6e", "v6e-8", CapacityType.ON_DEMAND),
        Node("tpu-6e", CE_ZONE, "v6e-4", "READY", CapacityType.ON_DEMAND),  # the TPU API's pool
    ]
    book = QuotaBook(catalog, _ce_limits(), nodes)
    tpu7x = catalog.resolve("tpu7x-64")

    (spot,) = book.uses_for(tpu7x, CE_ZONE, CapacityType.SPOT, Surface.COMPUTE)
    assert (spot.quota_id, spot.location, spot.tpu_family) == (TPU7X_SPOT_Q, "us-central1", None)
    assert (spot.limit, spot.in_use, spot.available, spot.unit) == (64, 32, 32, "chips")
    assert spot.surface is Surface.COMPUTE

    (od,) = book.uses_for(tpu7x, CE_ZONE, CapacityType.ON_DEMAND, Surface.COMPUTE)
    assert (od.quota_id, od.tpu_family, od.limit, od.in_use, od.reclaimable) == (
        FAMILY_Q,
        "TPU7X",
        128,
        20,
        4,
    )
    assert book.holders(FAMILY_Q, "us-central1", "TPU7X") == ["slice dead-7x (TERMINATED, us-central1-c)"]
    assert book.holders(FAMILY_Q, "us-central1") == []  # no other family's slice is named

    (ct6e,) = book.uses_for(catalog.resolve("v6e-8"), CE_ZONE, CapacityType.ON_DEMAND, Surface.COMPUTE)
    assert (ct6e.tpu_family, ct6e.limit, ct6e.in_use) == ("CT6E", 256, 8)  # not the TPU API's v6e-4
    tpu_api = book.uses_for(catalog.resolve("v6e-8"), CE_ZONE, CapacityType.ON_DEMAND)
    assert [(u.quota_id, u.in_use, u.surface) for u in tpu_api] == [
        ("TPUV6EPerProjectPerZoneForTPUAPI", 4, Surface.TPU_API),
        ("TPUV6EPerProjectPerRegionForTPUAPI", 4, Surface.TPU_API),
    ]


def test_a_family_without_its_own_row_takes_the_quotas_default() -> None:
    limits = [row for row in _ce_limits() if row.tpu_family != "TPU7X"]
    book = QuotaBook(Catalog.load(), limits, [])
    (od,) = book.uses_for(Catalog.load().resolve("tpu7x-8"), CE_ZONE, CapacityType.ON_DEMAND, Surface.COMPUTE)
    assert (od.tpu_family, od.limit) == ("TPU7X", 0)
    assert QuotaCheck.from_use(od, needed=4).fits is False


def test_every_compute_quota_is_listed_with_its_family() -> None:
    book = QuotaBook(Catalog.load(), _ce_limits(), [_ce_node("od-7x", "tpu7x-32", CapacityType.ON_DEMAND)])
    rows = {(u.quota_id, u.location, u.tpu_family): u.to_dict() for u in book.all_uses()}
    assert rows[(FAMILY_Q, "us-central1", "TPU7X")] == {
        "quota_id": FAMILY_Q,
        "scope": "region",
        "location": "us-central1",
        "limit": 128,
        "in_use": 16,
        "available": 112,
        "unit": "chips",
        "preempted_holding": 0,
        "reclaimable": 0,
        "tpu_family": "TPU7X",
        "surface": "compute",
    }
    assert rows[(FAMILY_Q, "us-central1", None)]["limit"] == 0
    assert rows[("TPUV6EPerProjectPerZoneForTPUAPI", CE_ZONE, None)]["surface"] == "tpu"


def test_a_generations_quotas_are_its_tpu_api_and_compute_engine_ones() -> None:
    catalog = Catalog.load()
    book = QuotaBook(catalog, _ce_limits(), [])
    rows = book.all_uses()

    def keys(generation: str) -> set[tuple[str, str | None]]:
        return {(u.quota_id, u.tpu_family) for u in generation_uses(rows, catalog.generation(generation))}

    assert keys("tpu7x") == {(FAMILY_Q, "TPU7X"), (TPU7X_SPOT_Q, None)}
    assert keys("v6e") == {(FAMILY_Q, "CT6E"), ("TPUV6EPerProjectPerZoneForTPUAPI", None)}
    # No row of its own: the per-family quota's row for every other family is the one that holds.
    without_ct6e = QuotaBook(catalog, [r for r in _ce_limits() if r.tpu_family != "CT6E"], []).all_uses()
    assert {(u.quota_id, u.tpu_family) for u in generation_uses(without_ct6e, catalog.generation("v6e"))} == {
        (FAMILY_Q, None),
        ("TPUV6EPerProjectPerZoneForTPUAPI", None),
    }
    assert keys("v5e") == set()
