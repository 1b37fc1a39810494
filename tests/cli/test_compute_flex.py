"""Flex-start on the simulator: `pod create --queued` on Compute Engine is a flex-start create
(docs/google-facts.md#flex-start): one host an instance that waits PENDING for capacity, several a FLEX_START
template and a BULK MIG made at size 0 and resized to the host count; the wait is bounded by --valid-for,
after which nothing is left and placement fails over like a stockout. Every Compute answer is checked
against Google's compute v1 discovery document (``schema_problems``). The simulator runs in this process
(``sim_cli``): a wait for capacity moves its fake clock instead of real time."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_schema import schema_problems
from compute_cli_helpers import OTHER_ZONE, REGION, WORLD, ZONE, compute_get

from tpuctl.sim import SimAdminClient
from tpuctl.testing.backend import InProcessCli

__all__ = ["schema_problems"]  # a fixture


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return WORLD


@pytest.fixture
def cli(sim_cli: InProcessCli, schema_problems: list[str]) -> InProcessCli:
    return sim_cli


@pytest.fixture
def admin(sim_cli: InProcessCli) -> SimAdminClient:
    return sim_cli.admin


def _get(cli: InProcessCli, path: str) -> httpx.Response:
    return compute_get(cli.admin, path, transport=cli.transport)


def _items(cli: InProcessCli, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = _get(cli, path).json().get("items") or []
    return items


def _pods(cli: InProcessCli) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = cli("pod", "list", "-o", "json").json["pods"]
    return pods


def test_a_queued_tpu7x_8_dry_run_plans_one_flex_start_instance_insert(
    admin: SimAdminClient, cli: InProcessCli
) -> None:
    result = cli(
        "pod",
        "create",
        "tpu7x-8",
        "--queued",
        "--valid-for",
        "30m",
        "--zone",
        ZONE,
        "--dry-run",
        "-o",
        "json",
    )
    assert result.code == 0, result.stderr
    plan = result.json["plan"]
    (request,) = plan["requests"]
    assert request["method"] == "POST" and httpx.URL(request["url"]).path.endswith(f"/zones/{ZONE}/instances")
    body = request["body"]
    assert body["scheduling"] == {
        "provisioningModel": "FLEX_START",
        "maxRunDuration": {"seconds": "604800"},
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["params"] == {"requestValidForDuration": {"seconds": "1800"}}
    # Flex-start is placed as preemptible capacity (its quota: docs/google-facts.md#provisioning-models), not
    # a queued resource.
    assert plan["request"]["flex_start"] is True and plan["request"]["queued"] is False
    assert {c["capacity"] for c in plan["candidates"]} == {"preemptible"}
    chosen = next(c for c in plan["candidates"] if c["zone"] == ZONE)
    assert [q["quota_id"] for q in chosen["quota"]] == ["PREEMPTIBLE-TPU7X-per-project-region"]
    # No flex-start price for TPU7x was found: unknown, never the spot or on-demand one.
    assert chosen["price_per_chip_hour"] is None
    assert admin.status()["nodes"] == []


def test_a_queued_tpu7x_16_dry_run_plans_a_template_a_mig_at_0_and_a_resize_to_2(
    admin: SimAdminClient, cli: InProcessCli
) -> None:
    result = cli(
        "pod", "create", "tpu7x-16", "--queued", "--zone", ZONE, "--name", "fx", "--dry-run", "-o", "json"
    )
    assert result.code == 0, result.stderr
    policy, template, mig, resize = result.json["plan"]["requests"]
    assert httpx.URL(policy["url"]).path.endswith(f"/regions/{REGION}/resourcePolicies")
    assert template["body"]["properties"]["scheduling"]["provisioningModel"] == "FLEX_START"
    assert mig["body"]["targetSize"] == 0 and mig["body"]["targetSizePolicy"] == {"mode": "BULK"}
    url = httpx.URL(resize["url"])
    assert resize["method"] == "POST" and url.path.endswith(f"/zones/{ZONE}/instanceGroupManagers/fx/resize")
    assert url.params["size"] == "2" and resize["body"] is None
    assert result.json["plan"]["request"]["valid_for_s"] == 7200  # the default: flex-start's 2 h cap


def test_a_queued_tpu7x_8_waits_pending_then_becomes_ready(admin: SimAdminClient, cli: InProcessCli) -> None:
    admin.stockout(ZONE)
    created = cli(
        "pod", "create", "tpu7x-8", "--queued", "--zone", ZONE, "--name", "fi", "--no-wait", "-o", "json"
    )
    assert created.code == 0, created.stderr[-3000:]
    instance = _get(cli, f"zones/{ZONE}/instances/fi").json()
    assert instance["status"] == "PENDING"
    assert instance["scheduling"]["provisioningModel"] == "FLEX_START"
    assert [(p["name"], p["state"]) for p in _pods(cli)] == [("fi", "CREATING")]
    admin.stockout(ZONE, clear=True)  # capacity comes: PENDING -> STAGING -> RUNNING
    cli.clock.wait_for(lambda: [p["state"] for p in _pods(cli)] == ["READY"], timeout=600, step=5)
    (pod,) = _pods(cli)
    assert pod["capacity"] == "preemptible" and pod["accelerator_type"] == "tpu7x-8"
    assert cli("pod", "delete", "fi", "--zone", ZONE, "-y").code == 0
    assert _get(cli, f"zones/{ZONE}/instances/fi").status_code == 404


def test_a_queued_tpu7x_16_is_a_mig_made_at_0_resized_to_2_and_ready(
    admin: SimAdminClient, cli: InProcessCli
) -> None:
    created = cli("pod", "create", "tpu7x-16", "--queued", "--zone", ZONE, "--name", "fm", "-o", "json")
    assert created.code == 0, created.stderr[-3000:]
    assert created.json["pod"]["state"] == "READY"
    mig = _get(cli, f"zones/{ZONE}/instanceGroupManagers/fm").json()
    assert mig["targetSize"] == 2 and mig["status"]["isStable"] is True
    template = _get(cli, "global/instanceTemplates/fm").json()
    assert template["properties"]["scheduling"]["provisioningModel"] == "FLEX_START"
    (pod,) = _pods(cli)
    assert (pod["name"], pod["state"], pod["hosts"], pod["capacity"]) == ("fm", "READY", 2, "preemptible")
    assert cli("pod", "delete", "fm", "--zone", ZONE, "-y").code == 0
    assert _get(cli, f"zones/{ZONE}/instanceGroupManagers/fm").status_code == 404


def test_a_flex_instance_not_granted_in_time_fails_over_leaving_nothing(
    admin: SimAdminClient, cli: InProcessCli
) -> None:
    # Both zones price TPU7x alike; placement tries us-central1-ai1a first (zone order), which is out.
    admin.stockout(OTHER_ZONE)
    args = ("tpu7x-8", "--queued", "--valid-for", "5m", "--zone", ZONE, "--zone", OTHER_ZONE)
    result = cli("pod", "create", *args, "-o", "json")
    assert result.code == 0, result.stderr[-3000:]
    attempts = [(a["zone"], a["outcome"]) for a in result.json["placement"]["attempts"]]
    assert attempts == [(OTHER_ZONE, "stockout"), (ZONE, "created")], attempts
    assert _items(cli, f"zones/{OTHER_ZONE}/instances") == []


@pytest.mark.parametrize(("accel", "valid_for"), [("tpu7x-8", "5m"), ("tpu7x-16", "1s")])
def test_a_flex_request_not_granted_in_time_is_exit_5_and_leaves_nothing(
    admin: SimAdminClient, cli: InProcessCli, accel: str, valid_for: str
) -> None:
    # One host: the insert's own deadline (simulated time). Several: tpuctl's bound (its poll's deadline
    # is real time, while its polls wait on the fake clock: one real second of polling here).
    admin.stockout(ZONE)
    result = cli("pod", "create", accel, "--queued", "--valid-for", valid_for, "--zone", ZONE, "--name", "fo")
    assert result.code == 5, result.stderr[-3000:]
    assert admin.status()["nodes"] == []
    assert _items(cli, f"zones/{ZONE}/instances") == []
    assert _items(cli, f"zones/{ZONE}/instanceGroupManagers") == []
    assert _items(cli, "global/instanceTemplates") == []
    assert _items(cli, f"regions/{REGION}/resourcePolicies") == []


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--slices", "2"), "--slices"),
        (("--strategy", "race"), "--strategy race"),
        (("--valid-for", "3h"), "--valid-for"),
    ],
)
def test_queued_resource_only_options_are_refused_on_compute_naming_the_option(
    admin: SimAdminClient, cli: InProcessCli, args: tuple[str, ...], named: str
) -> None:
    result = cli("pod", "create", "tpu7x-8", "--queued", *args, "--zone", ZONE)
    assert result.code == 2, result.stderr
    assert named in result.stderr
    assert admin.status()["nodes"] == []


def test_a_v6e_asked_on_compute_with_queued_is_flex_start_at_its_own_price_not_the_spot_one(
    admin: SimAdminClient, cli: InProcessCli
) -> None:
    args = ("v6e-8", "--api", "compute", "--queued", "--zone", "us-central1-b", "--dry-run", "-o", "json")
    result = cli("pod", "create", *args)
    assert result.code == 0, result.stderr
    plan = result.json["plan"]
    (request,) = plan["requests"]
    assert "/compute/v1/" in request["url"]
    assert request["body"]["scheduling"]["provisioningModel"] == "FLEX_START"
    (chosen,) = [c for c in plan["candidates"] if c["zone"] == "us-central1-b"]
    # Flex-start's own SKU was seen only in europe-west4 and us-east5: here its price is unknown, not
    # the spot price (0.544).
    assert chosen["capacity"] == "preemptible" and chosen["price_per_chip_hour"] is None
