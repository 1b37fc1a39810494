"""`tpuctl pod create` end to end (in-process CLI, against the simulator through the real client, the
simulator in this process on a fake clock): failover across stocked-out zones, the dry-run plan as a CI
gate and its exit codes, the price cap, quota short everywhere, and bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from allocator_helpers import V5E_ZONES, InProcessEnv

from tpuctl.store.ledger import Ledger
from tpuctl.store.records import AttemptOutcome, PodState
from tpuctl.testing.cli import CliResult

SPOT_Z = "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"
SPOT_R = "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI"
OD_Z = "TPUV5sLitepodPerProjectPerZoneForTPUAPI"

Cli = Callable[..., CliResult]


def zone_flags(zones: list[str]) -> list[str]:
    return [arg for z in zones for arg in ("--zone", z)]


def test_failover_seven_of_eight_zones_stocked_out(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim()
    for zone in V5E_ZONES[:7]:
        env.admin.stockout(zone)

    result = cli(
        "pod", "create", "v5e-16", "--spot", "--name", "fo", *zone_flags(V5E_ZONES), "-o", "json", env=env
    )

    assert result.code == 0, result.stderr
    data = result.json
    placement = data["placement"]
    assert placement["zone"] == "asia-southeast1-b"
    assert [p["name"] for p in data["pods"]] == ["fo"]
    assert data["pod"]["state"] == "READY"
    # Cheapest first: the seven stocked-out zones in price order, then the eighth.
    expected_order = V5E_ZONES
    assert [a["zone"] for a in placement["attempts"]] == expected_order
    assert [a["outcome"] for a in placement["attempts"]] == ["stockout"] * 7 + ["created"]
    with Ledger(env.state_dir) as ledger:
        attempts = ledger.attempts(placement["request_id"])
        assert [(a.zone, a.outcome) for a in attempts] == [
            *((z, AttemptOutcome.STOCKOUT) for z in V5E_ZONES[:7]),
            ("asia-southeast1-b", AttemptOutcome.CREATED),
        ]
        assert all("no more capacity" in (a.message or "") for a in attempts[:7])
        # Each failed zone's incarnation ended FAILED; the placed one is READY.
        pods = ledger.list_pods()
        assert sorted((p.zone, p.state) for p in pods) == sorted(
            [*((z, PodState.FAILED) for z in V5E_ZONES[:7]), ("asia-southeast1-b", PodState.READY)]
        )
    listed = cli("pod", "list", "-o", "json", env=env).json["pods"]
    assert [(p["name"], p["zone"], p["state"]) for p in listed] == [("fo", "asia-southeast1-b", "READY")]
    assert env.admin.status()["queued_resources"] == []


def test_dry_run_plan_is_a_ci_gate_and_mutates_nothing(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim()
    result = cli(
        "pod", "create", "v5e-16", "--spot", "--max-price", "8", "--name", "gate",
        *zone_flags(["us-central1-a", "us-west4-a", "us-east5-b"]), "--dry-run", "-o", "json", env=env,
    )  # fmt: skip

    assert result.code == 0, result.stderr
    data = result.json
    assert (data["backend"], data["dry_run"]) == ("sim", True)
    plan = data["plan"]
    assert (plan["feasible"], plan["verdict"], plan["exit_code"]) == (True, "feasible", 0)
    assert plan["estimated_price_per_hour"] == pytest.approx(3.92)
    assert plan["chosen"]["zone"] == "us-central1-a"
    assert plan["order"] == ["us-central1-a/spot", "us-west4-a/spot"]
    statuses = {(c["zone"], c["status"]) for c in plan["candidates"]}
    assert statuses == {("us-central1-a", "chosen"), ("us-west4-a", "fallback"), ("us-east5-b", "rejected")}
    east = next(c for c in plan["candidates"] if c["zone"] == "us-east5-b")
    assert east["reason"] == "over the price cap: 9.60 USD/h > 8.00 USD/h"
    assert east["within_cap"] is False
    zone_quota = next(q for q in plan["chosen"]["quota"] if q["scope"] == "zone")
    assert zone_quota == {
        "quota_id": SPOT_Z, "scope": "zone", "location": "us-central1-a", "limit": 256, "in_use": 0,
        "needed": 16, "available": 256, "fits": True, "unit": "chips", "preempted_holding": 0,
        "reclaimable": 0, "reclaimable_holders": [],
    }  # fmt: skip
    [request] = plan["requests"]
    assert request["method"] == "POST"
    assert request["url"].startswith(f"{env.url}/v2/projects/tpuctl-sim/locations/us-central1-a/nodes?")
    assert "nodeId=gate" in request["url"]
    body = request["body"]
    assert body["acceleratorType"] == "v5litepod-16"
    assert body["schedulingConfig"] == {"spot": True}
    assert body["labels"]["tpuctl-request"] == plan["request"]["request_id"]
    # Nothing was created, nothing recorded.
    assert env.session().cloud.list_nodes(None) == []
    with Ledger(env.state_dir) as ledger:
        assert list(ledger.events()) == []


def test_dry_run_table_output(in_process_sim: Callable[..., InProcessEnv], cli: Cli) -> None:
    env = in_process_sim()
    result = cli("pod", "create", "v5e-16", "--zone", "us-east5-b", "--dry-run", env=env)
    assert result.code == 0
    assert "dry run" in result.stdout and "verdict: feasible (exit 0)" in result.stdout
    assert "request: POST " in result.stdout


def test_max_price_below_every_candidate_exits_6_with_each_price(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim()
    zones = ["us-central1-a", "us-west4-a", "us-east5-b"]
    args = ["pod", "create", "v5e-16", "--spot", "--max-price", "2.5", *zone_flags(zones)]

    dry = cli(*args, "--dry-run", "-o", "json", env=env)
    assert dry.code == 6
    plan = dry.json["plan"]
    assert (plan["feasible"], plan["verdict"], plan["exit_code"]) == (False, "over_price_cap", 6)
    assert [(c["zone"], c["price_per_hour"], c["reason"]) for c in plan["candidates"]] == [
        ("us-central1-a", pytest.approx(3.92), "over the price cap: 3.92 USD/h > 2.50 USD/h"),
        ("us-west4-a", pytest.approx(7.68), "over the price cap: 7.68 USD/h > 2.50 USD/h"),
        ("us-east5-b", pytest.approx(9.6), "over the price cap: 9.60 USD/h > 2.50 USD/h"),
    ]

    real = cli(*args, "-o", "json", env=env)
    assert real.code == 6
    error = real.json
    assert error["error"] == "over_price_cap"
    assert error["message"] == (
        "every priced candidate for v5litepod-16 is over the price cap of 2.50 USD/h: "
        "us-central1-a spot 3.92 USD/h; us-west4-a spot 7.68 USD/h; us-east5-b spot 9.60 USD/h"
    )
    assert error["fix"] == (
        "raise --max-price to 3.92, the smallest cap that would place it (us-central1-a spot), "
        "or choose a smaller type or fewer slices"
    )
    assert [c["price_per_hour"] for c in error["candidates"]] == [
        pytest.approx(3.92),
        pytest.approx(7.68),
        pytest.approx(9.6),
    ]
    assert "over the price cap of 2.50 USD/h" in real.stderr
    assert env.session().cloud.list_nodes(None) == []


def test_quota_short_everywhere_exits_4_naming_where_needed_available_and_fix(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim(
        quotas={
            "default": {"on_demand": {"zone": 8, "region": 512}, "preemptible": {"zone": 64, "region": 4}}
        }
    )
    result = cli(
        "pod", "create", "v5e-16", "--capacity-type", "on-demand", "--capacity-type", "spot",
        *zone_flags(["us-central1-a", "us-east5-b"]), "-o", "json", env=env,
    )  # fmt: skip

    assert result.code == 4
    error = result.json
    assert error["error"] == "no_quota"
    # 16 chips is over every candidate's LIMIT (on-demand zones 8, spot regions 4): the message says so
    # in one line, and the fix names the limits to raise, not every candidate.
    assert error["message"] == (
        "not enough quota for v5litepod-16 (16 chips) in any of 4 candidates: 16 chips is more than the "
        f"quota limit itself in every one (the highest is 8 chips, {OD_Z} in us-central1-a) "
        "(-o json lists every candidate)"
    )
    assert error["fix"] == (
        f"request a limit of at least 16 chips for {', '.join(sorted([OD_Z, SPOT_R]))} "
        "(https://console.cloud.google.com/iam-admin/quotas?service=tpu.googleapis.com); "
        "or ask for fewer chips (a smaller type, fewer slices)"
    )
    assert len(error["candidates"]) == 4
    assert env.session().cloud.list_nodes(None) == []

    only_on_demand = cli(
        "pod", "create", "v5e-16", "--zone", "us-east5-b", "--dry-run", "-o", "json", env=env
    )
    assert only_on_demand.code == 4
    assert (
        "allow spot capacity (--spot), whose quota is separate from on-demand"
        in only_on_demand.json["plan"]["fix"]
    )


def test_not_offered_anywhere_exits_5(in_process_sim: Callable[..., InProcessEnv], cli: Cli) -> None:
    env = in_process_sim(zones={"us-central1-b": {"v6e": {"on_demand": 64, "preemptible": 64}}})
    # us-central1-b offers only v6e; europe-west4-a is not a zone of this world at all.
    result = cli("pod", "create", "v5e-16", "--zone", "us-central1-b", "--zone", "europe-west4-a",
                 "--dry-run", "-o", "json", env=env)  # fmt: skip
    assert result.code == 5
    plan = result.json["plan"]
    assert plan["verdict"] == "no_capacity"
    assert (
        plan["message"] == "v5litepod-16 is not offered in any zone considered: us-central1-b, europe-west4-a"
    )
    # Rejected candidates are listed by price: us-central1 19.20 USD/h, europe-west4 24.96 USD/h.
    assert [(c["zone"], c["offered"], c["reason"]) for c in plan["candidates"]] == [
        ("us-central1-b", False, "v5litepod-16 is not offered in zone us-central1-b"),
        ("europe-west4-a", False, "v5litepod-16 is not offered in zone europe-west4-a"),
    ]


def test_region_flag_considers_that_regions_zones(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim()
    result = cli("pod", "create", "v5e-4", "--region", "us-east5", "--dry-run", "-o", "json", env=env)
    assert result.code == 0, result.stderr
    assert result.json["plan"]["zones_considered"] == ["us-east5-b"]


def test_create_warns_when_preempted_slices_hold_needed_quota(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim(quotas={"default": {"preemptible": {"zone": 16, "region": 512}}})
    assert (
        cli("pod", "create", "v5e-16", "--spot", "--zone", "us-central1-a", "--name", "old", env=env).code
        == 0
    )
    env.admin.preempt("us-central1-a", "old", notice=False)
    result = cli("pod", "create", "v5e-16", "--spot", "--zone", "us-central1-a", "--zone", "us-west4-a",
                 "--name", "new", env=env)  # fmt: skip
    assert result.code == 0, result.stderr
    assert "warning:" in result.stderr
    assert "slice old (PREEMPTED, us-central1-a)" in " ".join(result.stderr.split())
    assert "placed new in us-west4-a" in result.stdout


BAD_INPUT: list[tuple[list[str], dict[str, Any]]] = [
    (
        ["--capacity-type", "cheap"],
        {"field": "--capacity-type", "value": "cheap",
         "message": "unknown capacity type 'cheap'",
         "fix": "use one of: on-demand, spot, preemptible, reserved, queued "
                "(repeat the flag to allow several)"},
    ),
    (
        ["--capacity-type", "reserved"],
        {"field": "--capacity-type", "value": "reserved",
         "message": "reserved capacity needs a reservation name",
         "fix": "pass --reserved RESERVATION_NAME (it implies --capacity-type reserved)"},
    ),
    (
        ["--reserved", " "],
        {"field": "--reserved", "message": "--reserved needs a reservation name, got an empty one"},
    ),
    (
        ["--max-price=-5"],
        {"field": "--max-price", "value": "-5",
         "message": "--max-price must be a positive number of USD per hour, got '-5'",
         # One fix for the price cap from every source (flag, environment, profile).
         "fix": "give a positive number of USD per hour for the whole request (all slices), "
                "e.g. --max-price 20"},
    ),
    (
        ["--max-price", "-5"],
        {"field": "--max-price", "value": "-5"},
    ),
    (
        ["--max-price", "cheap"],
        {"field": "--max-price", "value": "cheap", "message": "--max-price 'cheap' is not a number"},
    ),
    (
        ["--slices", "0"],
        {"field": "--slices", "value": "0", "message": "--slices must be a whole number >= 1, got '0'",
         "fix": "use --slices 1 for one slice, or N >= 2 for N slices through one queued resource "
                "(multislice)"},
    ),
    (
        ["--queued", "--valid-for", "a while"],
        {"field": "--valid-for", "value": "a while",
         "message": "cannot parse --valid-for 'a while' as a duration",
         "fix": "use a duration such as 2h, 30m, 1h30m, 1d or 3600s"},
    ),
    (
        ["--strategy", "race", "--no-wait"],
        {"field": "--no-wait", "message": "--strategy race cannot be combined with --no-wait"},
    ),
    (
        ["--race-k", "4"],
        {"field": "--race-k", "value": "4", "message": "--race-k only applies to --strategy race"},
    ),
    (
        ["--strategy", "fastest"],
        {"field": "--strategy", "value": "fastest", "message": "unknown strategy 'fastest'"},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "expected"), BAD_INPUT, ids=[" ".join(f) for f, _ in BAD_INPUT])
def test_bad_input_exits_2_naming_value_and_fix(cli: Cli, flags: list[str], expected: dict[str, Any]) -> None:
    # No simulator is given: bad input must be refused before anything is contacted.
    result = cli("pod", "create", "v5e-16", *flags, "-o", "json")
    assert result.code == 2, result.stdout + result.stderr
    error = result.json
    assert error["error"] == "usage" and error["exit_code"] == 2
    for key, value in expected.items():
        assert error[key] == value
    assert error["fix"]
    assert "backend" not in error  # refused before a backend was opened


def test_bad_input_table_output_names_value_and_fix(cli: Cli) -> None:
    result = cli("pod", "create", "v5e-16", "--valid-for", "2h")
    assert result.code == 2
    assert "--valid-for only applies to queued resources" in result.stderr
    assert "fix:" in result.stderr and "add --queued" in result.stderr


def test_every_feasible_zone_stocked_out_exits_5_and_leaves_nothing(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim()
    zones = ["us-central1-a", "us-west4-a"]
    for zone in zones:
        env.admin.stockout(zone)
    result = cli("pod", "create", "v5e-4", "--spot", *zone_flags(zones), "-o", "json", env=env)
    assert result.code == 5
    error = result.json
    assert error["error"] == "no_capacity"
    assert error["message"].startswith(
        "no capacity: every feasible candidate failed: us-central1-a spot: stockout"
    )
    assert [(a["zone"], a["outcome"]) for a in error["attempts"]] == [
        ("us-central1-a", "stockout"),
        ("us-west4-a", "stockout"),
    ]
    assert "--queued" in error["fix"]
    assert env.admin.status()["nodes"] == []


def test_a_name_in_use_is_refused_before_creating(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim()
    assert cli("pod", "create", "v5e-4", "--zone", "us-west4-a", "--name", "dup", env=env).code == 0
    again = cli("pod", "create", "v5e-4", "--zone", "us-east5-b", "--name", "dup", "-o", "json", env=env)
    assert again.code == 12
    assert again.json["message"] == "a slice named 'dup' already exists in us-west4-a (READY)"
    assert [n["zone"] for n in env.admin.status()["nodes"]] == ["us-west4-a"]
