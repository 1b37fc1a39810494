"""State: persistence across server restarts (time computed lazily from timestamps), the world persisted
in the state dir, file permissions, and two servers on one state dir at once (no lost update, no
duplicate)."""

from __future__ import annotations

import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from google.api_core import exceptions
from google.cloud import tpu_v2
from sim_helpers import PARENT, ZONE, create_ready, make_world, node, spot_node, tpu_client

from tpuctl.sim import SimAdminClient, SimServer, default_world
from tpuctl.testing.clock import FakeClock


def test_state_persists_across_restarts_and_time_is_lazy(
    start_server: Callable[..., SimServer], state_dir: Path
) -> None:
    clock = FakeClock(time.time())
    first = start_server(make_world(), clock=clock, ticker_interval_s=0)
    client = tpu_client(first.url)
    client.create_node(parent=PARENT, node_id="kept", node=node("v5litepod-16"))
    assert client.get_node(name=f"{PARENT}/nodes/kept").state == tpu_v2.Node.State.CREATING
    first.stop()

    # No server runs while the create's 120 simulated seconds (0.12 s) pass.
    clock.advance(0.2)
    second = start_server(None, clock=clock, ticker_interval_s=0)  # None: the persisted world
    assert second.world.speed == 1000  # the test world, not the default one
    client = tpu_client(second.url)
    got = client.get_node(name=f"{PARENT}/nodes/kept")
    assert got.state == tpu_v2.Node.State.READY
    assert len(got.network_endpoints) == 4
    ops = client.list_operations(request={"name": PARENT}).operations
    assert [op.done for op in ops] == [True]


def test_an_explicit_world_replaces_the_persisted_one(start_server: Callable[..., SimServer]) -> None:
    first = start_server(make_world())
    first.stop()
    second = start_server(make_world(speed=5))
    assert second.world.speed == 5
    second.stop()
    third = start_server()
    assert third.world.speed == 5


def test_first_start_without_a_world_uses_the_default(start_server: Callable[..., SimServer]) -> None:
    server = start_server()
    assert server.world == default_world()


def test_state_files_are_private(server: SimServer) -> None:
    sim_dir = server.state_dir / "sim"
    assert stat.S_IMODE(sim_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((sim_dir / "sim.db").stat().st_mode) == 0o600


def test_reset_forgets_everything(server: SimServer, admin: SimAdminClient) -> None:
    client = tpu_client(server.url)
    create_ready(client, "x", node())
    admin.stockout(ZONE)
    admin.set_faults(transient_error_rate=0.5)
    summary = admin.reset()
    assert summary["world"]["speed"] == 1000
    status = admin.status()
    assert status["nodes"] == [] and status["queued_resources"] == []
    assert not any(z["stockout"] for z in status["zones"])
    assert status["faults"]["transient_error_rate"] == 0.0
    # A reset with a new world puts it in force.
    data = make_world(speed=42).model_dump(mode="json")
    assert admin.reset(world=data)["world"]["speed"] == 42
    assert admin.world()["speed"] == 42
    assert server.world.speed == 42
    bad = dict(data, speed=-1)
    try:
        admin.reset(world=bad)
    except Exception as exc:
        assert "speed" in str(exc)
    else:
        raise AssertionError("a bad world was accepted")


def test_two_servers_on_one_state_dir_no_lost_update(start_server: Callable[..., SimServer]) -> None:
    # Quota of 32 on-demand v5e chips in the zone: at most four 8-chip nodes, whoever creates them.
    world = make_world(quotas={"generations": {"v5e": {"on_demand": {"zone": 32, "region": 1024}}}})
    servers = [start_server(world), start_server(world)]
    clients = [tpu_client(s.url) for s in servers]
    outcomes: dict[str, list[str]] = {"ok": [], "quota": [], "conflict": []}
    lock = threading.Lock()

    def create(client: tpu_v2.TpuClient, node_id: str) -> None:
        try:
            client.create_node(parent=PARENT, node_id=node_id, node=node("v5litepod-8"))
            kind = "ok"
        except exceptions.TooManyRequests:
            kind = "quota"
        except exceptions.Conflict:
            kind = "conflict"
        with lock:
            outcomes[kind].append(node_id)

    threads = [
        threading.Thread(target=create, args=(clients[i % 2], f"n{i // 2}"))  # each name from both servers
        for i in range(16)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    names = [n.name.rsplit("/", 1)[-1] for n in clients[0].list_nodes(parent=PARENT)]
    assert len(names) == len(set(names)) == 4, (names, outcomes)
    assert len(outcomes["ok"]) == 4
    assert len(outcomes["ok"]) + len(outcomes["quota"]) + len(outcomes["conflict"]) == 16
    # Both servers see the same nodes.
    assert sorted(n.name for n in clients[1].list_nodes(parent=PARENT)) == sorted(
        n.name for n in clients[0].list_nodes(parent=PARENT)
    )


def test_two_servers_distinct_names_all_created(start_server: Callable[..., SimServer]) -> None:
    servers = [start_server(make_world()), start_server(make_world())]
    clients = [tpu_client(s.url) for s in servers]
    errors: list[BaseException] = []

    def create_many(client: tpu_v2.TpuClient, prefix: str) -> None:
        try:
            for i in range(10):
                client.create_node(parent=PARENT, node_id=f"{prefix}-{i}", node=spot_node("v5litepod-1"))
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=create_many, args=(c, p)) for c, p in zip(clients, ("a", "b"), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    names = sorted(n.name.rsplit("/", 1)[-1] for n in clients[1].list_nodes(parent=PARENT))
    assert names == sorted([f"a-{i}" for i in range(10)] + [f"b-{i}" for i in range(10)])
