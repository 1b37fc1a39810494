"""Preparing a run: validate everything the user gave and build the bundle before anything outside the
process changes (``prepare``), and say what the run would do without doing it (``plan``)."""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.catalog import Surface
from tpuctl.errors import UsageError
from tpuctl.hosts.base import ENV_NAME_RE, HostPlan
from tpuctl.hosts.bundle import build_bundle
from tpuctl.services.run import bucket_check, checkpoints, hosts, provision
from tpuctl.services.run.model import EXAMPLES, RUN_ID_RE, PreparedRun, RunRequest
from tpuctl.services.run.rundir import RunDir
from tpuctl.services.run.script_path import script_path
from tpuctl.services.run.secretenv import check_secrets
from tpuctl.timefmt import iso

if TYPE_CHECKING:
    from tpuctl.hosts.pythons import HostPython
    from tpuctl.hosts.setup import SetupSpec
    from tpuctl.services.session import Session


def prepare(
    session: Session, request: RunRequest, *, secrets: Mapping[str, str] | None = None
) -> PreparedRun:
    """Validate the request and build the bundle; raises UsageError for any bad input. ``secrets``: the
    values of ``request.secret_names`` (``Runs.prepare``)."""
    user_env = parse_env(request.env)
    secret_values = check_secrets(request.secret_names, secrets or {}, env_names=user_env)
    program, display, workdir = _program(request)
    if request.checkpoint_every is not None and request.checkpoint_every < 0:
        raise UsageError(
            f"--checkpoint-every must be 0 or more, got {request.checkpoint_every}",
            field="checkpoint_every",
            value=request.checkpoint_every,
            fix="give a number of steps, e.g. --checkpoint-every 50",
        )
    if request.example is not None and request.checkpoint_every is not None:
        program = (*program, "--checkpoint-every", str(request.checkpoint_every))
    if request.timeout_s is not None and request.timeout_s <= 0:
        raise UsageError(
            f"--timeout must be positive, got {request.timeout_s}",
            field="timeout",
            value=request.timeout_s,
            fix="give seconds, e.g. --timeout 3600",
        )
    executor_kind = hosts.executor_kind(session, request.executor)
    if request.max_hours is not None and request.deadline_at is None:
        # Fixed the first time the run is prepared: a resume or a recovery ends at the same moment.
        request = dataclasses.replace(request, deadline_at=session.clock() + request.max_hours * 3600.0)
    run_id = request.run_id or new_run_id(session.clock())
    if not RUN_ID_RE.match(run_id):
        raise UsageError(
            f"invalid run id {run_id!r}",
            field="run_id",
            value=run_id,
            fix="use lowercase letters, digits and dashes, starting with a letter (at most 63)",
        )
    where = provision.target(session, request, run_id)
    checkpoint_dir = checkpoints.checkpoint_dir(session, request, run_id, where)
    where = checkpoints.placed_near(where, checkpoint_dir)
    setup = _setup_spec(session, request)
    bundle = build_bundle(workdir, limit_bytes=request.bundle_limit_bytes, exclude=(session.state_dir,))
    bucket = checkpoints.bucket_of(checkpoint_dir)
    if bucket is not None:
        # Last, once every input is known good: it asks Google. The hosts' account is the one their
        # slices are made with: --service-account, else the profile's, else the project's default.
        account = request.placement.service_account or session.settings.service_account
        bucket_check.check_bucket(session, bucket, account)
    return PreparedRun(
        request=request,
        run_id=run_id,
        program=program,
        display=display,
        user_env=user_env,
        bundle=bundle,
        target=where,
        executor_kind=executor_kind,
        checkpoint_dir=checkpoint_dir,
        run_dir=RunDir.of(session.state_dir, run_id),
        setup=setup,
        secrets=secret_values,
    )


def with_budget(session: Session, prepared: PreparedRun, budget_usd: float | None) -> PreparedRun:
    """The run as its ``--budget`` needs it: refused (exit 2, before anything is made) where the budget
    could not count the run's spend (``refuse_unpriced_budget``); else, without an assumed price, placed
    only where tpuctl knows the price (``priced_only``), so that no slice of it spends unguarded."""
    from tpuctl.services.budget import refuse_unpriced_budget
    from tpuctl.services.placement import candidate_zones

    target = prepared.target
    accel = target.accelerator
    placement = target.placement
    if target.existing is not None:
        places = [(node.zone, node.capacity) for node in target.existing.nodes]
        flex_start = False
    else:
        assert placement is not None
        zones = candidate_zones(accel, zones=placement.zones, region=placement.region)
        places = [(zone, capacity) for zone in zones for capacity in placement.capacity_types]
        flex_start = placement.flex_start
    assumed = prepared.request.assumed_price_per_hour
    refuse_unpriced_budget(
        session.catalog,
        accel,
        places,
        flex_start=flex_start,
        budget_usd=budget_usd,
        assumed_usd_per_hour=assumed,
    )
    if budget_usd is None or assumed is not None or placement is None or placement.priced_only:
        return prepared
    priced = dataclasses.replace(placement, priced_only=True)
    return dataclasses.replace(prepared, target=dataclasses.replace(target, placement=priced))


