"""The simulated network's package mirror as the hosts see it: answered while the world gives them a
route to the package index, unanswered (the connection closed) once it gives them none, and every fetch
of a distribution file logged in the state, whether answered or not."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tpuctl.sim import SimAdminClient, default_world
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.network import API_PORT, MirrorFetch, NetworkServices, mirror_fetch_log, mirror_fetches
from tpuctl.sim.state import SimDatabase, db_path_for
from tpuctl.sim.vms.layout import services_address
from tpuctl.sim.world import World
from tpuctl.testing.clock import wait_for

WHEEL = "demo-1.0-py3-none-any.whl"


def test_hosts_without_a_route_get_no_answer_and_every_fetch_is_logged(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    (wheelhouse / WHEEL).write_bytes(b"0123456789")
    world: list[World] = [default_world()]
    storage = tmp_path / "state" / "sim-gcs"
    services = NetworkServices(
        services_address(tmp_path / "state"),
        storage_dir=storage,
        wheelhouse=wheelhouse,
        world=lambda: world[0],
    )
    services.start()
    try:
        wait_for(services.ready, 30, 0.05, what="the simulated network")
        url = services.mirror_url + WHEEL
        assert httpx.get(url).content == b"0123456789"
        assert httpx.get(url, headers={"Range": "bytes=2-3"}).content == b"23"
        assert httpx.get(services.mirror_url).status_code == 200  # pages are not fetches
        world[0] = default_world().model_copy(update={"hosts_reach_package_index": False})
        for where in (url, services.mirror_url):
            with pytest.raises(httpx.RemoteProtocolError):
                httpx.get(where)
    finally:
        services.stop()
    assert mirror_fetches(mirror_fetch_log(storage)) == [
        MirrorFetch(WHEEL, None, served=True),
        MirrorFetch(WHEEL, "bytes=2-3", served=True),
        MirrorFetch(WHEEL, None, served=False),
    ]


def test_the_network_serves_the_simulated_apis_where_its_hosts_are_told_they_are(tmp_path: Path) -> None:
    """With an engine, the network serves its APIs at the state's own address (as Google's VMs find
    googleapis.com, whichever simulator process runs), and its hosts' variables name them."""
    state = tmp_path / "state"
    db = SimDatabase(db_path_for(state))
    engine = SimEngine(db, clock=time.time)
    engine.install_world(default_world())
    services = NetworkServices(
        services_address(state),
        storage_dir=state / "sim-gcs",
        wheelhouse=tmp_path,
        world=lambda: engine.world,
        engine=engine,
    )
    services.start()
    try:
        wait_for(services.ready, 30, 0.05, what="the simulated network")
        assert services.api_url == f"http://{services_address(state)}:{API_PORT}"
        assert services.env["TPUCTL_SIM_URL"] == services.api_url
        assert services.env["TPUCTL_BACKEND"] == "sim"
        admin = SimAdminClient(services.api_url)
        try:
            assert admin.status()["project"] == engine.world.project
        finally:
            admin.close()
    finally:
        services.stop()
        db.close()
    # A network without an engine (a test's bucket and mirror) names no APIs.
    bare = NetworkServices("127.0.0.1", storage_dir=tmp_path, wheelhouse=tmp_path, world=default_world)
    assert bare.api_url is None and "TPUCTL_SIM_URL" not in bare.env and "TPUCTL_BACKEND" not in bare.env
