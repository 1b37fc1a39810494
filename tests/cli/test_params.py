"""The parameter boundary as one table: every numeric or duration flag of every
command, and every numeric setting from the environment and from a profile, given each bad value it can
get, exits 2 with one JSON error naming where the value came from (``field``), the value and the fix.
All of them are refused before a backend is contacted, so no simulator is needed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)


Cli = Callable[..., Result]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run `tpuctl ARGS` in-process and return its exit code and output."""

    def run(*args: str) -> Result:
        from tpuctl.cli.main import run as tpuctl_main

        capsys.readouterr()
        try:
            tpuctl_main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


# Bad values by what the parameter holds. Every kind refuses text, inf and nan; a negative or zero
# value only where the parameter does not allow it.
POSITIVE = ("abc", "-3", "0", "inf", "nan", "-inf")  # USD amounts, hours, MiB: finite and > 0
DURATION = ("abc", "-3", "0", "inf", "nan", "2x")  # seconds or 2h/30m/1d: > 0
GRACE = ("abc", "-3", "inf", "nan", "-1s")  # a duration where 0 is allowed (SIGKILL at once)
COUNT = ("abc", "-3", "0", "inf", "nan", "1.5")  # whole numbers >= 1
COUNT_OR_ZERO = ("abc", "-3", "inf", "nan", "1.5")  # whole numbers >= 0
PORT = ("abc", "-1", "inf", "nan", "65536")

# (command before the flag, flag, bad values). A flag's JSON `field` is the flag itself.
FLAGS: list[tuple[tuple[str, ...], str, tuple[str, ...]]] = [
    (("pod", "create", "v5e-8", "--dry-run"), "--max-price", POSITIVE),
    (("pod", "create", "v5e-8", "--dry-run"), "--max-hours", POSITIVE),
    (("pod", "create", "v5e-8", "--dry-run"), "--slices", COUNT),
    (("pod", "create", "v5e-8", "--dry-run", "--strategy", "race"), "--race-k", COUNT),
    (("pod", "create", "v5e-8", "--dry-run", "--queued"), "--valid-for", DURATION),
    (("run", "train.py", "--type", "v5e-8", "--dry-run"), "--budget", POSITIVE),
    (("run", "train.py", "--type", "v5e-8", "--dry-run"), "--max-hours", POSITIVE),
    (("run", "train.py", "--type", "v5e-8", "--dry-run"), "--timeout", DURATION),
    (("run", "train.py", "--type", "v5e-8", "--dry-run"), "--grace", GRACE),
    (("run", "train.py", "--type", "v5e-8", "--dry-run"), "--checkpoint-every", COUNT),
    (("run", "train.py", "--type", "v5e-8", "--dry-run"), "--max-restarts", COUNT_OR_ZERO),
    (("run", "train.py", "--type", "v5e-8", "--dry-run"), "--max-preemptions", COUNT_OR_ZERO),
    (("run", "train.py", "--type", "v5e-8", "--dry-run"), "--max-bundle-mb", POSITIVE),
    (("runs", "list"), "--limit", COUNT),
    (("runs", "logs", "some-run"), "--worker", COUNT_OR_ZERO),
    (("runs", "resume", "some-run"), "--budget", POSITIVE),
    (("runs", "resume", "some-run"), "--max-preemptions", COUNT_OR_ZERO),
    (("bench", "step", "v5e-4"), "--steps", COUNT),
    (("bench", "step", "v5e-4"), "--batch-per-device", COUNT),
    (("bench", "step", "v5e-4"), "--seq-len", COUNT),
    (("bench", "step", "v5e-4"), "--d-model", COUNT),
    (("bench", "step", "v5e-4"), "--layers", COUNT),
    (("bench", "step", "v5e-4"), "--matmul-n", COUNT),
    (("cost", "estimate", "v5e-8"), "--hours", POSITIVE),
    (("cost", "estimate", "v5e-8"), "--slices", COUNT),
    (("cost", "report", "--no-reconcile"), "--limit", COUNT_OR_ZERO),
    (("sim", "serve"), "--port", PORT),
]

FLAG_CASES = [
    pytest.param(command, flag, value, id=f"{' '.join(command[:2])} {flag} {value}")
    for command, flag, values in FLAGS
    for value in values
]


