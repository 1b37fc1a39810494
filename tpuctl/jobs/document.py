"""A run request as a job document, and back: the request's one serialised form. What ``tpuctl run``
saves as a run's request, and what a server takes, is this document: the keys a user writes in a job
file, nothing else (the run's own state is saved beside it, ``services.run.control``).

``document_from_run_request`` writes a request (with its run's budget and recovery limits) as a job
file's mapping; ``run_request_from_document`` reads one back through the same format check and parsers
as a job file (``load.check_job``, ``request.build``), as a document from elsewhere: its paths are
kept as written and its secrets are names only. The two give the same request, field for field, over
every field a job file holds (``request``'s docstring names the others).

A job file's bucket, setup, requirements, ProxyCommand, network and service account are defaults the
settings may fill in (``HostFlags``); a document's values are the run's own, settled when it was
submitted, so ``run_request_from_document`` puts them in the request itself.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl import params
from tpuctl.jobs.request import JOB_NAME_LABEL, HostFlags
from tpuctl.services.run.model import RecoveryPolicy, RunRequest

if TYPE_CHECKING:
    from tpuctl.catalog import Catalog


@dataclass(frozen=True)
class RequestedRun:
    """A run as a document asks for it: the request, the run's budget and its recovery limits."""

    request: RunRequest
    budget_usd: float | None
    policy: RecoveryPolicy


def run_request_from_document(
    doc: Mapping[str, Any], *, catalog: Catalog, path: str = "<document>"
) -> RequestedRun:
    """The run ``doc`` (a job file's mapping) asks for, checked as a job file is; an error names
    ``path``, the line of ``doc`` written as JSON, and the key (exit 2)."""
    from tpuctl.jobs.load import load_job_text
    from tpuctl.jobs.request import build

    loaded = load_job_text(json.dumps(doc, indent=1), path)
    job = build(loaded.values, catalog=catalog, source=loaded.source, environ={}, local=False)
    request = _with_host_values(job.request, job.host_flags)
    return RequestedRun(request, job.budget_usd, job.policy)


def _with_host_values(request: RunRequest, flags: HostFlags) -> RunRequest:
    network = None
    if flags.network is not None or flags.subnetwork is not None or flags.tags:
        network = params.host_network(
            None if flags.network is None else params.network(flags.network),
            None if flags.subnetwork is None else params.subnetwork(flags.subnetwork),
            flags.tags or (),
        )
    return dataclasses.replace(
        request,
        bucket=flags.bucket,
        setup=flags.setup or (),
        requirements=flags.requirements,
        ssh_proxy_command=flags.ssh_proxy_command,
        placement=dataclasses.replace(
            request.placement, network=network, service_account=flags.service_account
        ),
    )


def document_from_run_request(
    request: RunRequest, *, budget_usd: float | None = None, policy: RecoveryPolicy | None = None
) -> dict[str, Any]:
    """``request`` (with its run's budget and recovery limits) as a job file's mapping; keys left at
    their defaults are left out."""
    labels = dict(request.labels)
    name = labels.pop(JOB_NAME_LABEL, None)
    env = dict(pair.split("=", 1) for pair in request.env)
    doc: dict[str, Any] = {
        "name": name,
        "workdir": request.workdir,
        "resources": _resources(request, labels, policy),
        "envs": env or None,
        # Names only: a secret's value is never written down (taken from the environment on load).
        "secrets": {key: None for key in request.secret_names} or None,
        "setup": list(request.setup) or None,
        "run": request.command,
        "script": request.script,
        "example": request.example,
        "args": list(request.args) or None,
        "slices": request.slices if request.slices != 1 else None,
        "budget": budget_usd,
        "assume_price_per_hour": request.assumed_price_per_hour,
        "bucket": request.bucket,
        "checkpoint_every": request.checkpoint_every,
        "checkpoint_dir": request.checkpoint_dir,
        "max_hours": request.max_hours,
        "timeout": request.timeout_s,
        "grace": request.grace_s,
        "requirements": request.requirements,
        "runtime_deps": None if request.runtime_deps else False,
        "keep_pod": request.keep_pod or None,
        "max_bundle_mb": request.bundle_limit_bytes / (1024 * 1024),
        "ssh_proxy_command": request.ssh_proxy_command,
        "priority": request.priority,
        "workspace": request.workspace,
    }
    if policy is not None:
        doc["max_preemptions"] = policy.max_preemptions
    return {key: value for key, value in doc.items() if value is not None}


def _resources(request: RunRequest, labels: dict[str, str], policy: RecoveryPolicy | None) -> dict[str, Any]:
    placement = request.placement
    types = [t for t in (request.accelerator_type, *request.other_accelerator_types) if t is not None]
    accelerators: Any = None
    if len(types) == 1 and request.type_preference == "ordered":
        accelerators = types[0]
    elif types:
        accelerators = types if request.type_preference == "ordered" else {t: None for t in types}
    network = placement.network
    out: dict[str, Any] = {
        "accelerators": accelerators,
        "pod": request.pod,
        "zones": list(placement.zones) or None,
        "region": placement.region,
        "capacity": [c.value for c in placement.capacity_types] + (["queued"] if placement.queued else [])
        or None,
        "reservation": placement.reserved,
        "max_hourly_cost": placement.max_price,
        "valid_for": placement.valid_for_s,
        "strategy": placement.strategy.value,
        "race_k": placement.race_k,
        "api": None if placement.surface is None else placement.surface.value,
        "network": None if network is None or network.network is None else network.network.text,
        "subnetwork": None if network is None or network.subnetwork is None else network.subnetwork.text,
        "tags": None if network is None else list(network.tags) or None,
        "service_account": placement.service_account,
        "labels": labels or None,
    }
    if placement.runtime_version is not None:
        out["accelerator_args"] = {"runtime_version": placement.runtime_version}
    if policy is not None:
        out["job_recovery"] = {"max_restarts_on_errors": policy.max_restarts}
    return {key: value for key, value in out.items() if value is not None}
