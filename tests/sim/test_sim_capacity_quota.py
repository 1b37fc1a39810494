"""Quota (checked first, synchronously: HTTP 429 with a QuotaFailure detail) and capacity (checked
second: the create operation fails with code 8, and no node is left behind), through the real client."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2
from sim_helpers import FAST_POLLING, PARENT, PROJECT, create_ready, make_world, node, spot_node, tpu_client

from tpuctl.sim import SimAdminClient, SimServer

STOCKOUT_RE = re.compile(
    r'^There is no more capacity in the zone "us-central1-a"; you can try in another zone where Cloud TPU '
    r"Nodes are offered \(see https://cloud.google.com/tpu/docs/regions\) \[EID: 0x[0-9a-f]{16}\]$"
)


def _operation_error(
    client: tpu_v2.TpuClient, node_id: str, body: tpu_v2.Node
) -> exceptions.GoogleAPICallError:
    operation = client.create_node(parent=PARENT, node_id=node_id, node=body)
    with pytest.raises(exceptions.GoogleAPICallError) as info:
        operation.result(polling=FAST_POLLING)
    # The raw google.rpc.Status of the failed operation.
    assert operation.operation.error.code == 8
    return info.value


def test_stockout_fails_the_operation_with_code_8_and_leaves_no_node(client: tpu_v2.TpuClient) -> None:
    create_ready(client, "fills-zone", node("v5litepod-64"))  # on-demand v5e capacity is 64 chips
    operation = client.create_node(parent=PARENT, node_id="one-too-many", node=node("v5litepod-8"))
    # Not an error at create time: the operation runs, then fails (the create's own answer says so;
    # done() would ask again, and 10 simulated seconds are only 10 ms here).
    assert not operation.operation.done
    with pytest.raises(exceptions.ResourceExhausted):
        operation.result(polling=FAST_POLLING)
    assert operation.operation.error.code == 8
    assert STOCKOUT_RE.match(operation.operation.error.message), operation.operation.error.message
    names = [n.name.rsplit("/", 1)[-1] for n in client.list_nodes(parent=PARENT)]
    assert names == ["fills-zone"]
    # Spot capacity is a separate pool: still free.
    create_ready(client, "spot-ok", spot_node("v5litepod-8"))


def test_capacity_frees_when_a_node_is_deleted(client: tpu_v2.TpuClient) -> None:
    create_ready(client, "a", node("v5litepod-64"))
    _operation_error(client, "b", node("v5litepod-8"))
    client.delete_node(name=f"{PARENT}/nodes/a").result(polling=FAST_POLLING)
    create_ready(client, "b", node("v5litepod-8"))


def test_manual_stockout_and_clear(client: tpu_v2.TpuClient, admin: SimAdminClient) -> None:
    assert admin.stockout("us-central1-a") is True
    zone = next(z for z in admin.status()["zones"] if z["zone"] == "us-central1-a")
    assert zone["stockout"] and all(p["capacity_chips"] == 0 for p in zone["pools"])
    error = _operation_error(client, "no", spot_node("v5litepod-1"))
    assert "There is no more capacity" in error.message
    assert admin.stockout("us-central1-a", clear=True) is False
    create_ready(client, "yes", spot_node("v5litepod-1"))


def test_reserved_capacity(client: tpu_v2.TpuClient) -> None:
    reserved = tpu_v2.SchedulingConfig(reserved=True)
    ready = create_ready(client, "r1", node("v5litepod-16", scheduling_config=reserved))  # res-a has 16
    assert ready.scheduling_config.reserved
    operation = client.create_node(
        parent=PARENT, node_id="r2", node=node("v5litepod-1", scheduling_config=reserved)
    )
    with pytest.raises(exceptions.GoogleAPICallError):
        operation.result(polling=FAST_POLLING)
    # FAILED_PRECONDITION, not RESOURCE_EXHAUSTED: what Google answers for reserved capacity
    # (docs/google-facts.md#tpu-api-errors).
    assert operation.operation.error.code == 9
    assert re.match(
        r"^Insufficient reserved capacity\. Contact customer support to increase your reservation\. "
        r"\[EID: 0x[0-9a-f]{16}\]$",
        operation.operation.error.message,
    )
    # No reservation at all for v5p in the zone: the same error.
    operation = client.create_node(
        parent=PARENT, node_id="r3", node=node("v5p-8", scheduling_config=reserved)
    )
    with pytest.raises(exceptions.GoogleAPICallError):
        operation.result(polling=FAST_POLLING)
    assert operation.operation.error.message.startswith("Insufficient reserved capacity")


def _quota_world_server(start_server: Callable[..., SimServer]) -> SimServer:
    return start_server(
        make_world(
            zones={"us-central1-a": {"v5e": {"on_demand": 256, "preemptible": 256}}},
            quotas={
                "generations": {
                    "v5e": {
                        "on_demand": {"zone": 64, "region": 128},
                        "preemptible": {"zone": 256, "region": 256},
                    },
                },
                "overrides": [
                    {"generation": "v5e", "capacity": "preemptible", "location": "us-central1", "limit": 16}
                ],
            },
        )
    )


def test_quota_rejection_is_429_with_quota_failure(start_server: Callable[..., SimServer]) -> None:
    client = tpu_client(_quota_world_server(start_server).url)
    # Multi-host shapes: single-host v5e (1, 4, 8 chips) draws on the serving family instead.
    create_ready(client, "spot-16a", spot_node("v5litepod-16"))
    with pytest.raises(exceptions.TooManyRequests) as info:
        client.create_node(parent=PARENT, node_id="spot-16", node=spot_node("v5litepod-16"))
    exc = info.value
    assert exc.code == 429
    # HTTP 429 maps to TooManyRequests, not ResourceExhausted (that one is the operation's code 8).
    assert not isinstance(exc, exceptions.ResourceExhausted)
    assert exc.message.endswith(
        "Quota limit 'TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI' has been exceeded. "
        "Limit: 16 in region us-central1."
    )
    assert exc.reason is None  # no ErrorInfo: distinguishable from the request-rate 429
    (detail,) = exc.details
    assert detail["@type"] == "type.googleapis.com/google.rpc.QuotaFailure"
    (violation,) = detail["violations"]
    assert violation["quotaId"] == "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI"
    assert violation["quotaValue"] == "16"
    assert violation["quotaDimensions"] == {"region": "us-central1"}
    assert violation["subject"] == f"project:{PROJECT}"
    assert "has been exceeded" in violation["description"]
    # Rejected synchronously, before capacity: nothing was created.
    assert [n.name.rsplit("/", 1)[-1] for n in client.list_nodes(parent=PARENT)] == ["spot-16a"]


def test_zone_and_region_quota_both_apply(start_server: Callable[..., SimServer]) -> None:
    client = tpu_client(_quota_world_server(start_server).url)
    create_ready(client, "od-64", node("v5litepod-64"))  # on-demand zone limit 64 reached
    with pytest.raises(exceptions.TooManyRequests) as info:
        client.create_node(parent=PARENT, node_id="od-16", node=node("v5litepod-16"))
    assert "TPUV5sLitepodPerProjectPerZoneForTPUAPI" in info.value.message
    assert "in zone us-central1-a" in info.value.message
    # Another zone of the same region has its own zone quota but shares the region's (128).
    other = f"projects/{PROJECT}/locations/us-central1-b"
    with pytest.raises(exceptions.BadRequest):  # v5e is not offered in us-central1-b in this world
        client.create_node(parent=other, node_id="x", node=node("v5litepod-1"))


def test_quota_counts_creating_nodes(start_server: Callable[..., SimServer]) -> None:
    client = tpu_client(_quota_world_server(start_server).url)
    client.create_node(parent=PARENT, node_id="a", node=node("v5litepod-32"))  # still CREATING
    client.create_node(parent=PARENT, node_id="b", node=node("v5litepod-32"))
    with pytest.raises(exceptions.TooManyRequests):
        client.create_node(parent=PARENT, node_id="c", node=node("v5litepod-16"))


def test_rate_limit_429_is_distinguishable(
    server: SimServer, client: tpu_v2.TpuClient, admin: SimAdminClient
) -> None:
    admin.set_faults(transient_error_rate=1.0)
    seen: set[str] = set()
    for _ in range(30):
        try:
            client.get_node(name=f"{PARENT}/nodes/none")
        except exceptions.TooManyRequests as exc:
            assert exc.reason == "RATE_LIMIT_EXCEEDED"
            assert "tpu.googleapis.com/qps/create" in exc.message
            assert not any(d.get("@type", "").endswith("QuotaFailure") for d in exc.details)
            seen.add("429")
        except exceptions.InternalServerError:
            seen.add("500")
        except exceptions.ServiceUnavailable:
            seen.add("503")
    assert seen == {"429", "500", "503"}