def _backstop_plan(session: Session, prepared: PreparedRun) -> dict[str, Any] | None:
    """What deletes the run's slices if no supervisor is left to (``backstop``); None with --keep-pod."""
    from tpuctl.services.run import backstop

    if not backstop.guards(prepared):
        return None
    deadline = prepared.request.deadline_at
    ends = backstop.termination_at(session, prepared)
    placement = prepared.target.placement
    # Compute Engine deletes a one-host slice itself at its terminationTime, unless it is spot or
    # flex-start (docs/google-facts.md#backstop; compute_shapes.instance_body).
    by_cloud = (
        placement is not None
        and placement.surface is Surface.COMPUTE
        and placement.accelerator.hosts == 1
        and not placement.flex_start
        and any(not c.is_preemptible for c in placement.capacity_types)
    )
    return {
        "grace_s": session.settings.backstop_grace,
        "deadline": None if deadline is None else iso(deadline),
        "deadman": "host 0",
        "compute_engine_deletes_at": iso(ends) if ends is not None and by_cloud else None,
    }


def _host_python(session: Session, prepared: PreparedRun) -> HostPython:
    """The image's Python and the environment's, and how setup bridges a difference (``hosts.pythons``)."""
    from tpuctl.hosts.pythons import ImagePython, host_python
    from tpuctl.services.run.hostsetup import env_bucket

    target = prepared.target
    placement = target.placement
    image = None
    if target.existing is not None:
        image = target.existing.nodes[0].runtime_version or None
    elif placement is not None and placement.surface is Surface.COMPUTE:
        compute = target.accelerator.generation.compute
        image = None if compute is None else compute.image_family
    elif placement is not None:
        image = placement.runtime_version
    offered = session.backend.image_python(image) if image else ImagePython(None, downloads=True)
    setup = prepared.setup
    return host_python(
        offered,
        setup.python if setup.needs_env else None,
        bucket=env_bucket(prepared) is not None,
        # A new slice's hosts get external IPs unless a ProxyCommand reaches them (``with_host_access``).
        external_ips=None if placement is None else prepared.request.ssh_proxy_command is None,
    )


def _setup_spec(session: Session, request: RunRequest) -> SetupSpec:
    """What every host installs and runs after each provision (``tpuctl.hosts.setup``)."""
    from tpuctl.hosts.setup import SetupSpec

    requirements = None
    if request.requirements is not None:
        path = Path(request.requirements).expanduser()
        try:
            requirements = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"cannot read --requirements {request.requirements}: {exc}",
                field="requirements",
                value=request.requirements,
                fix="give a readable pip requirements file (one requirement per line)",
            ) from None
    for command in request.setup:
        if not command.strip() or "\x00" in command:
            raise UsageError(
                f"bad --setup {command!r}: an empty command or one holding a NUL byte",
                field="setup",
                value=command,
                fix="give a shell command, e.g. --setup 'sudo apt-get install -y libsndfile1'",
            )
    return SetupSpec(
        runtime=session.backend.runtime if request.runtime_deps else None,
        requirements=requirements,
        commands=request.setup,
    )


def _program(request: RunRequest) -> tuple[tuple[str, ...], str, Path | None]:
    if request.command is not None:
        return _shell_program(request)
    if request.example is not None:
        example = EXAMPLES.get(request.example)
        if example is None:
            raise UsageError(
                f"unknown example {request.example!r}",
                field="example",
                value=request.example,
                fix="use one of: " + ", ".join(f"{k} ({v.description})" for k, v in EXAMPLES.items()),
            )
        if request.script is not None:
            raise UsageError(
                "give either a SCRIPT or --example, not both",
                field="SCRIPT",
                value=request.script,
                fix="with --example, pass the example's own arguments after `--`",
            )
        workdir = Path(request.workdir).expanduser() if request.workdir else None
        return ("-m", example.module, *request.args), f"example:{request.example}", workdir
    if request.script is None:
        raise UsageError(
            "nothing to run: give a SCRIPT or --example NAME",
            field="SCRIPT",
            fix="e.g. `tpuctl run train.py --type v5e-8` or `tpuctl run --example lm --type v5e-8`",
        )
    located = script_path(request.script, request.workdir)
    rel, workdir = located.in_workdir, located.workdir
    if rel == "tpuctl" or rel.startswith("tpuctl/"):
        raise UsageError(
            f"script {rel} is inside a tpuctl/ directory, whose paths the runtime takes in the bundle",
            field="SCRIPT",
            value=request.script,
            fix="move the script out of tpuctl/, or pick another --workdir",
        )
    return (rel, *request.args), rel, workdir


