"""`tpuctl cost ...`, `catalog prices --refresh` and the budget flags end to end: the CLI on the
in-process backend (``sim_cli``: the simulator in this process, on a fake clock the tests move), so what is
billed is exactly the simulated time that passed; reconciliation with slices made or deleted behind
tpuctl's back through the cloud layer, bad input, and a run stopped by its budget (on hosts: a served
simulator, in real time)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
import yaml

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import NodeRequest, TpuCloud
from tpuctl.sim.world import world_from_data
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, PodState, RunStatus
from tpuctl.testing.backend import WORLD_SOURCE, InProcessCli
from tpuctl.testing.cli import Cli

ZONE = "us-central1-a"
WORLD: dict[str, Any] = {
    "project": "tpuctl-sim",
    "speed": 1000,  # a 60 s create takes 60 ms
    "seed": 3,
    "zones": {
        ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}},
        "us-east1-c": {"v5e": {"on_demand": 64, "preemptible": 64}},
    },
    "quotas": {
        "default": {"on_demand": {"zone": 64, "region": 64}, "preemptible": {"zone": 64, "region": 128}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    "durations": {"node_create_s": 60, "node_delete_s": 10, "preemption_grace_s": 1},
}


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return WORLD


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, state_dir: Path, tmp_path: Path) -> None:
    """The CLI's default path, for what reaches hosts: each command serves the simulator of WORLD."""
    world_file = tmp_path / "world.yaml"
    world_file.write_text(yaml.safe_dump(WORLD))
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(state_dir))
    monkeypatch.setenv("TPUCTL_SIM_WORLD", str(world_file))


@pytest.fixture
def behind_the_back(sim_cli: InProcessCli) -> TpuCloud:
    """The cloud layer on the same simulator, with no ledger: what another tool would do."""
    return sim_cli.cloud()


# --- report ------------------------------------------------------------------------------------------


def test_report_bills_a_slice_tpuctl_created(sim_cli: InProcessCli, state_dir: Path) -> None:
    created = sim_cli("pod", "create", "v5e-8", "--spot", "--name", "a", "--zone", ZONE, "-o", "json")
    assert created.code == 0, created.stderr
    sim_cli.clock.advance(600)

    report = sim_cli("cost", "report", "-o", "json")

    assert report.code == 0, report.stderr
    doc = report.json
    assert doc["backend"] == "sim"
    (group,) = doc["groups"]
    assert (group["name"], group["zone"], group["capacity"], group["state"]) == ("a", ZONE, "spot", "READY")
    assert group["price_per_chip_hour"] == 0.245
    with Ledger(state_dir) as ledger:
        pod = ledger.get_pod("a", zone=ZONE)
    assert pod is not None and pod.ready_at is not None
    # Billed from READY until now, the ten minutes that passed (the create itself is not billed).
    assert pod.ready_at == pytest.approx(sim_cli.clock.now() - 600)
    assert group["billed_hours"] * 3600 == pytest.approx(600, abs=0.01)
    assert group["cost_usd"] == pytest.approx(8 * 0.245 * 600 / 3600, abs=1e-5)
    assert doc["prices"]["catalog"]["cached"] is False
    assert doc["untracked"] == [] and doc["reconciled"] == []


def test_untracked_slice_made_outside_tpuctl_is_shown_with_its_rate(
    sim_cli: InProcessCli, behind_the_back: TpuCloud
) -> None:
    behind_the_back.create_node(
        NodeRequest(name="rogue", zone=ZONE, accelerator_type="v5litepod-16",
                    runtime_version="v2-alpha-tpuv5-lite", capacity=CapacityType.ON_DEMAND)
    )  # fmt: skip

    doc = sim_cli("cost", "report", "-o", "json").json

    (rogue,) = doc["untracked"]
    assert (rogue["name"], rogue["zone"], rogue["state"], rogue["capacity"]) == (
        "rogue",
        ZONE,
        "READY",
        "on-demand",
    )
    assert rogue["chips"] == 16
    assert rogue["usd_per_hour"] == pytest.approx(16 * 1.20)
    assert doc["totals"]["untracked_usd_per_hour"] == pytest.approx(19.2)
    assert doc["totals"]["cost_usd"] == 0.0  # not billed to the ledger: its past is unknown
    table = sim_cli("cost", "report")
    assert "untracked slices" in table.stdout and "rogue" in table.stdout


