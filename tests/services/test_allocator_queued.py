"""Queued resources: --queued with failover when one FAILS at --valid-for, --strategy race, and --slices N
(multislice through one queued resource). Against the simulator through the real client: in this process
on a fake clock, but for the races, whose placer runs on a thread while the test steers a served
simulator in real time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from allocator_helpers import InProcessEnv, SimEnv

from tpuctl.cloud.base import QueuedResource
from tpuctl.services.attempts import Placement
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import AttemptOutcome, EventKind, PodState
from tpuctl.testing.cli import CliResult
from tpuctl.testing.clock import wait_for

Cli = Callable[..., CliResult]


def test_race_keeps_the_first_active_and_deletes_the_others(sim: Callable[..., SimEnv]) -> None:
    # us-central1-a is the cheapest but frees up last; us-west4-a frees up first; us-east5-b never does.
    env = sim(durations={"queued_provision_s": 100})  # 0.1 s at speed 1000
    zones = ["us-central1-a", "us-west4-a", "us-east5-b"]
    for zone in zones:
        env.admin.stockout(zone)
    allocator = env.allocator()
    request = env.request("v5e-8", zones=zones, spot=True, strategy="race", race_k="3", name="racer")
    plan = allocator.plan(request)
    assert [c.zone for c in plan.racing] == zones
    assert [r.method for r in plan.requests] == ["POST"] * 3
    assert all("/queuedResources?" in r.url and "requestId=" in r.url for r in plan.requests)

    result: dict[str, Placement] = {}
    worker = threading.Thread(target=lambda: result.setdefault("p", allocator.place(request, plan=plan)))
    worker.start()
    status = env.admin.status
    wait_for(
        lambda: len([q for q in status()["queued_resources"] if q["state"] == "WAITING_FOR_RESOURCES"]) == 3
    )
    env.admin.stockout("us-west4-a", clear=True)
    # The placer sees us-west4-a ACTIVE and cancels the rest (none waits any more) before this.
    wait_for(
        lambda: (
            not [
                q
                for q in status()["queued_resources"]
                if q["zone"] != "us-west4-a" and q["state"] == "WAITING_FOR_RESOURCES"
            ]
        )
    )
    env.admin.stockout("us-central1-a", clear=True)
    worker.join(timeout=30)
    assert not worker.is_alive()

    placement = result["p"]
    assert placement.candidate.zone == "us-west4-a"
    assert placement.queued_resource == "racer"
    assert [(n.name, n.zone, n.state) for n in placement.nodes] == [("racer", "us-west4-a", "READY")]
    # The other queued resources are gone, and so is every slice but the winner.
    qrs = env.admin.status()["queued_resources"]
    assert [(q["zone"], q["name"]) for q in qrs] == [("us-west4-a", "racer")]
    nodes = env.session().cloud.list_nodes(None)
    assert [(n.name, n.zone) for n in nodes] == [("racer", "us-west4-a")]
    # The ledger shows the race: the winner created, the others cancelled with what they cost.
    with Ledger(env.state_dir) as ledger:
        attempts = {a.zone: a for a in ledger.attempts(request.request_id)}
        assert {z: a.outcome for z, a in attempts.items()} == {
            "us-west4-a": AttemptOutcome.CREATED,
            "us-central1-a": AttemptOutcome.CANCELLED,
            "us-east5-b": AttemptOutcome.CANCELLED,
        }
        for zone in ("us-central1-a", "us-east5-b"):
            detail = attempts[zone].detail or {}
            assert detail["cost_usd"] == 0.0  # they only waited: nothing to pay
            assert detail["state_when_cancelled"] == "WAITING_FOR_RESOURCES"
            assert detail["deleted"] is True
            assert attempts[zone].message == "lost the race: WAITING_FOR_RESOURCES when cancelled"
        pods = {p.zone: p for p in ledger.list_pods()}
        assert pods["us-west4-a"].state == PodState.READY
        assert pods["us-central1-a"].state == PodState.DELETED
        assert pods["us-east5-b"].state == PodState.DELETED


def test_queued_fails_over_when_valid_for_runs_out(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim()
    env.admin.stockout("us-central1-a")
    result = cli(
        "pod", "create", "v5e-4", "--spot", "--queued", "--valid-for", "30s", "--name", "q",
        "--zone", "us-central1-a", "--zone", "us-west4-a", "-o", "json", env=env,
    )  # fmt: skip
    assert result.code == 0, result.stderr
    placement = result.json["placement"]
    assert placement["zone"] == "us-west4-a"
    assert placement["queued_resource"] == "q"
    first, second = placement["attempts"]
    assert (first["zone"], first["outcome"]) == ("us-central1-a", "stockout")
    assert "validUntil" in first["message"]
    assert (second["zone"], second["outcome"]) == ("us-west4-a", "created")
    # The failed queued resource was deleted (it would hold quota); only the kept one remains.
    assert [(q["zone"], q["name"], q["state"]) for q in env.admin.status()["queued_resources"]] == [
        ("us-west4-a", "q", "ACTIVE")
    ]
    plan = cli("pod", "create", "v5e-4", "--spot", "--queued", "--valid-for", "2h", "--zone", "us-west4-a",
               "--dry-run", "-o", "json", env=env).json["plan"]  # fmt: skip
    [request] = plan["requests"]
    assert request["body"]["queueingPolicy"] == {"validUntilDuration": "7200s"}
    assert "spot" in request["body"]


def test_queued_failover_when_the_placer_looks_only_after_valid_until(
    in_process_sim: Callable[..., InProcessEnv], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded machine the placer's first look at a queued resource can come after its validUntil
    (--valid-for 30s is 30 ms at speed 1000). One created where there is capacity started provisioning when
    it was created, so it must not fail then: the failover above flaked on this. In process, nothing looks
    at it between the create and the placer's first poll, and time moves only when told: this is exact."""
    env = in_process_sim()
    clock = env.clock
    env.admin.stockout("us-central1-a")
    allocator = env.allocator()
    cloud = allocator.context.cloud
    create = cloud.create_queued_resource

    def create_then_stall(*args: Any, **kwargs: Any) -> QueuedResource:
        created: QueuedResource = create(*args, **kwargs)
        clock.advance(0.05)  # 50 simulated seconds: past validUntil before the placer looks
        return created

    monkeypatch.setattr(cloud, "create_queued_resource", create_then_stall)
    zones = ["us-central1-a", "us-west4-a"]
    request = env.request("v5e-4", zones=zones, spot=True, queued=True, valid_for="30s", name="q")
    placement = allocator.place(request)
    assert [(a.zone, a.outcome) for a in placement.attempts] == [
        ("us-central1-a", AttemptOutcome.STOCKOUT),
        ("us-west4-a", AttemptOutcome.CREATED),
    ]
    assert "validUntil" in placement.attempts[0].message
    assert [(n.name, n.zone, n.state) for n in placement.nodes] == [("q", "us-west4-a", "READY")]
    assert [(q["zone"], q["name"], q["state"]) for q in env.admin.status()["queued_resources"]] == [
        ("us-west4-a", "q", "ACTIVE")
    ]


