"""Fault injection through the CLI: mixed `pod create`, `pod list`, `pod delete` and `pod gc` against one
simulator answering 20% of TPU API / Cloud Quotas requests with 429, 500 or 503 and dropping 5% of
mutations after performing them (connection resets), with latency spikes, while a chaos thread stocks
zones out and shrinks the quotas mid-placement. Every command ends 0 or with the error its situation
calls for; afterwards, with the faults off and one `pod gc`, the simulator and the ledger agree: no
duplicate slice, no orphan. Seeded (the op mix, the chaos and the simulator's fault draws).

Default: 24 operations. `--slow`: 240."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hardening_helpers import (
    ZONES,
    assert_ledger_agrees,
    fast_world,
    no_crash,
    sim_nodes,
)

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.world import world_from_data
from tpuctl.testing.cli import CliResult, invoke

# 4: quota (shrunk under it, or short everywhere); 5: every zone stocked out; 14: retries exhausted.
CREATE_FAILS = {
    4: {"quota_exceeded", "no_quota"},
    5: {"stockout", "no_capacity"},
    14: {"transient", "rate_limited", "ambiguous"},
}


def faulty_world(seed: int) -> dict[str, object]:
    return fast_world(
        seed=seed,
        latency={"base_ms": 1, "jitter_ms": 1, "spike_probability": 0.03, "spike_ms": 250},
        faults={"transient_error_rate": 0.2, "ambiguous_error_rate": 0.05},
    )


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[SimServer, SimAdminClient]]:
    server = SimServer(tmp_path / "sim-state", world_from_data(faulty_world(3), "test"))
    server.start()
    admin = SimAdminClient(server.url)
    try:
        yield server, admin
    finally:
        admin.close()
        server.stop()


class Chaos:
    """Mid-placement trouble from another thread: zones stocked out and back, quotas shrunk and back."""

    def __init__(self, server: SimServer, seed: int) -> None:
        self.rng = random.Random(seed)
        self.admin = SimAdminClient(server.url)
        self.server = server
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.thread = threading.Thread(target=self._loop, name="chaos", daemon=True)
        self.errors: list[BaseException] = []

    def _install(self, quota: int) -> None:
        world = faulty_world(3)
        world["quotas"] = {
            "default": {
                "on_demand": {"zone": quota, "region": 2 * quota},
                "preemptible": {"zone": quota, "region": 2 * quota},
            }
        }
        engine = self.server._engine  # the test's own simulator: swap the world in force, state kept
        assert engine is not None
        engine.install_world(world_from_data(world, "chaos"))

    def _loop(self) -> None:
        try:
            while not self.stop.wait(self.rng.uniform(0.05, 0.3)):
                zone = self.rng.choice(ZONES)
                action = self.rng.random()
                if action < 0.4:
                    self.admin.stockout(zone)
                    self.counts["stockout"] += 1
                elif action < 0.8:
                    self.admin.stockout(zone, clear=True)
                    self.counts["stockout_cleared"] += 1
                elif action < 0.9:
                    self._install(8)
                    self.counts["quota_shrunk"] += 1
                else:
                    self._install(64)
                    self.counts["quota_restored"] += 1
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)

    def __enter__(self) -> Chaos:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self._install(64)
        for zone in ZONES:
            self.admin.stockout(zone, clear=True)
        self.admin.close()


def run_ops(
    n_ops: int,
    seed: int,
    sim: tuple[SimServer, SimAdminClient],
    monkeypatch: pytest.MonkeyPatch,
    state_dir: Path,
) -> Counter[str]:
    server, admin = sim
    monkeypatch.setenv("TPUCTL_SIM_URL", server.url)

    def cli(*args: str) -> CliResult:
        result = invoke(args)
        no_crash(result)
        return result

    rng = random.Random(seed)
    created: dict[str, str] = {}  # name -> zone, created and not deleted
    tally: Counter[str] = Counter()
    with Chaos(server, seed) as chaos:
        for i in range(n_ops):
            pick = rng.random()
            if pick < 0.45 or not created:
                name = f"h{seed}-{i:03d}"
                args = ["pod", "create", rng.choice(["v5e-4", "v5e-8"]), "--name", name, "-o", "json"]
                if rng.random() < 0.5:
                    args += ["--zone", rng.choice(ZONES), "--zone", rng.choice(ZONES)]
                if rng.random() < 0.3:
                    args += ["--spot"]
                r = cli(*args)
                if r.code == 0:
                    pod = r.json["pod"]
                    assert pod["name"] == name and pod["state"] == "READY"
                    created[name] = pod["zone"]
                    tally["create_ok"] += 1
                else:
                    assert r.code in CREATE_FAILS, (args, r.code, r.output)
                    kind = r.output.split('"error": "', 1)[-1].split('"', 1)[0]
                    assert kind in CREATE_FAILS[r.code], (r.code, kind, r.output)
                    tally[f"create_{kind}"] += 1
                    # A failed create leaves no slice of that name behind.
                    assert name not in {n["name"] for n in sim_nodes(admin) if n["state"] != "DELETING"}
            elif pick < 0.65:
                r = cli("pod", "list", "-o", "json")
                assert r.code in (0, 14), r.output
                if r.code == 0:
                    listed = {p["name"] for p in r.json["pods"]}
                    assert set(created) <= listed, set(created) - listed
                tally[f"list_{r.code}"] += 1
            elif pick < 0.9:
                name = rng.choice(sorted(created))
                r = cli("pod", "delete", name, "-y", "-o", "json")
                assert r.code in (0, 14), r.output
                if r.code == 0:
                    assert r.json["deleted"] == [{"name": name, "zone": created.pop(name)}]
                tally[f"delete_{r.code}"] += 1
            else:
                r = cli("pod", "gc", "-y", "-o", "json")
                assert r.code in (0, 14), r.output
                if r.code == 0:
                    assert not set(r.json["deleted"]) & set(created), "gc deleted a live, tracked slice"
                tally[f"gc_{r.code}"] += 1
    assert not chaos.errors, chaos.errors
    # The chaos happened: zones stocked out and quotas shrunk while commands ran.
    assert chaos.counts["stockout"] > 0 and chaos.counts["quota_shrunk"] >= (1 if n_ops >= 100 else 0)
    tally.update({f"chaos_{k}": v for k, v in chaos.counts.items()})

    admin.set_faults(transient_error_rate=0.0, ambiguous_error_rate=0.0)
    r = cli("pod", "gc", "-y", "-o", "json")
    assert r.code == 0, r.output
    admin.advance()
    nodes = {n["name"]: n for n in sim_nodes(admin) if n["state"] != "DELETING"}
    assert set(nodes) == set(created), set(nodes) ^ set(created)
    assert {nodes[n]["zone"] for n in created} <= set(ZONES)
    assert all(nodes[name]["zone"] == zone for name, zone in created.items())
    assert admin.status()["queued_resources"] == []
    assert_ledger_agrees(state_dir, admin)
    return tally


def test_mixed_operations_under_faults(
    sim: tuple[SimServer, SimAdminClient],
    monkeypatch: pytest.MonkeyPatch,
    state_dir: Path,
) -> None:
    tally = run_ops(24, 1, sim, monkeypatch, state_dir)
    print("fault-injection tally:", dict(tally))
    assert tally["create_ok"] > 5, tally


@pytest.mark.slow
def test_240_mixed_operations_under_faults(
    sim: tuple[SimServer, SimAdminClient],
    monkeypatch: pytest.MonkeyPatch,
    state_dir: Path,
) -> None:
    tally = run_ops(240, 2, sim, monkeypatch, state_dir)
    print("fault-injection tally:", dict(tally))
    assert tally["create_ok"] > 30, tally
