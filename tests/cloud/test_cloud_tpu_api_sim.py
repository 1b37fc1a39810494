"""TpuApiCloud against the real simulator (tpuctl.sim.server.SimServer), through the real tpu_v2 client.

Every TpuCloud method, a stockout, a quota rejection, queued resources (single, multislice, one that waits
then goes ACTIVE, one that FAILS at valid-until), and the fault acceptance test: under injected faults, 50
create/delete cycles all succeed with no duplicate and no orphaned slice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import LABEL_REQUEST, NodeRequest, QueuedResource, QueuedResourceRequest
from tpuctl.cloud.idempotent import create_node_idempotent, delete_node_idempotent
from tpuctl.cloud.retry import poll_until
from tpuctl.cloud.tpu_api import TpuApiCloud
from tpuctl.errors import (
    AlreadyExistsError,
    CloudError,
    NotFoundError,
    QuotaExceededError,
    StockoutError,
)
from tpuctl.sim.admin import SimAdminClient
from tpuctl.sim.server import SimServer
from tpuctl.sim.world import default_world, world_from_data

ZONE = "us-east5-b"
V5E_RT = "v2-alpha-tpuv5-lite"


def fast_world(**over: Any) -> Any:
    """The default world, with time short enough for tests (speed 60: 6 simulated s = 0.1 real s)."""
    data = default_world().model_dump(mode="json")
    data["latency"] = {"base_ms": 0, "jitter_ms": 0, "spike_probability": 0, "spike_ms": 0}
    data["durations"] = {
        "node_create_s": 6,
        "node_delete_s": 3,
        "node_stop_s": 3,
        "node_start_s": 3,
        "queued_provision_s": 6,
        "stockout_s": 1,
        "preemption_grace_s": 1,
    }
    for key, value in over.items():
        data[key] = value
    return world_from_data(data, "test world")


@pytest.fixture(autouse=True)
def _int64_node_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work around a simulator defect while it lasts (reported; this disables itself once fixed).

    Node.id is an int64, but ``tpuctl.sim.engine._node_uid`` draws from [10**18, 10**19), so about 8% of
    ids exceed 2**63-1 and the real client cannot parse the node ("Value out of range"). tpuctl.cloud
    turns that into a CloudError; here we keep the ids in range so these tests stay deterministic.
    """
    from tpuctl.sim import engine

    original = engine._node_uid
    if all(int(original(0, "p", "z", f"n{i}", float(i))) < 2**63 for i in range(2000)):
        return
    monkeypatch.setattr(engine, "_node_uid", lambda *args: str(10**18 + int(original(*args)) % (8 * 10**18)))


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimServer]:
    server = SimServer(tmp_path / "state", fast_world())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cloud(sim: SimServer) -> Iterator[TpuApiCloud]:
    c = TpuApiCloud.for_simulator("tpuctl-sim", sim.url)
    yield c
    c.close()


@pytest.fixture
def admin(sim: SimServer) -> Iterator[SimAdminClient]:
    a = SimAdminClient(sim.url)
    yield a
    a.close()


def node_req(
    name: str,
    accel: str = "v5litepod-8",
    capacity: CapacityType = CapacityType.SPOT,
    zone: str = ZONE,
    **labels: str,
) -> NodeRequest:
    return NodeRequest(
        name=name,
        zone=zone,
        accelerator_type=accel,
        runtime_version=V5E_RT,
        capacity=capacity,
        labels={"managed-by": "tpuctl", **labels},
    )


def wait_qr(
    cloud: TpuApiCloud, zone: str, qr_id: str, states: set[str], timeout_s: float = 15
) -> QueuedResource:
    return poll_until(
        lambda: cloud.get_queued_resource(zone, qr_id),
        lambda q: q.state in states,
        timeout_s=timeout_s,
        initial_interval_s=0.02,
        max_interval_s=0.2,
    )


class Progress:
    def __init__(self) -> None:
        self.updates: list[str] = []

    def update(self, description: str, *, elapsed_s: float) -> None:
        self.updates.append(description)


def test_node_lifecycle_create_get_list_stop_start_delete(cloud: TpuApiCloud) -> None:
    progress = Progress()
    node = cloud.create_node(node_req("life"), request_id="r-life", progress=progress)
    assert (node.name, node.zone, node.state, node.capacity) == ("life", ZONE, "READY", CapacityType.SPOT)
    assert node.accelerator_type == "v5litepod-8" and node.topology == "2x4"
    assert len(node.network_endpoints) == 1 and node.network_endpoints[0].ip_address
    assert node.labels[LABEL_REQUEST] == "r-life" and node.is_tpuctl_managed
    assert node.create_time is not None
    assert progress.updates[0].startswith("create node life in us-east5-b") and len(progress.updates) >= 2

    assert cloud.get_node(ZONE, "life") == node
    assert [n.name for n in cloud.list_nodes(ZONE)] == ["life"]
    assert "life" in [n.name for n in cloud.list_nodes()]  # locations/-
    assert cloud.list_nodes("us-west4-a") == []

    assert cloud.stop_node(ZONE, "life").state == "STOPPED"
    assert cloud.start_node(ZONE, "life").state == "READY"

    with pytest.raises(AlreadyExistsError):
        cloud.create_node(node_req("life"))
    cloud.delete_node(ZONE, "life")
    with pytest.raises(NotFoundError):
        cloud.get_node(ZONE, "life")
    with pytest.raises(NotFoundError):
        cloud.delete_node(ZONE, "life")


