"""The saved request: the job document (the same keys a user writes) and, apart, the run's own state.
Written atomically and durably (0600, data and directory fsynced; a write that fails half way leaves the
previous request whole); read back into an equal request, from this form and from every form written
before it; secret values never in it."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuctl.catalog import CapacityType, Catalog, Surface
from tpuctl.cloud.base import HostNetwork, VpcNetwork, VpcSubnetwork
from tpuctl.jobs.document import run_request_from_document
from tpuctl.jobs.load import load_job_text
from tpuctl.jobs.model import JobFile
from tpuctl.services.placement import Strategy
from tpuctl.services.placement_choices import PlacementChoices
from tpuctl.services.run.model import RecoveryPolicy, RunRequest
from tpuctl.services.run.rundir import RunDir
from tpuctl.services.run.saved import (
    JOB_PART,
    RUN_PART,
    load_request,
    parse_request,
    record_request,
    save_request,
    saved_request,
    with_saved_requirements,
)
from tpuctl.store.ledger import Ledger
from tpuctl.store.secrets import load_secret_key

NETWORK = HostNetwork(
    VpcNetwork("shared", "host-proj"), VpcSubnetwork("s1", "host-proj", "us-central1"), ("tpu",)
)


def _rich_request() -> RunRequest:
    """A request with every field set, as `tpuctl run job.yaml` with many flags would make it."""
    return RunRequest(
        command='python3 -m x "$@"', args=("--lr", "3e-4"), workdir="/home/u/proj", env=("A=1", "MODE=fast"),
        secret_names=("HF_TOKEN",), priority="batch", workspace="ml", labels={"team": "ml", "job": "lm"},
        accelerator_type="v5e-16", other_accelerator_types=("v6e-8",), type_preference="cheapest", slices=2,
        placement=PlacementChoices(
            zones=("us-central1-a", "us-east5-b"), region="us-central1", capacity_types=(CapacityType.SPOT,),
            reserved="r1", max_price=30.0, queued=True, valid_for_s=600.0, strategy=Strategy.RACE, race_k=2,
            surface=Surface.COMPUTE, network=NETWORK, service_account="t@p.iam.gserviceaccount.com",
        ),
        keep_pod=True, checkpoint_every=50, checkpoint_dir="gs://b/c", executor="ssh", timeout_s=7200.0,
        grace_s=3.0, max_hours=6.0, deadline_at=1_800_005_400.0, bundle_limit_bytes=12_345_678,
        run_id="run-x", python="/usr/bin/python3", ssh_remote_root="/opt/t", setup=("echo hi",),
        requirements="/home/u/proj/r.txt", runtime_deps=False, bucket="b", ssh_proxy_command="nc %h %p",
        assumed_price_per_hour=12.0,
    )  # fmt: skip


def _old_record(request: RunRequest, *, run_id: str, budget_usd: float | None, policy: RecoveryPolicy) -> Any:
    """A record as the release before the job document saved it: the request's fields."""
    data = dataclasses.asdict(request)
    data["placement"] = request.placement.to_dict()
    data["run_id"] = run_id
    return {"request": data, "budget_usd": budget_usd, "policy": policy.to_dict()}


def _save(run_dir: RunDir, budget: float | None) -> Path:
    return save_request(
        run_dir, RunRequest(example="lm", env=("TOKEN=s3cret",)), run_id="run-x", budget_usd=budget,
        policy=RecoveryPolicy(max_preemptions=3),
    )  # fmt: skip


def test_the_saved_request_is_the_job_document_and_the_runs_own_state_apart(tmp_path: Path) -> None:
    run_dir = RunDir.of(tmp_path, "run-x")
    policy = RecoveryPolicy(max_restarts=2, max_preemptions=9, poll_s=1.0)
    path = save_request(run_dir, _rich_request(), run_id="run-x", budget_usd=40.0, policy=policy)
    record = json.loads(path.read_text())
    assert sorted(record) == [JOB_PART, RUN_PART]
    job = record[JOB_PART]
    JobFile.model_validate(job)  # only a job file's keys, of a job file's types
    assert job["run"] == 'python3 -m x "$@"' and job["budget"] == 40.0 and job["max_preemptions"] == 9
    assert job["resources"]["accelerators"] == {"v5e-16": None, "v6e-8": None}
    assert job["secrets"] == {"HF_TOKEN": None}
    assert record[RUN_PART] == {
        "run_id": "run-x", "deadline_at": 1_800_005_400.0, "executor": "ssh", "python": "/usr/bin/python3",
        "ssh_remote_root": "/opt/t", "network_settled": True, "recovery": {"poll_s": 1.0},
    }  # fmt: skip
    saved = load_request(run_dir)
    assert saved.request == _rich_request() and saved.policy == policy and saved.budget_usd == 40.0


