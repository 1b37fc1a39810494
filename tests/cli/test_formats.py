"""Formats and polish: `pod describe` for people (units, labels as k=v, a row per host, events in words),
a format that does not apply refused, `catalog types` without scientific notation or an internal path in
its source, `cost estimate` with spot and preemptible as one row when they are one offer, `cost report -o
csv --group-by slice` with a column per fact, and `--help` in a sensible order with named values."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import pytest

from tpuctl.testing.backend import InProcessCli

ZONE = "us-central1-a"
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


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return WORLD


def test_pod_describe_reads_as_words_and_refuses_csv(sim_cli: InProcessCli) -> None:
    assert sim_cli("pod", "create", "v5e-16", "--name", "p16", "--zone", ZONE).code == 0

    shown = sim_cli("pod", "describe", "p16")

    assert shown.code == 0, shown.stderr
    out = shown.stdout
    assert re.search(r"price_per_chip_hour\s+1\.20 USD/chip-hour", out)
    assert re.search(r"price_per_hour\s+19\.20 USD/hour", out)
    assert re.search(
        r"labels\s+managed-by=tpuctl, tpuctl-ledger=[0-9a-f]{16}, tpuctl-owner=\S+, tpuctl-request=[0-9a-f]+",
        out,
    )
    assert re.search(r"created_at\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", out)
    hosts = [line.split() for line in out.splitlines() if re.match(r"^\d\s+127\.\d+\.\d+\.\d+\s+", line)]
    assert [h[0] for h in hosts] == ["0", "1", "2", "3"]
    assert len({h[1] for h in hosts}) == 4  # each host its own address
    attempt = next(line for line in out.splitlines() if " attempt " in line)
    assert "outcome=created" in attempt and "message='READY in us-central1-a'" in attempt
    assert not re.search(r"\d\.\d{4,}", out) and "{" not in out  # no 16-digit floats, no reprs

    refused = sim_cli("pod", "describe", "p16", "-o", "csv")
    assert refused.code == 2 and refused.stdout == ""
    assert "-o csv does not apply to `pod describe`" in refused.stderr
    assert "use -o table, -o json, -o yaml" in refused.stderr
    # Refused before anything happens: no slice is made for a CSV nobody can write.
    assert sim_cli("pod", "create", "v5e-8", "--name", "x", "--zone", ZONE, "-o", "csv").code == 2
    assert [p["name"] for p in sim_cli("pod", "list", "-o", "json").json["pods"]] == ["p16"]
    assert sim_cli("sim", "status", "-o", "csv").code == 2


def test_catalog_types_has_plain_numbers_and_a_clean_source(sim_cli: InProcessCli) -> None:
    table = sim_cli("catalog", "types")
    assert table.code == 0
    assert not re.search(r"\b\d+(\.\d+)?e[+-]\d+\b", table.stdout)
    assert ".md" not in table.stdout  # the source is named in words, never as a document's path
    row = next(line.split() for line in table.stdout.splitlines() if line.startswith("v5p-12288 "))
    assert row[7] == "2820096"  # 6144 chips x 459 TFLOP/s, whole


def test_cost_estimate_shows_one_offer_once(sim_cli: InProcessCli) -> None:
    table = sim_cli("cost", "estimate", "v5e-8", "--zone", ZONE)
    assert table.code == 0, table.stderr
    rows = [line.split()[:2] for line in table.stdout.splitlines() if line.startswith(ZONE)]
    assert rows == [[ZONE, "spot/preemptible"], [ZONE, "on-demand"]]
    machine = sim_cli("cost", "estimate", "v5e-8", "--zone", ZONE, "-o", "csv")
    capacities = [r["CAPACITY"] for r in csv.DictReader(io.StringIO(machine.stdout))]
    assert sorted(capacities) == ["on-demand", "preemptible", "spot"]  # CSV: a row per capacity type


def test_cost_report_csv_by_slice_has_a_column_per_fact(sim_cli: InProcessCli) -> None:
    assert sim_cli("pod", "create", "v5e-8", "--spot", "--name", "a-r1", "--zone", ZONE).code == 0
    sim_cli.clock.advance(60)

    result = sim_cli("cost", "report", "--group-by", "slice", "-o", "csv", "--no-reconcile")

    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 1
    row = rows[0]
    assert (row["key"], row["zone"], row["name"], row["incarnation"]) == (f"{ZONE}/a-r1#1", ZONE, "a-r1", "1")
    assert (row["accelerator_type"], row["chips"], row["capacity"], row["state"]) == (
        "v5litepod-8", "8", "spot", "READY"
    )  # fmt: skip
    assert float(row["cost_usd"]) >= 0 and re.match(r"\d{4}-\d\d-\d\dT", row["ready_at"])


def test_help_lists_commands_in_order_with_named_values(sim_cli: InProcessCli) -> None:
    top = sim_cli("--help").stdout
    commands = re.findall(r"^  (\w+)\s{2,}", top.split("Commands:")[1], re.MULTILINE)
    expected = [
        "run",
        "runs",
        "queue",
        "job",
        "pod",
        "cost",
        "catalog",
        "quota",
        "bench",
        "doctor",
        "dashboard",
        "server",
        "workspace",
        "audit",
        "db",
        "sim",
    ]
    assert commands == expected
    assert "..." not in top.split("Commands:")[1] and "<str>" not in top
    assert "-o, --output FORMAT" in top and "--state-dir DIR" in top
    create = sim_cli("pod", "create", "--help").stdout
    assert "<str>" not in create and "<list[str]>" not in create
    assert "--zone ZONE" in create and "--capacity-type CAPACITY" in create
    assert re.search(r"^  TYPE\s+e\.g\. v5e-64", create, re.MULTILINE)
    pod = sim_cli("pod", "--help").stdout
    assert re.findall(r"^  (\w+)\s{2,}", pod.split("Commands:")[1], re.MULTILINE) == [
        "create", "list", "describe", "delete", "gc"
    ]  # fmt: skip