def test_slice_deleted_behind_tpuctls_back_is_closed_when_seen_gone(
    sim_cli: InProcessCli, behind_the_back: TpuCloud, state_dir: Path
) -> None:
    assert sim_cli("pod", "create", "v5e-8", "--spot", "--name", "gone", "--zone", ZONE).code == 0
    assert sim_cli("pod", "create", "v5e-8", "--spot", "--name", "kept", "--zone", ZONE).code == 0
    behind_the_back.delete_node(ZONE, "gone")
    sim_cli.clock.advance(60)

    dry = sim_cli("--dry-run", "cost", "report", "-o", "json").json
    assert dry["reconciled"][0]["recorded"] is False
    with Ledger(state_dir) as ledger:
        pod = ledger.get_pod("gone", zone=ZONE)
        assert pod is not None and pod.alive  # a dry run recorded nothing

    seen_gone_at = sim_cli.clock.now()
    doc = sim_cli("cost", "report", "-o", "json").json

    (action,) = doc["reconciled"]
    assert (action["name"], action["event"], action["recorded"]) == ("gone", "gone", True)
    groups = {g["name"]: g for g in doc["groups"]}
    group = groups["gone"]  # the report that reconciled already bills it only until it was seen gone
    assert (group["state"], group["end_reason"], group["ended_at"]) == ("DELETED", "gone", action["at"])
    with Ledger(state_dir) as ledger:
        pod = ledger.get_pod("gone", zone=ZONE)
        kept = ledger.get_pod("kept", zone=ZONE)
        events = [e.kind for e in ledger.pod_events("gone", zone=ZONE)]
    assert pod is not None and pod.state is PodState.DELETED and pod.end_reason == "gone"
    assert pod.ended_at == seen_gone_at
    assert events[-1] is EventKind.GONE
    # The report computed again after recording bills the live slice until now, the same instant.
    assert kept is not None and kept.ready_at is not None
    assert groups["kept"]["billed_hours"] * 3600 == pytest.approx(seen_gone_at - kept.ready_at, abs=0.01)
    # Closed: a later report bills it only up to the time it was seen gone.
    later = sim_cli("cost", "report", "-o", "json", "--no-reconcile").json
    assert {g["name"]: g["ended_at"] for g in later["groups"]}["gone"] is not None
    assert sim_cli("cost", "report", "-o", "json").json["reconciled"] == []


def test_a_slice_preempted_in_the_cloud_is_marked_preempted_and_then_holds_quota(
    sim_cli: InProcessCli, state_dir: Path
) -> None:
    assert sim_cli("pod", "create", "v5e-8", "--spot", "--name", "p", "--zone", ZONE).code == 0
    sim_cli.clock.advance(20)
    sim_cli.admin.preempt(ZONE, "p", notice=False)
    sim_cli.clock.advance(10)

    doc = sim_cli("cost", "report", "-o", "json").json

    (action,) = doc["reconciled"]
    assert (action["name"], action["event"], action["ledger_state"]) == ("p", "preempted", "READY")
    with Ledger(state_dir) as ledger:
        pod = ledger.get_pod("p", zone=ZONE)
    assert pod is not None and pod.state is PodState.PREEMPTED and pod.deleted_at is None
    # Preempted within its first minute: GCP does not charge it.
    assert doc["totals"]["cost_usd"] == 0.0
    sim_cli.clock.advance(1800)
    later = sim_cli("cost", "report", "-o", "json", "--no-reconcile").json["totals"]
    # (Counted once it ended before the report's end: the report that saw it gone ends at that instant.)
    assert (later["cost_usd"], later["free_preemptions"]) == (0.0, 1)
    assert later["quota_held_chip_hours"] > 0  # still listed PREEMPTED: it holds quota until deleted


