"""Controlling runs from outside their supervisor, the pieces the ``Runs`` service (``service``) puts
together: the saved request (``--detach``, ``runs resume``), a supervisor started in the background,
preparing a run again to resume it, and cleaning up after a run nobody supervises (``runs cancel``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.catalog import CapacityType, Surface
from tpuctl.errors import (
    EXIT_LEASE_HELD,
    CloudError,
    LeaseHeldError,
    NotFoundError,
    TpuctlError,
    UsageError,
)
from tpuctl.services.placement_choices import PlacementChoices
from tpuctl.services.run import hosts, prepare
from tpuctl.services.run.lease import Lease
from tpuctl.services.run.model import EXECUTOR_KINDS, RecoveryPolicy, RunRequest
from tpuctl.services.run.runkey import secret_key
from tpuctl.services.run.views import Cancellation, CancelOutcome, Detached, LeaseHolder, Resumption
from tpuctl.store.paths import atomic_write_json, atomic_write_text, private_file
from tpuctl.store.records import RunStatus

if TYPE_CHECKING:
    from tpuctl.cloud.base import Node
    from tpuctl.hosts.bundle import Bundle
    from tpuctl.services.run.rundir import RunDir
    from tpuctl.services.session import Session
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.records import RunRecord
    from tpuctl.store.secrets import SecretKey


@dataclass(frozen=True)
class SavedRequest:
    """What ``runs resume`` and a background supervisor need to prepare a run again."""

    request: RunRequest  # with the run's id
    budget_usd: float | None
    policy: RecoveryPolicy


#: Where a run's program is unpacked from the ledger's bundle, in its directory on this machine.
PROGRAM_FOLDER = "program"
#: The run's secret that holds its ``--env`` values, and the saved request's mark that they are there.
ENV_SECRET = "env"
ENV_IN_SECRET = "env_in_secret"
#: Where a run's ``--requirements`` are written from the ledger, in its directory on this machine.
REQUIREMENTS_FILE = "requirements.txt"
#: The saved request's keys beyond the request: the script's path in the bundle, the requirements' text.
SCRIPT_IN_BUNDLE = "script_in_bundle"
REQUIREMENTS_TEXT = "requirements_text"


def request_payload(
    request: RunRequest, *, run_id: str, budget_usd: float | None, policy: RecoveryPolicy
) -> dict[str, Any]:
    """What a supervisor prepares the run again from (the ledger's and the local file's one form)."""
    data = dataclasses.asdict(request)
    data["placement"] = request.placement.to_dict()
    data["run_id"] = run_id
    return {"request": data, "budget_usd": budget_usd, "policy": policy.to_dict()}


def save_request(
    run_dir: RunDir, request: RunRequest, *, run_id: str, budget_usd: float | None, policy: RecoveryPolicy
) -> Path:
    """Write the request to the run's local file, for a run whose ledger holds none: 0600 (--env values
    may be secrets), atomically and durably (a run killed while saving keeps the old request whole, and a
    machine that crashes after ``runs resume`` returned still has the new one). ``record_request`` is
    what a run uses: it keeps the --env values out of every file."""
    run_dir.make()
    payload = request_payload(request, run_id=run_id, budget_usd=budget_usd, policy=policy)
    return atomic_write_json(run_dir.request_file, payload)


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
    ``script_in_bundle``: the script's path inside the bundle, where another machine finds it;
    ``requirements_text``: the ``--requirements`` file's content (another machine has no such file).
    Either, not given, stays as the ledger had it. The ``--env`` values may be secrets: neither the
    ledger's request nor the local file carries them; they are one secret of the run's, encrypted with
    ``key``."""
    payload = request_payload(request, run_id=run_id, budget_usd=budget_usd, policy=policy)
    env = payload["request"].pop("env", None) or []
    ledger.put_secret(run_id, ENV_SECRET, json.dumps(list(env)).encode(), key)
    payload[ENV_IN_SECRET] = True
    given = {SCRIPT_IN_BUNDLE: script_in_bundle, REQUIREMENTS_TEXT: requirements_text}
    before_text = ledger.run_request(run_id)
    before = json.loads(before_text) if before_text is not None else {}
    for name, value in given.items():
        kept = value if value is not None else before.get(name)
        if kept is not None:
            payload[name] = kept
    run_dir.make()
    atomic_write_json(run_dir.request_file, payload)
    ledger.save_run_request(run_id, json.dumps(payload, sort_keys=True))


