"""A flag replaces the file's value; --env, --label and --secret add keys; each value says where from."""

from __future__ import annotations

from tpuctl.jobs.load import load_job_text
from tpuctl.jobs.values import Given, merged

TEXT = "resources:\n  accelerators: tpu-v6e-8\n  use_spot: true\nenvs: {A: '1', B: '2'}\nrun: x\n"


def test_flags_replace_or_add_and_say_what_they_replaced() -> None:
    loaded = load_job_text(TEXT, "job.yaml")
    values = merged(
        loaded.values,
        {"accelerator_type": Given("v5e-8", flag="--type"), "env": Given({"B": "3", "C": "4"}, flag="--env")},
    )
    assert values["accelerator_type"].value == "v5e-8"
    assert values["env"].value == {"A": "1", "B": "3", "C": "4"}  # the flag wins on B
    origin = values["accelerator_type"].origin(loaded.source)
    assert origin == "flag --type (over job.yaml:2 resources.accelerators)"
    assert values["env"].origin(loaded.source) == "flag --env (added to job.yaml:4 envs)"
    assert values["spot"].origin(loaded.source) == "job.yaml:3 resources.use_spot"
