"""One set of placement flags (``tpuctl.cli.placement_flags``): `pod create` and `run` take the same ones,
with the same names and meaning; the names other tools use work or get the right suggestion; and the
hosts' network flags reach the plan and the request bodies. All on the in-process simulator (dry runs and
one create each): no host is reached."""

from __future__ import annotations

from typing import Any

import pytest
from typer.main import get_command

from tpuctl.cli.context import OTHER_TOOLS_NAMES, command_options
from tpuctl.cli.main import app
from tpuctl.cli.placement_flags import PLACEMENT_PARAMS
from tpuctl.testing.backend import InProcessCli

#: `pod create`'s options that are not placement choices a run makes: the slice's own name and software,
#: and waiting (a run always waits).
POD_CREATE_ONLY = {"--name", "--runtime-version", "--wait", "--no-wait"}

PROGRAM = ("--example", "lm")


def _commands() -> dict[str, Any]:
    root = get_command(app)
    return {"run": root.commands["run"], "pod create": root.commands["pod"].commands["create"]}  # type: ignore[attr-defined]


def _params(command: Any) -> dict[str, Any]:
    return {p.name: p for p in command.params}


def _shape(param: Any) -> tuple[Any, ...]:
    """What a flag is to the user: its names, whether it repeats or takes no value, its value's name, its
    help."""
    return (
        tuple(param.opts),
        tuple(param.secondary_opts),
        param.multiple,
        param.is_flag,
        param.metavar,
        param.help,
    )


def test_run_and_pod_create_take_the_same_placement_flags() -> None:
    commands = _commands()
    run, create = _params(commands["run"]), _params(commands["pod create"])
    for name in PLACEMENT_PARAMS:
        assert name in run and name in create, name
        assert _shape(run[name]) == _shape(create[name]), name
    # A flag added to `pod create` is a placement flag `run` takes too, unless it is named above.
    missing = set(command_options(commands["pod create"])) - set(command_options(commands["run"]))
    assert missing <= POD_CREATE_ONLY, missing


def test_gcloud_and_skypilot_names_are_aliases() -> None:
    commands = _commands()
    run, create = _params(commands["run"]), _params(commands["pod create"])
    assert {"--type", "--accelerator-type"} <= set(run["accelerator_type"].opts)
    assert {"--type", "--accelerator-type"} <= set(create["type_option"].opts)
    assert "-d" in run["detach"].opts


def test_run_over_the_cap_is_exit_6_like_pod_create(sim_cli: InProcessCli) -> None:
    created = sim_cli("pod", "create", "--max-price", "1", "--type", "v5e-64", "--dry-run")
    ran = sim_cli("run", *PROGRAM, "--max-price", "1", "--type", "v5e-64", "--dry-run")
    assert created.code == ran.code == 6, (created.stderr, ran.stderr)
    assert "over the price cap of 1.00 USD/h" in ran.stderr


def test_the_cap_from_the_environment_is_raised_with_the_flag_it_names(sim_cli: InProcessCli) -> None:
    env = {"TPUCTL_MAX_PRICE": "1"}
    refused = sim_cli("-o", "json", "run", *PROGRAM, "--type", "v5e-8", "--dry-run", env=env)
    assert refused.code == 6, refused.stderr
    assert refused.json["fix"].startswith("raise --max-price")
    raised = sim_cli(
        "-o", "json", "run", *PROGRAM, "--type", "v5e-8", "--max-price", "20", "--dry-run", env=env
    )
    assert raised.code == 0, raised.stderr
    assert raised.json["plan"]["target"]["create"]["request"]["max_price_per_hour"] == 20.0


def test_accelerator_type_works_on_run_and_pod_create(sim_cli: InProcessCli) -> None:
    for args in (
        ("run", *PROGRAM, "--accelerator-type", "v5e-8"),
        ("pod", "create", "--accelerator-type", "v5e-8"),
        ("pod", "create", "--type", "v5e-8"),
        ("pod", "create", "v5e-8"),
    ):
        planned = sim_cli("-o", "json", *args, "--dry-run")
        assert planned.code == 0, (args, planned.stderr)
        plan = planned.json["plan"]
        request = plan["target"]["create"]["request"] if "target" in plan else plan["request"]
        assert request["accelerator_type"] == "v5litepod-8", args
    both = sim_cli("-o", "json", "pod", "create", "v5e-8", "--type", "v5e-16", "--dry-run")
    assert both.code == 2 and both.json["field"] == "TYPE", both.stderr
    assert "`tpuctl pod create TYPE` or `tpuctl pod create --type TYPE`" in both.json["fix"]
    quota = sim_cli("-o", "json", "quota", "v5e", "--type", "v6e")
    assert quota.code == 2 and quota.json["field"] == "TYPE", quota.stderr
    assert "`tpuctl quota TYPE` or `tpuctl quota --type TYPE`" in quota.json["fix"]
    neither = sim_cli("-o", "json", "pod", "create", "--dry-run")
    assert neither.code == 2 and "pod create v5e-8" in neither.json["fix"], neither.stderr


@pytest.mark.parametrize(
    ("command", "typed", "suggested"),
    [
        (("run", *PROGRAM), "--gpus", "--type"),
        (("run", *PROGRAM), "--use-spot", "--spot"),
        (("run", *PROGRAM), "--max-prce", "--max-price"),
        (("run", *PROGRAM), "--version", None),  # pod create's --runtime-version: `run` has none
        (("pod", "create", "v5e-8"), "--version", "--runtime-version"),
        (("pod", "create", "v5e-8"), "--accelerator_type", "--accelerator-type"),
        (("pod", "create", "v5e-8"), "--reservation", "--reserved"),
    ],
)
def test_suggestions_name_only_flags_the_command_has(
    sim_cli: InProcessCli, command: tuple[str, ...], typed: str, suggested: str | None
) -> None:
    refused = sim_cli("-o", "json", *command, typed, "x", "--dry-run")
    assert refused.code == 2, refused.stderr
    message = refused.json["message"]
    if suggested is None:
        assert "did you mean" not in message, message
    else:
        assert message.endswith(f"did you mean {suggested}?"), message


def test_every_other_tools_name_maps_to_a_flag_some_command_has() -> None:
    """The table never sends anyone to a flag tpuctl does not have (a suggestion is made only where the
    command itself has it)."""
    root = get_command(app)
    everywhere: set[str] = set()
    stack = [root]
    while stack:
        command = stack.pop()
        everywhere.update(command_options(command))
        stack.extend(getattr(command, "commands", {}).values())
    assert set(OTHER_TOOLS_NAMES.values()) <= everywhere


def test_run_takes_reserved_and_queued_capacity_as_pod_create_does(sim_cli: InProcessCli) -> None:
    reserved = sim_cli("-o", "json", "run", *PROGRAM, "--type", "v5e-8", "--reserved",
                       "tpuctl-demo-reservation", "--dry-run")  # fmt: skip
    assert reserved.code == 0, reserved.stderr
    create = reserved.json["plan"]["target"]["create"]
    assert create["request"]["reservation"] == "tpuctl-demo-reservation"
    assert create["chosen"]["capacity"] == "reserved"
    queued = sim_cli("-o", "json", "run", *PROGRAM, "--type", "v5e-8", "--queued", "--dry-run")
    assert queued.code == 0, queued.stderr
    [request] = queued.json["plan"]["target"]["create"]["requests"]
    assert "/queuedResources" in request["url"]
