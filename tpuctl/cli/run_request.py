"""`tpuctl run`'s request from its job file and its flags, through one path (``tpuctl.jobs``): each flag
typed on the command line is a value of the same parameter as the file's key, replacing it (``--env``,
``--label`` and ``--secret`` add keys), and every value is then parsed once by ``tpuctl.params``.

A flag left at its default gives nothing, so the file's value (or the parameter's default) stands.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import typer

from tpuctl import params
from tpuctl.jobs.request import JobRequest
from tpuctl.jobs.values import Given

#: `run`'s parameter -> the run's parameter (``jobs.values``), where they differ.
_RENAMED: Final[Mapping[str, str]] = {"zone": "zones", "capacity_type": "capacity_types"}
#: The flags that are not a value of the run's request (how tpuctl runs it, not what it runs).
_NOT_VALUES: Final = frozenset({"script", "args", "executor", "detach", "verbose", "output", "dry_run",
                                "no_import_check"})  # fmt: skip


def _pairs(param: str, pairs: list[str]) -> dict[str, Any]:
    """``--env``, ``--label`` or ``--secret`` words by key, parsed as the flag's own parser does."""
    if param == "env":
        from tpuctl.services.run.prepare import parse_env

        return parse_env(pairs)
    if param == "label":
        return params.labels(pairs)
    from tpuctl.services.run.secretenv import parse_secret_flags

    return dict(parse_secret_flags(pairs))


def flag_values(ctx: typer.Context, *, script: str | None, args: list[str]) -> dict[str, Given]:
    """The run's values given as flags on the command line (``ctx``), with SCRIPT and its arguments."""
    out: dict[str, Given] = {}
    if script is not None:
        out["script"] = Given(script, flag="SCRIPT")
    if args:
        out["args"] = Given(list(args), flag="ARGS")
    for name, value in ctx.params.items():
        if name in _NOT_VALUES or value is None:
            continue
        source = ctx.get_parameter_source(name)
        # By name: typer carries its own copy of click, whose enum is not public.
        if source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
            continue
        param = _RENAMED.get(name, name)
        if param in ("env", "label", "secret"):
            value = _pairs(param, list(value))
        label = params.flag(param) if param in params.FLAGS else "--" + name.replace("_", "-")
        out[param] = Given(value, flag=label)
    return out


def run_request(
    ctx: typer.Context, *, job_file: str | None, script: str | None, args: list[str]
) -> JobRequest:
    """The run's typed request from the job file (None: flags only) and the flags. A bad job file is
    exit 2 here, naming its line and key, before anything is contacted."""
    from tpuctl.catalog import Catalog
    from tpuctl.jobs.load import load_job
    from tpuctl.jobs.request import build
    from tpuctl.jobs.values import merged

    loaded = None if job_file is None else load_job(Path(job_file))
    flags = flag_values(ctx, script=script, args=args)
    values = flags if loaded is None else merged(loaded.values, flags)
    return build(values, catalog=Catalog.load(), source=None if loaded is None else loaded.source)


def plan_fields(job: JobRequest) -> dict[str, Any]:
    """What a dry run's plan adds about the request: where each value came from, the slice types and
    how they rank, the secrets by name (their values shown as ``<secret>``), and recorded keys."""
    request = job.request
    fields: dict[str, Any] = {"sources": dict(sorted(job.sources.items()))}
    if request.other_accelerator_types:
        fields["accelerator_types"] = [request.accelerator_type, *request.other_accelerator_types]
        fields["type_preference"] = request.type_preference
    if request.secret_names:
        fields["secrets"] = {name: "<secret>" for name in request.secret_names}
    if request.command is not None:
        fields["command"] = request.command
    recorded = {"priority": request.priority, "workspace": request.workspace}
    fields.update({key: value for key, value in recorded.items() if value is not None})
    return fields