def _assert_usage_error(result: Result, field: str, value: str) -> dict[str, Any]:
    assert result.code == 2, (result.stdout, result.stderr)
    assert "Infinity" not in result.stdout and "NaN" not in result.stdout
    error: dict[str, Any] = result.json  # one valid JSON document, whatever the value was
    assert error["exit_code"] == 2 and error["error"] in ("usage", "config")
    assert error["field"] == field, error
    assert error["value"] == value, error
    assert error["fix"], error
    assert "backend" not in error  # refused before a backend was opened
    return error


@pytest.mark.parametrize(("command", "flag", "value"), FLAG_CASES)
def test_a_bad_flag_value_exits_2_naming_flag_value_and_fix(
    cli: Cli, command: tuple[str, ...], flag: str, value: str
) -> None:
    # `--flag=value`: a negative value must not read as another option. `-o json` is given before the
    # command: `runs logs` and `sim serve` have no -o of their own.
    _assert_usage_error(cli("-o", "json", *command, f"{flag}={value}"), flag, value)


# Settings that hold numbers: the environment variable and the profile key of each.
SETTINGS = [("TPUCTL_MAX_PRICE", "max_price"), ("TPUCTL_MONTHLY_BUDGET", "monthly_budget")]
# Commands that read the settings before anything else.
SETTINGS_COMMANDS = [("pod", "create", "v5e-8", "--dry-run"), ("cost", "estimate", "v5e-8")]


@pytest.mark.parametrize("command", SETTINGS_COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize(("variable", "key"), SETTINGS)
@pytest.mark.parametrize("value", POSITIVE)
def test_a_bad_environment_value_names_the_variable(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...], variable: str, key: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    error = _assert_usage_error(cli(*command, "-o", "json"), variable, value)
    assert variable in error["message"] and variable in error["fix"]


# YAML values: text, numbers, and YAML's own infinity and not-a-number (.inf, .nan), which arrive as
# floats, with the value they are shown as.
PROFILE_VALUES = [("abc", "abc"), ("-3", "-3"), ("0", "0"), ("inf", "inf"), (".inf", "inf"),
                  (".nan", "nan"), ("-.inf", "-inf")]  # fmt: skip


@pytest.fixture
def profile(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    def write(key: str, text: str) -> Path:
        path = tmp_path / "xdg-config" / "tpuctl" / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"profiles:\n  default:\n    {key}: {text}\n")
        return path

    yield write


@pytest.mark.parametrize("command", SETTINGS_COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize(("variable", "key"), SETTINGS)
@pytest.mark.parametrize(("text", "value"), PROFILE_VALUES)
def test_a_bad_profile_value_names_the_file_and_the_key(
    cli: Cli,
    profile: Callable[[str, str], Path],
    command: tuple[str, ...],
    variable: str,
    key: str,
    text: str,
    value: str,
) -> None:
    path = profile(key, text)
    error = _assert_usage_error(cli(*command, "-o", "json"), f"profiles.default.{key}", value)
    assert error["error"] == "config" and error["path"] == str(path)


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_one_value_gives_one_fix_from_flag_environment_and_profile(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, profile: Callable[[str, str], Path], value: str
) -> None:
    """The same bad price cap from the three sources: the same exit code, value and fix, each naming its
    own source (the example in the fix is written the way that source is)."""
    from_flag = cli("pod", "create", "v5e-8", "--dry-run", f"--max-price={value}", "-o", "json").json
    monkeypatch.setenv("TPUCTL_MAX_PRICE", value)
    from_env = cli("pod", "create", "v5e-8", "--dry-run", "-o", "json").json
    monkeypatch.delenv("TPUCTL_MAX_PRICE")
    profile("max_price", value)
    from_profile = cli("pod", "create", "v5e-8", "--dry-run", "-o", "json").json
    fixes = [
        from_flag["fix"].replace("--max-price 20", "X"),
        from_env["fix"].replace("TPUCTL_MAX_PRICE=20", "X"),
        from_profile["fix"].replace("max_price: 20", "X"),
    ]
    assert len(set(fixes)) == 1, fixes
    assert {e["value"] for e in (from_flag, from_env, from_profile)} == {value}
    assert {e["exit_code"] for e in (from_flag, from_env, from_profile)} == {2}


def test_an_infinite_price_cap_from_the_environment_exits_2(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUCTL_MAX_PRICE", "inf")
    result = cli("pod", "create", "v5e-8", "--dry-run", "-o", "json")
    assert result.code == 2
    assert result.json["field"] == "TPUCTL_MAX_PRICE"  # before: a plan with "max_price_per_hour": Infinity


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("pod", "create", "--dry-run"), "TYPE"),
        (("cost", "estimate", "--"), "TYPE"),
        (("pod", "describe"), "NAME"),
        (("pod", "create", "v5e-8", "--no-such-flag"), "--no-such-flag"),
    ],
)
def test_a_missing_argument_or_unknown_option_is_the_field(
    cli: Cli, args: tuple[str, ...], field: str
) -> None:
    result = cli("-o", "json", *args)
    assert result.code == 2
    assert result.json["field"] == field and result.json["fix"]


