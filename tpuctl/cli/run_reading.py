"""Reading a run back on the command line: `runs logs` (registered on `tpuctl runs` by ``run_cmds``),
and what `runs list` and `runs describe` add for people: short times, why the run ended, each host's
exit status, sparklines of its steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuctl.cli.context import build_settings, make_output, session
from tpuctl.cli.options import server_of

if TYPE_CHECKING:
    from tpuctl.services.run.views import RunDescription

#: How a RUN argument may name a run (``tpuctl.services.run.lookup``).
RUN_HELP = "Run id, a unique start or end of one (`ab16`), or `latest`."


def run_logs(
    ctx: typer.Context,
    run_id: Annotated[str | None, typer.Argument(metavar="RUN", help=RUN_HELP + " Default: latest.")] = None,
    worker_flag: Annotated[
        str | None, typer.Option("--worker", metavar="N", help="Only this host's log.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing new lines until the run ends.")
    ] = False,
    timestamps: Annotated[
        bool, typer.Option("-t", "--timestamps", help="Start each line with the time it arrived (UTC).")
    ] = False,
    everything: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Also the libraries' plumbing (Gloo peer connections, absl INFO lines, JAX's SIGTERM).",
        ),
    ] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="tpuctl's event lines as the program printed them (JSON).")
    ] = False,
) -> None:
    """Print the hosts' logs of a run (one host's with --worker N, unprefixed). Each attempt starts
    with a `=== tpuctl: attempt N on POD (ZONE) ===` line; the runtime's event lines read as words
    (`[tpuctl] step 6 took 0.012 s`), or as printed with --raw."""
    import sys

    from tpuctl import params
    from tpuctl.services.run.service import Runs

    out = make_output(ctx, None)
    worker = None if worker_flag is None else params.whole(worker_flag, "worker", minimum=0)
    settings = build_settings(ctx)
    server = server_of(settings)
    style = LogStyle(one_worker=worker is not None, timestamps=timestamps, everything=everything, raw=raw)
    if server is not None:
        from tpuctl.cli import runs_remote

        runs_remote.logs(server, run_id, worker=worker, follow=follow, style=style)
        return
    with session(ctx, out, settings) as sess:
        runs = Runs(sess)
        logs = runs.logs(run_id, worker=worker)
        for w, path in logs.files:
            if not path.exists() and not follow:
                out.note(f"(no log for worker {w})")
        style = style.for_hosts(len(logs.files))
        for line in runs.read_logs(logs, follow=follow):
            text = style.line(line.text, worker=line.worker, at=line.at)
            if text is None:
                continue
            sys.stdout.write(text + "\n")
            if follow:
                sys.stdout.flush()
    sys.stdout.flush()


@dataclass(frozen=True)
class LogStyle:
    """How `runs logs` prints a host's line, locally or through a server alike: a worker prefix (padded
    to the widest worker number) unless one worker's, the arrival time with ``timestamps``, events in
    words unless ``raw``, plumbing only with ``everything``."""

    one_worker: bool = False
    timestamps: bool = False
    everything: bool = False
    raw: bool = False
    width: int = 1

    def for_hosts(self, hosts: int) -> LogStyle:
        """This style for a run of ``hosts`` hosts (the prefix's width)."""
        from dataclasses import replace

        return replace(self, width=len(str(max(hosts - 1, 0))))

    def line(self, text: str, *, worker: int, at: float | None) -> str | None:
        """The printed line; None for one not shown."""
        from tpuctl.services.run.hostlog import iso

        shown = log_text(text, everything=self.everything, raw=self.raw)
        if shown is None:
            return None
        prefix = "" if self.one_worker else f"w{worker:<{self.width}} | "
        if self.timestamps:
            prefix = ("-" * 24 if at is None else iso(at)) + " " + prefix
        return prefix + shown


def log_text(text: str, *, everything: bool, raw: bool) -> str | None:
    """A host log's line as `runs logs` prints it: an event in words unless ``raw``; None for plumbing
    unless ``everything`` (``host_lines``)."""
    from tpuctl.cli.host_lines import event_words, shown
    from tpuctl.runtime.preemption import parse_event

    event = None if raw else parse_event(text)
    if event is not None:
        return event_words(event)
    return text if everything else shown(text)


def ending_fields(described: RunDescription) -> dict[str, Any]:
    """Why the run ended, each host's exit status, and sparklines of its step times and losses."""
    from tpuctl.cli.render import human, sparkline

    fields: dict[str, Any] = {}
    if described.reason:
        fields["reason"] = described.reason
    if described.host_exits:
        fields["host exits"] = ", ".join(
            f"w{e.worker} {e.exit_code}" + (" (failed first)" if e.failed else "")
            for e in described.host_exits
        )
    series = described.series
    for values, label, unit in ((series.step_time_s, "step time", " s"), (series.loss, "loss", "")):
        if values:
            fields[label] = f"{sparkline(values)}  {human(values[0])}{unit} .. {human(values[-1])}{unit}"
    return fields


def short_time(iso: str | None) -> str | None:
    """An ISO time in a table: date and time to the second, in UTC (the header says so)."""
    return None if iso is None else iso.replace("T", " ").removesuffix("+00:00")
