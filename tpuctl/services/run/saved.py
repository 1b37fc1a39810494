"""A run's saved request: what ``--detach``, ``runs resume`` and a supervisor taking the run over on any
machine prepare it again from, in the ledger (``request.json``) and in the run's directory.

The saved record has two parts, kept apart so that one is what a user (or a server) writes and the
other is tpuctl's own:

- ``job``: the job document (``tpuctl.jobs.document``), the run request's one serialised form: the
  keys of a job file, read back through the same checks as a job file. The budget and the recovery
  limits a job file has keys for (``budget``, ``max_preemptions``, ``job_recovery``) are here.
- ``run``: the run's own state, which no job file says and no user writes:
  ``run_id`` (given by tpuctl); ``deadline_at`` (``max_hours`` fixed once, when the run was first
  prepared, so a recovery or a resume keeps the moment); ``executor`` (how tpuctl reaches the hosts:
  ssh is the only one); ``python`` and ``ssh_remote_root`` (hidden options of the installation that
  submitted the run: where the hosts' interpreter and tpuctl's files are; a job file names what runs,
  not how this tpuctl is laid out on the hosts); ``network_settled`` (the hosts' network was settled
  when the run was submitted: with no network named that is the project's default, not whatever the
  settings of the machine that resumes the run say); ``recovery`` (the recovery policy's timings, which
  only tests and backends set); ``env_in_secret`` (the ``envs`` values are one encrypted secret of the
  run's, not in this record); ``script_in_bundle`` and ``requirements_text`` (where another machine
  finds the program in the ledger's bundle, and the requirements file's text, which another machine
  does not have).

Keys keep the document's order, not sorted: the order of ``envs``, ``secrets`` and a set of
accelerators is the request's (the first type of a set is the run's own).

A secret's value is never in the record: the document names secrets only (their values are kept
encrypted, ``secretenv``). Records written before the job document was the saved form (a
``request`` key holding the request's fields) are read too.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tpuctl.catalog import CapacityType, Catalog, Surface
from tpuctl.cloud.base import HostNetwork
from tpuctl.errors import UsageError
from tpuctl.jobs.document import document_from_run_request, run_request_from_document
from tpuctl.services.placement_choices import PlacementChoices
from tpuctl.services.run.model import EXECUTOR_KINDS, RecoveryPolicy, RunRequest
from tpuctl.store.paths import atomic_write_json, atomic_write_text

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpuctl.services.run.rundir import RunDir
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.secrets import SecretKey

#: The record's two parts: the job document, and the run's own state.
JOB_PART: Final = "job"
RUN_PART: Final = "run"
#: The run's secret that holds its ``envs`` values.
ENV_SECRET: Final = "env"
#: Where a run's ``--requirements`` are written from the ledger, in its directory on this machine.
REQUIREMENTS_FILE: Final = "requirements.txt"
#: The recovery policy's fields a job file has keys for (the rest are the run part's ``recovery``).
_POLICY_IN_JOB: Final = frozenset({"max_restarts", "max_preemptions"})
_POLICY_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(RecoveryPolicy))
_DEFAULT_REMOTE_ROOT: Final = RunRequest().ssh_remote_root


@dataclass(frozen=True)
class SavedRequest:
    """What ``runs resume`` and a background supervisor need to prepare a run again."""

    request: RunRequest  # with the run's id
    budget_usd: float | None
    policy: RecoveryPolicy
    #: The script's path inside the run's bundle, where another machine finds it (None: not recorded).
    script_in_bundle: str | None = None
    #: The ``--requirements`` file's content (another machine has no such file; None: not recorded).
    requirements_text: str | None = None
    #: The ``envs`` values are one secret of the run's, not in the record.
    env_in_secret: bool = False


def saved_record(
    request: RunRequest, *, run_id: str, budget_usd: float | None, policy: RecoveryPolicy
) -> dict[str, Any]:
    """The record of ``request``: its job document and the run's own state (the module's docstring)."""
    job = document_from_run_request(request, budget_usd=budget_usd, policy=policy)
    return {JOB_PART: job, RUN_PART: _run_state(request, run_id, policy)}


def _run_state(request: RunRequest, run_id: str, policy: RecoveryPolicy) -> dict[str, Any]:
    """The record's run part; values left at their defaults are left out."""
    defaults = RecoveryPolicy().to_dict()
    tuning = {k: v for k, v in policy.to_dict().items() if k not in _POLICY_IN_JOB and v != defaults[k]}
    remote_root = request.ssh_remote_root
    state: dict[str, Any] = {
        "run_id": run_id,
        "deadline_at": request.deadline_at,
        "executor": request.executor,
        "python": request.python,
        "ssh_remote_root": remote_root if remote_root != _DEFAULT_REMOTE_ROOT else None,
        "network_settled": True if request.placement.network is not None else None,
        "recovery": tuning or None,
    }
    return {key: value for key, value in state.items() if value is not None}


