"""A submission becomes a recorded run: the job document read as a job file is (``jobs.document``), the
program unpacked from its uploaded bundle, the run prepared and recorded QUEUED with no lease, for a
replica to admit when its workspace has room (``admission``, ``replica``); one that can never fit its
workspace is refused (exit 3).

Idempotent on the client's key: everything is checked first, then the key is stored with the new run's
id (``Ledger.remember_submission``), then the run is recorded. A retry with the same key finds the first
run (``created`` False) and never records a second; the same key with another request is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.server.problems import Conflict, RequestProblem

if TYPE_CHECKING:
    from tpuctl.jobs.document import RequestedRun
    from tpuctl.server.bundles import BundleStore
    from tpuctl.server.wire import SubmitRun
    from tpuctl.services.run.model import PreparedRun, RunRequest
    from tpuctl.services.session import Session
    from tpuctl.store.records import RunRecord
    from tpuctl.teams.workspaces import Workspaces


@dataclass(frozen=True)
class Accepted:
    record: RunRecord
    created: bool  # False: a retry that found the run its key made


def request_digest(body: SubmitRun) -> str:
    """The submission's identity beside its key: the same key may only ever mean the same request. The
    secrets count by name only: the digest is stored in the ledger in the clear, and a digest of a
    short secret is as good as the secret to whoever guesses it (a retry sends the same values anyway)."""
    identity = body.model_dump(exclude={"secrets"})
    identity["secret_names"] = sorted(body.secrets or {})
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def submit(
    session: Session, bundles: BundleStore, body: SubmitRun, key: str, workspaces: Workspaces | None = None
) -> Accepted:
    """Record the submission as a QUEUED run of its workspace (``workspaces``: the server's; None, the
    implicit one), refused (exit 3) if it can never fit there (``admission.queue_entry``)."""
    digest = request_digest(body)
    known = session.ledger.submission(key)
    if known is not None:
        return _the_first(session, known.run_id, known.request_sha256, digest, key)
    from tpuctl.server.admission import queue_entry
    from tpuctl.services.run.prepare import new_run_id
    from tpuctl.services.run.rundir import RunDir
    from tpuctl.services.run.supervisor import Supervisor
    from tpuctl.teams.workspaces import Workspaces

    run_id = new_run_id(session.clock())
    workspaces = workspaces or Workspaces.implicit()
    requested, prepared = _prepared(
        session, bundles, body, run_id, RunDir.of(session.state_dir, run_id).make().root, workspaces
    )
    entry = queue_entry(session, workspaces, prepared)
    stored = session.ledger.remember_submission(key, run_id, digest)
    if stored.run_id != run_id:  # the same key arrived twice at once: the other one is the run
        return _the_first(session, stored.run_id, stored.request_sha256, digest, key)
    supervisor = Supervisor(session, policy=requested.policy, budget_usd=requested.budget_usd)
    try:
        supervisor.create_record(prepared, queue=entry)
    except BaseException:
        # Not recorded (or half: a run row without its request is one no replica takes up): the key
        # must not keep pointing at it, or every retry would be told to wait for it.
        session.ledger.forget_submission(key, run_id)
        raise
    bundles.prune(now=time.time())  # the run's bundle is the ledger's now; old uploads go
    record = session.ledger.get_run(run_id)
    assert record is not None
    return Accepted(record, created=True)


def plan(
    session: Session, bundles: BundleStore, body: SubmitRun, workspaces: Workspaces | None = None
) -> dict[str, Any]:
    """What a submission of ``body`` would do, as `run --dry-run` plans it locally: every check a
    submission makes, nothing recorded, nothing created; the program unpacked into a directory of its
    own that is removed after (a plan leaves no run behind)."""
    import tempfile

    from tpuctl.services.run.prepare import new_run_id
    from tpuctl.services.run.service import Runs
    from tpuctl.store.paths import ensure_private_dir
    from tpuctl.teams.workspaces import Workspaces

    run_id = new_run_id(session.clock())
    ensure_private_dir(session.state_dir)
    with tempfile.TemporaryDirectory(prefix="plan-", dir=session.state_dir) as root:
        requested, prepared = _prepared(
            session, bundles, body, run_id, Path(root), workspaces or Workspaces.implicit()
        )
        return Runs(session).plan(prepared, budget_usd=requested.budget_usd)


def _prepared(
    session: Session, bundles: BundleStore, body: SubmitRun, run_id: str, root: Path, workspaces: Workspaces
) -> tuple[RequestedRun, PreparedRun]:
    """``body`` as a prepared run with id ``run_id``, its program unpacked under ``root``: every check of
    a submission (each bad value is exit 2 -> 400), before anything is stored. A run of several slice
    types keeps only those its workspace could ever hold (``admission.fitting_types``): one of them
    that can never fit there is no reason to refuse the run, and its queue and placement must not
    wait for or choose it; none fitting is exit 3."""
    from tpuctl.jobs.document import run_request_from_document
    from tpuctl.services.run.service import Runs

    requested = run_request_from_document(body.job, catalog=session.catalog, path="the submitted job")
    request = _with_program(session, bundles, body, requested, run_id, root)
    _refuse_unrecoverable(session, request)
    runs = Runs(session)
    # A secret named but not sent (or sent but not named) is a 400 too, naming the variable and never
    # its value (``secretenv.check_secrets``).
    prepared = runs.prepare(request, secrets=body.secrets or {})
    narrowed = _within_workspace(session, workspaces, request, prepared)
    if narrowed is not None:
        prepared = runs.prepare(narrowed, secrets=body.secrets or {})
    runs.check_imports(prepared).refuse()
    return requested, prepared


def _within_workspace(
    session: Session, workspaces: Workspaces, request: RunRequest, prepared: PreparedRun
) -> RunRequest | None:
    """``request`` with only the slice types its workspace could ever hold, where it named some that
    it could not; None where nothing is to drop (or the workspace is unknown: ``queue_entry`` refuses)."""
    from tpuctl.server.admission import fitting_types

    workspace = workspaces.get(session.actor.submit_workspace(request.workspace))
    placement = prepared.target.placement
    if workspace is None or placement is None or not placement.other_types:
        return None
    fitting, refusal = fitting_types(workspace, prepared.target)
    if refusal is not None:
        raise refusal
    if len(fitting) == 1 + len(placement.other_types):
        return None
    return dataclasses.replace(request, accelerator_type=fitting[0], other_accelerator_types=fitting[1:])


def _the_first(session: Session, run_id: str, stored_digest: str, digest: str, key: str) -> Accepted:
    if stored_digest != digest:
        raise RequestProblem(
            f"the Idempotency-Key {key!r} was used for another submission (run {run_id})",
            status=422,
            field="Idempotency-Key",
            value=key,
            fix="use a new key for a new submission; a retry sends the same body with the same key",
        )
    record = session.ledger.get_run(run_id)
    if record is None:
        raise Conflict(
            f"run {run_id} of this Idempotency-Key is still being recorded",
            fix="retry the same request in a moment; if this persists, the server stopped while recording "
            "it: submit again with a new key",
        )
    return Accepted(record, created=False)


def _with_program(
    session: Session, bundles: BundleStore, body: SubmitRun, requested: RequestedRun, run_id: str, root: Path
) -> RunRequest:
    """The request reading its program from the uploaded bundle, unpacked under ``root`` (the run's
    directory on the server, as a takeover unpacks it from the ledger)."""
    from tpuctl.services.run.control import PROGRAM_FOLDER, unpack_user_files
    from tpuctl.store.paths import atomic_write_text

    request = requested.request
    data = bundles.get(body.bundle_sha256)
    program = root / PROGRAM_FOLDER
    try:
        unpack_user_files(data, program)
    except Exception as exc:  # tarfile's and gzip's errors, a path the "data" filter refuses
        raise RequestProblem(
            f"the bundle {body.bundle_sha256} is not a tpuctl bundle (.tar.gz): {exc}",
            status=400,
            field="bundle_sha256",
            value=body.bundle_sha256,
            fix="upload the .tar.gz `tpuctl run --server` builds",
        ) from None
    script = None
    if request.script is not None:
        script = _script_in(program, body.script_in_bundle)
    elif body.script_in_bundle is not None:
        raise RequestProblem(
            "script_in_bundle names a script, but the job runs none (it has an example or a command)",
            status=400,
            field="script_in_bundle",
            value=body.script_in_bundle,
            fix="leave script_in_bundle out, or give the job a script",
        )
    requirements = request.requirements
    if body.requirements_text is not None:
        requirements = str(atomic_write_text(root / "requirements.txt", body.requirements_text))
    elif requirements is not None:
        raise RequestProblem(
            "the job names a requirements file, but its text was not sent",
            status=400,
            field="requirements_text",
            fix="send the file's text as requirements_text",
        )
    return dataclasses.replace(
        request,
        run_id=run_id,
        # Where it checkpoints: the document's bucket, else the server's (its profile's) bucket.
        bucket=request.bucket or session.settings.bucket,
        script=script,
        workdir=str(program) if script is not None or request.workdir else None,
        requirements=requirements,
    )


def _script_in(program: Path, script_in_bundle: str | None) -> str:
    """The script's path in the unpacked program; 400 for none, one outside it or one it lacks."""
    path = (program / (script_in_bundle or "")).resolve()
    if script_in_bundle is None or not path.is_relative_to(program.resolve()) or not path.is_file():
        raise RequestProblem(
            f"the bundle has no script {script_in_bundle!r}",
            status=400,
            field="script_in_bundle",
            value=script_in_bundle,
            fix="name the script by its path inside the bundle, e.g. train.py",
        )
    return str(path)


def _refuse_unrecoverable(session: Session, request: RunRequest) -> None:
    """A run that would lose its work at its first preemption is refused, as `tpuctl run` refuses it."""
    from tpuctl.services.run.checkpoints import refuse_unrecoverable

    settings = session.settings
    refuse_unrecoverable(
        request,
        bucket=request.bucket,
        default_bucket=session.backend.default_bucket,
        defaults=settings.capacity_types or (),
    )
