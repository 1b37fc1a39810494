"""A job file's YAML keeps the line of every key and item, and bad YAML names its line."""

from __future__ import annotations

import pytest

from tpuctl.errors import ConfigError
from tpuctl.jobs.source import parse_job_source

TEXT = """\
name: lm
resources:
  accelerators: [tpu-v6e-8, tpu-v5e-16]
  use_spot: yes
envs: {LR: 3e-4}
"""


def test_each_key_and_list_item_has_its_line() -> None:
    source = parse_job_source(TEXT, "job.yaml")
    assert source.data["resources"]["use_spot"] is True  # YAML's own booleans, as any tool reads them
    assert source.lines[("resources", "use_spot")] == 4
    assert source.lines[("resources", "accelerators", 1)] == 3
    assert source.lines[("envs", "LR")] == 5
    # A key the file lacks is placed at the nearest one it has.
    assert source.line_of(("resources", "any_of", 0)) == 2


def test_bad_yaml_names_the_file_and_line() -> None:
    # PyYAML names the line where it found the problem: the unclosed list runs into line 4.
    with pytest.raises(ConfigError, match=r"^job\.yaml:4: not valid YAML"):
        parse_job_source("name: a\nresources:\n  accelerators: [a\nrun: x\n", "job.yaml")


def test_a_top_level_list_is_refused() -> None:
    with pytest.raises(ConfigError, match="a job file is a mapping of keys"):
        parse_job_source("- a\n- b\n", "job.yaml")