def test_runs_describe_with_no_runs_is_not_found_naming_the_run(cli: Cli) -> None:
    # RUN defaults to the latest run: with none, nothing is found (exit 11), as for any name.
    result = cli("-o", "json", "runs", "describe")
    assert result.code == 11
    assert result.json["field"] == "RUN" and result.json["fix"] == "start one with `tpuctl run`"


@pytest.mark.parametrize(
    "flags",
    [
        ("--spot", "--preemptible"),
        ("--capacity-type", "preemptible", "--spot"),
        ("--capacity-type", "on-demand"),
    ],
    ids=" ".join,
)
def test_the_capacity_flags_mean_the_same_on_pod_create_and_run(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...]
) -> None:
    """Each capacity flag adds to the allowed set, and both commands take the cheapest allowed (the one
    meaning docs/configuration.md gives them); before, `--spot --preemptible` was an error on `run`."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    create = cli("pod", "create", "v5e-8", *flags, "--dry-run", "-o", "json")
    assert create.code == 0, create.stderr
    plan = create.json["plan"]
    run = cli("run", "train.py", "--type", "v5e-8", *flags, "--dry-run", "-o", "json")
    assert run.code == 0, run.stderr
    target = run.json["plan"]["target"]
    assert target["capacity"] == plan["chosen"]["capacity"]
    assert target["zone"] == plan["chosen"]["zone"]


def test_services_name_parameters_and_the_cli_shows_flags(cli: Cli) -> None:
    """A service's error names the parameter (race_k); the JSON shows the flag the user typed."""
    from tpuctl.params import FLAGS as TABLE
    from tpuctl.params import flag

    assert flag("race_k") == "--race-k" and flag("TYPE") == "TYPE"
    assert all(spelling.startswith("-") for spelling in TABLE.values())
    result = cli("pod", "create", "v5e-8", "--race-k", "4", "--dry-run", "-o", "json")
    assert result.code == 2 and result.json["field"] == "--race-k"


def refused_dry_run(
    cli: Cli,
    monkeypatch: pytest.MonkeyPatch,
    profile: Callable[[str, str], Path],
    command: tuple[str, ...],
    env: dict[str, str],
    config: str,
) -> dict[str, Any]:
    """The error document of `pod create v5e-8 --dry-run COMMAND` with ``env`` set and ``config`` (one
    ``key: value`` line) in the default profile: exit 2, bad input."""
    for name, text in env.items():
        monkeypatch.setenv(name, text)
    if config:
        profile(*config.split(": ", 1))
    result = cli("-o", "json", "pod", "create", "v5e-8", "--dry-run", *command)
    assert result.code == 2, result.stderr
    return dict(result.json)


@pytest.mark.parametrize(
    ("command", "env", "config", "field", "value"),
    [
        (("--zone", "nowhere"), {}, "", "--zone", "nowhere"),
        ((), {"TPUCTL_ZONES": "nowhere"}, "", "TPUCTL_ZONES", "nowhere"),
        ((), {}, "zones: [nowhere]", "profiles.default.zones", "nowhere"),
        (("--region", "x"), {}, "", "--region", "x"),
        ((), {"TPUCTL_REGION": "x"}, "", "TPUCTL_REGION", "x"),
        ((), {}, "region: x", "profiles.default.region", "x"),
        ((), {"TPUCTL_OUTPUT": "xml"}, "", "TPUCTL_OUTPUT", "xml"),
    ],
)
def test_zones_regions_and_output_name_their_source(
    cli: Cli,
    monkeypatch: pytest.MonkeyPatch,
    profile: Callable[[str, str], Path],
    command: tuple[str, ...],
    env: dict[str, str],
    config: str,
    field: str,
    value: str,
) -> None:
    error = refused_dry_run(cli, monkeypatch, profile, command, env, config)
    assert error["field"] == field and error["fix"], error
    assert value in error.get("value", "") or value in error["message"], error


