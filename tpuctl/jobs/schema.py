"""The job file's JSON Schema, as `tpuctl job schema` publishes it (the model's, with its identity)."""

from __future__ import annotations

from typing import Any

from tpuctl.jobs.model import JobFile

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def job_schema() -> dict[str, Any]:
    schema = JobFile.model_json_schema()
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "tpuctl job file",
        "description": "A run: SkyPilot's task YAML where the concept is the same, and tpuctl's own keys.",
        **{key: value for key, value in schema.items() if key not in ("title", "description")},
    }
