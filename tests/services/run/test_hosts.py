"""Each host's expected SSH host key, read from the slice's guest attributes before tpuctl connects: when a
host published none, the error says why that happens and what to do (Compute Engine publishes nothing
unless guest attributes are enabled)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest

from tpuctl.catalog import CapacityType, Surface
from tpuctl.cloud.base import NetworkEndpoint, Node
from tpuctl.errors import RunFailedError
from tpuctl.services.run.hosts import expected_host_keys

if TYPE_CHECKING:
    from tpuctl.services.session import Session

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOnehost"


def _session(published: list[tuple[str, ...]]) -> Session:
    cloud = SimpleNamespace(host_keys=lambda zone, name: published)
    return cast("Session", SimpleNamespace(cloud=cloud))


def _node(surface: Surface, metadata: dict[str, str]) -> Node:
    return Node(
        name="s1",
        zone="us-central1-c",
        accelerator_type="tpu7x-16",
        state="READY",
        capacity=CapacityType.SPOT,
        metadata=metadata,
        network_endpoints=(NetworkEndpoint("10.0.0.2", 22), NetworkEndpoint("10.0.0.3", 22)),
        surface=surface,
    )


def test_every_hosts_published_keys_are_returned_in_worker_order() -> None:
    published: list[tuple[str, ...]] = [(KEY,), (KEY.replace("one", "two"),)]
    node = _node(Surface.COMPUTE, {"enable-guest-attributes": "TRUE"})
    assert expected_host_keys(_session(published), node, deadline_s=0) == published


def test_a_compute_slice_without_guest_attributes_is_named_as_the_cause_with_the_fix() -> None:
    node = _node(Surface.COMPUTE, {"ssh-keys": "tpuctl:" + KEY})  # made elsewhere, without the key
    with pytest.raises(RunFailedError) as raised:
        expected_host_keys(_session([(KEY,), ()]), node, deadline_s=0)
    error = raised.value
    assert "workers without keys: 1" in error.message
    assert "guest attributes" in error.message and "enable-guest-attributes" in error.message
    assert error.fix is not None
    assert "enable-guest-attributes=TRUE" in error.fix and "tpuctl pod create" in error.fix


def test_a_slice_with_guest_attributes_on_that_published_nothing_points_at_its_health() -> None:
    node = _node(Surface.COMPUTE, {"enable-guest-attributes": "TRUE"})
    with pytest.raises(RunFailedError) as raised:
        expected_host_keys(_session([(), ()]), node, deadline_s=0)
    assert "workers without keys: 0, 1" in raised.value.message
    assert "enable-guest-attributes" not in raised.value.message  # not the cause here
    assert raised.value.fix is not None and "tpuctl pod describe" in raised.value.fix