def record_bundle(ledger: Ledger, run_id: str, bundle: Bundle) -> None:
    """The program's files (the bundle, as shipped to the hosts) in the ledger, for another machine."""
    ledger.save_bundle(run_id, bundle.tar_gz())


def _host_access(ledger: Ledger, run_id: str, run_dir: RunDir) -> hosts.HostAccess:
    """How the run reached its hosts (its saved request's remote root and ProxyCommand; the defaults
    otherwise)."""
    try:
        request = saved_payload(ledger, run_id, run_dir)["request"]
        return hosts.HostAccess(
            str(request.get("ssh_remote_root") or ".tpuctl"), request.get("ssh_proxy_command") or None
        )
    except (UsageError, ValueError, KeyError, TypeError, AttributeError):
        return hosts.HostAccess(".tpuctl")


def load_request(run_dir: RunDir) -> SavedRequest:
    """The request saved in the run's local file (``saved_payload`` prefers the ledger's)."""
    return parse_request(_local_payload(run_dir))


def saved_payload(
    ledger: Ledger, run_id: str, run_dir: RunDir, key: Callable[[], SecretKey] | None = None
) -> dict[str, Any]:
    """The run's saved request as the ledger holds it (any machine), else this machine's file. Its
    ``--env`` values are decrypted with the key ``key`` gives, asked for only when there are some;
    without one (a caller that reads no env) they are left out."""
    text = ledger.run_request(run_id)
    loaded = json.loads(text) if text is not None else None
    payload = loaded if isinstance(loaded, dict) else _local_payload(run_dir)
    if payload.pop(ENV_IN_SECRET, False) and key is not None:
        env = ledger.get_secret(run_id, ENV_SECRET, key())
        payload["request"]["env"] = json.loads(env) if env is not None else []
    return payload


def _local_payload(run_dir: RunDir) -> dict[str, Any]:
    path = run_dir.request_file
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"cannot read the saved request of this run ({path}: {exc})",
            field="RUN",
            value=run_dir.root.name,
            fix="only runs started by a tpuctl that saves requests can be resumed; start it again with "
            "`tpuctl run`",
        ) from None
    return dict(payload)


def parse_request(payload: dict[str, Any]) -> SavedRequest:
    raw = dict(payload["request"])
    raw["placement"] = _placement(raw)
    for key in ("args", "env", "setup", "other_accelerator_types", "secret_names"):
        raw[key] = tuple(raw.get(key) or ())
    if raw.get("executor") not in EXECUTOR_KINDS:
        raw["executor"] = None  # one that is gone (simulated hosts are VMs now, reached over SSH)
    raw["labels"] = {str(k): str(v) for k, v in (raw.get("labels") or {}).items()}
    names = {f.name for f in dataclasses.fields(RunRequest)}
    request = RunRequest(**{k: v for k, v in raw.items() if k in names})
    policy_raw = payload.get("policy") or {}
    policy_names = {f.name for f in dataclasses.fields(RecoveryPolicy)}
    policy = RecoveryPolicy(**{k: v for k, v in policy_raw.items() if k in policy_names})
    budget = payload.get("budget_usd")
    return SavedRequest(request, float(budget) if budget is not None else None, policy)


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


def _settings_env(session: Session) -> dict[str, str]:
    """The settings a background supervisor must share with the command that started it."""
    settings = session.settings
    # Paths absolute, as the user meant them: the supervisor starts in the run's log directory.
    env = {"TPUCTL_STATE_DIR": str(session.state_dir.absolute())}
    for name, value in (
        ("TPUCTL_PROFILE", settings.profile),
        ("TPUCTL_PROJECT", settings.project),
        ("TPUCTL_BACKEND", None if settings.backend is None else settings.backend.value),
        # The resolved default path even when there is no file: pass it on only if it exists (named,
        # a missing file is an error).
        (
            "TPUCTL_CONFIG",
            settings.config_file if settings.config_file and settings.config_file.exists() else None,
        ),
        ("TPUCTL_SIM_URL", settings.sim_url),
        ("TPUCTL_SIM_WORLD", settings.sim_world),
        # The one ledger, the key of the runs' secrets and the lease's timing: the background
        # supervisor must claim, renew and read the run exactly as this command would.
        ("TPUCTL_DATABASE_URL", settings.resolved_database.text),
        (
            "TPUCTL_SECRET_KEY",
            None if settings.secret_key is None else settings.secret_key.get_secret_value(),
        ),
        ("TPUCTL_SECRET_KEY_FILE", settings.resolved_secret_key_file),
        ("TPUCTL_LEASE_DURATION", f"{settings.lease_duration!r}"),
        ("TPUCTL_LEASE_RENEW_EVERY", f"{settings.lease_renew_every!r}"),
        # ... and the backstop the hosts are armed with: the same grace as the command that started it.
        ("TPUCTL_BACKSTOP_GRACE", f"{settings.backstop_grace!r}"),
    ):
        if value is not None:
            env[name] = str(value.absolute() if isinstance(value, Path) else value)
    return env


