"""`tpuctl run` and `tpuctl runs ...` through a `tpuctl server` (``--server URL``): the same commands, their
work done by the server (``tpuctl.client``), rendered here.

`run` uploads the program, submits the run and follows its logs until it ends, exiting as a local run
would for how it ended; Ctrl-C stops following only (the run goes on under the server) and says how to
cancel it. `--detach` submits and returns.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Final, TextIO

import typer

from tpuctl.errors import EXIT_BUDGET, EXIT_INTERRUPTED, EXIT_RUN_FAILED

if TYPE_CHECKING:
    from tpuctl.cli.render import Output
    from tpuctl.cli.run_reading import LogStyle
    from tpuctl.client.api import ServerClient
    from tpuctl.jobs.request import JobRequest
    from tpuctl.server.wire import CancelOut, LogsOut, RunDescriptionOut, RunOut
    from tpuctl.services.run.model import RunRequest

#: How often a follower asks for new lines while there are none.
POLL_S: Final = 0.5
#: How a run that ended other than well makes `run` exit (as a local run's error would).
_EXIT_OF_STATUS: Final = {
    "failed": EXIT_RUN_FAILED,
    "cancelled": EXIT_INTERRUPTED,
    "budget_exceeded": EXIT_BUDGET,
}


def client(server: str) -> ServerClient:
    from tpuctl.cli import remote

    return remote.client(server)


def run(out: Output, server: str, job: JobRequest, request: RunRequest, *, detach: bool) -> None:
    """Submit the run and, unless ``detach``, follow it to its end (see the module docstring)."""
    from tpuctl.client.submission import submission_of

    submission = submission_of(job, request)
    with client(server) as api:
        api.upload_bundle(submission.sha256, submission.bundle)
        submitted = api.submit(submission.body).run
        _hand_over(out, api, server, submitted, "submitted to", detach=detach)


def resume(
    out: Output,
    server: str,
    ref: str | None,
    *,
    budget_usd: float | None,
    max_preemptions: int | None,
    detach: bool,
) -> None:
    """`runs resume` through a server: the run made ready there (a replica takes it up), then followed
    to its end unless ``detach``, as a submission is."""
    from tpuctl.server.wire import ResumeRun

    with client(server) as api:
        resumed = api.resume(
            ref or "latest", ResumeRun(budget_usd=budget_usd, max_preemptions=max_preemptions)
        )
        if resumed.note:
            out.warn(resumed.note)
        _hand_over(out, api, server, resumed.run, "resumed under", detach=detach)


def _hand_over(out: Output, api: ServerClient, server: str, run: RunOut, how: str, *, detach: bool) -> None:
    """The run is the server's now: say how to reach it (``detach``), or follow its lines to its end."""
    from tpuctl.cli.run_reading import LogStyle

    run_id = run.run_id
    cancel = f"tpuctl --server {server} runs cancel {run_id}"
    if detach:
        if out.machine:
            out.document(out.envelope(run={"run_id": run_id, "status": "submitted", "server": server}))
            return
        out.out.print(
            f"run {run_id} is supervised by tpuctl server {server}.\n"
            f"  tpuctl --server {server} runs describe {run_id}    "
            f"tpuctl --server {server} runs logs -f {run_id}    {cancel}"
        )
        return
    out.note(f"run {run_id} {how} tpuctl server {server}; Ctrl-C stops following, not the run")
    try:
        style = LogStyle().for_hosts(int(run.detail.get("hosts") or 1))
        _follow(api, run_id, worker=None, stream=sys.stderr if out.machine else sys.stdout, style=style)
    except KeyboardInterrupt:
        out.warn(f"stopped following run {run_id}; it goes on under the server. To stop it: {cancel}")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    render_end(out, api.describe(run_id))


