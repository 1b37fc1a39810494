"""Identifiers are never cut: `pod list`, `runs list` and `cost report` at 80 columns in a terminal and
piped show every run id, slice name (with a replacement's `-r1`) and zone whole; a narrow terminal loses
lower-value columns first and says which; piped output is plain text at full width."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tpuctl.catalog import CapacityType
from tpuctl.cli import tables
from tpuctl.cli.render import Output
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, NewEvent, RunStatus
from tpuctl.testing.backend import InProcessCli

ZONE = "northamerica-northeast1-b"  # the longest zone name of the catalog's kind
WORLD: dict[str, Any] = {
    "project": "tpuctl-sim",
    "speed": 1000,
    "seed": 3,
    "zones": {ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}}},
    "quotas": {
        "default": {"on_demand": {"zone": 64, "region": 64}, "preemptible": {"zone": 64, "region": 64}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    "durations": {"node_create_s": 60, "node_delete_s": 10, "preemption_grace_s": 1},
}
RUN_IDS = [f"run-20261124-1509{i:02d}-ab1{i}" for i in range(3)]
SLICE = "tpu-v5e-8-9df1bf-train-llama-r1"  # a recovery's replacement slice
TERMINAL_80 = {"TTY_COMPATIBLE": "1", "COLUMNS": "80", "NO_COLOR": "1"}


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return WORLD


def _ledger(state_dir: Path, now: float) -> None:
    """Three runs on SLICE, and SLICE's billing to the first (READY two days before ``now``, deleted an hour
    later)."""
    start = now - 2 * 86400
    common: dict[str, Any] = {"pod": SLICE, "zone": ZONE, "run_id": RUN_IDS[0]}
    with Ledger(state_dir) as ledger:
        ledger.record_events_bulk(
            [
                NewEvent(EventKind.REQUESTED, accelerator_type="v5litepod-8", chips=8,
                         capacity=CapacityType.SPOT, price_per_chip_hour=1.2, ts=start, backend="sim",
                         project="tpuctl-sim", **common),
                NewEvent(EventKind.READY, ts=start + 60, **common),
                NewEvent(EventKind.DELETED, ts=start + 3660, **common),
            ]
        )  # fmt: skip
        for run_id in RUN_IDS:
            ledger.create_run(
                run_id, script="examples/train_a_much_longer_program_name.py", status=RunStatus.SUCCEEDED,
                pod=SLICE, zone=ZONE, accelerator_type="v5litepod-8",
            )  # fmt: skip


@pytest.mark.parametrize("env", [TERMINAL_80, {}], ids=["terminal-80", "piped"])
def test_runs_list_and_cost_report_show_whole_ids_slices_and_zones(
    sim_cli: InProcessCli, state_dir: Path, env: dict[str, str]
) -> None:
    _ledger(state_dir, sim_cli.clock.now())

    runs = sim_cli("runs", "list", env=env)
    report = sim_cli("cost", "report", "--no-reconcile", "--group-by", "slice", env=env)
    by_run = sim_cli("cost", "report", "--no-reconcile", "--group-by", "run", env=env)

    for result in (runs, report, by_run):
        assert result.code == 0, result.stderr
        assert "…" not in result.stdout
    assert all(run_id in runs.stdout for run_id in RUN_IDS)
    assert RUN_IDS[0] in by_run.stdout  # the run the slice's time is billed to
    assert runs.stdout.count(SLICE) == 3 and runs.stdout.count(ZONE) == 3
    assert SLICE in report.stdout and ZONE in report.stdout
    # The money stays at 80 columns: COST USD is kept.
    assert "COST USD" in report.stdout
    if env:
        assert "PROGRAM" in runs.stderr and "not shown at 80 columns" in runs.stderr
        assert "┌" in report.stdout  # a terminal gets the box where the kept columns fit
        boxed = [line for line in report.stdout.splitlines() if line[:1] in "┌│├└"]
        assert len(boxed) == 5 and all(len(_visible(line)) <= 80 for line in boxed)
    else:
        assert "┌" not in runs.stdout and "│" not in runs.stdout and "─" not in runs.stdout
        header = runs.stdout.splitlines()[0].split()
        assert header[:5] == ["RUN", "STATUS", "WORKSPACE", "USER", "PROGRAM"]  # every column, piped
        assert "examples/train_a_much_longer_program_name.py" in runs.stdout
        assert runs.stderr.count("not shown") == 0


def _visible(line: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", line)


@pytest.mark.parametrize("env", [TERMINAL_80, {}], ids=["terminal-80", "piped"])
def test_pod_list_shows_whole_names_and_zones(sim_cli: InProcessCli, env: dict[str, str]) -> None:
    created = sim_cli("pod", "create", "v5e-8", "--name", SLICE, "--zone", ZONE)
    assert created.code == 0, created.stderr

    listed = sim_cli("pod", "list", env=env)

    assert listed.code == 0, listed.stderr
    assert SLICE in listed.stdout and ZONE in listed.stdout and "READY" in listed.stdout
    assert "…" not in listed.stdout
    if not env:
        name, zone, *rest = listed.stdout.splitlines()[1].split()
        assert (name, zone, rest[0]) == (SLICE, ZONE, "v5litepod-8")


def test_a_narrow_terminal_drops_named_columns_first_then_the_rest_right_to_left() -> None:
    columns = ("NAME", "ZONE", "A", "B", "C")
    cells = [["n" * 20, "z" * 20, "a" * 10, "b" * 10, "c" * 10]]
    # boxed: 20+20+10+10+10 + 3*5 + 1 = 86; without C: 73
    assert tables.fit(columns, cells, 86) == tables.Layout((0, 1, 2, 3, 4), True, ())
    assert tables.fit(columns, cells, 80) == tables.Layout((0, 1, 2, 3), True, ("C",))
    assert tables.fit(columns, cells, 80, drop=("A",)) == tables.Layout((0, 1, 3, 4), True, ("A",))
    # Identifiers alone do not fit: the box goes, the identifiers stay.
    assert tables.fit(columns, cells, 40) == tables.Layout((0, 1), False, ("A", "B", "C"))


def test_a_terminal_table_never_ellipsizes_and_piped_is_plain(capsys: pytest.CaptureFixture[str]) -> None:
    long_id = "run-20261124-150943-" + "x" * 60
    terminal = Output(_stdout=Console(width=80, force_terminal=True, no_color=True, highlight=True))
    terminal.rows("runs", ("RUN", "STATUS"), [[long_id, "running"]], key="runs", records=[])
    shown = capsys.readouterr().out
    assert "…" not in shown and long_id in shown

    piped = Output(_stdout=Console(width=80, force_terminal=False))
    piped.rows("runs", ("RUN", "STATUS"), [[long_id, None]], key="runs", records=[])
    assert capsys.readouterr().out == f"RUN{' ' * (len(long_id) - 1)}STATUS\n{long_id}  -\n"
