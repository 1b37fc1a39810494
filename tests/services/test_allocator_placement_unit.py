"""The pure part of placement: flag parsing, quota accounting, candidate judging, ranking and verdicts.
No simulator: QuotaBook is built from QuotaLimit and Node values directly."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tpuctl import params
from tpuctl.catalog import CapacityType, Catalog
from tpuctl.cloud.base import Node, QueuedResource, QuotaLimit
from tpuctl.errors import UsageError
from tpuctl.services.placement import (
    Offer,
    PlacementRequest,
    Rejection,
    Verdict,
    build_candidates,
    candidate_zones,
    decide,
    resolve_capacity_types,
)
from tpuctl.services.quota import QuotaBook

CATALOG = Catalog.load()
V5E = CATALOG.resolve("v5e-16")
OD_Z, OD_R = "TPUV5sLitepodPerProjectPerZoneForTPUAPI", "TPUV5sLitepodPerProjectPerRegionForTPUAPI"
SP_Z, SP_R = (
    "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI",
    "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI",
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("1d", 86400), ("3600s", 3600), ("3600", 3600),
     ("1.5h", 5400), (" 2H ", 7200), ("1h 30m", 5400)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float) -> None:
    assert params.duration(text, "valid_for") == seconds


@pytest.mark.parametrize("text", ["", "soon", "2x", "-1h", "h", "1h-30m", "0s", "0"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UsageError) as err:
        params.duration(text, "valid_for")
    assert err.value.field == "valid_for" and err.value.value == text
    assert err.value.fix == "use a duration such as 2h, 30m, 1h30m, 1d or 3600s"


def test_parse_price() -> None:
    assert params.usd("20", "max_price", per_hour=True) == 20.0
    assert params.usd(" 0.5 ", "max_price", per_hour=True) == 0.5
    for bad in ("abc", "-1", "0", "nan", "inf", ""):
        with pytest.raises(UsageError) as err:
            params.usd(bad, "max_price", per_hour=True)
        assert err.value.field == "max_price" and err.value.value == bad


def test_parse_count() -> None:
    assert params.whole("4", "slices", fix="f") == 4
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(UsageError, match="--slices must be a whole number >= 1"):
            params.whole(bad, "slices", fix="f")


def test_capacity_types_flags_shorthands_and_defaults() -> None:
    assert resolve_capacity_types() == ((CapacityType.ON_DEMAND,), None)
    assert resolve_capacity_types(defaults=[CapacityType.SPOT]) == ((CapacityType.SPOT,), None)
    # The flags are parsed at the edge: --capacity-type (in order) plus the shorthands, and `queued`.
    types, queued = params.capacity_types(["on-demand", "queued"], spot=True)
    assert (types, queued) == ([CapacityType.ON_DEMAND, CapacityType.SPOT], True)
    assert resolve_capacity_types(capacity_types=types) == ((CapacityType.ON_DEMAND, CapacityType.SPOT), None)
    assert resolve_capacity_types(reserved="res-a") == ((CapacityType.RESERVED,), "res-a")
    # A reserved default without a reservation name is dropped rather than failing every create.
    assert resolve_capacity_types(defaults=[CapacityType.RESERVED, CapacityType.SPOT]) == (
        (CapacityType.SPOT,),
        None,
    )


def node(name: str, zone: str, state: str = "READY", capacity: CapacityType = CapacityType.SPOT) -> Node:
    return Node(name=name, zone=zone, accelerator_type="v5litepod-16", state=state, capacity=capacity)


def limits(**by_key: int) -> list[QuotaLimit]:
    out = []
    for key, value in by_key.items():
        quota_id, location = key.split("@")
        scope = {"zone": location} if location.count("-") == 2 else {"region": location}
        out.append(QuotaLimit(quota_id=quota_id, metric="m", limit=value, **scope))  # type: ignore[arg-type]
    return out


def request(**over: Any) -> PlacementRequest:
    fields: dict[str, Any] = {
        "accelerator": V5E,
        "name": "p",
        "request_id": "r1",
        "capacity_types": (CapacityType.SPOT,),
        "runtime_version": "rt",
        "labels": {},
    }
    fields.update(over)
    return PlacementRequest(**fields)


def test_quota_book_counts_dead_queued_resources_and_names_holders() -> None:
    book = QuotaBook(
        CATALOG,
        limits(**{f"{SP_Z}@us-central1-a": 64}),
        [node("a", "us-central1-a"), node("b", "us-central1-a", state="PREEMPTED")],
        [
            QueuedResource(id="q1", zone="us-central1-a", state="FAILED", tier="spot",
                           node_ids=("q1",), accelerator_type="v5litepod-16"),
            # Its node is listed (and counted) already: only the missing one counts here.
            QueuedResource(id="q2", zone="us-central1-a", state="SUSPENDED", tier="spot",
                           node_ids=("b", "q2-1"), accelerator_type="v5litepod-16"),
            QueuedResource(id="q3", zone="us-central1-a", state="WAITING_FOR_RESOURCES", tier="spot",
                           node_ids=("q3",), accelerator_type="v5litepod-16"),
        ],
    )  # fmt: skip
    use = book.use(SP_Z, "us-central1-a")
    assert (use.limit, use.in_use, use.available, use.preempted_holding, use.reclaimable) == (
        64,
        64,
        0,
        16,
        48,
    )
    assert book.holders(SP_Z, "us-central1-a") == [
        "slice b (PREEMPTED, us-central1-a)",
        "queued resource q1 (FAILED, us-central1-a)",
        "queued resource q2 (SUSPENDED, us-central1-a)",
    ]


def test_candidates_judged_offer_then_price_then_quota() -> None:
    req = request(capacity_types=(CapacityType.SPOT, CapacityType.RESERVED), max_price=5.0, reservation="r")
    book = QuotaBook(CATALOG, limits(**{f"{SP_Z}@us-west4-a": -1, f"{SP_R}@us-west4": 8}), [])
    zones = ["us-central1-a", "us-west4-a", "us-west1-c"]
    offers = {"us-central1-a": Offer(False), "us-west4-a": Offer(True), "us-west1-c": Offer(True)}
    cands = {c.key: c for c in build_candidates(req, catalog=CATALOG, book=book, zones=zones, offers=offers)}
    assert cands["us-central1-a/spot"].rejection is Rejection.NOT_OFFERED
    assert cands["us-west4-a/spot"].rejection is Rejection.OVER_CAP  # 7.68 > 5
    assert cands["us-west1-c/spot"].rejection is Rejection.NO_PRICE  # the catalog has no us-west1 price
    assert cands["us-west1-c/spot"].reason == (
        "no price for v5e spot in region us-west1, so the cap of 5.00 USD/h cannot be checked"
    )
    # Reserved capacity draws on its reservation: no TPU API quota applies.
    assert cands["us-west4-a/reserved"].quota == ()
    assert cands["us-west4-a/reserved"].rejection is Rejection.OVER_CAP  # priced at on-demand: 19.20

    uncapped = request()
    cands2 = build_candidates(uncapped, catalog=CATALOG, book=book, zones=["us-west4-a"], offers=offers)
    [spot] = cands2
    zone_check, region_check = spot.quota
    assert (zone_check.available, zone_check.fits, zone_check.headroom) == (None, True, math.inf)
    assert (region_check.available, region_check.fits) == (8, False)
    assert spot.reason == (
        f"region quota {SP_R} in region us-west4: needs 16 chips, 8 available (limit 8, 0 in use)"
    )


def test_under_a_budget_only_priced_candidates_are_taken() -> None:
    """A run's --budget counts its spend by the price: a candidate with none is rejected (the priced
    ones are taken), and a request no candidate can price is refused saying so."""
    book = QuotaBook(CATALOG, limits(), [])
    zones = ["us-central1-a", "us-west1-c"]
    offers = {z: Offer(True) for z in zones}
    req = request(priced_only=True)
    plan = decide(
        req, build_candidates(req, catalog=CATALOG, book=book, zones=zones, offers=offers), zones=zones
    )
    assert [c.zone for c in plan.order] == ["us-central1-a"]
    (unpriced,) = [c for c in plan.candidates if c.zone == "us-west1-c"]
    assert unpriced.rejection is Rejection.NO_PRICE
    assert unpriced.reason == (
        "no price for v5e spot in region us-west1, and --budget counts the run's spend by its price"
    )
    nowhere = decide(
        req,
        build_candidates(req, catalog=CATALOG, book=book, zones=["us-west1-c"], offers=offers),
        zones=["us-west1-c"],
    )
    assert nowhere.verdict is Verdict.OVER_PRICE_CAP
    assert nowhere.message is not None and "no candidate for v5litepod-16 has a price" in nowhere.message
    assert nowhere.fix is not None and "--assume-price-per-hour" in nowhere.fix
    # Without a budget the unpriced zone stays a candidate (tried after the priced one).
    free = request()
    plan = decide(
        free, build_candidates(free, catalog=CATALOG, book=book, zones=zones, offers=offers), zones=zones
    )
    assert [c.zone for c in plan.order] == ["us-central1-a", "us-west1-c"]


def test_ranking_price_then_headroom_then_capacity_order_then_zone() -> None:
    req = request(capacity_types=(CapacityType.ON_DEMAND,))
    zones = ["us-west4-a", "us-east5-b", "us-central1-a"]  # all 1.20 USD/chip-h on demand
    book = QuotaBook(
        CATALOG,
        limits(**{f"{OD_Z}@us-west4-a": 32, f"{OD_Z}@us-east5-b": 64, f"{OD_Z}@us-central1-a": 64,
                  f"{OD_R}@us-west4": 512, f"{OD_R}@us-east5": 512, f"{OD_R}@us-central1": 512}),
        [],
    )  # fmt: skip
    offers = {z: Offer(True) for z in zones}
    plan = decide(
        req, build_candidates(req, catalog=CATALOG, book=book, zones=zones, offers=offers), zones=zones
    )
    # Equal prices: more headroom first (48 left vs 16 in us-west4-a), then the zone name.
    assert [c.zone for c in plan.order] == ["us-central1-a", "us-east5-b", "us-west4-a"]
    assert plan.verdict is Verdict.FEASIBLE and plan.verdict.exit_code == 0


def test_verdict_codes() -> None:
    assert [v.exit_code for v in Verdict] == [0, 4, 5, 6]


def test_candidate_zones() -> None:
    assert candidate_zones(V5E, zones=["us-east5-b", "us-east5-b"]) == ["us-east5-b"]
    assert candidate_zones(V5E, region="us-central1", cloud_zones=["us-central1-f", "us-east5-b"]) == [
        "us-central1-a",
        "us-central1-f",
    ]
    assert candidate_zones(V5E) == sorted(V5E.generation.zones)


def test_over_cap_names_priced_candidates_apart_and_the_smallest_cap_that_places() -> None:
    req = request(max_price=1.0)  # spot v5e-16: 3.92 USD/h in us-central1-a, 7.68 in us-west4-a
    zones = ["us-central1-a", "us-west4-a", "us-west1-c"]  # us-west1 has no price in the catalog
    # No room in us-central1-a's zone quota: a higher cap would place the request in us-west4-a.
    book = QuotaBook(CATALOG, limits(**{f"{SP_Z}@us-central1-a": 8}), [])
    offers = {z: Offer(True) for z in zones}
    plan = decide(
        req, build_candidates(req, catalog=CATALOG, book=book, zones=zones, offers=offers), zones=zones
    )
    assert plan.verdict is Verdict.OVER_PRICE_CAP
    assert plan.message == (
        "every priced candidate for v5litepod-16 is over the price cap of 1.00 USD/h: "
        "us-central1-a spot 3.92 USD/h; us-west4-a spot 7.68 USD/h; "
        "no known price (so the cap cannot be checked) for us-west1-c spot"
    )
    assert plan.fix == (
        "raise --max-price to 7.68, the smallest cap that would place it (us-west4-a spot), "
        "or choose a smaller type or fewer slices"
    )
    raised = request(max_price=7.68)
    cands = build_candidates(raised, catalog=CATALOG, book=book, zones=zones, offers=offers)
    assert [c.zone for c in decide(raised, cands, zones=zones).order] == ["us-west4-a"]


def test_over_cap_with_no_price_anywhere_says_the_cap_cannot_be_checked() -> None:
    req = request(max_price=1.0)
    book = QuotaBook(CATALOG, limits(), [])
    zones = ["us-west1-c"]
    cands = build_candidates(req, catalog=CATALOG, book=book, zones=zones, offers={"us-west1-c": Offer(True)})
    plan = decide(req, cands, zones=zones)
    assert plan.verdict is Verdict.OVER_PRICE_CAP
    assert plan.message == (
        "no candidate for v5litepod-16 has a known price, so the price cap of 1.00 USD/h cannot be "
        "checked anywhere: us-west1-c spot"
    )
    assert plan.fix is not None and plan.fix.startswith("drop --max-price")
