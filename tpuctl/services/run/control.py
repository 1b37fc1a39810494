"""Controlling runs from outside their supervisor, the pieces the ``Runs`` service (``service``) puts
together: the program's files in the ledger, a supervisor started in the background, preparing a run
again to resume it from its saved request (``saved``), and cleaning up after a run nobody supervises
(``runs cancel``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.errors import (
    EXIT_LEASE_HELD,
    CloudError,
    LeaseHeldError,
    NotFoundError,
    TpuctlError,
    UsageError,
)
from tpuctl.services.run import hosts, prepare
from tpuctl.services.run.lease import Lease
from tpuctl.services.run.model import RunRequest
from tpuctl.services.run.runkey import secret_key
from tpuctl.services.run.saved import SavedRequest, saved_request, with_saved_requirements
from tpuctl.services.run.secretenv import load_secrets
from tpuctl.services.run.views import Cancellation, CancelOutcome, Detached, LeaseHolder, Resumption
from tpuctl.store.paths import private_file
from tpuctl.store.records import RunStatus

if TYPE_CHECKING:
    from tpuctl.cloud.base import Node
    from tpuctl.hosts.bundle import Bundle
    from tpuctl.services.run.rundir import RunDir
    from tpuctl.services.session import Session
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.records import RunRecord


#: Where a run's program is unpacked from the ledger's bundle, in its directory on this machine.
PROGRAM_FOLDER = "program"


def record_bundle(ledger: Ledger, run_id: str, bundle: Bundle) -> None:
    """The program's files (the bundle, as shipped to the hosts) in the ledger, for another machine."""
    ledger.save_bundle(run_id, bundle.tar_gz())


def _host_access(ledger: Ledger, run_id: str, run_dir: RunDir) -> hosts.HostAccess:
    """How the run reached its hosts (its saved request's remote root and ProxyCommand; the defaults
    otherwise)."""
    try:
        request = saved_request(ledger, run_id, run_dir).request
        return hosts.HostAccess(request.ssh_remote_root, request.ssh_proxy_command or None)
    except (UsageError, ValueError, KeyError, TypeError, AttributeError):
        return hosts.HostAccess(".tpuctl")


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
        # (secret_url: the password too, where the URL has one; text shows it as ***.)
        ("TPUCTL_DATABASE_URL", settings.resolved_database.secret_url),
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
    saved = saved_request(session.ledger, run_id, run_dir, lambda: secret_key(session.settings))
    request = _from_ledger_bundle(session, saved, run_dir)
    request = with_saved_requirements(request, saved, run_dir)
    # The secret values from the ledger, decrypted here: whichever machine resumes the run gives the
    # program the values the run was started with.
    secrets = (
        load_secrets(session.ledger, run_id, secret_key(session.settings)) if request.secret_names else {}
    )
    prepared = prepare.prepare(session, dataclasses.replace(request, run_id=run_id), secrets=secrets)
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


def _from_ledger_bundle(session: Session, saved: SavedRequest, run_dir: RunDir) -> RunRequest:
    """``request`` reading the program from the ledger's bundle, unpacked into the run's directory on
    this machine (the first machine's files are not needed, nor looked at); as saved when the ledger has
    no bundle (a run recorded before bundles were)."""
    request = saved.request
    data = session.ledger.bundle(run_dir.root.name)
    if data is None:
        return request
    program = run_dir.make().root / PROGRAM_FOLDER
    unpack_user_files(data, program)
    script = saved.script_in_bundle
    return dataclasses.replace(
        request,
        workdir=str(program) if request.script is not None or request.workdir else None,
        script=None if request.script is None or not script else str(program / script),
    )


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