def test_slices_2_makes_two_slices_through_one_queued_resource(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim(quotas={"default": {"on_demand": {"zone": 16, "region": 512}}})
    dry = cli("pod", "create", "v5e-8", "--slices", "2", "--zone", "us-east5-b", "--name", "ms",
              "--dry-run", "-o", "json", env=env)  # fmt: skip
    assert dry.code == 0, dry.stderr
    plan = dry.json["plan"]
    # Quota and price for both slices: 2 x 8 chips at 1.20 USD/chip-h.
    assert plan["estimated_price_per_hour"] == pytest.approx(19.2)
    assert {q["needed"] for q in plan["chosen"]["quota"]} == {16}
    [request] = plan["requests"]
    assert "/queuedResources?" in request["url"] and "queuedResourceId=ms" in request["url"]
    [spec] = request["body"]["tpu"]["nodeSpec"]
    assert spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "ms"}
    assert "guaranteed" in request["body"]

    three = cli("pod", "create", "v5e-8", "--slices", "3", "--zone", "us-east5-b", "--dry-run", "-o", "json",
                env=env)  # fmt: skip
    assert three.code == 4  # 24 chips > the zone quota of 16

    result = cli("pod", "create", "v5e-8", "--slices", "2", "--zone", "us-east5-b", "--name", "ms",
                 "-o", "json", env=env)  # fmt: skip
    assert result.code == 0, result.stderr
    data = result.json
    assert [(p["name"], p["slice_index"], p["state"]) for p in data["pods"]] == [
        ("ms-0", 0, "READY"),
        ("ms-1", 1, "READY"),
    ]
    assert data["placement"]["queued_resource"] == "ms"
    assert [(q["name"], q["state"]) for q in env.admin.status()["queued_resources"]] == [("ms", "ACTIVE")]
    with Ledger(env.state_dir) as ledger:
        pods = sorted(ledger.list_pods(), key=lambda p: p.name)
        assert [(p.name, p.slice_index, p.queued_resource, p.state) for p in pods] == [
            ("ms-0", 0, "ms", PodState.READY),
            ("ms-1", 1, "ms", PodState.READY),
        ]
    table = cli("pod", "create", "v5e-8", "--slices", "2", "--zone", "us-west4-a", "--name", "mt", env=env)
    assert table.code == 0, table.stderr
    # Piped, the table is plain text: SLICE and NAME are the first two words of a slice's line.
    rows = [line.split()[:2] for line in table.stdout.splitlines() if "mt-" in line]
    assert rows == [["0", "mt-0"], ["1", "mt-1"]]


