"""Bad input, fuzzed with hypothesis: CLI arguments of the commands that take values (pod create, cost
estimate/report, run), config files, world files and job arguments (run's --env, --workdir, script
paths, program arguments). Never a traceback or an internal error; every rejection exits 2 and names
the field or the value it refused.

Default: 480 cases over all tests (about 40 s). `--slow`: 11,000 (see CASES)."""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hardening_helpers import fast_world, no_crash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuctl.errors import TpuctlError, UsageError
from tpuctl.sim.world import load_world, world_from_data
from tpuctl.testing.backend import InProcessBackend
from tpuctl.testing.cli import CliResult, invoke
from tpuctl.testing.cloud import InProcessSim

# Cases per test: (default, --slow).
# (default suite, --slow): the default's few seeded cases catch a regression in seconds; the long runs find
# new ones.
CASES = {
    "pod_create": (30, 1500),
    "cost": (20, 1000),
    "run": (20, 1000),
    "config": (20, 2500),
    "world": (150, 5000),
}

# Exit codes a fuzzed command may end with: ok, bad input, infeasible, quota, capacity, price cap,
# not found. Never 1 (an internal or unclassified error).
ALLOWED = {0, 2, 3, 4, 5, 6, 11}

hostile = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=string.printable, max_size=20),
    st.sampled_from(
        [
            "",
            " ",
            "-",
            "--",
            "=",
            "-1",
            "0",
            "1e309",
            "nan",
            "inf",
            "-inf",
            "1" * 40,
            "v5e-48",
            "v5e-4",
            "v9z-8",
            "us-central1-a",
            "../../etc/passwd",
            "$(rm -rf /)",
            "'\"",
            "\x00",
            "\n",
            "🙂",
            "K=V",
            "=V",
            "K=",
            "2026-13-45",
            "7d",
            "-7d",
            "1h30m",
            "month",
            "label:",
            "label:team",
            "PT1H",
            "99999999999999999999999",
            "0x10",
            "1_000",
            "--help",
        ]
    ),
)


def examples(request: pytest.FixtureRequest, key: str) -> int:
    default, slow = CASES[key]
    return slow if request.config.getoption("--slow") else default


def fuzz_settings(n: int) -> Callable[[Any], Any]:
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,  # seeded: the same cases every run
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Callable[..., CliResult]]:
    """`tpuctl -o json ARGS` in-process, against one simulator for the whole test (no start per case), in
    this process too (``InProcessBackend``: nothing served, its waits on a fake clock)."""
    with InProcessSim(tmp_path / "sim-state", world_from_data(fast_world(), "test")) as sim:
        backend = InProcessBackend(sim)

        def run(*args: str) -> CliResult:
            return invoke(["-o", "json", *args], backend=backend)

        yield run


def error_doc(result: CliResult) -> dict[str, Any]:
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        doc = None
    assert isinstance(doc, dict) and "error" in doc, f"no JSON error document:\n{result.output}"
    return doc


def check(result: CliResult, args: list[str]) -> None:
    no_crash(result)
    assert result.code in ALLOWED, (args, result.code, result.output)
    if result.code != 2:
        return
    doc = error_doc(result)
    named = [str(doc.get("field") or ""), str(doc.get("value") or "")]
    message = str(doc.get("message", ""))
    # Click splits bundled short options (`-00` is `-0 0`): its message names the first.
    tokens = [a.strip() for a in args] + [a[:2] for a in args if a.startswith("-")]
    mentions = any(t and t in message for t in tokens) or any(n for n in named)
    assert mentions, f"exit 2 names neither the field nor the value: {doc} for {args}"
    assert doc.get("fix"), doc


