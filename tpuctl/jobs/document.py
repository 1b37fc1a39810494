"""A run request as a job file: the request's one serialised form (``job_document``). Loading the
document again (``load.load_job_text`` then ``request.build``) gives the same request, field for field,
over every field a job file holds (``request``'s docstring names the others)."""

from __future__ import annotations

from typing import Any

from tpuctl.jobs.request import JOB_NAME_LABEL
from tpuctl.services.run.model import RecoveryPolicy, RunRequest


def job_document(
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
    if len(types) == 1:
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