def save_request(
    run_dir: RunDir, request: RunRequest, *, run_id: str, budget_usd: float | None, policy: RecoveryPolicy
) -> Path:
    """Write the request to the run's local file, for a run whose ledger holds none: 0600 (``envs``
    values may be secrets), atomically and durably (a run killed while saving keeps the old request
    whole, and a machine that crashes after ``runs resume`` returned still has the new one).
    ``record_request`` is what a run uses: it keeps the ``envs`` values out of every file."""
    run_dir.make()
    record = saved_record(request, run_id=run_id, budget_usd=budget_usd, policy=policy)
    return atomic_write_json(run_dir.request_file, record, sort_keys=False)


def record_request(
    ledger: Ledger,
    run_dir: RunDir,
    request: RunRequest,
    *,
    run_id: str,
    budget_usd: float | None,
    policy: RecoveryPolicy,
    key: SecretKey,
    script_in_bundle: str | None = None,
    requirements_text: str | None = None,
) -> None:
    """The saved request in the ledger, where a supervisor on any machine reads it, and in the local file.
    ``script_in_bundle``, ``requirements_text``: as ``SavedRequest``'s; either, not given, stays as the
    ledger had it. The ``envs`` values may be secrets: neither the ledger's record nor the local file
    carries them; they are one secret of the run's, encrypted with ``key``."""
    record = saved_record(request, run_id=run_id, budget_usd=budget_usd, policy=policy)
    record[JOB_PART].pop("envs", None)
    ledger.put_secret(run_id, ENV_SECRET, json.dumps(list(request.env)).encode(), key)
    run = record[RUN_PART]
    run["env_in_secret"] = True
    before_text = ledger.run_request(run_id)
    before = _extras(json.loads(before_text)) if before_text is not None else {}
    given = {"script_in_bundle": script_in_bundle, "requirements_text": requirements_text}
    for name, value in given.items():
        kept = value if value is not None else before.get(name)
        if kept is not None:
            run[name] = kept
    run_dir.make()
    atomic_write_json(run_dir.request_file, record, sort_keys=False)
    ledger.save_run_request(run_id, json.dumps(record))


def load_request(run_dir: RunDir) -> SavedRequest:
    """The request saved in the run's local file (``saved_request`` prefers the ledger's)."""
    return parse_request(_local_record(run_dir), where=str(run_dir.request_file))


def saved_request(
    ledger: Ledger, run_id: str, run_dir: RunDir, key: Callable[[], SecretKey] | None = None
) -> SavedRequest:
    """The run's saved request as the ledger holds it (any machine), else this machine's file. Its
    ``envs`` values are decrypted with the key ``key`` gives, asked for only when there are some;
    without one (a caller that reads no env) they are left out."""
    text = ledger.run_request(run_id)
    loaded = json.loads(text) if text is not None else None
    if isinstance(loaded, dict):
        saved = parse_request(loaded, where=f"the ledger's saved request of run {run_id}")
    else:
        saved = parse_request(_local_record(run_dir), where=str(run_dir.request_file))
    if not saved.env_in_secret or key is None:
        return saved
    env = ledger.get_secret(run_id, ENV_SECRET, key())
    values = tuple(json.loads(env)) if env is not None else ()
    return dataclasses.replace(saved, request=dataclasses.replace(saved.request, env=values))


def _local_record(run_dir: RunDir) -> dict[str, Any]:
    path = run_dir.request_file
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"cannot read the saved request of this run ({path}: {exc})",
            field="RUN",
            value=run_dir.root.name,
            fix="only runs started by a tpuctl that saves requests can be resumed; start it again with "
            "`tpuctl run`",
        ) from None
    return dict(record)


def parse_request(record: dict[str, Any], *, where: str = "the saved request") -> SavedRequest:
    """A saved record, of either form: the job document with the run's state, or (written before the
    job document was the saved form) the request's fields under ``request``. ``where`` names it in an
    error."""
    if JOB_PART in record:
        return _from_document(record, where)
    return _from_fields(record)


