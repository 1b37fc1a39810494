"""What `tpuctl server` and its client say to each other: the request and response bodies of the HTTP API,
typed (pydantic only, no web framework: the CLI's client imports this module too).

Each response carries the same fields as the CLI's JSON document for the same command: ``RunOut`` is a
run of `runs list -o json`, ``RunDescriptionOut`` the ``run`` of `runs describe -o json`,
``CancelOut`` the ``cancel`` of `runs cancel -o json`, ``ErrorOut`` the error document every command
prints with ``-o json`` (``TpuctlError.to_dict``).

A submission is two requests: the program's files, ``PUT /v1/bundles/{sha256}`` (the bundle's
``.tar.gz``, content-addressed: the digest is the body's SHA-256), then ``POST /v1/runs`` with a
``SubmitRun`` naming that digest and an ``Idempotency-Key`` header.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

#: The header that makes a submission safe to retry: the same key, the same run, never a second.
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
#: A key: what a client makes up (a UUID, say), printable, bounded.
IDEMPOTENCY_KEY_PATTERN: Final = r"^[A-Za-z0-9._:-]{8,128}$"
SHA256_PATTERN: Final = r"^[0-9a-f]{64}$"
#: The content type of a bundle upload.
BUNDLE_MEDIA_TYPE: Final = "application/gzip"


class _Strict(BaseModel):
    """A request body: an unknown key is refused (a typo must not be ignored), values are not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)


class SubmitRun(_Strict):
    """``POST /v1/runs``: a run, as a job document plus where its program is."""

    #: The job document (the keys of a job file, ``tpuctl job schema``): what runs, where, how.
    job: dict[str, Any]
    #: The uploaded bundle holding the program's files.
    bundle_sha256: str = Field(pattern=SHA256_PATTERN)
    #: The script's path inside the bundle (a SCRIPT run); None for ``--example`` or a ``run:`` command.
    script_in_bundle: str | None = Field(default=None, min_length=1, max_length=1024)
    #: The ``--requirements`` file's text (the server has no such file).
    requirements_text: str | None = Field(default=None, max_length=1_000_000)
    #: The values of the job's ``secrets`` by name, read from the submitting environment as a local run
    #: reads them. The server keeps them encrypted in the ledger with its key, as a local run does; they
    #: are never echoed back, never in the submission's digest, never in a log. They cross the wire in
    #: plain text, which is why the server listens on loopback only until it has authentication and TLS.
    secrets: dict[str, str] | None = Field(default=None, max_length=256)


class RunOut(BaseModel):
    """One run, as `runs list -o json` shows it."""

    run_id: str
    status: str
    program: str
    args: list[str]
    pod: str | None
    zone: str | None
    accelerator_type: str | None
    capacity: str | None
    exit_code: int | None
    created_at: str | None
    ended_at: str | None
    duration_s: float | None
    restarts: int
    preemptions: int
    labels: dict[str, str]
    detail: dict[str, Any]
    #: Whose share it uses and who submitted it (``RunView``'s).
    workspace: str = "default"
    principal: str = "(unknown)"


class RunPlanOut(BaseModel):
    """``POST /v1/runs:plan``: what the submission would do, the document `run --dry-run -o json` prints
    locally (the client adds the job's own keys, which it parsed)."""

    plan: dict[str, Any]


class ResumeRun(_Strict):
    """``POST /v1/runs/{run}/resume``: carry a stopped run on (`runs resume`), with a new budget or
    preemption cap when given."""

    budget_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_preemptions: int | None = Field(default=None, ge=0)


class Resumed(BaseModel):
    """The run made ready to carry on, for a replica to take up; ``note`` as `runs resume` says it."""

    run: RunOut
    note: str | None


class RunList(BaseModel):
    runs: list[RunOut]


class Submitted(BaseModel):
    """The run a submission made; ``created`` is False for a retry that found the first one."""

    run: RunOut
    created: bool


class RunDescriptionOut(RunOut):
    """One run, as `runs describe -o json` shows it."""

    segments: list[dict[str, Any]]
    timeline: list[dict[str, Any]]
    recovery: dict[str, Any]
    supervisor_state: str
    supervisor: dict[str, Any] | None
    reason: str | None
    host_exits: list[dict[str, Any]]
    series: dict[str, Any]
    lease_history: list[dict[str, Any]]
    queue: dict[str, Any] | None = None  # its time in the server's queue: waited_s, reason, ...


class LogLineOut(BaseModel):
    """One line a host printed: ``seq`` numbers a worker's lines from 0; ``at`` when it arrived."""

    worker: int
    seq: int
    at: float
    text: str


class LogsOut(BaseModel):
    """Lines after a cursor, and the cursor to ask from next; ``live``: more may come (the run has not
    ended, or a supervisor still holds it)."""

    run_id: str
    lines: list[LogLineOut]
    cursor: str
    live: bool


class CancelOut(BaseModel):
    """What `runs cancel` did; the keys of its ``-o json`` document for that outcome only."""

    run_id: str
    status: str | None
    cancelled: bool
    note: str | None = None
    by: str | None = None
    hosts_killed: int | None = None
    deleted: str | None = None


class BundleOut(BaseModel):
    sha256: str
    size: int


class Health(BaseModel):
    """``/healthz``: the process answers. ``/readyz`` adds whether it can do its work."""

    status: str
    ledger: bool | None = None
    replica: bool | None = None
    replica_id: str | None = None
    supervising: list[str] | None = None


class ErrorOut(BaseModel):
    """Every error: the CLI's error document (``error`` is its kind, ``exit_code`` the CLI's)."""

    error: str
    message: str
    exit_code: int
    fix: str | None = None
    field: str | None = None
    value: str | None = None