def test_csv_has_the_documented_header_and_a_row_per_group(sim_cli: InProcessCli) -> None:
    assert sim_cli("pod", "create", "v5e-8", "--spot", "--name", "a", "--zone", ZONE).code == 0
    sim_cli.clock.advance(60)
    result = sim_cli("cost", "report", "--group-by", "capacity", "-o", "csv", "--no-reconcile")
    lines = result.stdout.strip().splitlines()
    assert lines[0] == (
        "group_by,key,slices,billed_hours,chip_hours,cost_usd,on_demand_usd,spot_savings_usd,recomputed_usd,"
        "quota_held_chip_hours,quota_held_usd,waste_usd"
    )
    assert lines[1].startswith("capacity,spot,1,")
    assert len(lines) == 2


def test_table_shows_totals_chart_and_price_source(sim_cli: InProcessCli) -> None:
    assert sim_cli("pod", "create", "v5e-8", "--spot", "--name", "a", "--zone", ZONE).code == 0
    sim_cli.clock.advance(60)
    result = sim_cli("cost", "report", "--group-by", "zone")
    assert result.code == 0
    assert "total " in result.stdout and "per day (UTC)" in result.stdout
    assert "█" in result.stdout or "▏" in result.stdout or "0.00" in result.stdout
    assert "prices: bundled catalog" in result.stderr


def _ledger_of(state_dir: Path, hours: list[float], now: float) -> None:
    """Slices s0, s1, ... of 8 on-demand v5e chips (1.20 USD/chip-hour), run for ``hours`` each, two days
    before ``now``."""
    from tpuctl.store.records import NewEvent

    start = now - 2 * 86400
    events = []
    for i, h in enumerate(hours):
        common: dict[str, Any] = {"pod": f"s{i}", "zone": ZONE}
        events += [
            NewEvent(EventKind.REQUESTED, accelerator_type="v5litepod-8", chips=8,
                     capacity=CapacityType.ON_DEMAND, price_per_chip_hour=1.2, ts=start, backend="sim",
                     project="tpuctl-sim", **common),
            NewEvent(EventKind.READY, ts=start + 60, **common),
            NewEvent(EventKind.DELETED, ts=start + 60 + h * 3600, **common),
        ]  # fmt: skip
    with Ledger(state_dir) as ledger:
        ledger.record_events_bulk(events)


def test_table_shows_the_50_costliest_and_says_how_to_see_the_rest(
    sim_cli: InProcessCli, state_dir: Path
) -> None:
    _ledger_of(state_dir, [1.0 + i / 100 for i in range(53)], sim_cli.clock.now())

    table = sim_cli("cost", "report", "--no-reconcile")

    assert table.code == 0, table.stderr
    assert "the 50 costliest of 53" in table.stdout
    # Piped, the table is plain: a slice's name is the first word of its line.
    firsts = {line.split()[0] for line in table.stdout.splitlines() if line.strip()}
    shown = [n for n in (f"s{i}" for i in range(53)) if n in firsts]
    assert shown == [f"s{i}" for i in range(3, 53)]  # the three cheapest are left out
    # s0..s2: 8 x 1.20 x (1.00 + 1.01 + 1.02) h = 29.088 USD
    assert "... and 3 more slices costing 29.09 USD" in table.stdout
    assert "--limit 0 shows them all" in table.stdout
    everything = sim_cli("cost", "report", "--no-reconcile", "--limit", "0")
    assert "costliest" not in everything.stdout and "more slices" not in everything.stdout
    everyone = {line.split()[0] for line in everything.stdout.splitlines() if line.strip()}
    assert all(f"s{i}" in everyone for i in range(53))