@pytest.mark.parametrize(
    "command",
    [
        ("pod", "list"),
        ("pod", "gc", "--dry-run"),
        ("pod", "describe", "some-pod"),
        ("pod", "delete", "some-pod", "--dry-run"),
        ("run", "train.py", "--type", "v5e-8", "--dry-run"),
    ],
    ids=" ".join,
)
def test_a_malformed_zone_is_refused_before_a_backend_opens(cli: Cli, command: tuple[str, ...]) -> None:
    _assert_usage_error(cli("-o", "json", *command, "--zone", "nowhere"), "--zone", "nowhere")


def test_a_param_error_names_each_source_its_own_way() -> None:
    from tpuctl.errors import ConfigError
    from tpuctl.params import ParamError, flag_error, usd

    with pytest.raises(ParamError) as info:
        usd("{label} and {eg}", "max_price", per_hour=True)
    err = info.value
    assert err.field == "max_price" and "{label} and {eg}" in err.message  # the value is quoted as given
    env = err.for_source("TPUCTL_MAX_PRICE")
    assert env.field == "TPUCTL_MAX_PRICE" and env.fix and "TPUCTL_MAX_PRICE=20" in env.fix
    key = err.for_source("profiles.team.max_price", path="/etc/tpuctl.yaml")
    assert (
        isinstance(key, ConfigError) and key.path == "/etc/tpuctl.yaml" and "max_price: 20" in (key.fix or "")
    )
    assert flag_error(err).field == "--max-price"


def test_an_explicit_capacity_flag_wins_over_the_profile_on_run(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: Callable[[str, str], Path]
) -> None:
    profile("capacity_types", "[spot]")
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    for flags, expected in ((("--capacity-type", "on-demand"), "on-demand"), ((), "spot")):
        run = cli("run", "train.py", "--type", "v5e-8", *flags, "--dry-run", "-o", "json")
        assert run.code == 0, run.stderr
        assert run.json["plan"]["target"]["capacity"] == expected


