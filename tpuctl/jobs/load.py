"""Reading a job file: its YAML (with lines), the SkyPilot keys tpuctl refuses, then the format
(``model.JobFile``); the first problem is a ``JobFileError`` naming the file, the line and the key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from tpuctl.errors import UsageError
from tpuctl.jobs.located import at, from_validation
from tpuctl.jobs.model import JobFile
from tpuctl.jobs.source import JobSource, parse_job_source, read_job_source
from tpuctl.jobs.unsupported import refused
from tpuctl.jobs.values import Given, file_values

#: What makes ``tpuctl run``'s first argument a job file rather than a script.
JOB_FILE_SUFFIXES = (".yaml", ".yml")


def is_job_file(argument: str | None) -> bool:
    return argument is not None and argument.lower().endswith(JOB_FILE_SUFFIXES)


@dataclass(frozen=True)
class LoadedJob:
    """A job file read and checked against the format: its document and its values by parameter."""

    source: JobSource
    job: JobFile
    values: dict[str, Given]


def load_job(path: Path) -> LoadedJob:
    return check_job(read_job_source(path))


def load_job_text(text: str, path: str) -> LoadedJob:
    """A job file's text (``path`` names it in errors): what tests and a server take."""
    return check_job(parse_job_source(text, path))


def check_job(source: JobSource) -> LoadedJob:
    for where, fix in refused(source.data):
        raise at(source, where, "not supported by tpuctl", value=where[-1], fix=fix)
    try:
        job = JobFile.model_validate(source.data)
    except ValidationError as exc:
        raise from_validation(source, exc) from None
    try:
        values = file_values(job)
    except UsageError as exc:  # two ways of naming slice types at once
        where = tuple(str(exc.field).split("."))
        raise at(source, where, exc.message, value=exc.value, fix=exc.fix or "") from None
    return LoadedJob(source, job, values)