def _shell_program(request: RunRequest) -> tuple[tuple[str, ...], str, Path | None]:
    """A shell command (a job file's ``run:``), run in the workdir (none: the runtime alone is shipped)."""
    assert request.command is not None
    if request.script is not None or request.example is not None:
        raise UsageError(
            "give one program: a shell command (run:), a SCRIPT or --example, not several",
            field="SCRIPT" if request.script is not None else "example",
            value=request.script or request.example,
            fix="drop run: from the job file to run a script or an example, or drop the script/--example",
        )
    workdir = Path(request.workdir).expanduser().resolve() if request.workdir else None
    if workdir is not None and not workdir.is_dir():
        raise UsageError(
            f"--workdir {request.workdir} does not exist or is not a directory",
            field="workdir",
            value=request.workdir,
            fix="pass the directory that holds your program and its files",
        )
    first = request.command.strip().splitlines()[0]
    display = "sh: " + (first if len(first) <= 60 else first[:57] + "...")
    return (request.command, *request.args), display, workdir


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """``["A=1", "B=x=y"]`` -> dict, validated: a shell identifier, not one of tpuctl's own names."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        # The name, never the value: a value may be a token (errors are printed, logged and sent on).
        shown = f"{key}=..." if sep else key
        if not sep or not ENV_NAME_RE.match(key):
            raise UsageError(
                f"bad --env {shown!r}: expected KEY=VALUE with KEY a letter or _ followed by letters, "
                "digits or _",
                field="env",
                value=shown,
                fix="write it as --env NAME=value, e.g. --env LEARNING_RATE=3e-4",
            )
        if key.startswith("TPUCTL_") or key == "PYTHONPATH":
            raise UsageError(
                f"bad --env {shown!r}: {key} is set by tpuctl on every host (the worker environment)",
                field="env",
                value=shown,
                fix="choose another name; tpuctl sets TPUCTL_* and PYTHONPATH itself",
            )
        if "\x00" in value:
            raise UsageError(
                f"bad --env {key}: the value holds a NUL byte", field="env", value=key, fix="remove it"
            )
        env[key] = value
    return env


def new_run_id(now: float | None = None) -> str:
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y%m%d-%H%M%S")
    return f"run-{stamp}-{secrets.token_hex(2)}"


def _per_slice(created: dict[str, Any], slices: int) -> float | None:
    """Each slice's USD/hour in the chosen placement (the allocator prices the whole request)."""
    total = (created.get("chosen") or {}).get("price_per_hour")
    return None if total is None else round(float(total) / slices, 6)


def plan(session: Session, prepared: PreparedRun, *, budget_usd: float | None = None) -> dict[str, Any]:
    """What the run would ship and run where: bundle, target, and each host's command and env (secret
    values and secret-looking --env values shown as ``<secret>``), with ``budget_usd`` as the run would
    have it (``with_budget``). Changes nothing."""
    prepared = with_budget(session, prepared, budget_usd)
    created, chosen_zone = provision.plan_creation(session, prepared)
    # Of several slice types, the plan is of the one it would place first.
    prepared = provision.planned_as(session.catalog, prepared, created)
    target = prepared.target
    accel = target.accelerator
    where: dict[str, Any] = {
        "pod": target.name,
        "zone": target.zone,
        "accelerator_type": accel.api_name,
        "topology": accel.topology,
        "slices": target.slices,
        "hosts": target.hosts,
        "hosts_per_slice": accel.hosts,
        "chips_per_host": accel.chips_per_host,
        "capacity": target.capacity.value,
        "existing": target.existing is not None,
    }
    if target.existing is not None and target.existing.is_multislice:
        where["slice_names"] = target.existing.names
    if created is not None:
        where["create"] = created
        where["zone"] = chosen_zone
        assert target.placement is not None  # a creation plan is made only for a placement
        where["slice_names"] = list(target.placement.node_names)
        where["slice_price_per_hour"] = _per_slice(created, target.slices)
    if target.creates:
        where["delete_after"] = not prepared.request.keep_pod
        where["backstop"] = _backstop_plan(session, prepared)
    executor = hosts.plan_executor(session, prepared, chosen_zone)
    host_plans: list[HostPlan] = executor.plan(prepared.spec(), digest=prepared.bundle.digest)
    return {
        "run_id": prepared.run_id,
        "program": list(prepared.program),
        "executor": prepared.executor_kind,
        "bundle": prepared.bundle.summary(),
        "target": where,
        "checkpoint_dir": prepared.checkpoint_dir,
        "setup": {
            "key": prepared.setup.key(),
            "runtime": prepared.setup.runtime,
            "requirements": prepared.request.requirements,
            "commands": list(prepared.setup.commands),
            "python": prepared.python,
            "host_python": _host_python(session, prepared).to_dict(),
        },
        "hosts": [h.to_dict(user_keys=list(prepared.user_env)) for h in host_plans],
    }