@pytest.mark.parametrize(
    ("command", "field", "value", "near"),
    [
        (("pod", "create", "v5e-8", "--zone", "us-centrl1-a"), "--zone", "us-centrl1-a", "us-central1-a"),
        (
            ("pod", "create", "v5e-8", "--zone", "us-centrl1-a", "--dry-run"),
            "--zone",
            "us-centrl1-a",
            "us-central1-a",
        ),
        (
            ("pod", "create", "v5e-8", "--region", "us-centrl1", "--dry-run"),
            "--region",
            "us-centrl1",
            "us-central1",
        ),
        (
            # us-central1-c is as near by spelling, but offers no v5e: the suggestion must offer the type.
            ("run", "train.py", "--type", "v5e-8", "--zone", "us-central1-z", "--dry-run"),
            "--zone",
            "us-central1-z",
            "us-central1-a",
        ),
        (
            ("pod", "create", "v6e-8", "--zone", "us-central1-z", "--dry-run"),
            "--zone",
            "us-central1-z",
            "us-central1-b",
        ),
        (("sim", "stockout", "us-centrl1-a"), "ZONE", "us-centrl1-a", "us-central1-a"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v[:2]),
)
def test_a_typod_zone_or_region_exits_2_with_did_you_mean(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: tuple[str, ...],
    field: str,
    value: str,
    near: str,
) -> None:
    """A zone nobody offers is a usage error (exit 2), not "not offered" (exit 5): a CI gate must not page
    someone about capacity for a typo. Nothing is created."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    result = cli("-o", "json", *command)
    assert result.code == 2, result.stderr
    error = result.json
    assert (error["field"], error["value"]) == (field, value), error
    assert f"did you mean {near}" in error["message"], error
    assert f"use {near}" in error["fix"] or f"use {field} {near}" in error["fix"]
    listed = cli("-o", "json", "pod", "list")
    assert listed.code == 0 and listed.json["pods"] == []


@pytest.mark.parametrize(
    ("command", "env", "config", "field", "fix"),
    [
        (("--zone", "us-central1"), {}, "", "--zone", "use --region us-central1 (any of its zones), or "),
        ((), {"TPUCTL_ZONES": "us-central1"}, "", "TPUCTL_ZONES", "use TPUCTL_REGION=us-central1 "),
        ((), {}, "zones: [us-central1]", "profiles.default.zones", "use region: us-central1 "),
    ],
)
def test_a_region_given_as_a_zone_says_to_use_the_region_setting(
    cli: Cli,
    monkeypatch: pytest.MonkeyPatch,
    profile: Callable[[str, str], Path],
    command: tuple[str, ...],
    env: dict[str, str],
    config: str,
    field: str,
    fix: str,
) -> None:
    error = refused_dry_run(cli, monkeypatch, profile, command, env, config)
    assert (error["field"], error["value"]) == (field, "us-central1"), error
    assert error["message"].startswith(f"{field} 'us-central1' is a region, not a zone"), error
    assert error["fix"].startswith(fix), error


def test_a_region_given_as_a_zone_argument_has_no_region_to_point_to() -> None:
    from tpuctl.params import ParamError, zone

    with pytest.raises(ParamError) as info:
        zone("us-central1", "ZONE")
    assert info.value.fix == "name one of its zones (`tpuctl catalog zones` lists them)"


def test_a_zone_the_backend_offers_beyond_the_catalog_is_accepted() -> None:
    """The simulator's world (or a project) may offer a zone the catalog does not list."""
    from tpuctl.catalog import Catalog
    from tpuctl.params import ParamError
    from tpuctl.services.locations import check_region, check_zones

    class Cloud:
        calls = 0

        def list_zones(self) -> list[str]:
            Cloud.calls += 1
            return ["us-central1-f"]

    catalog = Catalog.load()
    cloud: Any = Cloud()
    assert check_zones(catalog, cloud, ["us-central1-a"]) == ["us-central1-a"]
    assert Cloud.calls == 0  # the catalog knew it: no API call
    assert check_zones(catalog, cloud, ["us-central1-f"]) == ["us-central1-f"]
    assert check_region(catalog, cloud, "us-central1") == "us-central1"
    with pytest.raises(ParamError, match="did you mean us-central1-f"):
        check_zones(catalog, cloud, ["us-central1-g"])


def test_an_option_run_does_not_know_is_refused_with_did_you_mean(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--preemptable` once reached the program and the run billed an on-demand slice; the program's own
    options go after `--`."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    typo = cli("-o", "json", "run", "train.py", "--type", "v5e-8", "--preemptable")
    assert typo.code == 2, typo.stderr
    error = typo.json
    assert error["field"] == "--preemptable"
    assert "did you mean --preemptible?" in error["message"]
    assert "after `--`" in error["fix"] and "--preemptible" in error["fix"]
    assert cli("-o", "json", "pod", "list").json["pods"] == []
    assert cli("-o", "json", "runs", "list").json["runs"] == []
    passed = cli("-o", "json", "run", "train.py", "--type", "v5e-8", "--dry-run", "--", "--preemptable")
    assert passed.code == 0, passed.stderr
    assert passed.json["plan"]["hosts"][0]["argv"][-2:] == ["train.py", "--preemptable"]
    spaced = cli(
        "-o", "json", "run", "train.py", "--type", "v5e-8", "--dry-run", "--", "data.txt", "--lr", "3"
    )
    assert spaced.json["plan"]["hosts"][0]["argv"][-4:] == ["train.py", "data.txt", "--lr", "3"]


def test_networks_are_read_in_every_form_the_apis_take() -> None:
    from tpuctl import params
    from tpuctl.cloud.base import VpcNetwork, VpcSubnetwork

    for given in (
        "vpc",
        "global/networks/vpc",
        "https://www.googleapis.com/compute/v1/projects/proj-1/global/networks/vpc",
    ):
        assert params.network(given).name == "vpc"
    assert params.network("projects/host-proj/global/networks/vpc") == VpcNetwork("vpc", "host-proj")
    assert params.subnetwork("compute/v1/projects/host-proj/regions/us-east5/subnetworks/s") == VpcSubnetwork(
        "s", "host-proj", "us-east5"
    )
    assert params.subnetwork("regions/us-east5/subnetworks/s") == VpcSubnetwork("s", None, "us-east5")
    assert params.network_tags(["a,b", "b", " c "]) == ("a", "b", "c")  # in order, without repeats
    bad_values = (
        ("UPPER", params.network),
        ("-x", params.network),
        ("projects/proj-1/networks/x", params.network),
        ("projects/p1/global/networks/x", params.network),  # not a project id: 6 to 30 characters
        ("regions/us-east5/s", params.subnetwork),
    )
    for bad, parse in bad_values:
        with pytest.raises(params.ParamError):
            parse(bad)
    with pytest.raises(params.ParamError, match="at most 64"):
        params.network_tags([",".join(f"t{i}" for i in range(65))])
    with pytest.raises(params.ParamError, match="give its email"):
        params.service_account("trainer")
