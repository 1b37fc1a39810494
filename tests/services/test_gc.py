"""`tpuctl pod gc`: PREEMPTED slices, failed queued resources and this user's tpuctl-labelled slices that no
ledger entry owns are listed and deleted (with confirmation unless -y; --dry-run lists only); everything
else (live tracked slices, another user's, non-tpuctl ones) is left alone."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
from allocator_helpers import InProcessEnv

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import LABEL_LEDGER, LABEL_MANAGED_BY, LABEL_OWNER, NodeRequest, QueuedResourceRequest
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, PodState
from tpuctl.testing.cli import CliResult

Cli = Callable[..., CliResult]
RT = "v2-alpha-tpuv5-lite"


@pytest.fixture
def garbage(in_process_sim: Callable[..., InProcessEnv], monkeypatch: pytest.MonkeyPatch) -> InProcessEnv:
    """A project with one of each kind of garbage, and three slices that are not garbage."""
    monkeypatch.setenv("TPUCTL_OWNER", "alice")
    env = in_process_sim(zones={"us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}}})
    session = env.session()
    cloud = session.cloud
    allocator = env.allocator(session)
    zone = "us-central1-a"
    # Tracked and healthy: stays.
    allocator.place(env.request("v5e-4", session=session, zones=[zone], name="keep"))
    # Tracked, then preempted: holds quota, goes.
    allocator.place(env.request("v5e-4", session=session, zones=[zone], spot=True, name="dead"))
    env.admin.preempt(zone, "dead", notice=False)
    # A queued resource that FAILED at its valid-until (the zone was stocked out): goes.
    env.admin.stockout(zone)
    template = NodeRequest(name="qf", zone=zone, accelerator_type="v5litepod-4", runtime_version=RT)
    cloud.create_queued_resource(
        QueuedResourceRequest(id="qf", zone=zone, node=template, valid_for_seconds=5)
    )
    env.clock.wait_for(lambda: cloud.get_queued_resource(zone, "qf").state == "FAILED", timeout=600, step=1)
    env.admin.stockout(zone, clear=True)
    # Made by this ledger's tpuctl (its identity label), but no ledger entry owns it (that tpuctl was
    # killed): goes.
    mine = {LABEL_MANAGED_BY: "tpuctl", LABEL_OWNER: "alice"}
    ours = {**mine, LABEL_LEDGER: session.ledger.identity}
    cloud.create_node(NodeRequest("orphan", zone, "v5litepod-4", RT, labels=ours))
    # tpuctl's but bob's: stays. Not tpuctl's at all: stays.
    cloud.create_node(NodeRequest("bobs", zone, "v5litepod-4", RT, labels={**mine, LABEL_OWNER: "bob"}))
    cloud.create_node(NodeRequest("other", zone, "v5litepod-4", RT, capacity=CapacityType.ON_DEMAND))
    return env


def test_gc_dry_run_lists_only(garbage: InProcessEnv, cli: Cli) -> None:
    result = cli("pod", "gc", "--dry-run", "-o", "json", env=garbage)
    assert result.code == 0, result.stderr
    data = result.json
    assert data["dry_run"] is True and data["deleted"] == []
    assert [(i["kind"], i["name"], i["state"], i["reason"]) for i in data["gc"]] == [
        (
            "queued_resource",
            "qf",
            "FAILED",
            "failed queued resource; it holds quota until deleted: "
            + data["gc"][0]["reason"].split("deleted: ", 1)[1],
        ),
        ("slice", "dead", "PREEMPTED", "PREEMPTED slice; it holds quota until deleted"),
        ("slice", "orphan", "READY", "tpuctl slice of alice that no ledger entry owns (READY)"),
    ]
    assert "validUntil" in data["gc"][0]["reason"]
    assert [
        (r["method"], r["url"].split("?")[0].rsplit("/", 2)[-2:]) for i in data["gc"] for r in i["requests"]
    ] == [
        ("DELETE", ["queuedResources", "qf"]),
        ("DELETE", ["nodes", "dead"]),
        ("DELETE", ["nodes", "orphan"]),
    ]
    assert "force=true" in data["gc"][0]["requests"][0]["url"]
    names = sorted(n["name"] for n in garbage.admin.status()["nodes"])
    assert names == ["bobs", "dead", "keep", "orphan", "other"]


def test_gc_asks_before_deleting(garbage: InProcessEnv, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    monkeypatch.setattr("tpuctl.cli.context.stdin_is_tty", lambda: True)
    result = cli("pod", "gc", env=garbage)
    assert result.code == 1  # declined: aborted, nothing deleted (it was 130, "interrupted")
    assert "orphan" in result.stdout and "delete these 3?" in result.stdout
    assert "aborted" in result.stderr and "interrupted" not in result.stderr
    assert len(garbage.admin.status()["nodes"]) == 5
    monkeypatch.setattr("tpuctl.cli.context.stdin_is_tty", lambda: False)
    unasked = cli("pod", "gc", env=garbage)
    assert unasked.code == 2 and "pass -y" in unasked.stderr  # no terminal to ask on
    assert len(garbage.admin.status()["nodes"]) == 5


def test_gc_deletes_with_yes_and_records_it(garbage: InProcessEnv, cli: Cli) -> None:
    result = cli("pod", "gc", "-y", "-o", "json", env=garbage)
    assert result.code == 0, result.stderr
    assert sorted(result.json["deleted"]) == ["dead", "orphan", "qf"]
    status = garbage.admin.status()
    assert sorted(n["name"] for n in status["nodes"]) == ["bobs", "keep", "other"]
    assert status["queued_resources"] == []
    with Ledger(garbage.state_dir) as ledger:
        gc_events = [e for e in ledger.events(kinds=[EventKind.GC])]
        assert sorted(e.detail["name"] for e in gc_events if e.detail) == ["dead", "orphan", "qf"]
        dead = ledger.get_pod("dead", zone="us-central1-a")
        assert dead is not None and dead.state == PodState.DELETED and dead.end_reason == "preempted"
        keep = ledger.get_pod("keep", zone="us-central1-a")
        assert keep is not None and keep.state == PodState.READY
    again = cli("pod", "gc", "-y", env=garbage)
    assert again.code == 0 and "nothing to collect" in again.stdout


def test_gc_records_a_tracked_slice_the_cloud_no_longer_has(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    """A `pod delete` (or a run's supervisor) killed after its delete landed, or a slice deleted behind
    tpuctl's back, leaves a live ledger entry with no slice: gc records it gone, so after one gc the ledger
    agrees with the cloud. A dry run only says so; an entry still at REQUESTED is left alone (its create
    may be on its way from another tpuctl)."""
    env = in_process_sim(zones={"us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}}})
    session = env.session()
    allocator = env.allocator(session)
    zone = "us-central1-a"
    allocator.place(env.request("v5e-4", session=session, zones=[zone], name="keep"))
    allocator.place(env.request("v5e-4", session=session, zones=[zone], name="vanished"))
    session.cloud.delete_node(zone, "vanished", wait=True)
    session.ledger.record_event(
        EventKind.REQUESTED, pod="inflight", zone=zone, accelerator_type="v5litepod-4"
    )

    dry = cli("pod", "gc", "--dry-run", "-o", "json", env=env)
    assert dry.code == 0, dry.stderr
    assert dry.json["gc"] == [] and dry.json["deleted"] == []
    assert dry.json["gone"] == [{"name": "vanished", "zone": zone, "state": "READY", "recorded": False}]
    vanished = session.ledger.get_pod("vanished", zone=zone)
    assert vanished is not None and vanished.alive

    result = cli("pod", "gc", "-y", "-o", "json", env=env)
    assert result.code == 0, result.stderr
    assert result.json["gone"] == [{"name": "vanished", "zone": zone, "state": "READY", "recorded": True}]
    assert result.json["deleted"] == []
    vanished = session.ledger.get_pod("vanished", zone=zone)
    assert vanished is not None and vanished.state == PodState.DELETED and vanished.end_reason == "gone"
    alive = sorted(p.name for p in session.ledger.list_pods(alive=True))
    assert alive == ["inflight", "keep"]
    assert [n["name"] for n in env.admin.status()["nodes"]] == ["keep"]
    table = cli("pod", "gc", "-y", env=env)
    assert table.code == 0 and "nothing to collect" in table.stdout


def test_gc_ends_a_request_whose_tpuctl_died_before_its_create_reached_the_cloud(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    """`pod create` killed between recording its request and the create reaching the API leaves a
    REQUESTED entry that nothing will ever complete: the request names its process, and once that process
    is gone gc records the entry failed (abandoned). One whose requester still runs is left alone: its
    create may be on its way."""
    import os
    import subprocess
    import sys

    from tpuctl.processes import process_start_ticks
    from tpuctl.services.attempts import REQUESTED_BY, requester

    env = in_process_sim(zones={"us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}}})
    session = env.session()
    zone = "us-central1-a"
    env.allocator(session).place(env.request("v5e-4", session=session, zones=[zone], name="placed"))
    (requested,) = session.ledger.events(kinds=[EventKind.REQUESTED])
    assert requested.detail is not None and requested.detail[REQUESTED_BY]["pid"] == os.getpid()

    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ticks = process_start_ticks(killed.pid)
    killed.kill()
    killed.wait()
    dead = {"pid": killed.pid, "start_ticks": ticks, "host": os.uname().nodename}
    for name, who in (("abandoned", dead), ("on-its-way", requester())):
        session.ledger.record_event(
            EventKind.REQUESTED,
            pod=name,
            zone=zone,
            accelerator_type="v5litepod-4",
            detail={REQUESTED_BY: who},
        )

    result = cli("pod", "gc", "-y", "-o", "json", env=env)
    assert result.code == 0, result.stderr
    assert result.json["gone"] == [
        {"name": "abandoned", "zone": zone, "state": "REQUESTED", "recorded": True}
    ]
    abandoned = session.ledger.get_pod("abandoned", zone=zone)
    assert abandoned is not None and abandoned.state == PodState.FAILED and not abandoned.alive
    (failed,) = session.ledger.events(kinds=[EventKind.FAILED])
    assert failed.detail is not None and failed.detail["outcome"] == "abandoned"
    assert sorted(p.name for p in session.ledger.list_pods(alive=True)) == ["on-its-way", "placed"]


def test_gc_on_a_second_ledger_lists_another_ledgers_live_slice_and_deletes_nothing(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Two machines of one user (USER=root on both), one project: each has its own ledger.
    monkeypatch.setenv("USER", "root")
    monkeypatch.delenv("TPUCTL_OWNER", raising=False)
    env = in_process_sim()
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(tmp_path / "machine-a"))
    made = cli(
        "pod", "create", "v5e-16", "--zone", "us-central1-a", "--name", "theirs", "-o", "json", env=env
    )
    assert made.code == 0, made.stderr
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(tmp_path / "machine-b"))
    for args in (("--dry-run",), ("-y",)):
        result = cli("pod", "gc", *args, "-o", "json", env=env)
        assert result.code == 0, result.stderr
        assert result.json["gc"] == [] and result.json["deleted"] == []
        [listed] = result.json["not_ours"]
        assert (listed["kind"], listed["name"], listed["state"]) == ("slice", "theirs", "READY")
        assert listed["reason"].startswith("not ours") and listed["ledger"]
    assert [n["name"] for n in env.admin.status()["nodes"]] == ["theirs"]
    # The machine that made it still owns it: its own gc has nothing to say.
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(tmp_path / "machine-a"))
    again = cli("pod", "gc", "--dry-run", "-o", "json", env=env)
    assert again.json["gc"] == [] and again.json["not_ours"] == []
