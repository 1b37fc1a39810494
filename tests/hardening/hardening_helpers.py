"""Shared helpers of the hardening suite: the in-process CLI, a fast test world and the checks that the
ledger and the simulator agree. (Not conftest.py: several test directories have one.)"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from tpuctl.sim import SimAdminClient
from tpuctl.testing.cli import CliResult

PROJECT = "tpuctl-sim"
ZONES = ["us-central1-a", "us-east1-c", "us-west4-a", "europe-west4-b"]


def fast_world(**overrides: Any) -> dict[str, Any]:
    """Four zones offering v5e, a 1000x clock (a create takes 60 ms) and no latency unless asked."""
    world: dict[str, Any] = {
        "project": PROJECT,
        "speed": 1000,
        "seed": 7,
        "zones": {z: {"v5e": {"on_demand": 64, "preemptible": 64}} for z in ZONES},
        "quotas": {
            "default": {
                "on_demand": {"zone": 64, "region": 128},
                "preemptible": {"zone": 64, "region": 128},
            }
        },
        "latency": {"base_ms": 0, "jitter_ms": 0},
        "durations": {
            "node_create_s": 60,
            "node_delete_s": 10,
            "node_stop_s": 10,
            "node_start_s": 10,
            "queued_provision_s": 60,
            "stockout_s": 5,
            "preemption_grace_s": 1,
        },
    }
    world.update(overrides)
    return world


def write_world(path: Path, world: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(world))
    return path


def no_crash(result: CliResult) -> None:
    """No traceback and no internal error, whatever the outcome."""
    assert "Traceback" not in result.output, result.output
    assert "internal error" not in result.output, result.output


def sim_nodes(admin: SimAdminClient) -> list[dict[str, Any]]:
    return [dict(n) for n in admin.status()["nodes"]]


def assert_ledger_agrees(state_dir: Path, admin: SimAdminClient) -> None:
    """Every slice in the simulator is a live ledger entry and vice versa; no name appears twice; the
    ledger's SQLite file passes integrity_check and its view replays from the event log."""
    from tpuctl.store import Ledger

    nodes = sim_nodes(admin)
    names = Counter((n["zone"], n["name"]) for n in nodes)
    assert all(c == 1 for c in names.values()), names
    by_name = Counter(n["name"] for n in nodes)
    assert all(c == 1 for c in by_name.values()), f"duplicate slices: {by_name}"
    ledger = Ledger(state_dir)
    try:
        assert ledger.integrity_check() == "ok"
        assert ledger.check_view() == []
        alive = {(p.zone, p.name) for p in ledger.list_pods(alive=True)}
    finally:
        ledger.close()
    in_sim = {(n["zone"], n["name"]) for n in nodes if n["state"] not in ("DELETING",)}
    assert in_sim <= alive, f"orphans (in the simulator, unknown to the ledger): {in_sim - alive}"
    assert alive <= in_sim, f"ledger entries with no slice: {alive - in_sim}"


def walk_modes(root: Path) -> list[tuple[Path, int]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out.append((p, os.lstat(p).st_mode & 0o777))
    return out