def test_json_and_csv_list_every_group_unless_limited(sim_cli: InProcessCli, state_dir: Path) -> None:
    _ledger_of(state_dir, [1.0, 3.0, 2.0], sim_cli.clock.now())

    doc = sim_cli("cost", "report", "--no-reconcile", "-o", "json").json
    assert (doc["groups_total"], doc["limit"]) == (3, None)
    assert [g["name"] for g in doc["groups"]] == ["s1", "s2", "s0"]  # most expensive first
    top = sim_cli("cost", "report", "--no-reconcile", "-o", "json", "--limit", "2").json
    assert (top["groups_total"], top["limit"]) == (3, 2)
    assert top["groups"] == doc["groups"][:2]
    assert top["totals"] == doc["totals"] and top["totals"]["cost_usd"] == pytest.approx(8 * 1.2 * 6)
    csv_rows = sim_cli("cost", "report", "--no-reconcile", "-o", "csv").stdout.strip().splitlines()
    assert len(csv_rows) == 1 + 3
    limited = (
        sim_cli("cost", "report", "--no-reconcile", "-o", "csv", "--limit", "1").stdout.strip().splitlines()
    )
    # By slice, the slice's facts follow the key, a column each, then the figures.
    assert len(limited) == 2 and limited[1].startswith(
        "slice,us-central1-a/s1#1,us-central1-a,s1,1,v5litepod-8,8,on-demand,DELETED,,"
    )
    figures = dict(zip(limited[0].split(","), limited[1].split(","), strict=True))
    assert (figures["slices"], figures["billed_hours"]) == ("1", "3.0")


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        (("cost", "report", "--limit", "-1"), "--limit", "-1"),
        (("cost", "report", "--limit", "ten"), "--limit", "ten"),
        (("cost", "report", "--since", "last tuesday"), "--since", "last tuesday"),
        (("cost", "report", "--until", "2026-13-40"), "--until", "2026-13-40"),
        (("cost", "report", "--since", "2026-11-02", "--until", "2026-11-01"), "--since", "2026-11-02"),
        (("cost", "report", "--group-by", "node"), "--group-by", "node"),
        (("cost", "estimate", "v5e-8", "--hours", "-3"), "--hours", "-3"),
        (("cost", "estimate", "v5e-8", "--hours", "soon"), "--hours", "soon"),
        (("run", "x.py", "--type", "v5e-8", "--budget", "-5"), "--budget", "-5"),
        (("pod", "create", "v5e-8", "--max-hours", "0"), "--max-hours", "0"),
    ],
)
def test_bad_input_exits_2_naming_the_value_and_the_fix(
    sim_cli: InProcessCli, args: tuple[str, ...], field: str, value: str
) -> None:
    result = sim_cli(*args, "-o", "json")
    assert result.code == 2, result.stderr
    error = result.json
    assert error["exit_code"] == 2
    assert error["field"] == field and error["value"] == value
    assert error["fix"]
    assert "fix:" in result.stderr


# --- estimate ----------------------------------------------------------------------------------------


def test_estimate_lists_every_offered_option_cheapest_first(sim_cli: InProcessCli) -> None:
    result = sim_cli("cost", "estimate", "v5e-64", "--hours", "12", "-o", "json")

    assert result.code == 0, result.stderr
    est = result.json["estimate"]
    options = est["options"]
    assert [(o["zone"], o["capacity"]) for o in options] == [
        ("us-central1-a", "spot"), ("us-central1-a", "preemptible"), ("us-east1-c", "spot"),
        ("us-east1-c", "preemptible"), ("us-central1-a", "on-demand"), ("us-east1-c", "on-demand"),
    ]  # fmt: skip
    spot = options[0]
    assert spot["usd_per_hour"] == 15.68  # 64 x 0.245
    assert spot["usd_total"] == 188.16
    assert spot["saving_usd"] == pytest.approx((76.8 - 15.68) * 12)
    assert spot["saving_pct"] == pytest.approx(79.58, abs=0.01)
    # 64 chips of on-demand quota per zone, 64 per region: one slice fits; preemptible quota too.
    assert all(o["quota_fits"] for o in options)
    assert est["hours"] == 12.0 and est["chips"] == 64
    assert "us-west4-a" in est["not_offered_in"]


