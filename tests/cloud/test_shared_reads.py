"""Node reads shared through a zone's listing, on the in-process simulator: many readers, one listing;
a state at most max_age old; a slice the listing lacks asked for by itself; a mutation through the
wrapper drops the listing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import NodeRequest
from tpuctl.cloud.shared_reads import SharedNodeReads
from tpuctl.errors import NotFoundError
from tpuctl.testing.cloud import InProcessSim

ZONE = "us-central1-a"


def _request(name: str) -> NodeRequest:
    return NodeRequest(
        name=name, zone=ZONE, accelerator_type="v5litepod-8", runtime_version="v2-alpha-tpuv5-lite",
        capacity=CapacityType.SPOT,
    )  # fmt: skip


def test_many_readers_of_a_zone_share_one_listing_at_most_max_age_old(tmp_path: Path) -> None:
    with InProcessSim(tmp_path) as sim:
        cloud = sim.cloud()
        for name in ("a", "b", "c"):
            cloud.create_node(_request(name))
        shared = SharedNodeReads(cloud, max_age_s=1.0, clock=sim.clock)
        seen: list[str] = []

        def read() -> None:
            for name in ("a", "b", "c"):
                seen.append(shared.get_node(ZONE, name).state)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == ["READY"] * 24 and shared.listings_asked == 1

        sim.engine.preempt(ZONE, "b", notice=False)
        assert shared.get_node(ZONE, "b").state == "READY"  # the listing is not a second old yet
        sim.clock.advance(1.0)
        assert shared.get_node(ZONE, "b").state == "PREEMPTED"  # ... and now it is
        assert shared.listings_asked == 2


def test_a_slice_the_listing_lacks_is_asked_for_and_a_mutation_drops_the_listing(tmp_path: Path) -> None:
    with InProcessSim(tmp_path) as sim:
        cloud = sim.cloud()
        cloud.create_node(_request("a"))
        shared = SharedNodeReads(cloud, max_age_s=60.0, clock=sim.clock)
        assert shared.get_node(ZONE, "a").state == "READY"
        cloud.create_node(_request("late"))  # made after the listing, not through the wrapper
        assert shared.get_node(ZONE, "late").name == "late"  # asked for by itself
        with pytest.raises(NotFoundError):
            shared.get_node(ZONE, "never")  # only the API's own answer says a slice is not there
        shared.delete_node(ZONE, "a")
        with pytest.raises(NotFoundError):
            shared.get_node(ZONE, "a")  # not the listing of a minute ago


def test_a_max_age_of_zero_is_refused(tmp_path: Path) -> None:
    with InProcessSim(tmp_path) as sim, pytest.raises(ValueError, match="max_age_s must be > 0"):
        SharedNodeReads(sim.cloud(), max_age_s=0.0)
