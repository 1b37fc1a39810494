"""A job's values -> the typed run request: every value parsed by tpuctl.params, a bad one naming the
file's line and key (or the flag); secrets kept out of the request; several types filled in."""

from __future__ import annotations

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.errors import UsageError
from tpuctl.jobs.load import load_job_text
from tpuctl.jobs.located import JobFileError
from tpuctl.jobs.request import JobRequest, build
from tpuctl.jobs.values import Given


def job(text: str, environ: dict[str, str] | None = None, **flags: Given) -> JobRequest:
    loaded = load_job_text(text, "job.yaml")
    values = {**loaded.values, **flags}
    return build(values, catalog=Catalog.load(), source=loaded.source, environ=environ or {})


def test_a_set_of_types_fills_the_first_the_others_and_cheapest() -> None:
    request = job("resources:\n  accelerators: {tpu-v5e-16, tpu-v6e-8, v5e-16}\nrun: x\n").request
    assert request.accelerator_type == "v5e-16"
    assert request.other_accelerator_types == ("v6e-8",)  # the repeat (v5e-16 twice) dropped
    assert request.type_preference == "cheapest"
    ordered = job("resources:\n  ordered:\n  - accelerators: tpu-v6e-8\n  - accelerators: tpu-v5e-16\n")
    assert (ordered.request.accelerator_type, ordered.request.type_preference) == ("v6e-8", "ordered")


def test_an_unknown_type_in_a_list_names_its_item() -> None:
    with pytest.raises(JobFileError) as caught:
        job("resources:\n  accelerators:\n  - tpu-v6e-8\n  - tpu-v9z-8\nrun: x\n")
    assert caught.value.key == "resources.accelerators[1]" and caught.value.line == 4
    assert "unknown accelerator generation" in caught.value.message


def test_a_bad_value_is_the_flags_error_at_the_files_line() -> None:
    with pytest.raises(JobFileError) as caught:
        job("run: x\nresources: {accelerators: v5e-8}\nbudget: -3\n")
    assert caught.value.message.startswith("job.yaml:3: budget: budget must be a positive number of USD")
    # The same value as a flag is the flag's own error.
    with pytest.raises(UsageError) as flagged:
        job("run: x\n", budget=Given("-3", flag="--budget"))
    assert not isinstance(flagged.value, JobFileError) and flagged.value.field == "budget"


def test_secrets_come_from_the_environment_and_stay_out_of_the_request() -> None:
    built = job("run: x\nsecrets: {HF_TOKEN: null, B: given}\nenvs: {LR: 0.1}\n", {"HF_TOKEN": "hf-123"})
    assert built.request.secret_names == ("HF_TOKEN", "B")
    assert dict(built.secret_values) == {"HF_TOKEN": "hf-123", "B": "given"}
    assert built.request.env == ("LR=0.1",)
    assert "hf-123" not in repr(built) and "given" not in repr(built.request)


def test_an_unset_secret_and_an_empty_env_value_name_their_key() -> None:
    with pytest.raises(JobFileError, match=r"job\.yaml:3: secrets\.HF_TOKEN: secret HF_TOKEN has no value"):
        job("run: x\nsecrets:\n  HF_TOKEN: null\n")
    with pytest.raises(JobFileError, match=r"job\.yaml:3: envs\.LR: LR has no value") as caught:
        job("run: x\nenvs:\n  LR:\n")
    assert caught.value.fix == "give it with --env LR=VALUE, or write a value in the file"


def test_placement_recovery_and_tpuctl_keys() -> None:
    built = job(
        "resources:\n  accelerators: tpu-v5litepod-16\n  use_spot: true\n  infra: gcp/us-central1\n"
        "  max_hourly_cost: 30\n  accelerator_args: {runtime_version: v2-alpha-tpuv5-lite}\n"
        "  job_recovery: {max_restarts_on_errors: 3}\n"
        "run: x\nslices: 2\nmax_preemptions: 7\ntimeout: 2h\npriority: interactive\nworkspace: ml\nname: lm\n"
    )
    request, placement = built.request, built.request.placement
    assert placement.capacity_types == (CapacityType.SPOT,) and placement.region == "us-central1"
    assert placement.max_price == 30.0 and placement.runtime_version == "v2-alpha-tpuv5-lite"
    assert (built.policy.max_restarts, built.policy.max_preemptions) == (3, 7)
    assert (request.slices, request.timeout_s, request.priority, request.workspace) == (
        2,
        7200.0,
        "interactive",
        "ml",
    )
    assert request.labels == {"job": "lm"}


def test_one_runtime_version_for_several_types_is_refused() -> None:
    with pytest.raises(JobFileError, match="one runtime_version for several slice types"):
        job("resources:\n  accelerators: [v5e-8, v6e-8]\n  accelerator_args: {runtime_version: x}\n")


def test_a_gs_file_mount_is_copied_at_setup_before_the_setup_commands() -> None:
    built = job("run: x\nsetup: echo hi\nfile_mounts:\n  /data: gs://b/data\n")
    copy, own = built.host_flags.setup or ()
    assert copy.startswith("python -c ") and copy.endswith(" gs://b/data /data") and own == "echo hi"
    with pytest.raises(JobFileError, match="is not a gs:// URL") as caught:
        job("run: x\nfile_mounts:\n  /data: ./local\n")
    assert caught.value.line == 3
