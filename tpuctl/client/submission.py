"""What a server takes for a run (``wire.SubmitRun`` and the program's bundle), made from the request the
CLI parsed: the job document (``jobs.document``), the program's directory as the local run would ship
it (``hosts.bundle``), the script's place in it, and the requirements file's text. Nothing here opens a
session: a client needs no ledger and no cloud."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.errors import UsageError
from tpuctl.server.wire import SubmitRun

if TYPE_CHECKING:
    from tpuctl.jobs.request import JobRequest
    from tpuctl.services.run.model import RunRequest


@dataclass(frozen=True)
class Submission:
    body: SubmitRun
    bundle: bytes  # the .tar.gz the server unpacks
    sha256: str  # of ``bundle``'s bytes: its address on the server


def submission_of(job: JobRequest, request: RunRequest) -> Submission:
    """``request`` (``job``'s, with the settings applied) as a submission; exit 2 for a script or a
    directory that is not there, or a script outside the directory shipped, as a local run says
    (``script_path``)."""
    from tpuctl.hosts.bundle import build_bundle
    from tpuctl.jobs.document import document_from_run_request
    from tpuctl.services.run.script_path import script_path

    located = None if request.script is None else script_path(request.script, request.workdir)
    workdir = Path(request.workdir).expanduser().resolve() if request.workdir else None
    if located is not None:
        workdir = located.workdir
    bundle = build_bundle(workdir, limit_bytes=request.bundle_limit_bytes)
    data = bundle.tar_gz()
    body = SubmitRun(
        job=document_from_run_request(request, budget_usd=job.budget_usd, policy=job.policy),
        bundle_sha256=hashlib.sha256(data).hexdigest(),
        script_in_bundle=None if located is None else located.in_workdir,
        requirements_text=_requirements(request.requirements),
        secrets=dict(job.secret_values) or None,
    )
    return Submission(body, data, body.bundle_sha256)


def _requirements(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"cannot read --requirements {path}: {exc.strerror or exc}",
            field="requirements",
            value=path,
            fix="give a pip requirements file that exists",
        ) from None
