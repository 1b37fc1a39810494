"""Cloud Quotas as Google serves it: real metric names, a default entry per QuotaInfo next to its
per-location overrides, int64 values as strings, and the v5e serving family drawn by single-host shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from google.api_core import exceptions
from sim_helpers import AUTH, PARENT, PROJECT, create_ready, make_world, node, tpu_client

from tpuctl.cloud.quotas import parse_quota_infos
from tpuctl.sim import SimServer

QUOTAS = f"/v1/projects/{PROJECT}/locations/global/services/tpu.googleapis.com/quotaInfos"
SERVING_Z = "TPUV5sLitepodServingPerProjectPerZoneForTPUAPI"


def _infos(server: SimServer) -> dict[str, dict[str, Any]]:
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        return {i["quotaId"]: i for i in http.get(QUOTAS).json()["quotaInfos"]}


@pytest.fixture
def quota_server(start_server: Callable[..., SimServer]) -> SimServer:
    return start_server(
        make_world(
            quotas={
                "generations": {
                    "v5e": {
                        "on_demand": {"zone": 64, "region": 64},
                        "preemptible": {"zone": 64, "region": 96},
                    }
                },
                "serving": {"v5e": {"on_demand": {"zone": 8}, "preemptible": {"zone": 16}}},
                "overrides": [
                    {"generation": "v5e", "capacity": "preemptible", "location": "us-east5-b", "limit": 0}
                ],
            }
        )
    )


@pytest.mark.parametrize(
    ("quota_id", "metric", "dimensions"),
    [
        ("TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI", "tpu-v5s-litepod-preemptible", ["zone"]),
        ("TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI", "tpu-v5s-litepod-preemptible", ["region"]),
        ("TPUV5sLitepodPerProjectPerZoneForTPUAPI", "tpu-v5s-litepod", ["zone"]),
        ("TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "tpu-v6e-preemptible", ["zone"]),
        ("TPUV5PPreemptiblePerProjectPerRegionForTPUAPI", "tpu-v5p-preemptible", ["region"]),
        (SERVING_Z, "tpu-v5s-litepod-serving", ["zone"]),
        (
            "TPUV5sPreemptibleLitepodServingPerProjectPerZoneForTPUAPI",
            "tpu-v5s-litepod-serving-preemptible",
            ["zone"],
        ),
    ],
)
def test_quota_ids_carry_real_metric_names(
    quota_server: SimServer, quota_id: str, metric: str, dimensions: list[str]
) -> None:
    info = _infos(quota_server)[quota_id]
    assert info["metric"] == f"tpu.googleapis.com/{metric}"
    assert info["dimensions"] == dimensions


def test_serving_family_is_per_zone_only(quota_server: SimServer) -> None:
    assert not any("Serving" in q and "Region" in q for q in _infos(quota_server))


def test_quota_info_has_a_default_entry_and_overrides(quota_server: SimServer) -> None:
    info = _infos(quota_server)["TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"]
    default, *overrides = info["dimensionsInfos"]
    assert "dimensions" not in default  # proto3 JSON omits the empty map: the project default
    assert default["details"] == {"value": "64"}  # int64 as a JSON string
    assert default["applicableLocations"] == ["us-central1-a"]
    assert overrides == [
        {
            "dimensions": {"zone": "us-east5-b"},
            "details": {"value": "0"},
            "applicableLocations": ["us-east5-b"],
        }
    ]
    # tpuctl reads it back: the default in its zones, the override where it applies.
    limits = {(r.zone, r.limit) for r in parse_quota_infos([info])}
    assert limits == {("us-central1-a", 64), ("us-east5-b", 0)}


def test_single_host_v5e_draws_on_the_serving_quota(quota_server: SimServer) -> None:
    client = tpu_client(quota_server.url)
    create_ready(client, "serve-8", node("v5litepod-8"))  # serving limit 8 in the zone: used up
    with pytest.raises(exceptions.TooManyRequests) as info:
        client.create_node(parent=PARENT, node_id="serve-4", node=node("v5litepod-4"))
    assert (
        f"Quota limit '{SERVING_Z}' has been exceeded. Limit: 8 in zone us-central1-a." in info.value.message
    )
    (violation,) = info.value.details[0]["violations"]
    assert violation["quotaMetric"] == "tpu.googleapis.com/tpu-v5s-litepod-serving"
    # A multi-host shape draws on the training family, untouched by the serving slice.
    create_ready(client, "train-16", node("v5litepod-16"))
