"""A run's values by parameter, each with where it came from: the job file (its line and key), a flag,
or nothing (the default). Keyed by ``tpuctl.params``' parameter names, so a file's key and a flag for the
same thing are one value: a flag replaces the file's, except ``env``, ``label`` and ``secret``, whose
keys are added to the file's (the flag winning on the same key).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tpuctl.jobs.accelerators import AcceleratorSet, accelerator_set
from tpuctl.jobs.located import dotted
from tpuctl.jobs.model import JobFile, Resources
from tpuctl.jobs.source import JobSource, KeyPath

#: The parameters whose keys a flag adds to the file's rather than replacing them all.
ADDITIVE: Final = frozenset({"env", "label", "secret"})


@dataclass(frozen=True)
class Given:
    """One parameter's value as given (before ``tpuctl.params`` parses it), and where from: ``where``
    is its key path in the job file, ``flag`` the flag it was typed as (one of them is set)."""

    value: Any
    where: KeyPath | None = None
    flag: str | None = None
    #: The job file's value this flag's replaced (or, for ``ADDITIVE`` ones, added to).
    over: Given | None = None

    def origin(self, source: JobSource | None) -> str:
        """Where the value came from, for the plan: ``job.yaml:4 resources.accelerators``, ``flag
        --type``, or ``flag --type over job.yaml:4 resources.accelerators``."""
        if self.flag is not None:
            verb = "added to" if self.over is not None and isinstance(self.value, dict) else "over"
            return f"flag {self.flag}" + (
                "" if self.over is None else f" ({verb} {self.over.origin(source)})"
            )
        assert self.where is not None and source is not None
        line = source.line_of(self.where)
        return f"{source.path}:{line} {dotted(self.where)}" if line else f"{source.path} {dotted(self.where)}"


def merged(file_values: Mapping[str, Given], flag_values: Mapping[str, Given]) -> dict[str, Given]:
    """The file's values with the flags' over them (``ADDITIVE`` ones key by key)."""
    out = dict(file_values)
    for name, given in flag_values.items():
        before = out.get(name)
        if before is None:
            out[name] = given
        elif name in ADDITIVE:
            out[name] = Given({**before.value, **given.value}, flag=given.flag, over=before)
        else:
            out[name] = Given(given.value, flag=given.flag, over=before)
    return out


def file_values(job: JobFile) -> dict[str, Given]:
    """The parameters ``job`` gives, each with its key path."""
    out: dict[str, Given] = {}

    def put(name: str, value: Any, *where: str | int) -> None:
        if value is not None:
            out[name] = Given(value, where=where)

    for key in ("workdir", "script", "example", "args", "slices", "budget", "assume_price_per_hour",
                "bucket", "checkpoint_every", "checkpoint_dir", "max_preemptions", "max_hours", "timeout",
                "grace", "requirements", "runtime_deps", "keep_pod", "max_bundle_mb", "ssh_proxy_command",
                "priority", "workspace", "file_mounts"):  # fmt: skip
        put(key, getattr(job, key), key)
    put("job_name", job.name, "name")
    put("command", job.run, "run")
    put("env", job.envs, "envs")
    put("secret", job.secrets, "secrets")
    if job.setup is not None:
        put("setup", [job.setup] if isinstance(job.setup, str) else job.setup, "setup")
    if job.resources is not None:
        out.update(_resource_values(job.resources))
    return out


#: ``resources`` keys -> parameter names, where they differ.
_RESOURCE_PARAMS: Final[Mapping[str, str]] = {
    "use_spot": "spot",
    "max_hourly_cost": "max_price",
    "capacity": "capacity_types",
    "reservation": "reserved",
    "labels": "label",
}


def _resource_values(resources: Resources) -> dict[str, Given]:
    out: dict[str, Given] = {}
    for key in ("use_spot", "max_hourly_cost", "capacity", "reservation", "labels", "region", "zones",
                "queued", "valid_for", "strategy", "race_k", "api", "network", "subnetwork", "tags",
                "service_account", "pod", "infra", "zone"):  # fmt: skip
        value = getattr(resources, key)
        if value is not None:
            out[_RESOURCE_PARAMS.get(key, key)] = Given(value, where=("resources", key))
    chosen: AcceleratorSet | None = accelerator_set(resources)
    if chosen is not None:
        first = chosen.places[0][:2]
        out["accelerator_type"] = Given(chosen, where=first)
    if resources.accelerator_args is not None and resources.accelerator_args.runtime_version is not None:
        where = ("resources", "accelerator_args", "runtime_version")
        out["runtime_version"] = Given(resources.accelerator_args.runtime_version, where=where)
    recovery = resources.job_recovery
    if recovery is not None and recovery.max_restarts_on_errors is not None:
        where = ("resources", "job_recovery", "max_restarts_on_errors")
        out["max_restarts"] = Given(recovery.max_restarts_on_errors, where=where)
    return out
