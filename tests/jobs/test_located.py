"""Where an error is: a key path written as the user reads it, and the line of the nearest key."""

from __future__ import annotations

from tpuctl.jobs.located import at, dotted
from tpuctl.jobs.source import parse_job_source


def test_dotted_paths_and_located_errors() -> None:
    assert dotted(("resources", "any_of", 1, "accelerators")) == "resources.any_of[1].accelerators"
    source = parse_job_source("resources:\n  any_of:\n  - accelerators: a\n  - accelerators: b\n", "j.yaml")
    error = at(source, ("resources", "any_of", 1, "accelerators"), "bad", value="b", fix="f")
    assert (error.message, error.line, error.exit_code) == (
        "j.yaml:4: resources.any_of[1].accelerators: bad",
        4,
        2,
    )
    assert error.to_dict()["key"] == "resources.any_of[1].accelerators"
