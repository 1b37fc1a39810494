"""Placement under injected faults: 20% transient errors (429 rate limits, 500, 503) on every TPU API and
Cloud Quotas request and 10% ambiguous failures (performed, then the connection dropped) on mutations.
50 placements: every one READY, no duplicate slice, no orphan, all asserted by listing the simulator."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from allocator_helpers import SimEnv

from tpuctl.cloud.base import LABEL_REQUEST, Node, NodeRequest
from tpuctl.errors import AmbiguousError, CloudError
from tpuctl.store.records import AttemptOutcome


class CountingCloud:
    """The real cloud, counting what ``create_node`` raised (to prove the faults were met)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.create_errors: Counter[str] = Counter()

    def create_node(self, request: NodeRequest, **kwargs: Any) -> Node:
        try:
            node: Node = self._inner.create_node(request, **kwargs)
        except CloudError as exc:
            self.create_errors[type(exc).__name__] += 1
            raise
        return node

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_fifty_placements_under_faults_no_duplicate_no_orphan(sim: Callable[..., SimEnv]) -> None:
    zones = ["us-central1-a", "us-west4-a"]
    env = sim(
        zones={z: {"v5e": {"on_demand": 512, "preemptible": 512}} for z in zones},
        quotas={
            "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
        },
        faults={"transient_error_rate": 0.2, "ambiguous_error_rate": 0.1},
        durations={"node_create_s": 20},
    )
    session = env.session()
    counting = CountingCloud(session.cloud)
    session.cloud = counting  # type: ignore[assignment]
    allocator = env.allocator(session)

    request_ids: dict[str, str] = {}
    for i in range(50):
        request = env.request("v5e-4", session=session, zones=zones, name=f"p{i:02d}")
        placement = allocator.place(request)
        assert [n.state for n in placement.nodes] == ["READY"]
        request_ids[request.name] = request.request_id

    # The faults were met on the create path itself, ambiguous ones included.
    assert counting.create_errors["AmbiguousError"] > 0, counting.create_errors
    assert issubclass(AmbiguousError, CloudError)
    env.admin.set_faults(transient_error_rate=0.0, ambiguous_error_rate=0.0)
    status = env.admin.status()
    names = [n["name"] for n in status["nodes"]]
    assert sorted(names) == sorted(request_ids)  # exactly one slice per placement: no duplicate, no orphan
    assert Counter(names).most_common(1)[0][1] == 1
    assert {n["state"] for n in status["nodes"]} == {"READY"}
    assert status["queued_resources"] == []
    # Each slice carries its own request's label, and its placement's attempts end in "created".
    listed = env.session().cloud.list_nodes(None)
    for node in listed:
        assert node.labels[LABEL_REQUEST] == request_ids[node.name]
    ledger = session.ledger
    for rid in request_ids.values():
        outcomes = [a.outcome for a in ledger.attempts(rid)]
        assert outcomes[-1] == AttemptOutcome.CREATED
        assert outcomes.count(AttemptOutcome.CREATED) == 1
    alive = {(p.zone, p.name) for p in ledger.list_pods(alive=True)}
    assert alive == {(n.zone, n.name) for n in listed}


def test_queued_placements_under_faults_no_duplicate_no_orphan(sim: Callable[..., SimEnv]) -> None:
    """The same through queued resources (the race strategy, two zones each): creates carry a requestId
    and are looked for after an ambiguous failure, so no queued resource or slice is made twice."""
    zones = ["us-central1-a", "us-west4-a"]
    env = sim(
        zones={z: {"v5e": {"on_demand": 512, "preemptible": 512}} for z in zones},
        quotas={
            "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
        },
        faults={"transient_error_rate": 0.2, "ambiguous_error_rate": 0.1},
        durations={"queued_provision_s": 20},
    )
    session = env.session()
    allocator = env.allocator(session)
    placed: dict[str, str] = {}
    for i in range(10):
        request = env.request(
            "v5e-4", session=session, zones=zones, name=f"q{i}", strategy="race", race_k="2"
        )
        placement = allocator.place(request)
        placed[request.name] = placement.candidate.zone
    env.admin.set_faults(transient_error_rate=0.0, ambiguous_error_rate=0.0)
    status = env.admin.status()
    assert sorted((n["name"], n["zone"]) for n in status["nodes"]) == sorted(placed.items())
    assert sorted((q["name"], q["zone"], q["state"]) for q in status["queued_resources"]) == sorted(
        (name, zone, "ACTIVE") for name, zone in placed.items()
    )