def test_the_saved_job_is_a_job_file_a_server_takes(tmp_path: Path) -> None:
    """The document part is what a user writes: as YAML, it loads as a job file (its workdir checked
    where it is given, its secret taken from the submitting environment)."""
    import yaml

    from tpuctl.jobs.request import build

    request = dataclasses.replace(_rich_request(), workdir=str(tmp_path))
    path = save_request(RunDir.of(tmp_path, "run-x"), request, run_id="run-x", budget_usd=None,
                        policy=RecoveryPolicy())  # fmt: skip
    text = yaml.safe_dump(json.loads(path.read_text())[JOB_PART])
    loaded = load_job_text(text, "job.yaml")
    job = build(loaded.values, catalog=Catalog.load(), source=loaded.source, environ={"HF_TOKEN": "v"})
    assert job.request.command == request.command and job.request.workdir == str(tmp_path)
    assert job.request.other_accelerator_types == ("v6e-8",) and dict(job.secret_values) == {"HF_TOKEN": "v"}


def test_a_request_saved_by_the_release_before_loads_into_an_equal_request(tmp_path: Path) -> None:
    request = _rich_request()
    policy = RecoveryPolicy(max_restarts=2, max_preemptions=9, poll_s=1.0)
    run_dir = RunDir.of(tmp_path, "run-x").make()
    run_dir.request_file.write_text(
        json.dumps(_old_record(request, run_id="run-x", budget_usd=40.0, policy=policy))
    )
    saved = load_request(run_dir)
    assert saved.request == request and saved.policy == policy and saved.budget_usd == 40.0


def test_a_ledger_record_of_the_release_before_loads_with_its_env_and_program_place(tmp_path: Path) -> None:
    """As the release before wrote it to the ledger: env values in the run's secret, marked at the top,
    with the script's place in the bundle and the requirements' text."""
    from tpuctl.services.run.saved import ENV_SECRET

    request = _rich_request()
    key = load_secret_key(env_key=None, key_file=tmp_path / "secret.key")
    record = _old_record(dataclasses.replace(request, env=()), run_id="run-x", budget_usd=None,
                         policy=RecoveryPolicy())  # fmt: skip
    del record["request"]["env"]
    record.update(env_in_secret=True, script_in_bundle="train.py", requirements_text="numpy\n")
    with Ledger(tmp_path / "shared") as ledger:
        ledger.create_run("run-x", script="train.py")
        ledger.save_run_request("run-x", json.dumps(record, sort_keys=True))
        ledger.put_secret("run-x", ENV_SECRET, json.dumps(list(request.env)).encode(), key)
        saved = saved_request(ledger, "run-x", RunDir.of(tmp_path / "two", "run-x"), lambda: key)
    assert saved.request == request
    assert (saved.script_in_bundle, saved.requirements_text) == ("train.py", "numpy\n")


def test_the_saved_request_is_private_in_a_private_directory(tmp_path: Path) -> None:
    run_dir = RunDir.of(tmp_path, "run-x")
    path = _save(run_dir, 5.0)
    assert path == run_dir.request_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(run_dir.root.stat().st_mode) == 0o700
    assert sorted(p.name for p in run_dir.root.iterdir()) == ["request.json"]  # no temporary file left
    saved = load_request(run_dir)
    assert saved.budget_usd == 5.0 and saved.policy.max_preemptions == 3
    assert saved.request.run_id == "run-x" and saved.request.env == ("TOKEN=s3cret",)


def test_the_data_and_the_directory_entry_are_fsynced_before_save_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = RunDir.of(tmp_path, "run-x").make()
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        # What was synced: a regular file (the data) or a directory (the rename's entry).
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _save(run_dir, None)
    assert synced == ["file", "dir"]


def test_a_save_that_fails_half_way_keeps_the_old_request_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = RunDir.of(tmp_path, "run-x")
    _save(run_dir, 1.0)
    before = run_dir.request_file.read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        _save(run_dir, 2.0)
    assert run_dir.request_file.read_bytes() == before
    assert json.loads(before)[JOB_PART]["budget"] == 1.0
    assert sorted(p.name for p in run_dir.root.iterdir()) == ["request.json"]


