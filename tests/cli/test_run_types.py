"""A run that may go on any of several slice types (``--type v5e-8,v6e-8``): its plan ranks every type's
candidates in one list, it runs on the type it was placed on (the program sees that type), its record
says which, and a recovery may land on another type of the set and says so. One-host types and a
stdlib program: nothing to install, so these runs take seconds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from recovery_helpers import V5E_ZONE, WORLD, Chaos, Preempt, steps_program

from tpuctl.sim import SimAdminClient
from tpuctl.testing.cli import Cli

V6E_ZONE = "us-east1-d"
#: The recovery tests' world with v6e in a zone of its own.
TYPES_WORLD: dict[str, Any] = {
    **WORLD,
    "zones": {**WORLD["zones"], V6E_ZONE: {"v6e": {"on_demand": 64, "preemptible": 64}}},
}
#: Says which type it runs on, and stops at a preemption notice as the runtime's programs do.
PROGRAM = steps_program('"on", os.environ["TPUCTL_ACCELERATOR_TYPE"]')


@pytest.fixture
def admin(
    serve_sim: Callable[..., SimAdminClient], state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> SimAdminClient:
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(state_dir))
    return serve_sim(TYPES_WORLD)


def _args(tmp_path: Path, *extra: str, types: str = "v5e-8,v6e-8") -> tuple[str, ...]:
    script = tmp_path / "user" / "steps.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(PROGRAM)
    where = ("--zone", V5E_ZONE, "--zone", V6E_ZONE)
    return (str(script), "--type", types, *where, "--spot", "--no-runtime-deps", *extra)


def test_the_dry_run_plan_ranks_both_types_candidates_in_one_list(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    result = cli("run", *_args(tmp_path, "--dry-run", "-o", "json"))
    assert result.code == 0, result.stderr[-4000:]
    target = result.json["plan"]["target"]
    create = target["create"]
    # v5e-8 spot in us-central1-a: 8 x 0.245; v6e-8 spot in us-east1-d: 8 x 0.544.
    assert create["order"] == [f"{V5E_ZONE}/spot/v5litepod-8", f"{V6E_ZONE}/spot/v6e-8"]
    ranked = [(c["accelerator_type"], c["zone"], c["rank"]) for c in create["candidates"] if c["rank"]]
    assert ranked == [("v5litepod-8", V5E_ZONE, 1), ("v6e-8", V6E_ZONE, 2)]
    assert [t["accelerator_type"] for t in create["request"]["slice_types"]] == ["v5litepod-8", "v6e-8"]
    assert create["request"]["type_preference"] == "ordered"
    assert (target["accelerator_type"], target["zone"]) == ("v5litepod-8", V5E_ZONE)
    human = cli("run", *_args(tmp_path, "--dry-run", "--no-import-check"))
    assert "every type ranked together (ordered):" in human.stdout
    assert "1. v5litepod-8 in us-central1-a spot (1.96 USD/h)" in human.stdout
    assert "2. v6e-8 in us-east1-d spot (4.35 USD/h)" in human.stdout

    # The first type over the price cap everywhere: the plan is of the type it would place.
    capped = cli(
        "run",
        *_args(
            tmp_path, "--max-price", "3", "--dry-run", "--no-import-check", "-o", "json", types="v6e-8,v5e-8"
        ),
    )
    assert capped.code == 0, capped.stderr[-4000:]
    target = capped.json["plan"]["target"]
    assert target["create"]["order"] == [f"{V5E_ZONE}/spot/v5litepod-8"]
    assert (target["accelerator_type"], target["zone"], target["hosts"]) == ("v5litepod-8", V5E_ZONE, 1)
    assert [h["env"]["TPUCTL_ACCELERATOR_TYPE"] for h in capped.json["plan"]["hosts"]] == ["v5litepod-8"]


def test_the_first_type_stocked_out_the_run_runs_on_the_second_and_says_so(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    admin.stockout(V5E_ZONE)
    result = cli("run", *_args(tmp_path))
    assert result.code == 0, result.output[-4000:]
    assert "w0 | attempt 0 on v6e-8" in result.stdout
    assert "(us-east1-d, 1 host, spot, 4.35 USD/h)" in result.stdout
    assert "creating" in result.stderr and "(v5litepod-8 or v6e-8, 1 host)" in result.stderr
    assert "placed on v6e-8 (of the run's slice types v5litepod-8, v6e-8, ordered)" in result.stderr

    (listed,) = cli("runs", "list", "-o", "json").json["runs"]
    assert listed["accelerator_type"] == "v6e-8"
    run = cli("runs", "describe", listed["run_id"], "-o", "json").json["run"]
    assert (run["status"], run["accelerator_type"], run["zone"]) == ("succeeded", "v6e-8", V6E_ZONE)


def test_a_preempted_run_recovers_on_another_type_of_its_set_and_says_so(
    admin: SimAdminClient, cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    # The preemption comes with a stockout of the only zone offering the first type.
    chaos = Chaos(admin, state_dir, [Preempt(1, 3, notice=True, stockout=V5E_ZONE)]).start()
    try:
        result = cli("run", *_args(tmp_path))
    finally:
        chaos.join(check=False)
    assert result.code == 0, result.output[-4000:]
    chaos.check()
    workers = [line for line in result.stdout.splitlines() if line.startswith("w0 | attempt")]
    assert workers == ["w0 | attempt 0 on v5litepod-8", "w0 | attempt 1 on v6e-8"]
    assert "recovered on another slice type: v5litepod-8 -> v6e-8" in result.stderr

    (listed,) = cli("runs", "list", "-o", "json").json["runs"]
    run = cli("runs", "describe", listed["run_id"], "-o", "json").json["run"]
    assert (run["status"], run["accelerator_type"], run["preemptions"]) == ("succeeded", "v6e-8", 1)
    assert run["detail"]["placed_types"] == ["v5litepod-8", "v6e-8"]


@pytest.mark.slow
def test_a_4_host_run_recovers_on_a_1_host_type_and_its_hosts_follow(
    admin: SimAdminClient, cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    """v5e-16 (4 hosts) preempted with its zone stocked out: the recovery lands on v6e-8, one host, and
    the program starts on that one host only."""
    chaos = Chaos(admin, state_dir, [Preempt(1, 3, notice=True, stockout=V5E_ZONE)]).start()
    try:
        result = cli("run", *_args(tmp_path, types="v5e-16,v6e-8"))
    finally:
        chaos.join(check=False)
    assert result.code == 0, result.output[-4000:]
    chaos.check()
    starts = sorted(line for line in result.stdout.splitlines() if " | attempt " in line)
    assert starts == sorted(
        [*(f"w{w} | attempt 0 on v5litepod-16" for w in range(4)), "w0 | attempt 1 on v6e-8"]
    )
    assert "recovered on another slice type: v5litepod-16 -> v6e-8" in result.stderr
    (listed,) = cli("runs", "list", "-o", "json").json["runs"]
    run = cli("runs", "describe", listed["run_id"], "-o", "json").json["run"]
    assert run["accelerator_type"] == "v6e-8"
    assert (run["detail"]["hosts"], run["detail"]["placed_types"]) == (1, ["v5litepod-16", "v6e-8"])
