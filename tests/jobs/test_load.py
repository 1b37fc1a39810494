"""Reading a job file: a typo'd key with "did you mean", a wrong type and a refused SkyPilot key, each
an exit-2 error naming the file, the line and the key."""

from __future__ import annotations

import pytest

from tpuctl.errors import EXIT_USAGE
from tpuctl.jobs.load import is_job_file, load_job_text
from tpuctl.jobs.located import JobFileError


def error_of(text: str) -> JobFileError:
    with pytest.raises(JobFileError) as caught:
        load_job_text(text, "job.yaml")
    assert caught.value.exit_code == EXIT_USAGE
    return caught.value


def test_a_typo_names_line_key_and_the_nearest_key() -> None:
    error = error_of("resources:\n  accelerators: tpu-v6e-8\n  use_spott: true\nrun: x\n")
    assert error.message == "job.yaml:3: resources.use_spott: unknown key; did you mean use_spot?"
    assert (error.line, error.key) == (3, "resources.use_spott")


def test_a_wrong_type_names_line_and_key() -> None:
    error = error_of("run: x\nslices: two\n")
    assert error.message.startswith("job.yaml:2: slices: input should be a valid integer")
    error = error_of("resources:\n  use_spot: 'maybe'\n")
    assert error.message.startswith("job.yaml:2: resources.use_spot: input should be a valid boolean")


def test_num_nodes_2_says_what_a_pod_is_and_what_slices_does() -> None:
    error = error_of("resources: {accelerators: tpu-v2-8}\nnum_nodes: 2\nrun: x\n")
    assert error.message == "job.yaml:2: num_nodes: not supported by tpuctl"
    assert error.fix is not None and "slices: N" in error.fix and "every host of its slice" in error.fix


def test_num_nodes_1_is_one_slice_as_written() -> None:
    loaded = load_job_text("resources: {accelerators: tpu-v2-8}\nnum_nodes: 1\nrun: x\n", "job.yaml")
    assert loaded.job.num_nodes == 1


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ("resources:\n  accelerators: tpu-v2-8\n  accelerator_args: {tpu_vm: false}\n",
         "resources.accelerator_args.tpu_vm", "TPU VMs only"),
        ("file_mounts:\n  /data:\n    source: gs://b/d\n    mode: MOUNT\n", "file_mounts./data.mode", "COPY"),
        ("resources:\n  cpus: 4+\n", "resources.cpus", "slice type"),
        ("resources:\n  job_recovery: {recover_on_exit_codes: [33]}\n",
         "resources.job_recovery.recover_on_exit_codes", "max_restarts_on_errors"),
    ],
)  # fmt: skip
def test_unsupported_skypilot_keys_are_refused_by_name_with_the_fix(text: str, key: str, says: str) -> None:
    error = error_of(text)
    assert error.key == key
    assert "not supported by tpuctl" in error.message
    assert error.fix is not None and says in error.fix


def test_two_ways_of_naming_types_is_refused_at_the_second() -> None:
    error = error_of("resources:\n  accelerators: tpu-v6e-8\n  any_of:\n    - accelerators: tpu-v5e-16\n")
    assert error.key == "resources.any_of" and error.line == 3


def test_job_files_are_told_from_scripts_by_their_suffix() -> None:
    assert is_job_file("job.yaml") and is_job_file("x/JOB.YML")
    assert not is_job_file("train.py") and not is_job_file(None)