def test_the_requirements_text_travels_in_the_ledger_and_is_written_where_the_run_is_resumed(
    tmp_path: Path,
) -> None:
    given_file = tmp_path / "one" / "proj" / "requirements.txt"
    request = RunRequest(example="lm", requirements=str(given_file))
    key = load_secret_key(env_key=None, key_file=tmp_path / "secret.key")
    with Ledger(tmp_path / "shared") as ledger:
        ledger.create_run("run-x", script="example:lm")
        one = RunDir.of(tmp_path / "one", "run-x")
        record_request(ledger, one, request, run_id="run-x", budget_usd=None, policy=RecoveryPolicy(),
                       key=key, requirements_text="numpy==2.1.0\n")  # fmt: skip
        # A later save without it (resume's new budget) keeps it.
        record_request(ledger, one, request, run_id="run-x", budget_usd=3.0, policy=RecoveryPolicy(), key=key)
        two = RunDir.of(tmp_path / "two", "run-x")
        saved = saved_request(ledger, "run-x", two)
    assert saved.requirements_text == "numpy==2.1.0\n" and saved.budget_usd == 3.0
    resumed = with_saved_requirements(saved.request, saved, two)
    assert resumed.requirements is not None and not given_file.exists()  # machine one's file is not needed
    written = Path(resumed.requirements)
    assert written.parent == two.root and written.read_text() == "numpy==2.1.0\n"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    # A run without --requirements gets none, whatever the record says.
    assert with_saved_requirements(RunRequest(example="lm"), saved, two).requirements is None


def test_env_values_travel_encrypted_and_come_back_only_with_the_key(tmp_path: Path) -> None:
    secret = "SENTINEL-env-value-7f3a"
    request = RunRequest(example="lm", env=(f"API_TOKEN={secret}", "MODE=fast"))
    key = load_secret_key(env_key=None, key_file=tmp_path / "secret.key")
    with Ledger(tmp_path / "shared") as ledger:
        ledger.create_run("run-x", script="example:lm")
        one = RunDir.of(tmp_path / "one", "run-x")
        record_request(
            ledger, one, request, run_id="run-x", budget_usd=None, policy=RecoveryPolicy(), key=key
        )
        two = RunDir.of(tmp_path / "two", "run-x")
        with_key = saved_request(ledger, "run-x", two, lambda: key).request
        without = saved_request(ledger, "run-x", two).request
    assert with_key.env == request.env  # another machine with the team's key restarts with the same --env
    assert without.env == ()  # a reader without the key gets none of them
    stored = b"".join(p.read_bytes() for p in (tmp_path / "shared").iterdir() if p.is_file())
    assert secret.encode() not in stored and b"MODE=fast" not in stored
    assert secret not in one.request_file.read_text()


def test_the_runs_deadline_travels_with_its_request_and_is_kept_by_a_resume(tmp_path: Path) -> None:
    """``run --max-hours``: fixed once, when the run was first prepared; another machine's resume
    prepares the same moment, not a new one H hours from then."""
    request = RunRequest(example="lm", max_hours=1.5, deadline_at=1_800_005_400.0)
    run_dir = RunDir.of(tmp_path, "run-x")
    save_request(run_dir, request, run_id="run-x", budget_usd=None, policy=RecoveryPolicy())
    again = load_request(run_dir).request
    assert (again.max_hours, again.deadline_at) == (1.5, 1_800_005_400.0)


def test_a_network_settled_at_submission_stays_settled_when_none_was_named(tmp_path: Path) -> None:
    """The CLI fixes the hosts' network when the run is submitted (the project's default where none is
    named): a resume on a machine whose profile names another network must not move the hosts."""
    run_dir = RunDir.of(tmp_path, "run-x")
    for network in (HostNetwork(), None, NETWORK):
        request = RunRequest(example="lm", placement=PlacementChoices(network=network))
        save_request(run_dir, request, run_id="run-x", budget_usd=None, policy=RecoveryPolicy())
        assert load_request(run_dir).request.placement.network == network


def test_a_request_saved_with_one_capacity_loads_as_that_allowed_set(tmp_path: Path) -> None:
    # Requests saved before capacity sets carried one "capacity"; on-demand meant "none named".
    for saved, expected in (("spot", (CapacityType.SPOT,)), ("on-demand", ())):
        record = _old_record(
            RunRequest(example="lm"), run_id="run-x", budget_usd=None, policy=RecoveryPolicy()
        )
        del record["request"]["placement"]
        record["request"]["capacity"] = saved
        assert parse_request(record).request.placement.capacity_types == expected