def plan(server: str, job: JobRequest, request: RunRequest) -> dict[str, Any]:
    """What the server would do with the run (`run --dry-run` through it): its bundle uploaded (the
    server checks the program's imports as a submission does), nothing recorded."""
    from tpuctl.client.submission import submission_of

    submission = submission_of(job, request)
    with client(server) as api:
        api.upload_bundle(submission.sha256, submission.bundle)
        return api.plan(submission.body).plan


def _follow(api: ServerClient, run_id: str, *, worker: int | None, stream: TextIO, style: LogStyle) -> None:
    """Print the run's host lines as they arrive until it ends (no more lines, and not live)."""
    cursor = ""
    while True:
        page = api.logs(run_id, after=cursor, worker=worker)
        cursor = page.cursor
        _print(page, style, stream)
        if not page.lines:
            if not page.live:
                return
            time.sleep(POLL_S)


def _print(page: LogsOut, style: LogStyle, stream: TextIO) -> None:
    """Lines as `runs logs` prints them locally (``LogStyle``)."""
    for line in page.lines:
        text = style.line(line.text, worker=line.worker, at=line.at)
        if text is not None:
            stream.write(text + "\n")
    stream.flush()


def render_end(out: Output, ended: RunDescriptionOut) -> None:
    """The run's end as a local run says it: its document or a line; an exit code for a bad end."""
    from tpuctl.client.api import ServerError

    if out.machine:
        out.document(out.envelope(run=ended.model_dump()))
    code = _EXIT_OF_STATUS.get(ended.status)
    if code is None:
        if not out.machine:
            out.out.print(
                f"[green]run {ended.run_id} {ended.status}[/] on {ended.pod} ({ended.zone}) in "
                f"{ended.duration_s} s. Logs: tpuctl runs logs {ended.run_id}"
            )
        return
    raise ServerError(
        {
            "error": f"run_{ended.status}",
            "message": f"run {ended.run_id} {ended.status}" + (f": {ended.reason}" if ended.reason else ""),
            "exit_code": code,
            "fix": f"see `tpuctl runs describe {ended.run_id}` and `tpuctl runs logs {ended.run_id}`",
        }
    )


def listed(server: str, limit: int, *, workspace: str | None, principal: str | None) -> list[RunOut]:
    with client(server) as api:
        return api.list_runs(limit=limit, workspace=workspace, principal=principal).runs


def describe(out: Output, server: str, ref: str | None) -> None:
    from tpuctl.services.run.views import QueueWait

    with client(server) as api:
        described = api.describe(ref or "latest")
    if out.machine:
        out.document(out.envelope(run=described.model_dump()))
        return
    fields = {
        "status": described.status,
        "program": " ".join([described.program, *described.args]),
        "pod": described.pod,
        "zone": described.zone,
        "type": described.accelerator_type,
        "capacity": described.capacity,
        "exit code": described.exit_code,
        "created": described.created_at,
        "ended": described.ended_at,
        "duration s": described.duration_s,
        "preemptions": described.preemptions,
        "restarts": described.restarts,
        "supervisor": described.supervisor_state,
        "reason": described.reason,
        **({} if described.queue is None else QueueWait(**described.queue).lines()),
    }
    out.fields(f"run {described.run_id}", {k: v for k, v in fields.items() if v is not None})


def logs(server: str, ref: str | None, *, worker: int | None, follow: bool, style: LogStyle) -> None:
    with client(server) as api:
        described = api.describe(ref or "latest")
        run_id = described.run_id
        style = style.for_hosts(int(described.detail.get("hosts") or 1))
        if follow:
            _follow(api, run_id, worker=worker, stream=sys.stdout, style=style)
            return
        _page_all(api, run_id, worker, style)


def _page_all(api: ServerClient, run_id: str, worker: int | None, style: LogStyle) -> None:
    cursor = ""
    while True:
        page = api.logs(run_id, after=cursor, worker=worker)
        if not page.lines:
            return
        cursor = page.cursor
        _print(page, style, sys.stdout)


def cancel(server: str, ref: str) -> CancelOut:
    with client(server) as api:
        return api.cancel(ref)