def _opt(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.lists(values.map(lambda v: [flag, v]), max_size=2).map(lambda xs: [a for x in xs for a in x])


def argv_of(*parts: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    return st.tuples(*parts).map(lambda ps: [a for p in ps for a in p])


types = st.one_of(
    hostile, st.sampled_from(["v5e-4", "v5e-8", "v6e-8", "v5p-8", "v4-8", "v2-8", "v5litepod-4"])
)


def test_fuzz_pod_create_dry_run(request: pytest.FixtureRequest, cli: Callable[..., CliResult]) -> None:
    flags = argv_of(
        types.map(lambda t: [t]),
        _opt("--zone", hostile),
        _opt("--max-price", hostile),
        _opt("--slices", hostile),
        _opt("--capacity-type", hostile),
        _opt("--valid-for", hostile),
        _opt("--race-k", hostile),
        _opt("--strategy", hostile),
        _opt("--label", hostile),
        _opt("--name", hostile),
        _opt("--max-hours", hostile),
        st.lists(st.sampled_from(["--spot", "--preemptible", "--queued", "--no-wait"]), max_size=2),
    )

    @fuzz_settings(examples(request, "pod_create"))
    @given(flags)
    def case(args: list[str]) -> None:
        argv = ["pod", "create", *args, "--dry-run"]
        check(cli(*argv), argv)

    case()


def test_fuzz_cost(request: pytest.FixtureRequest, cli: Callable[..., CliResult]) -> None:
    report = argv_of(_opt("--since", hostile), _opt("--until", hostile), _opt("--group-by", hostile)).map(
        lambda a: ["cost", "report", "--no-reconcile", *a]
    )
    estimate = argv_of(types.map(lambda t: [t]), _opt("--hours", hostile), _opt("--slices", hostile)).map(
        lambda a: ["cost", "estimate", *a]
    )

    @fuzz_settings(examples(request, "cost"))
    @given(st.one_of(report, estimate))
    def case(argv: list[str]) -> None:
        check(cli(*argv), argv)

    case()


def test_fuzz_run_job_arguments(
    request: pytest.FixtureRequest,
    cli: Callable[..., CliResult],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    work = tmp_path / "job"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    scripts = st.one_of(hostile, st.sampled_from(["job/train.py", "job", "job/missing.py", "/etc/passwd"]))
    env = st.one_of(hostile, st.builds(lambda k, v: f"{k}={v}", hostile, hostile))
    workdirs = st.one_of(hostile, st.sampled_from(["job", ".", "/", "job/train.py", "nope"]))
    flags = argv_of(
        scripts.map(lambda s: [s]),
        _opt("--env", env),
        _opt("--workdir", workdirs),
        _opt("--checkpoint-every", hostile),
        _opt("--timeout", hostile),
        _opt("--grace", hostile),
        _opt("--budget", hostile),
        _opt("--max-restarts", hostile),
        _opt("--max-bundle-mb", hostile),
        _opt("--executor", hostile),
        st.sampled_from([["--type", "v5e-4"], ["--pod", "no-such-pod"], ["--type", "v5e-48"]]),
        st.lists(hostile, max_size=3).map(lambda xs: ["--", *xs] if xs else []),
    )

    @fuzz_settings(examples(request, "run"))
    @given(flags)
    def case(args: list[str]) -> None:
        argv = (
            ["run", *args[:-1], "--dry-run"] if args and args[-1:] == ["--"] else ["run", "--dry-run", *args]
        )
        check(cli(*argv), argv)

    case()


yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), hostile),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(hostile, children, max_size=3)
    ),
    max_leaves=8,
)
CONFIG_KEYS = [
    "backend",
    "project",
    "zones",
    "region",
    "capacity_types",
    "max_price",
    "state_dir",
    "output",
    "sim_world",
    "monthly_budget",
    "retry",
    "default_profile",
    "profiles",
    "sim_url",
]


def test_fuzz_config_files(
    request: pytest.FixtureRequest,
    cli: Callable[..., CliResult],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("TPUCTL_CONFIG", str(config))
    profile = st.dictionaries(st.one_of(st.sampled_from(CONFIG_KEYS), hostile), yaml_values, max_size=4)
    documents = st.one_of(
        st.builds(
            lambda p, d: {"default_profile": d, "profiles": {"default": p, "x": p}},
            profile,
            st.sampled_from(["default", "x", "missing"]),
        ),
        profile.map(lambda p: {"profiles": {"default": p}}),
        yaml_values,
    )
    texts = st.one_of(documents.map(lambda d: yaml.safe_dump(d, allow_unicode=True)), st.text(max_size=80))

    @fuzz_settings(examples(request, "config"))
    @given(texts)
    def case(text: str) -> None:
        config.write_text(text, errors="surrogateescape")
        argv = ["cost", "report", "--no-reconcile"]
        result = cli(*argv)
        # A config error names the file (and the field where there is one).
        check(result, [*argv, str(config)])

    case()


WORLD_KEYS = [
    "project",
    "speed",
    "seed",
    "zones",
    "reservations",
    "quotas",
    "prices",
    "latency",
    "faults",
    "durations",
    "preemption",
]


def test_fuzz_world_files(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    base = fast_world()
    path = tmp_path / "world.yaml"
    mutate = st.tuples(st.sampled_from([*WORLD_KEYS, "bogus"]), yaml_values)
    zone_mutation = st.tuples(hostile, st.dictionaries(hostile, yaml_values, max_size=2))
    documents = st.one_of(
        st.lists(mutate, min_size=1, max_size=3).map(lambda ms: {**base, **dict(ms)}),
        zone_mutation.map(lambda zm: {**base, "zones": {**base["zones"], zm[0]: zm[1]}}),
        yaml_values,
    )
    texts = st.one_of(documents.map(lambda d: yaml.safe_dump(d, allow_unicode=True)), st.text(max_size=80))

    @fuzz_settings(examples(request, "world"))
    @given(texts)
    def case(text: str) -> None:
        path.write_text(text, errors="surrogateescape")
        try:
            load_world(path)
        except UsageError as exc:
            assert exc.exit_code == 2
            assert str(path) in str(exc) or getattr(exc, "field", None), str(exc)
        except TpuctlError as exc:  # pragma: no cover - reported with the type
            raise AssertionError(f"world file refused with {type(exc).__name__}, not exit 2: {exc}") from exc

    case()


def test_world_file_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample through the CLI: a bad world file exits 2 naming the file and the field."""
    path = tmp_path / "world.yaml"
    path.write_text(yaml.safe_dump({**fast_world(), "speed": -3}))
    monkeypatch.setenv("TPUCTL_SIM_WORLD", str(path))
    out = invoke(["-o", "json", "pod", "list"])
    assert out.code == 2, out
    doc = json.loads(out.stdout)
    assert str(path) in doc["message"] + str(doc.get("path")) and "speed" in json.dumps(doc), doc