def test_a_request_saved_before_placement_choices_keeps_its_zone_api_and_capacity() -> None:
    record = _old_record(RunRequest(example="lm"), run_id="run-x", budget_usd=None, policy=RecoveryPolicy())
    del record["request"]["placement"]
    record["request"].update(zone="us-east5-b", api="compute", capacity_types=["spot"])
    assert parse_request(record).request.placement == PlacementChoices(
        zones=("us-east5-b",), capacity_types=(CapacityType.SPOT,), surface=Surface.COMPUTE
    )


def test_a_bad_saved_document_names_where_it_is_and_the_key() -> None:
    from tpuctl.errors import UsageError

    record = {JOB_PART: {"example": "lm", "resources": {"use_spott": True}}, RUN_PART: {"run_id": "run-x"}}
    with pytest.raises(UsageError) as raised:
        parse_request(record, where="the ledger's saved request of run run-x")
    assert "the ledger's saved request of run run-x" in str(raised.value)
    assert "use_spott" in str(raised.value)


# --- the round trip, over every field a request holds --------------------------------------------------

_NAME = st.from_regex(r"[a-z][a-z0-9_-]{0,12}", fullmatch=True)
_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters="\x7f"), max_size=20)
_PATH = _NAME.map(lambda n: f"/home/u/{n}")
_AMOUNT = st.integers(1, 100_000).map(lambda cents: cents / 100)
_SECONDS = st.integers(1, 10**6).map(float)
_ENV_NAME = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: not n.startswith("TPUCTL_")
)
_TYPES = ("v5e-16", "v6e-8", "v5e-8", "v5p-8", "v4-8")
_NETWORKS = (None, HostNetwork(), NETWORK, HostNetwork(VpcNetwork("vpc"), None, ("a", "b")))


@st.composite
def _placements(draw: st.DrawFn, *, one_type: bool) -> PlacementChoices:
    optional = st.none
    return PlacementChoices(
        zones=tuple(draw(st.lists(st.sampled_from(["us-central1-a", "us-east5-b", "europe-west4-a"]),
                                  unique=True, max_size=3))),
        region=draw(optional() | st.sampled_from(["us-central1", "us-east5"])),
        capacity_types=tuple(draw(st.lists(st.sampled_from(list(CapacityType)), unique=True, max_size=3))),
        reserved=draw(optional() | _NAME),
        max_price=draw(optional() | _AMOUNT),
        queued=draw(st.booleans()),
        valid_for_s=draw(optional() | _SECONDS),
        strategy=draw(st.sampled_from(list(Strategy))),
        race_k=draw(optional() | st.integers(1, 5)),
        surface=draw(optional() | st.sampled_from(list(Surface))),
        network=draw(st.sampled_from(_NETWORKS)),
        service_account=draw(optional() | st.just("trainer@p.iam.gserviceaccount.com")),
        runtime_version=draw(optional() | st.just("v2-alpha-tpuv5-lite")) if one_type else None,
    )  # fmt: skip


@st.composite
def _requests(draw: st.DrawFn) -> RunRequest:
    optional = st.none
    types = draw(st.lists(st.sampled_from(_TYPES), unique=True, max_size=3))
    env = draw(st.dictionaries(_ENV_NAME, _TEXT, max_size=3))
    secrets = draw(st.lists(_ENV_NAME.filter(lambda n: n not in env), unique=True, max_size=2))
    program = draw(st.sampled_from(["script", "command", "example"]))
    labels = draw(st.dictionaries(_NAME.filter(lambda k: not k.startswith("tpuctl")), _NAME, max_size=3))
    return RunRequest(
        script=draw(_PATH) if program == "script" else None,
        command=draw(_TEXT.filter(str.strip)) if program == "command" else None,
        example="lm" if program == "example" else None,
        args=tuple(draw(st.lists(_TEXT, max_size=3))),
        workdir=draw(optional() | _PATH),
        env=tuple(f"{k}={v}" for k, v in env.items()),
        secret_names=tuple(secrets),
        priority=draw(optional() | st.sampled_from(["production", "interactive", "batch"])),
        workspace=draw(optional() | _NAME),
        labels=labels,
        pod=draw(optional() | _NAME),
        accelerator_type=types[0] if types else None,
        other_accelerator_types=tuple(types[1:]),
        type_preference=draw(st.sampled_from(["ordered", "cheapest"])) if types else "ordered",
        slices=draw(st.integers(1, 4)),
        placement=draw(_placements(one_type=len(types) <= 1)),
        keep_pod=draw(st.booleans()),
        checkpoint_every=draw(optional() | st.integers(1, 1000)),
        checkpoint_dir=draw(optional() | _NAME.map(lambda n: f"gs://b/{n}")),
        executor=draw(optional() | st.just("ssh")),
        timeout_s=draw(optional() | _SECONDS),
        grace_s=draw(st.integers(0, 60).map(float)),
        max_hours=draw(optional() | _AMOUNT),
        deadline_at=draw(optional() | st.floats(1e9, 3e9)),
        bundle_limit_bytes=draw(st.integers(1, 2**34)),
        run_id="run-x",
        python=draw(optional() | _PATH),
        ssh_remote_root=draw(st.sampled_from([".tpuctl", "/opt/tpuctl"])),
        setup=tuple(draw(st.lists(_TEXT, max_size=2))),
        requirements=draw(optional() | _PATH),
        runtime_deps=draw(st.booleans()),
        bucket=draw(optional() | _NAME),
        ssh_proxy_command=draw(optional() | st.just("nc %h %p")),
        assumed_price_per_hour=draw(optional() | _AMOUNT),
    )


