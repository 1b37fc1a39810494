"""`scripts/bench_server.py`'s pure parts: reading the program's step stamp, the ratios, the least-squares
extrapolation to runs per 8 GiB, the database counters' rates, the arguments, and the report's rows."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
GIB = 1024**3
MIB = 1024**2


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # The scripts import each other by bare name (they run by path, scripts/ first on sys.path).
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("bench_server")


def test_the_first_step_stamp_is_read_from_the_programs_line_as_the_client_shows_it(
    bench: ModuleType,
) -> None:
    assert bench.first_step_epoch("w0 | step 0 at 1795816591.250000") == 1795816591.25
    assert bench.first_step_epoch("step 12 at 17.5") == 17.5
    assert bench.first_step_epoch("w0 | placing the slice") is None
    assert bench.first_step_epoch("step 0 at noon") is None
    assert bench.first_step_epoch("step 0 at 1 2") is None


def test_the_ratio_is_of_the_medians(bench: ModuleType) -> None:
    assert bench.median_ratio([2.0, 6.0, 4.0], [3.0, 2.0, 4.0]) == 1.333
    assert bench.median_ratio([], [1.0]) is None


def test_runs_per_budget_come_from_the_least_squares_line(bench: ModuleType) -> None:
    line = bench.fit_line(
        [50, 100, 200], [200 * MIB + 50 * MIB, 200 * MIB + 100 * MIB, 200 * MIB + 200 * MIB]
    )
    assert line.slope == pytest.approx(MIB)
    assert line.intercept == pytest.approx(200 * MIB)
    assert bench.runs_within(8 * GIB, line) == 8192 - 200
    assert bench.runs_within(8 * GIB, bench.Line(9 * GIB, MIB)) == 0  # the fixed cost alone is over
    assert bench.runs_within(8 * GIB, bench.Line(GIB, -1.0)) is None  # no per-run cost measured
    with pytest.raises(ValueError):
        bench.fit_line([50, 50], [1.0, 2.0])


def _row(runs: int, rss_mib: float, cpu: float, calls: float) -> dict[str, Any]:
    return {
        "runs": runs,
        "replica": {
            "rss_bytes": int(rss_mib * MIB),
            "uss_bytes": int(rss_mib * MIB) - 30 * MIB,
            "cpu_s_per_s": cpu,
            "threads": 6 * runs + 3,
        },
        "database": {
            "statement_calls_per_s": calls,
            "xact_commit_per_s": calls / 3,
            "connections": {"idle": 2},
        },
    }


def test_extrapolation_reports_per_run_costs_and_what_fits(bench: ModuleType) -> None:
    rows = [_row(50, 250, 0.25, 75), _row(100, 300, 0.5, 150), _row(200, 400, 1.0, 300)]
    out = bench.extrapolate(rows)
    assert out["per_run"]["rss_bytes"] == MIB
    assert out["per_run"]["statements_per_s"] == 1.5
    assert out["runs_per_8_gib_rss"] == 8192 - 200
    assert out["runs_per_core"] == 200
    assert bench.extrapolate(rows[:1]) == {}

    scale = {**out, "rows": rows, "window_s": 30.0, "step_every_s": 10.0}
    figure, value, target, _ = bench.report_rows({"scale": scale})[0]
    assert figure.endswith("50/100/200 concurrent one-host runs")
    assert value.startswith("7992 ")
    assert target.startswith("≥ 500")


def test_database_rates_and_the_busiest_statements_per_run(bench: ModuleType) -> None:
    before = {
        "xact_commit": 100,
        "statement_calls": 1000,
        "statements": {"COMMIT": 400, "SELECT 1": 10},
        "at": 0.0,
    }
    after = {
        "xact_commit": 160,
        "statement_calls": 1600,
        "statements": {"COMMIT": 700, "SELECT 1": 10},
        "at": 30.0,
    }
    assert bench.rates(before, after) == {"xact_commit_per_s": 2.0, "statement_calls_per_s": 20.0}
    assert bench.top_statements(before, after, runs=10) == [{"calls_per_s_per_run": 1.0, "query": "COMMIT"}]


def test_levels_and_leases_are_parsed_and_checked(bench: ModuleType) -> None:
    assert bench.parse_levels("200,50,100") == [50, 100, 200]
    assert bench.parse_leases("12,4") == [4.0, 12.0]
    for bad in ("50", "0,10"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_levels(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_leases("1,4")