def start_detached(
    session: Session,
    run_dir: RunDir,
    *,
    holder: Callable[[], LeaseHolder | None],
    resume: bool = False,
    wait_s: float = 30.0,
) -> Detached:
    """Start ``python -m tpuctl runs supervise RUN`` in a session of its own (it survives the terminal
    and this process) and wait until it holds the run's ledger lease (``holder``: who holds it now)."""
    import subprocess
    import sys

    run_id = run_dir.root.name
    run_dir.make()
    log_path = private_file(run_dir.supervisor_log)
    env = {**os.environ, **_settings_env(session)}
    argv = [sys.executable, "-m", "tpuctl", "runs", "supervise", run_id] + (["--resume"] if resume else [])
    try:
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(run_dir.root),
                # A new session: no controlling terminal, so closing the terminal (SIGHUP) or Ctrl-C in it
                # does not reach the supervisor.
                start_new_session=True,
            )
    except OSError as exc:
        raise _not_started(
            session, run_id, f"the background supervisor could not start: {exc}", log_path
        ) from exc
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        held = holder()
        if held is not None and held.pid == proc.pid:
            return Detached(run_id, proc.pid, log_path, leased=True)
        if proc.poll() is not None:
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            reason = f"the background supervisor exited at once (status {proc.returncode}): {tail.strip()}"
            raise _not_started(session, run_id, reason, log_path, returncode=proc.returncode)
        time.sleep(0.05)
    return Detached(run_id, proc.pid, log_path, leased=False)


def _not_started(
    session: Session, run_id: str, reason: str, log_path: Path, *, returncode: int | None = None
) -> TpuctlError:
    """Record that ``run_id``'s supervisor never started (the run is FAILED with the reason, not left
    PENDING forever: nothing will ever take it up) and return the error to raise. Unless another
    supervisor holds the run's lease (the child then exits 9): the run is that one's, and nothing is
    written over it."""
    held = session.ledger.lease_of(run_id)
    if held is not None and not held.expired:
        return LeaseHeldError(
            run_id=run_id,
            owner_id=held.owner.owner_id,
            host=held.owner.host,
            pid=held.owner.pid,
            generation=held.generation,
            expires_at=held.expires_at,
            now=held.now,
        )
    if returncode == EXIT_LEASE_HELD:
        return TpuctlError(
            f"run {run_id}: another supervisor held its lease, so this one did not start",
            fix=f"see who supervises it with `tpuctl runs describe {run_id}`; also {log_path}",
        )
    record = session.ledger.get_run(run_id)
    if record is not None and not RunStatus(record.status).finished:
        detail = {**(record.detail or {}), "error": reason, "never_started": True, "supervisor": None}
        session.ledger.update_run(run_id, status=RunStatus.FAILED, detail=detail)
    return TpuctlError(f"run {run_id}: {reason}", fix=f"see {log_path}")


def prepare_again(session: Session, record: RunRecord, run_dir: RunDir) -> Resumption:
    """The saved request of ``record``'s run, prepared again under the same run id, with its saved policy
    and budget; with a note when the program's files changed since (the new ones are shipped)."""
    run_id = record.run_id
    payload = saved_payload(session.ledger, run_id, run_dir, lambda: secret_key(session.settings))
    saved = parse_request(payload)
    request = _from_ledger_bundle(session, saved.request, payload, run_dir)
    request = with_saved_requirements(request, payload, run_dir)
    prepared = prepare.prepare(session, dataclasses.replace(request, run_id=run_id))
    detail = record.detail or {}
    note = None
    if prepared.bundle.digest != detail.get("bundle_sha256"):
        note = (
            f"the program's files changed since run {run_id} started (bundle now "
            f"{prepared.bundle.short_digest}); the new files are shipped"
        )
    return Resumption(
        run_id=run_id,
        hosts=int(detail.get("hosts", 1)),
        prepared=prepared,
        policy=saved.policy,
        budget_usd=saved.budget_usd,
        note=note,
    )


