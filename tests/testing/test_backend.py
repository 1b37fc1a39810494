"""The in-process backend: a real Backend over the simulator's route table and its fake clock, handed from
the CLI runner down to every session. Nothing is served, nothing sleeps: a command that waits for a slice
moves simulated time."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tpuctl.backends.base import Backend
from tpuctl.backends.sim import SIM_TUNING
from tpuctl.errors import UnreachableError
from tpuctl.services.session import open_session
from tpuctl.settings import load_settings
from tpuctl.sim import default_world
from tpuctl.store.records import EventKind
from tpuctl.testing.backend import WORLD_SOURCE, InProcessBackend, InProcessCli
from tpuctl.testing.cloud import InProcessSim

ZONE = "us-central1-a"
OTHER_ZONE = "us-west4-a"
COMPUTE_ZONE = "us-central1-c"


@pytest.fixture
def sim_world() -> dict[str, Any]:
    # speed 1: the fake clock's seconds are simulated seconds, so a create visibly takes its minute.
    return {
        "speed": 1,
        "zones": {
            ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}},
            OTHER_ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}},
            COMPUTE_ZONE: {"tpu7x": {"on_demand": 64, "preemptible": 64}},
        },
        "quotas": {
            "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
        },
        "compute_quotas": [{"quota_id": "TPUS-PER-TPU-FAMILY-per-project-region", "limit": 256}],
        "durations": {"node_create_s": 60, "node_delete_s": 10},
        "prices": {"v5e": {"us-central1": {"spot": 0.5}}},
        "latency": {"base_ms": 0, "jitter_ms": 0},
    }


def test_it_is_a_backend_that_keeps_its_own_time(sim_cli: InProcessCli) -> None:
    backend: Backend = sim_cli.backend  # mypy holds it to the protocol
    assert backend.name == "sim" and backend.runtime == "cpu" and backend.default_bucket
    before = sim_cli.clock.now()
    backend.timekeeping.sleep(5)
    assert backend.timekeeping.clock() == backend.timekeeping.monotonic() == before + 5


def test_a_session_opened_with_it_reads_and_waits_on_the_fake_clock(
    sim_cli: InProcessCli, state_dir: Path
) -> None:
    settings = load_settings({"state_dir": state_dir, "backend": "sim"})
    with open_session(settings, backend=sim_cli.backend) as session:
        assert session.backend is sim_cli.backend
        assert session.clock() == session.monotonic() == sim_cli.clock.now()
        session.sleep(30)
        assert session.clock() == sim_cli.clock.now()
        session.ledger.record_event(EventKind.REQUESTED, pod="p", zone=ZONE)
        (event,) = session.ledger.pod_events("p")
        assert event.ts == sim_cli.clock.now()  # the ledger stamps its writes with the same clock


def test_pod_create_waits_in_simulated_time(sim_cli: InProcessCli) -> None:
    started_real, started_sim = time.monotonic(), sim_cli.clock.now()

    created = sim_cli("pod", "create", "v5e-8", "--name", "a", "--zone", ZONE, "-o", "json")

    assert created.code == 0, created.stderr
    assert created.json["pod"]["state"] == "READY"
    assert sim_cli.clock.now() - started_sim >= 60  # the create's minute passed on the fake clock
    assert time.monotonic() - started_real < 30
    listed = sim_cli("pod", "list", "-o", "json")
    assert listed.json["backend"] == "sim" and [p["name"] for p in listed.json["pods"]] == ["a"]
    assert sim_cli.admin.status()["nodes"][0]["name"] == "a"  # the admin API sees the same simulator


def test_a_queued_wait_in_the_allocator_passes_on_the_fake_clock(sim_cli: InProcessCli) -> None:
    # Polls up to 30 s apart: ten simulated minutes are a few dozen polls, and would be ten real minutes
    # if the allocator slept on the wall clock.
    tuning = replace(SIM_TUNING, poll_max_interval_s=30.0)
    cli = InProcessCli(InProcessBackend(sim_cli.sim, tuning=tuning))
    cli.admin.stockout(ZONE)
    started_real, started_sim = time.monotonic(), cli.clock.now()

    args = ("v5e-16", "--spot", "--queued", "--valid-for", "10m", "--zone", ZONE, "--zone", OTHER_ZONE)
    created = cli("pod", "create", *args, "-o", "json")

    assert created.code == 0, created.stderr
    attempts = [(a["zone"], a["outcome"]) for a in created.json["placement"]["attempts"]]
    assert attempts == [(ZONE, "stockout"), (OTHER_ZONE, "created")]
    assert cli.clock.now() - started_sim >= 600  # the queued resource's ten minutes, then the create
    assert time.monotonic() - started_real < 60
    cli.close()


def test_the_compute_engine_surface_is_served_in_process_too(sim_cli: InProcessCli) -> None:
    created = sim_cli("pod", "create", "tpu7x-8", "--name", "x", "--zone", COMPUTE_ZONE, "-o", "json")
    assert created.code == 0, created.stderr
    (pod,) = sim_cli("pod", "list", "-o", "json").json["pods"]
    assert (pod["name"], pod["accelerator_type"], pod["state"]) == ("x", "tpu7x-8", "READY")
    quota = sim_cli("quota", "-o", "json")
    assert quota.code == 0, quota.stderr
    assert "TPUS-PER-TPU-FAMILY-per-project-region" in quota.stdout
    assert sim_cli("pod", "delete", "x", "--zone", COMPUTE_ZONE, "-y").code == 0
    assert sim_cli("pod", "list", "-o", "json").json["pods"] == []


def test_its_prices_and_grace_are_its_worlds(sim_cli: InProcessCli) -> None:
    own = sim_cli.backend.own_prices()
    assert own.where == WORLD_SOURCE and own.project == sim_cli.world.project
    assert own.overrides == {"v5e": {"us-central1": {"spot": 0.5}}}
    cloud = sim_cli.cloud()
    assert sim_cli.backend.notice_grace_s(cloud) == sim_cli.world.durations.preemption_grace_s


def test_it_reaches_no_host(sim_cli: InProcessCli) -> None:
    assert sim_cli("pod", "create", "v5e-8", "--name", "h", "--zone", ZONE).code == 0
    cloud = sim_cli.cloud()
    node = cloud.get_node(ZONE, "h")
    with pytest.raises(UnreachableError, match="runs no VMs"):
        sim_cli.backend.host_addresses(cloud, node)


def test_two_backends_over_one_state_are_one_cloud(tmp_path: Path) -> None:
    world = default_world().model_copy(update={"speed": 1000.0})
    with InProcessSim(tmp_path / "state", world) as sim:
        first = InProcessCli(InProcessBackend(sim))
        assert first("pod", "create", "v5e-8", "--name", "s", "--zone", ZONE).code == 0
        second = InProcessCli(InProcessBackend(sim))
        other_state = {"TPUCTL_STATE_DIR": str(tmp_path / "other")}
        # Another state dir (another ledger) on the same simulated cloud: the slice is there, untracked.
        listed = second("pod", "list", "-o", "json", env=other_state)
        assert [p["name"] for p in listed.json["pods"]] == ["s"]
        first.close()
        second.close()
