"""Reading quotas as Google serves them: default entries honoured, an unlisted or unreadable quota unknown
(tried, never 0), the v5e serving family for single-host shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from allocator_helpers import SimEnv

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.cloud.base import QuotaLimit
from tpuctl.cloud.quotas import parse_quota_infos
from tpuctl.errors import PermissionDeniedError
from tpuctl.services.placement import QuotaCheck
from tpuctl.services.quota import QuotaBook

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
    assert [qid for qid, _ in QuotaBook.keys_for(accel, "us-central1-a", capacity)] == quota_ids


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
