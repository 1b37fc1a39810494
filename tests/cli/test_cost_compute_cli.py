"""`tpuctl cost estimate tpu7x-64` and `cost report` over a tpu7x slice, in text and JSON: the TPU7x price
(12.00 USD per chip-hour in us-central1), its source and date, and the note that its unit is unconfirmed.
Offline where it can be (the report reads the ledger); the estimate asks the in-process simulator."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.sim import SimAdminClient
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import Cli

ZONE = "us-central1-c"
WORLD: dict[str, Any] = {
    "project": "tpuctl-sim",
    "seed": 3,
    "zones": {ZONE: {"tpu7x": {"on_demand": 64, "preemptible": 64}}},
    "compute_quotas": [
        {"quota_id": "TPUS-PER-TPU-FAMILY-per-project-region", "tpu_family": "TPU7X", "limit": 64},
        {"quota_id": "PREEMPTIBLE-TPU7X-per-project-region", "limit": 64},
    ],
    "latency": {"base_ms": 0, "jitter_ms": 0},
}
PRICES = Catalog.load().prices


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return WORLD


def test_estimate_shows_the_tpu7x_price_its_source_and_its_unconfirmed_unit(sim_cli: InProcessCli) -> None:
    doc = sim_cli("cost", "estimate", "tpu7x-64", "--zone", ZONE, "-o", "json").json["estimate"]
    on_demand = next(o for o in doc["options"] if o["capacity"] == "on-demand")
    assert (on_demand["usd_per_chip_hour"], on_demand["usd_per_hour"]) == (12.0, 384.0)  # 32 chips
    assert (doc["prices"]["source"], doc["prices"]["date"]) == (PRICES.source, PRICES.date)
    assert doc["price_note"] == PRICES.notes["tpu7x"] and "unconfirmed" in doc["price_note"]
    assert doc["prices"]["notes"]["tpu7x"] == doc["price_note"]
    spot = next(o for o in doc["options"] if o["capacity"] == "spot")
    assert spot["usd_per_hour"] is None  # no TPU7x spot price was found: unknown, never 0

    text = sim_cli("cost", "estimate", "tpu7x-64", "--zone", ZONE)
    assert text.code == 0, text.stderr
    assert "384.00" in text.stdout and ZONE in text.stdout
    assert PRICES.date in text.stderr and PRICES.source in text.stderr
    assert f"tpu7x price: {PRICES.notes['tpu7x']}" in " ".join(text.stderr.split())


def test_report_shows_a_tpu7x_slice_with_its_price_source_and_note(
    sim_cli: InProcessCli, state_dir: Path
) -> None:
    ready = sim_cli.clock.now() - 7200
    common: dict[str, Any] = {"pod": "ce-7x", "zone": ZONE}
    with Ledger(state_dir) as ledger:
        ledger.record_event(
            EventKind.REQUESTED, accelerator_type="tpu7x-64", chips=32, capacity=CapacityType.ON_DEMAND,
            price_per_chip_hour=12.0, ts=ready - 420, backend="sim", project="tpuctl-sim", **common,
        )  # fmt: skip
        ledger.record_event(EventKind.READY, ts=ready, **common)
        ledger.record_event(EventKind.DELETED, ts=ready + 3600, **common)

    doc = sim_cli("cost", "report", "--no-reconcile", "-o", "json").json
    (group,) = doc["groups"]
    assert (group["name"], group["accelerator_type"], group["price_per_chip_hour"]) == (
        "ce-7x",
        "tpu7x-64",
        12.0,
    )
    assert group["cost_usd"] == 384.0  # 32 chips x 12.00 x 1 h
    assert doc["prices"]["catalog"]["source"] == PRICES.source
    assert doc["prices"]["notes"] == {"tpu7x": PRICES.notes["tpu7x"]}

    text = sim_cli("cost", "report", "--no-reconcile")
    assert text.code == 0, text.stderr
    assert "ce-7x" in text.stdout and "tpu7x-64" in text.stdout and "384.00" in text.stdout
    assert PRICES.source in " ".join(text.stderr.split())
    assert f"tpu7x price: {PRICES.notes['tpu7x']}" in " ".join(text.stderr.split())


# --- budgets on slices tpuctl has no price for ---------------------------------------------------------


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_budget_on_an_unpriced_slice_is_refused_before_anything_is_made(
    sim_cli: InProcessCli, tmp_path: Path, dry_run: bool
) -> None:
    """No TPU7x spot price was found anywhere: a budget could not tell when it is spent, so the run is
    refused (exit 2) naming the missing price and the flag that supplies one, and nothing is created."""
    script = tmp_path / "proj" / "loop.py"
    script.parent.mkdir()
    script.write_text("print('hello')\n")
    args = ["run", str(script), "--no-runtime-deps", "--type", "tpu7x-8", "--spot", "--budget", "0.01"]
    result = sim_cli(*args, *(["--dry-run"] if dry_run else []), "-o", "json")
    assert result.code == 2, result.stderr
    doc = result.json
    assert "--budget" in doc["message"] and "no price" in doc["message"]
    assert "tpu7x" in doc["message"] and "spot" in doc["message"]
    assert "--assume-price-per-hour" in doc["fix"]
    assert sim_cli.admin.status()["nodes"] == []
    assert sim_cli("runs", "list", "-o", "json").json["runs"] == []


def test_the_assumed_price_must_be_a_positive_number_and_goes_with_a_budget(
    sim_cli: InProcessCli, tmp_path: Path
) -> None:
    script = tmp_path / "proj" / "loop.py"
    script.parent.mkdir()
    script.write_text("print('hello')\n")
    run = ["run", str(script), "--no-runtime-deps", "--type", "tpu7x-8", "--spot", "--dry-run"]
    bad = sim_cli(*run, "--budget", "1", "--assume-price-per-hour", "-3")
    assert bad.code == 2 and "--assume-price-per-hour" in bad.stderr
    alone = sim_cli(*run, "--assume-price-per-hour", "20")
    assert alone.code == 2 and "--budget" in alone.stderr
    planned = sim_cli(*run, "--budget", "1", "--assume-price-per-hour", "20", "-o", "json")
    assert planned.code == 0, planned.stderr


def test_an_unpriced_spot_run_under_a_budget_counts_the_assumed_price_and_stops_at_it(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, tmp_path: Path, state_dir: Path
) -> None:
    """The same run with --assume-price-per-hour 40: the budget counts 40 USD/h for the slice (0.01 USD
    is gone within a second, the stop's margin included), stops the run before or as it starts (exit 7)
    and deletes the slice. One host, a stdlib program."""
    admin = serve_sim(WORLD)
    script = tmp_path / "proj" / "loop.py"
    script.parent.mkdir()
    script.write_text(
        "import time\nfor i in range(600):\n    print('step', i, flush=True)\n    time.sleep(0.1)\n"
    )
    result = cli("run", str(script), "--no-runtime-deps", "--type", "tpu7x-8", "--spot", "--zone", ZONE,
                 "--budget", "0.01", "--assume-price-per-hour", "40", "--grace", "1")  # fmt: skip
    assert result.code == 7, result.stderr[-3000:]
    assert "stopped at its budget" in result.stderr
    assert admin.status()["nodes"] == []
    with Ledger(state_dir) as ledger:
        (run,) = ledger.list_runs()
        (pod,) = ledger.list_pods(run_id=run.run_id)
    assert pod.price_per_chip_hour is None  # still unknown: only the budget assumed one
    assert run.detail is not None and run.detail["budget"]["rate_usd_per_hour"] == 40.0