_POLICIES = st.builds(
    RecoveryPolicy,
    max_restarts=st.integers(0, 5),
    max_preemptions=st.integers(0, 50),
    poll_s=st.none() | _SECONDS,
    confirm_polls=st.integers(1, 5),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=_requests(), policy=_POLICIES, budget=st.none() | _AMOUNT)
def test_any_request_saved_then_loaded_is_the_same_request(
    tmp_path: Path, request: RunRequest, policy: RecoveryPolicy, budget: float | None
) -> None:
    run_dir = RunDir.of(tmp_path, "run-x")
    save_request(run_dir, request, run_id="run-x", budget_usd=budget, policy=policy)
    saved = load_request(run_dir)
    assert (saved.request, saved.policy, saved.budget_usd) == (request, policy, budget)
    # The document alone (what a server takes) gives the same request, less the run's own state.
    job = json.loads(run_dir.request_file.read_text())[JOB_PART]
    asked = run_request_from_document(job, catalog=Catalog.load())
    expected = dataclasses.replace(
        request, run_id=None, deadline_at=None, executor=None, python=None, ssh_remote_root=".tpuctl"
    )
    if request.placement.network == HostNetwork():  # settled when submitted: the run's state says so
        expected = dataclasses.replace(
            expected, placement=dataclasses.replace(request.placement, network=None)
        )
    assert asked.request == expected


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=_requests(), values=st.lists(st.from_regex(r"SECRET-[a-z0-9]{12}", fullmatch=True),
                                              min_size=1, max_size=3, unique=True))  # fmt: skip
def test_secret_values_never_reach_the_saved_request_and_env_values_only_encrypted(
    tmp_path: Path, request: RunRequest, values: list[str]
) -> None:
    """A run's secrets are names in the saved request; its env values go into the ledger encrypted.
    The record (ledger and local file) holds neither, and the request comes back whole with the key."""
    import uuid

    from tpuctl.services.run.secretenv import store_secrets

    tmp_path = tmp_path / uuid.uuid4().hex  # one per example: hypothesis runs them in one test's directory
    names = [f"S{i}" for i in range(len(values))]
    request = dataclasses.replace(
        request, secret_names=tuple(names), env=tuple(f"E{i}={v}" for i, v in enumerate(values))
    )
    key = load_secret_key(env_key=None, key_file=tmp_path / "secret.key")
    shared = tmp_path / "shared"
    run_dir = RunDir.of(tmp_path / "one", "run-x")
    with Ledger(shared) as ledger:
        ledger.create_run("run-x", script="x")
        record_request(ledger, run_dir, request, run_id="run-x", budget_usd=None, policy=RecoveryPolicy(),
                       key=key)  # fmt: skip
        store_secrets(ledger, "run-x", dict(zip(names, values, strict=True)), key)
        text = ledger.run_request("run-x")
        again = saved_request(ledger, "run-x", RunDir.of(tmp_path / "two", "run-x"), lambda: key).request
    assert text is not None
    assert json.loads(text)[JOB_PART].get("secrets") == dict.fromkeys(names)
    stored = b"".join(p.read_bytes() for p in shared.rglob("*") if p.is_file())
    for value in values:
        assert value not in text and value.encode() not in stored
        assert value not in run_dir.request_file.read_text()
    assert again == request