def _from_document(record: dict[str, Any], where: str) -> SavedRequest:
    run = dict(record.get(RUN_PART) or {})
    job = record[JOB_PART]
    if isinstance(job, dict) and isinstance(job.get("priority"), int):
        # A number from before priority bands: it was recorded only, never acted on, so it is dropped.
        job = {k: v for k, v in job.items() if k != "priority"}
    asked = run_request_from_document(job, catalog=Catalog.load(), path=where)
    request = asked.request
    placement = request.placement
    if run.get("network_settled") and placement.network is None:
        placement = dataclasses.replace(placement, network=HostNetwork())
    request = dataclasses.replace(
        request,
        run_id=run.get("run_id"),
        deadline_at=run.get("deadline_at"),
        executor=run.get("executor") if run.get("executor") in EXECUTOR_KINDS else None,
        python=run.get("python"),
        ssh_remote_root=str(run.get("ssh_remote_root") or _DEFAULT_REMOTE_ROOT),
        placement=placement,
    )
    tuning = {k: v for k, v in (run.get("recovery") or {}).items() if k in _POLICY_FIELDS - _POLICY_IN_JOB}
    return SavedRequest(
        request,
        asked.budget_usd,
        dataclasses.replace(asked.policy, **tuning),
        **_extras(record),
    )


def _extras(record: dict[str, Any]) -> dict[str, Any]:
    """``SavedRequest``'s fields beyond the request, from either form (the old one kept them at the
    top)."""
    part = record.get(RUN_PART) if JOB_PART in record else record
    part = part if isinstance(part, dict) else {}
    script, text = part.get("script_in_bundle"), part.get("requirements_text")
    return {
        "script_in_bundle": script if isinstance(script, str) else None,
        "requirements_text": text if isinstance(text, str) else None,
        "env_in_secret": bool(part.get("env_in_secret")),
    }


def _from_fields(record: dict[str, Any]) -> SavedRequest:
    """A record of the request's fields (``dataclasses.asdict``), as tpuctl saved them before."""
    raw = dict(record["request"])
    raw["placement"] = _placement(raw)
    for key in ("args", "env", "setup", "other_accelerator_types", "secret_names"):
        raw[key] = tuple(raw.get(key) or ())
    if raw.get("executor") not in EXECUTOR_KINDS:
        raw["executor"] = None  # one that is gone (simulated hosts are VMs now, reached over SSH)
    raw["labels"] = {str(k): str(v) for k, v in (raw.get("labels") or {}).items()}
    names = {f.name for f in dataclasses.fields(RunRequest)}
    request = RunRequest(**{k: v for k, v in raw.items() if k in names})
    policy_raw = record.get("policy") or {}
    policy = RecoveryPolicy(**{k: v for k, v in policy_raw.items() if k in _POLICY_FIELDS})
    budget = record.get("budget_usd")
    return SavedRequest(request, float(budget) if budget is not None else None, policy, **_extras(record))


def _placement(raw: dict[str, Any]) -> PlacementChoices:
    """The saved placement choices; a request saved before they were one value reads its ``zone``,
    ``api`` and allowed set (or, older still, its one ``capacity``: an on-demand one as none named, the
    profile's deciding then, as they do now)."""
    if "placement" in raw:
        return PlacementChoices.from_dict(raw["placement"])
    if "capacity_types" in raw:
        types = tuple(CapacityType(t) for t in raw["capacity_types"])
    else:
        legacy = CapacityType(raw.get("capacity") or CapacityType.ON_DEMAND.value)
        types = () if legacy is CapacityType.ON_DEMAND else (legacy,)
    return PlacementChoices(
        zones=(raw["zone"],) if raw.get("zone") else (),
        capacity_types=types,
        surface=None if raw.get("api") is None else Surface(raw["api"]),
    )


def with_saved_requirements(request: RunRequest, saved: SavedRequest, run_dir: RunDir) -> RunRequest:
    """``request`` installing the ``--requirements`` saved in the ledger, written (0600) into the run's
    directory on this machine; as saved when the ledger has none (none given, or a run saved before)."""
    text = saved.requirements_text
    if request.requirements is None or text is None:
        return request
    path = atomic_write_text(run_dir.make().root / REQUIREMENTS_FILE, text)
    return dataclasses.replace(request, requirements=str(path))