def test_v5e_64_has_topology_8x8_and_16_endpoints(cloud: TpuApiCloud) -> None:
    node = cloud.create_node(node_req("big", "v5litepod-64", CapacityType.ON_DEMAND))
    assert (node.topology, len(node.network_endpoints), node.capacity) == ("8x8", 16, CapacityType.ON_DEMAND)


def test_create_without_wait_returns_creating(cloud: TpuApiCloud) -> None:
    node = cloud.create_node(node_req("later"), wait=False)
    assert node.state == "CREATING"


def test_stockout_raises_stockout_error_and_leaves_nothing(cloud: TpuApiCloud, admin: SimAdminClient) -> None:
    admin.stockout(ZONE)
    with pytest.raises(StockoutError) as err:
        cloud.create_node(node_req("nocap"))
    assert err.value.zone == ZONE and "no more capacity" in err.value.message
    assert err.value.exit_code == 5
    assert cloud.list_nodes(ZONE) == []


def test_quota_rejection_names_the_quota(tmp_path: Path) -> None:
    world = fast_world(
        quotas={
            "default": {},
            "generations": {
                "v5e": {"on_demand": {"zone": 8, "region": 8}, "preemptible": {"zone": 16, "region": 512}}
            },
            "overrides": [],
        }
    )
    with SimServer(tmp_path / "q", world) as server:
        server.start()
        c = TpuApiCloud.for_simulator("tpuctl-sim", server.url)
        with pytest.raises(QuotaExceededError) as err:
            c.create_node(node_req("toobig", "v5litepod-16", CapacityType.ON_DEMAND))
        e = err.value
        assert e.quota_id is not None and "ForTPUAPI" in e.quota_id
        assert e.limit == 8.0 and e.location in ("us-east5", ZONE) and e.exit_code == 4
        assert c.list_nodes() == []
        limits = c.quota_limits()
        assert any(q.quota_id == e.quota_id and q.limit == 8 for q in limits)
        c.close()


def test_catalog_reads(cloud: TpuApiCloud) -> None:
    assert "v5litepod-8" in cloud.list_accelerator_types(ZONE)
    assert V5E_RT in cloud.list_runtime_versions(ZONE)
    zones = cloud.list_zones()
    assert ZONE in zones and "us-central2-b" in zones
    limits = cloud.quota_limits()
    assert limits and all(q.zone or q.region for q in limits)
    assert any(q.zone == ZONE for q in limits) and any(q.region == "us-east5" for q in limits)