def test_race_records_ready_then_deleted_for_a_loser_seen_active(sim: Callable[..., SimEnv]) -> None:
    """A loser that went ACTIVE in the same poll as the winner bills until deleted: the ledger has its READY
    and DELETED events and the attempt its cost."""
    env = sim(durations={"queued_provision_s": 100})
    zones = ["us-central1-a", "us-west4-a"]
    for zone in zones:
        env.admin.stockout(zone)
    # Poll slowly so both are ACTIVE by the time the placer looks again.
    allocator = env.allocator(poll_interval_s=0.5, poll_max_interval_s=0.5)
    request = env.request("v5e-4", zones=zones, spot=True, strategy="race", race_k="2", name="pair")
    result: dict[str, Placement] = {}
    worker = threading.Thread(target=lambda: result.setdefault("p", allocator.place(request)))
    worker.start()
    wait_for(lambda: len(env.admin.status()["queued_resources"]) == 2)
    for zone in zones:
        env.admin.stockout(zone, clear=True)
    worker.join(timeout=30)
    placement = result["p"]
    # Both ACTIVE at once: the cheaper (rank order) is kept.
    assert placement.candidate.zone == "us-central1-a"
    loser = next(a for a in placement.attempts if a.zone == "us-west4-a")
    assert loser.outcome == AttemptOutcome.CANCELLED
    assert loser.detail["state_when_cancelled"] == "ACTIVE"
    assert loser.cost_usd is not None and loser.cost_usd > 0
    # 4 chips x 0.48 USD/chip-h for the time it was ACTIVE (active_s is rounded to ms)
    assert loser.cost_usd == pytest.approx(1.92 * loser.detail["active_s"] / 3600, rel=0.05)
    with Ledger(env.state_dir) as ledger:
        kinds = [e.kind for e in ledger.pod_events("pair", zone="us-west4-a")]
        assert kinds == [
            EventKind.REQUESTED,
            EventKind.QUEUED,
            EventKind.CREATED,
            EventKind.READY,
            EventKind.DELETED,
            EventKind.ATTEMPT,  # the cancelled attempt, with its cost
        ]
    assert [q["zone"] for q in env.admin.status()["queued_resources"]] == ["us-central1-a"]