def test_estimate_says_when_quota_does_not_fit(sim_cli: InProcessCli) -> None:
    # 16 of the 64 preemptible chips of us-central1-a's zone quota in use: a spot v5e-64 no longer fits
    # there, still fits in us-east1-c; on-demand quota is separate and free. (A multi-host slice: a
    # single-host v5e draws on the serving quota family instead.)
    assert sim_cli("pod", "create", "v5e-16", "--spot", "--name", "a", "--zone", ZONE).code == 0

    est = sim_cli("cost", "estimate", "v5e-64", "-o", "json").json["estimate"]

    fits = {(o["zone"], o["capacity"]): o["quota_fits"] for o in est["options"]}
    assert fits == {
        (ZONE, "spot"): False, (ZONE, "preemptible"): False, (ZONE, "on-demand"): True,
        ("us-east1-c", "spot"): True, ("us-east1-c", "preemptible"): True, ("us-east1-c", "on-demand"): True,
    }  # fmt: skip
    table = sim_cli("cost", "estimate", "v5e-64")
    assert "short" in table.stdout and "fits" in table.stdout


# --- prices ------------------------------------------------------------------------------------------


def test_refresh_on_the_simulator_takes_the_world_prices(sim_cli: InProcessCli, state_dir: Path) -> None:
    data = {**WORLD, "prices": {"v5e": {"us-central1": {"spot": 0.5}}}}
    sim_cli.sim.engine.install_world(world_from_data(data, "test world"))
    assert sim_cli("pod", "create", "v5e-8", "--spot", "--name", "a", "--zone", ZONE).code == 0

    result = sim_cli("catalog", "prices", "--refresh", "-g", "v5e", "-o", "json")

    assert result.code == 0, result.stderr
    doc = result.json
    assert doc["source"].startswith(f"simulator world {WORLD_SOURCE}")
    assert doc["cached"] is True
    row = next(r for r in doc["prices"] if r["region"] == "us-central1")
    assert (row["on_demand_per_chip_hour"], row["spot_per_chip_hour"]) == (1.2, 0.5)
    # The live slice's price moved: a price_change event, so the report bills each price for its part.
    assert doc["refresh"]["price_changes"] == [{"pod": "a", "zone": ZONE, "old": 0.245, "new": 0.5}]
    with Ledger(state_dir) as ledger:
        pod = ledger.get_pod("a", zone=ZONE)
    assert pod is not None and pod.price_per_chip_hour == 0.5
    report = sim_cli("cost", "report", "-o", "json", "--no-reconcile").json
    assert report["prices"]["catalog"]["source"].startswith("simulator world")
    assert "the simulator serves no billing catalog" in result.stderr or result.stderr == ""


@respx.mock
def test_refresh_from_a_billing_endpoint(sim_cli: InProcessCli, state_dir: Path) -> None:
    base = "https://billing.test"
    sku = {
        "skuId": "X", "description": "Preemptible TpuV5e chip", "serviceRegions": ["us-central1"],
        "category": {"usageType": "OnDemand", "resourceGroup": "TPU"},
        "pricingInfo": [{"pricingExpression": {"usageUnit": "h", "tieredRates": [
            {"unitPrice": {"currencyCode": "USD", "units": "0", "nanos": 300000000}}]}}],
    }  # fmt: skip
    respx.get(f"{base}/v1/services/6F81-5844-456A/skus").respond(200, json={"skus": [sku]})
    respx.get(f"{base}/v1/services/E000-3F24-B8AA/skus").respond(200, json={"skus": []})

    result = sim_cli("catalog", "prices", "--refresh", "--billing-url", base, "-g", "v5e", "-o", "json")

    assert result.code == 0, result.stderr
    doc = result.json
    assert doc["source"].startswith("Cloud Billing Catalog API")
    row = next(r for r in doc["prices"] if r["region"] == "us-central1")
    assert row["spot_per_chip_hour"] == 0.3
    assert row["on_demand_per_chip_hour"] == 1.2  # not listed: from the bundled table, and said so
    assert "v5e/us-central1/on_demand" in doc["refresh"]["filled_from_bundled"]
    assert (state_dir / "prices" / "sim.yaml").exists()
    est = sim_cli("cost", "estimate", "v5e-8", "--zone", ZONE, "-o", "json").json["estimate"]
    assert est["prices"]["cached"] is True
    assert est["options"][0]["usd_per_chip_hour"] == 0.3