def test_queued_resource_single_node_becomes_active(cloud: TpuApiCloud) -> None:
    req = QueuedResourceRequest(
        id="qr-one", zone=ZONE, node=node_req("qr-node"), tier="spot", valid_for_seconds=3600
    )
    qr = cloud.create_queued_resource(req, request_id=str(uuid.uuid4()))
    assert qr.id == "qr-one" and qr.tier == "spot" and qr.node_ids == ("qr-node",)
    active = wait_qr(cloud, ZONE, "qr-one", {"ACTIVE"})
    assert active.accelerator_type == "v5litepod-8"
    node = cloud.get_node(ZONE, "qr-node")
    assert node.queued_resource and node.queued_resource.endswith("/queuedResources/qr-one")
    assert [q.id for q in cloud.list_queued_resources(ZONE)] == ["qr-one"]
    assert "qr-one" in [q.id for q in cloud.list_queued_resources()]
    cloud.delete_queued_resource(ZONE, "qr-one", force=True, request_id=str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        cloud.get_queued_resource(ZONE, "qr-one")
    with pytest.raises(NotFoundError):
        cloud.get_node(ZONE, "qr-node")


def test_queued_resource_multislice(cloud: TpuApiCloud) -> None:
    req = QueuedResourceRequest(
        id="qr-ms", zone=ZONE, node=node_req("unused"), node_count=2, node_id_prefix="ms", tier="guaranteed"
    )
    qr = cloud.create_queued_resource(req)
    assert qr.node_ids == ("ms-0", "ms-1") and qr.node_count == 2 and qr.tier == "guaranteed"
    wait_qr(cloud, ZONE, "qr-ms", {"ACTIVE"})
    nodes = {n.name: n for n in cloud.list_nodes(ZONE)}
    assert set(nodes) == {"ms-0", "ms-1"}
    assert all(n.multislice_node and n.state == "READY" for n in nodes.values())
    cloud.delete_queued_resource(ZONE, "qr-ms", force=True)
    assert cloud.list_nodes(ZONE) == [] and cloud.list_queued_resources(ZONE) == []


def test_queued_resource_waits_then_active_and_one_that_fails_at_valid_until(
    cloud: TpuApiCloud, admin: SimAdminClient
) -> None:
    admin.stockout(ZONE)
    waiting = cloud.create_queued_resource(
        QueuedResourceRequest(id="qr-wait", zone=ZONE, node=node_req("w1"))
    )
    doomed = cloud.create_queued_resource(
        QueuedResourceRequest(id="qr-doomed", zone=ZONE, node=node_req("w2"), valid_for_seconds=3)
    )
    assert {waiting.state, doomed.state} <= {"ACCEPTED", "WAITING_FOR_RESOURCES", "CREATING"}
    failed = wait_qr(cloud, ZONE, "qr-doomed", {"FAILED"})
    assert failed.error_message and failed.error_code
    assert cloud.get_queued_resource(ZONE, "qr-wait").state in ("ACCEPTED", "WAITING_FOR_RESOURCES")
    admin.stockout(ZONE, clear=True)
    assert wait_qr(cloud, ZONE, "qr-wait", {"ACTIVE"}).state == "ACTIVE"
    assert cloud.reset_queued_resource(ZONE, "qr-doomed").id == "qr-doomed"
    for qr_id in ("qr-wait", "qr-doomed"):
        cloud.delete_queued_resource(ZONE, qr_id, force=True)


def test_errors_name_the_call(cloud: TpuApiCloud) -> None:
    with pytest.raises(CloudError) as err:
        cloud.create_node(node_req("bad", "v5litepod-48"))
    assert err.value.message.startswith("create node bad in us-east5-b:") and err.value.code == 3


# ---- acceptance: faults --------------------------------------------------------------------------------


@pytest.mark.parametrize(("transient", "ambiguous"), [(0.2, 0.0), (0.2, 0.1)])
def test_50_create_delete_cycles_under_faults_leave_no_duplicate_and_no_orphan(
    tmp_path: Path, transient: float, ambiguous: float
) -> None:
    world = fast_world(
        faults={"transient_error_rate": transient, "ambiguous_error_rate": ambiguous},
        durations={
            "node_create_s": 1.2,
            "node_delete_s": 0.6,
            "node_stop_s": 1,
            "node_start_s": 1,
            "queued_provision_s": 1,
            "stockout_s": 1,
            "preemption_grace_s": 1,
        },
    )
    with SimServer(tmp_path / "faults", world) as server:
        server.start()
        real = TpuApiCloud.for_simulator(
            "tpuctl-sim", server.url, poll_interval_s=0.01, poll_max_interval_s=0.05
        )
        cloud: Any = Recording(real)
        clean = TpuApiCloud.for_simulator("tpuctl-sim", server.url)  # for asserting: sees the same state
        admin = SimAdminClient(server.url)
        seen_requests: list[str] = []
        for i in range(50):
            rid = uuid.uuid4().hex[:12]
            name = f"cycle-{i}"
            node = create_node_idempotent(
                cloud, node_req(name), request_id=rid, poll_interval_s=0.01, poll_max_interval_s=0.05
            )
            assert node.state == "READY" and node.labels[LABEL_REQUEST] == rid
            # Exactly one slice for this request, and nothing else alive.
            live = _list_without_faults(admin, clean)
            assert [(n.name, n.labels.get(LABEL_REQUEST)) for n in live] == [(name, rid)]
            seen_requests.append(rid)
            delete_node_idempotent(cloud, ZONE, name, poll_interval_s=0.01, poll_max_interval_s=0.05)
        assert _list_without_faults(admin, clean) == []  # no orphan
        assert len(set(seen_requests)) == 50
        # The faults really were met at the boundary (retries of 429/503 inside are not even counted). How
        # many depends on how many polls the machine's timing made (a loaded clean-clone CI run met 2):
        # that some were, and the cycles above still left one slice each and no orphan, is the point.
        print("errors raised to the helper:", cloud.raised)
        assert cloud.raised.get("AmbiguousError", 0) >= 1, cloud.raised
        real.close()
        clean.close()
        admin.close()


class Recording:
    """A TpuCloud proxy that counts the errors its create/delete calls raised to the helper."""

    def __init__(self, inner: TpuApiCloud) -> None:
        self.inner = inner
        self.raised: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if name not in ("create_node", "delete_node"):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return target(*args, **kwargs)
            except Exception as exc:
                self.raised[type(exc).__name__] = self.raised.get(type(exc).__name__, 0) + 1
                raise

        return call


def _list_without_faults(admin: SimAdminClient, cloud: TpuApiCloud) -> list[Any]:
    """List every node with injected faults paused, so the assertion itself cannot be flaky."""
    saved = admin.faults()
    admin.set_faults(transient_error_rate=0.0, ambiguous_error_rate=0.0)
    try:
        return cloud.list_nodes()
    finally:
        admin.set_faults(
            transient_error_rate=saved["transient_error_rate"],
            ambiguous_error_rate=saved["ambiguous_error_rate"],
        )