def _from_ledger_bundle(
    session: Session, request: RunRequest, payload: dict[str, Any], run_dir: RunDir
) -> RunRequest:
    """``request`` reading the program from the ledger's bundle, unpacked into the run's directory on
    this machine (the first machine's files are not needed, nor looked at); as saved when the ledger has
    no bundle (a run recorded before bundles were)."""
    data = session.ledger.bundle(run_dir.root.name)
    if data is None:
        return request
    program = run_dir.make().root / PROGRAM_FOLDER
    unpack_user_files(data, program)
    script = payload.get(SCRIPT_IN_BUNDLE)
    return dataclasses.replace(
        request,
        workdir=str(program) if request.script is not None or request.workdir else None,
        script=None if request.script is None or not script else str(program / script),
    )


def with_saved_requirements(request: RunRequest, payload: dict[str, Any], run_dir: RunDir) -> RunRequest:
    """``request`` installing the ``--requirements`` saved in the ledger, written (0600) into the run's
    directory on this machine; as saved when the ledger has none (none given, or a run saved before)."""
    text = payload.get(REQUIREMENTS_TEXT)
    if request.requirements is None or not isinstance(text, str):
        return request
    path = atomic_write_text(run_dir.make().root / REQUIREMENTS_FILE, text)
    return dataclasses.replace(request, requirements=str(path))


def unpack_user_files(data: bytes, directory: Path) -> None:
    """The user's files of a bundle's .tar.gz into ``directory`` (emptied first), private; tpuctl's own
    runtime files are left out (this tpuctl ships its own)."""
    import io
    import shutil
    import tarfile

    from tpuctl.hosts.bundle import COMPLETE_MARKER, RUNTIME_PREFIX
    from tpuctl.store.paths import ensure_private_dir

    if directory.exists():
        shutil.rmtree(directory)
    ensure_private_dir(directory)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.isfile() and not m.name.startswith(RUNTIME_PREFIX) and m.name != COMPLETE_MARKER
        ]
        # The "data" filter refuses absolute paths, links out of the directory and device files.
        tar.extractall(directory, members=members, filter="data")
    for path in directory.rglob("*"):
        path.chmod(0o700 if path.is_dir() else (path.stat().st_mode & 0o700))


def clean_up(session: Session, record: RunRecord, run_dir: RunDir) -> Cancellation:
    """Cancel a run nobody supervises (its supervisor was killed): stop what it left on the user's own
    slices, end its open segments, delete the slices it made, and record it CANCELLED."""
    ledger = session.ledger
    run_id = record.run_id
    status = RunStatus(record.status)
    detail = dict(record.detail or {})
    # Held while cleaning up, so a `runs resume` started meanwhile does not take the run over.
    lease = Lease.acquire(run_dir.lock_file)
    try:
        killed = 0
        if not detail.get("created_pod") and record.pod and record.zone:
            # The user's own slices stay: stop the program the run left on them (it runs detached).
            from tpuctl.services.run.provision import find_pods
            from tpuctl.services.run.runkey import load_run_key

            key = load_run_key(session, run_id)
            with contextlib.suppress(CloudError, UsageError):
                given = find_pods(session, record.pod, record.zone)
                access = _host_access(ledger, run_id, run_dir)
                killed = hosts.stop_left_hosts(session, given, run_id, access, key)
        for seg in ledger.segments(run_id):
            if seg.end is None:
                ledger.close_segment(seg.id, end=time.time())
        deleted = None
        if detail.get("created_pod"):
            deleted = _delete_run_slices(session, run_id, record)
        if status is RunStatus.PENDING and not ledger.segments(run_id):
            detail["never_started"] = True  # it has no duration to show
        detail.update(supervisor=None, cancelled_by="runs cancel (no live supervisor)")
        ledger.update_run(run_id, status=RunStatus.CANCELLED, exit_code=130, detail=detail)
        return Cancellation(
            run_id, CancelOutcome.CLEANED_UP, status="cancelled", hosts_killed=killed, deleted=deleted
        )
    finally:
        if lease is not None:
            lease.release()


def _delete_run_slices(session: Session, run_id: str, record: RunRecord) -> str | None:
    """Delete every slice the run made that is still alive (``takeover.adopt_slices``); the names
    deleted, comma-separated (None: none)."""
    from tpuctl.services.pods import PodService
    from tpuctl.services.run.takeover import adopt_slices

    def delete(node: Node, reason: str) -> bool:
        with contextlib.suppress(NotFoundError):
            PodService(session).delete(node.name, zone=node.zone, wait=True, reason=reason)
        return True

    return ", ".join(adopt_slices(session, run_id, record, delete, by="runs cancel")) or None