def test_refresh_dry_run_writes_nothing(sim_cli: InProcessCli, state_dir: Path) -> None:
    result = sim_cli("--dry-run", "catalog", "prices", "--refresh", "-o", "json")
    assert result.code == 0, result.stderr
    assert result.json["refresh"]["dry_run"] is True
    assert not (state_dir / "prices").exists()


@respx.mock
def test_refresh_from_an_unreachable_endpoint_is_a_cloud_error(
    sim_cli: InProcessCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functools

    from tpuctl.cloud import billing
    from tpuctl.cloud.retry import RetryPolicy

    # The client's waits between its tries are kept, not slept (seconds of real time otherwise).
    waits: list[float] = []
    client = functools.partial(billing.CloudBillingCatalogClient, sleep=waits.append)
    monkeypatch.setattr(billing, "CloudBillingCatalogClient", client)
    respx.get(url__regex=r"https://billing\.test/.*").mock(side_effect=httpx.ConnectError("refused"))
    result = sim_cli("catalog", "prices", "--refresh", "--billing-url", "https://billing.test", "-o", "json")
    assert result.code == 14
    assert "could not connect" in result.json["message"]
    assert len(waits) == RetryPolicy().max_attempts - 1  # every try was made before giving up


# --- budgets -----------------------------------------------------------------------------------------


def test_monthly_budget_warns_on_create_once_exceeded(
    sim_cli: InProcessCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"profiles": {"default": {"monthly_budget": 10}}}))
    monkeypatch.setenv("TPUCTL_CONFIG", str(config))
    first = sim_cli("pod", "create", "v5e-8", "--spot", "--name", "a", "--zone", ZONE)
    assert first.code == 0 and "over the profile's monthly_budget" not in first.stderr
    with Ledger(state_dir) as ledger:  # 12 USD earlier this month
        now = sim_cli.clock.now()
        ledger.record_event(
            EventKind.REQUESTED, pod="old", zone=ZONE, accelerator_type="v5litepod-8", chips=8,
            capacity=CapacityType.ON_DEMAND, price_per_chip_hour=1.5, ts=now - 3600,
        )  # fmt: skip
        ledger.record_event(EventKind.READY, pod="old", zone=ZONE, ts=now - 3600)
        ledger.record_event(EventKind.DELETED, pod="old", zone=ZONE, ts=now - 3600 + 3600)
    second = sim_cli("pod", "create", "v5e-8", "--spot", "--name", "b", "--zone", ZONE)
    assert second.code == 0
    assert "over the profile's monthly_budget of 10.00 USD" in second.stderr


def test_max_hours_labels_the_slice(sim_cli: InProcessCli, state_dir: Path) -> None:
    assert sim_cli("pod", "create", "v5e-8", "--name", "t", "--zone", ZONE, "--max-hours", "1.5").code == 0
    with Ledger(state_dir) as ledger:
        pod = ledger.get_pod("t", zone=ZONE)
    assert pod is not None and pod.labels["tpuctl-max-seconds"] == "5400"


