"""A run's values (a job file's, the flags', or both: ``jobs.values``) -> tpuctl's typed run request
(``JobRequest``), each value parsed once by ``tpuctl.params`` as its flag is: a bad one names the flag
it was typed as, or the job file's line and key. ``document`` is the way back and forth between a run
request and its one serialised form, a job document.

Not in a job file (tpuctl's own bookkeeping, or hidden options): ``run_id``, ``deadline_at``,
``python``, ``ssh_remote_root`` and ``executor``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from tpuctl import params
from tpuctl.catalog import Catalog
from tpuctl.errors import UsageError
from tpuctl.hosts.bundle import DEFAULT_LIMIT_BYTES
from tpuctl.jobs.accelerators import AcceleratorSet, resolve_name
from tpuctl.jobs.located import from_usage
from tpuctl.jobs.source import JobSource
from tpuctl.jobs.values import Given
from tpuctl.services.placement import Strategy
from tpuctl.services.placement_choices import PlacementChoices
from tpuctl.services.run.model import RecoveryPolicy, RunRequest
from tpuctl.store.records import PriorityBand

T = TypeVar("T")

#: The label a job's ``name`` is recorded as (on the run and its slices).
JOB_NAME_LABEL: Final = "job"
#: The defaults of the parameters that have one where neither the file nor a flag gives it.
DEFAULTS: Final[Mapping[str, Any]] = {"grace": "5", "max_restarts": "0",
                                       "max_preemptions": "10"}  # fmt: skip
_SLICES_FIX = "a multislice has 2 or more slices, e.g. --slices 2; drop --slices to run on one slice"


@dataclass(frozen=True)
class HostFlags:
    """Values the settings decide, flag or job file first, then the environment and the profile
    (``build_settings``): given here only where the file or a flag gives them."""

    bucket: str | None = None
    setup: tuple[str, ...] | None = None
    requirements: str | None = None
    ssh_proxy_command: str | None = None
    network: str | None = None
    subnetwork: str | None = None
    tags: tuple[str, ...] | None = None
    service_account: str | None = None

    def as_settings(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "setup": None if self.setup is None else list(self.setup),
            "requirements": self.requirements,
            "ssh_proxy_command": self.ssh_proxy_command,
            "network": self.network,
            "subnetwork": self.subnetwork,
            "tags": None if self.tags is None else list(self.tags),
            "service_account": self.service_account,
        }


@dataclass(frozen=True)
class JobRequest:
    """A run as the job file and the flags ask for it, every value parsed."""

    request: RunRequest
    budget_usd: float | None
    policy: RecoveryPolicy
    host_flags: HostFlags
    #: ``secrets:`` and ``--secret`` values, by name: never in ``request`` (saved in plain text), the
    #: environment or a plan; the run passes them to its hosts encrypted.
    secret_values: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Parameter -> where its value came from (``Given.origin``), for the plan.
    sources: Mapping[str, str] = field(default_factory=dict)


class _Parser:
    """Reads one parameter at a time from ``values``, relocating a parser's error to the file's key."""

    def __init__(self, values: Mapping[str, Given], source: JobSource | None, *, local: bool = True) -> None:
        self.values = values
        self.source = source
        self.local = local

    def path(self, name: str) -> str | None:
        """A path parameter: made absolute on this machine for a local file; as written otherwise (it
        names a path on the machine that submitted the document, which this one need not have)."""
        value = self.raw(name)
        if value is None or not self.local:
            return None if value is None else str(value)
        return self.parse(name, params.local_path)

    def raw(self, name: str) -> Any:
        given = self.values.get(name)
        return DEFAULTS.get(name) if given is None else given.value

    def parse(self, name: str, parse: Callable[[Any], T]) -> T | None:
        value = self.raw(name)
        if value is None:
            return None
        try:
            return parse(value)
        except UsageError as exc:
            raise self.relocated(name, exc) from None

    def checked(self, names: tuple[str, ...], check: Callable[[], T]) -> T:
        """``check()``'s value, where it reads several parameters: an error is placed at the first of
        ``names`` given."""
        try:
            return check()
        except UsageError as exc:
            given = next((n for n in names if n in self.values), names[0])
            raise self.relocated(given, exc) from None

    def relocated(self, name: str, exc: UsageError, *, under: tuple[str, ...] = ()) -> UsageError:
        """``exc`` about parameter ``name`` (at its key ``under``, e.g. one env's) placed in the file."""
        given = self.values.get(name)
        if given is None or given.where is None or self.source is None:
            return exc
        return from_usage(self.source, (*given.where, *under), exc)


def build(
    values: Mapping[str, Given],
    *,
    catalog: Catalog,
    source: JobSource | None = None,
    environ: Mapping[str, str] | None = None,
    local: bool = True,
) -> JobRequest:
    """The typed request of ``values``; ``environ`` (default: this process's) gives the secrets and the
    env values a job file leaves empty. ``local``: the values are a file on this machine; False, a
    document from elsewhere (a saved request, a submission to a server): its paths are kept as written
    (not looked for here: the program travels in the run's bundle) and an empty secret is a name only
    (its value travels apart, encrypted), not looked up in ``environ``."""
    p = _Parser(values, source, local=local)
    env, secret_values, secret_names = _environment(p, os.environ if environ is None else environ)
    return JobRequest(
        request=_run_request(p, catalog, env, secret_names=secret_names),
        budget_usd=p.parse("budget", lambda v: params.usd(v, "budget")),
        policy=RecoveryPolicy(
            max_restarts=p.parse("max_restarts", lambda v: params.whole(v, "max_restarts", minimum=0)) or 0,
            max_preemptions=p.parse(
                "max_preemptions", lambda v: params.whole(v, "max_preemptions", minimum=0)
            )
            or 0,
        ),
        host_flags=_host_flags(p),
        secret_values=secret_values,
        sources={name: given.origin(source) for name, given in values.items()},
    )


def _run_request(
    p: _Parser, catalog: Catalog, env: Mapping[str, str], *, secret_names: tuple[str, ...]
) -> RunRequest:
    """The ``RunRequest`` part of the values (the settings' part is ``_host_flags``)."""
    types, preference = _types(p, catalog)
    if len(types) > 1 and p.raw("runtime_version") is not None:
        raise p.relocated(
            "runtime_version",
            UsageError(
                "one runtime_version for several slice types: each generation has its own software",
                field="runtime_version",
                value=p.raw("runtime_version"),
                fix="name one slice type, or drop runtime_version (each type gets its default)",
            ),
        )
    limit_mb = p.parse("max_bundle_mb", lambda v: params.mebibytes(v, "max_bundle_mb"))
    limit_bytes = DEFAULT_LIMIT_BYTES if limit_mb is None else int(limit_mb * 1024 * 1024)
    labels = dict(p.parse("label", lambda v: params.labels(f"{k}={x}" for k, x in v.items())) or {})
    name = p.parse("job_name", lambda v: params.labels([f"{JOB_NAME_LABEL}={v}"], "name"))
    labels.update(name or {})
    return RunRequest(
        script=p.path("script"),
        command=p.parse("command", _command),
        args=tuple(str(a) for a in p.raw("args") or ()),
        example=p.parse("example", _example),
        workdir=p.parse("workdir", _workdir) if p.local else p.path("workdir"),
        env=tuple(f"{k}={v}" for k, v in env.items()),
        secret_names=secret_names,
        priority=p.parse("priority", _priority),
        workspace=p.parse("workspace", _workspace),
        labels=labels,
        pod=p.raw("pod"),
        accelerator_type=types[0] if types else None,
        other_accelerator_types=types[1:],
        type_preference=preference,
        slices=p.parse(
            "slices", lambda v: params.whole(v, "slices", minimum=_least_slices(p), fix=_SLICES_FIX)
        )
        or 1,
        placement=_placement(p),
        keep_pod=bool(p.raw("keep_pod")),
        checkpoint_every=p.parse("checkpoint_every", lambda v: params.whole(v, "checkpoint_every")),
        checkpoint_dir=p.raw("checkpoint_dir"),
        runtime_deps=p.raw("runtime_deps") is not False,
        timeout_s=p.parse("timeout", lambda v: params.duration(v, "timeout")),
        grace_s=p.parse("grace", lambda v: params.duration(v, "grace", allow_zero=True)) or 0.0,
        max_hours=p.parse("max_hours", lambda v: params.hours(v, "max_hours")),
        bundle_limit_bytes=limit_bytes,
        assumed_price_per_hour=p.parse(
            "assume_price_per_hour", lambda v: params.slice_usd_per_hour(v, "assume_price_per_hour")
        ),
    )


def _example(value: Any) -> str:
    from tpuctl.services.run.model import EXAMPLES

    if value not in EXAMPLES:
        raise UsageError(
            f"unknown example {value!r}",
            field="example",
            value=value,
            fix="use one of: " + ", ".join(f"{k} ({v.description})" for k, v in EXAMPLES.items()),
        )
    return str(value)


def _workdir(value: Any) -> str:
    """The directory shipped to every host: absolute, relative to the current directory as SkyPilot's
    is, and there now (checked here so that a job file's mistake names its line)."""
    from pathlib import Path

    path = params.local_path(str(value))
    if not Path(path).is_dir():
        raise UsageError(
            f"workdir {value} does not exist or is not a directory (relative paths are from the current "
            "directory)",
            field="workdir",
            value=value,
            fix="give the directory that holds your program and its files",
        )
    return path


def _least_slices(p: _Parser) -> int:
    """``--slices`` asks for a multislice (2 or more); a file's ``slices: 1`` is one slice, as said."""
    given = p.values.get("slices")
    return 2 if given is not None and given.flag is not None else 1


def _command(value: Any) -> str:
    text = str(value)
    if not text.strip() or "\x00" in text:
        raise UsageError(
            "run: is empty or holds a NUL byte",
            field="run",
            value=text,
            fix="give the shell command every host runs, e.g. run: python3 -m mypkg.train",
        )
    return text


_WORKSPACE_RE = params.LABEL_VALUE_RE


def _priority(value: Any) -> str:
    try:
        return PriorityBand(str(value).lower()).value
    except ValueError:
        raise UsageError(
            f"bad priority {value!r}",
            field="priority",
            value=value,
            fix=f"use one of: {', '.join(PriorityBand)} (production runs first; batch is the default)",
        ) from None


def _workspace(value: Any) -> str:
    text = str(value)
    if not text or not _WORKSPACE_RE.fullmatch(text):
        raise UsageError(
            f"bad workspace {text!r}: 1-63 lowercase letters, digits, - and _",
            field="workspace",
            value=text,
            fix="e.g. workspace: ml-research",
        )
    return text


def _environment(
    p: _Parser, environ: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str], tuple[str, ...]]:
    """The program's variables, the secrets' values and their names; an empty one is taken from
    ``environ`` for a secret (a name only, for a document from elsewhere), and is an error for an env
    value (SkyPilot's rule: give it with --env KEY=VALUE)."""
    from tpuctl.services.run.prepare import parse_env

    env: dict[str, str] = {}
    for key, value in (p.raw("env") or {}).items():
        if value is None:
            raise p.relocated(
                "env",
                UsageError(
                    f"{key} has no value: an empty envs value is given at launch (--env)",
                    field="env",
                    value=key,
                    fix=f"give it with --env {key}=VALUE, or write a value in the file",
                ),
                under=(str(key),),
            )
        env[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    secrets: dict[str, str] = {}
    names = tuple(str(key) for key in p.raw("secret") or {})
    for key, value in (p.raw("secret") or {}).items():
        found = value if value is not None else environ.get(str(key)) if p.local else None
        if found is None and not p.local:
            continue  # a name only: its value travels apart from the document, encrypted
        if found is None:
            raise p.relocated(
                "secret",
                UsageError(
                    f"secret {key} has no value: it is not set in this environment",
                    field="secret",
                    value=key,
                    fix=f"export {key}=... before running tpuctl, or give --secret {key}=VALUE",
                ),
                under=(str(key),),
            )
        secrets[str(key)] = found
    try:
        parse_env([f"{k}={v}" for k, v in {**env, **{k: "" for k in names}}.items()])
    except UsageError as exc:
        raise p.relocated("secret" if str(exc.value).split("=")[0] in names else "env", exc) from None
    both = sorted(set(env) & set(names))
    if both:
        raise p.relocated(
            "secret",
            UsageError(
                f"{both[0]} is both an env value and a secret",
                field="secret",
                value=both[0],
                fix="give it once: as a secret if its value must stay out of logs and plans",
            ),
        )
    return env, secrets, names


def _types(p: _Parser, catalog: Catalog) -> tuple[tuple[str, ...], str]:
    """The slice types (tpuctl's names, the first the run's own) and how they rank."""
    given = p.values.get("accelerator_type")
    if given is None:
        return (), "ordered"
    chosen = given.value
    if isinstance(chosen, str):  # --type: one type, or several comma-separated, in order of preference
        chosen = AcceleratorSet(params.slice_types(chosen), (), "ordered")
    assert isinstance(chosen, AcceleratorSet)
    names: list[str] = []
    for index, name in enumerate(chosen.names):
        try:
            resolved = resolve_name(name, catalog, param="type" if given.flag else "accelerators")
        except UsageError as exc:
            if p.source is None or given.where is None or index >= len(chosen.places):
                raise
            raise from_usage(p.source, chosen.places[index], exc) from None
        if resolved not in names:
            names.append(resolved)
    return tuple(names), chosen.preference


def _placement(p: _Parser) -> PlacementChoices:
    infra_region, infra_zone = p.parse("infra", _infra) or (None, None)
    zones = [*(p.raw("zones") or ()), *filter(None, [p.raw("zone"), infra_zone])]
    spot, preemptible = bool(p.raw("spot")), bool(p.raw("preemptible"))
    capacity, queued_type = p.parse(
        "capacity_types",
        lambda v: params.capacity_types([str(c) for c in v], spot=spot, preemptible=preemptible),
    ) or params.capacity_types([], spot=spot, preemptible=preemptible)
    region = p.raw("region") or infra_region
    return PlacementChoices(
        zones=p.checked(
            ("zones", "zone", "infra"), lambda: tuple(params.zone(str(z), "zones") for z in zones)
        ),
        region=None if region is None else p.checked(("region", "infra"), lambda: params.region(str(region))),
        capacity_types=tuple(capacity),
        reserved=p.raw("reserved"),
        max_price=p.parse("max_price", lambda v: params.usd(v, "max_price", per_hour=True)),
        queued=bool(p.raw("queued")) or queued_type,
        valid_for_s=p.parse("valid_for", lambda v: params.duration(v, "valid_for")),
        strategy=p.parse("strategy", lambda v: params.strategy(str(v))) or Strategy.CHEAPEST,
        race_k=p.parse("race_k", lambda v: params.whole(v, "race_k")),
        surface=p.parse("api", lambda v: params.api(str(v))),
        runtime_version=p.raw("runtime_version"),
    )


#: SkyPilot's name of Google Cloud in ``infra`` (a cloud, not one of tpuctl's backends: the simulator
#: speaks Google's APIs, so a task for ``gcp`` plans on either).
SKYPILOT_GOOGLE_CLOUD = "gcp"


def _infra(value: Any) -> tuple[str | None, str | None]:
    """SkyPilot's ``infra``: ``gcp``, ``gcp/REGION`` or ``gcp/REGION/ZONE`` (``*`` for any)."""
    parts = [part.strip() for part in str(value).split("/")]
    if parts[0].lower() != SKYPILOT_GOOGLE_CLOUD or len(parts) > 3:
        raise UsageError(
            f"infra {value!r}: tpuctl places on Google Cloud only (gcp, gcp/REGION or gcp/REGION/ZONE)",
            field="infra",
            value=value,
            fix="write infra: gcp/us-central1 (or drop infra: every allowed zone is considered)",
        )
    region = parts[1] if len(parts) > 1 and parts[1] != "*" else None
    zone = parts[2] if len(parts) > 2 and parts[2] != "*" else None
    return region, zone


def _host_flags(p: _Parser) -> HostFlags:
    setup = p.raw("setup")
    copies = []
    for target, entry in (p.raw("file_mounts") or {}).items():
        try:
            copies.append(_copy_command(str(target), entry, runtime_deps=p.raw("runtime_deps") is not False))
        except UsageError as exc:
            raise p.relocated("file_mounts", exc, under=(str(target),)) from None
    if copies:
        setup = [*copies, *(setup or ())]
    network = p.parse("network", lambda v: params.network(str(v)))
    subnetwork = p.parse("subnetwork", lambda v: params.subnetwork(str(v)))
    tags = p.parse("tags", lambda v: params.network_tags([str(t) for t in v]))
    account = p.parse("service_account", lambda v: params.service_account(str(v)))
    return HostFlags(
        bucket=p.raw("bucket"),
        setup=None if setup is None else tuple(str(s) for s in setup),
        requirements=p.path("requirements"),
        ssh_proxy_command=p.raw("ssh_proxy_command"),
        network=None if network is None else str(p.raw("network")),
        subnetwork=None if subnetwork is None else str(p.raw("subnetwork")),
        tags=tags,
        service_account=account,
    )


#: Copies a gs:// source (an object, or a prefix's objects) to a path on the host, with the runtime
#: environment's gcsfs: the same client, credentials and endpoint the program's checkpoints use.
_COPY_PROGRAM: Final = (
    "import gcsfs,os,sys;src,dst=sys.argv[1],os.path.expanduser(sys.argv[2]);"
    "fs=gcsfs.GCSFileSystem();os.makedirs(os.path.dirname(dst.rstrip('/')) or '.',exist_ok=True);"
    "fs.get(src,dst,recursive=fs.isdir(src))"
)


def _copy_command(target: str, entry: Any, *, runtime_deps: bool) -> str:
    """The setup command of one ``file_mounts`` entry: its gs:// source copied to its path."""
    import shlex

    src = str(entry if isinstance(entry, str) else entry.source)
    if not src.startswith("gs://"):
        raise UsageError(
            f"source {src!r} is not a gs:// URL",
            field="file_mounts",
            value=src,
            fix="ship local files with workdir; a mount's source is gs://BUCKET/PATH",
        )
    if not runtime_deps:
        raise UsageError(
            "a file mount needs the runtime's environment (its gcsfs copies it); runtime_deps is false",
            field="file_mounts",
            value=target,
            fix="drop runtime_deps: false, or copy the files in setup: yourself",
        )
    return f"python -c {shlex.quote(_COPY_PROGRAM)} {shlex.quote(src)} {shlex.quote(target)}"