def test_run_stops_at_its_budget_deletes_the_slice_and_exits_7(
    served: None, cli: Cli, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = tmp_path / "proj" / "loop.py"
    program.parent.mkdir()
    program.write_text(
        "import time\nfor i in range(600):\n    print('step', i, flush=True)\n    time.sleep(0.1)\n"
    )
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()

    # 1.96 USD/h; the watch keeps 1 s of polling + --grace + 5 s to delete in hand: 0.001 USD is gone at
    # the first look after READY.
    result = cli("run", "proj/loop.py", "--type", "v5e-8", "--spot", "--zone", ZONE, "--budget", "0.001",
                 "--grace", "1")  # fmt: skip

    assert result.code == 7, result.stderr
    assert "stopped at its budget" in result.stderr
    assert time.monotonic() - started < 60
    with Ledger(state_dir) as ledger:
        (run,) = ledger.list_runs()
        assert run.pod is not None
        pod = ledger.get_pod(run.pod, zone=ZONE)
    assert run.status is RunStatus.BUDGET_EXCEEDED
    assert run.detail is not None and run.detail["budget"]["limit_usd"] == 0.001
    assert pod is not None and pod.state is PodState.DELETED
    # The report bills the run for its slice (through the run's segments on it).
    by_run = cli("cost", "report", "--group-by", "run", "-o", "json", "--no-reconcile").json["groups"]
    groups = {g["key"]: g for g in by_run}
    assert groups[run.run_id]["status"] == "budget_exceeded"
    # Billed, and for no longer than the slice can have lived: the whole command's wall time at 1.96
    # USD/h (a wall-clock bound like "< 0.01 USD" fails on a loaded machine, where setup alone is slow).
    assert 0 < groups[run.run_id]["cost_usd"] <= 1.96 * (time.monotonic() - started) / 3600
    # The allocator does not record the run on the slices it places for a run yet, so the seconds
    # between the run's last segment and the delete stay with "(none)".
    assert set(groups) <= {run.run_id, "(none)"}


# --- the table's figures ------------------------------------------------------------------------------


def _run_report(groups: list[dict[str, Any]], totals: Any) -> Any:
    from tpuctl.services.cost.model import CostReport
    from tpuctl.services.cost.window import GroupBy
    from tpuctl.services.prices import PriceSource

    return CostReport(
        group_by=GroupBy("run"),
        since=None,
        until=1e9,
        now=1e9,
        groups=groups,
        totals=totals,
        by_day=[],
        preemptions=1,
        free_preemptions=0,
        prices=PriceSource("bundled catalog", "2026-01-01", cached=False),
        groups_total=len(groups),
    )


def _group(key: str, *, steps_reported: bool, hours: float) -> dict[str, Any]:
    from tpuctl.services.cost.model import CostLine

    line = CostLine(key, slices=1, billed_hours=hours, chip_hours=hours * 8, cost_usd=hours * 9.6,
                    recomputed_usd=0.0 if not steps_reported else 0.5)  # fmt: skip
    record = line.to_dict()
    if not steps_reported:  # as the service marks a run whose program reports no steps
        record.update(steps=None, recomputed_usd=None, waste_usd=None, steps_reported=False)
    return record


def test_totals_say_unknown_where_the_rows_do_and_short_times_show_their_hours(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tpuctl.cli.cost_cmds import _render_report
    from tpuctl.cli.render import Output
    from tpuctl.services.cost.model import CostLine

    totals = CostLine("total", slices=1, billed_hours=0.0083, chip_hours=0.0664, cost_usd=0.08)
    _render_report(Output(), _run_report([_group("run-a", steps_reported=False, hours=0.0083)], totals))
    table = capsys.readouterr().out
    assert "waste unknown: recomputed work unknown (the program reports no steps)" in table
    assert "waste 0.00" not in table
    # 30 s of a slice is 0.0083 hours, not "0.00" beside its cost.
    (row,) = [line for line in table.splitlines() if line.startswith("run-a")]
    assert row.split()[1:5] == ["1", "0.0083", "0.066", "0.08"], row
    assert "for 0.066 chip-hours" in table

    # One run with steps and one without: the known part is a floor, and the total says so.
    both = [_group("run-a", steps_reported=False, hours=1.0), _group("run-b", steps_reported=True, hours=1.0)]
    totals = CostLine("total", slices=2, billed_hours=2.0, chip_hours=16.0, cost_usd=19.2, recomputed_usd=0.5)
    _render_report(Output(), _run_report(both, totals))
    table = capsys.readouterr().out
    assert (
        "waste at least 0.50 USD: recomputed work at least 0.50 USD (unknown for 1 run whose program "
        "reports no steps)" in table
    )
