"""A run on the console: the hosts' program output with a coloured worker prefix, tpuctl's own steps, and
one line per phase of each attempt (creating the slice, setting its hosts up) however many hosts it has.

Without ``-v`` a phase is one line, printed when it ends ("setting up 4 hosts: runtime (cpu)… 4/4 done
in 12.3 s"); on a terminal the status line shows it meanwhile, with its count. With ``-v`` its first line
is printed too, and the details under it: each host's setup commands and their output, shipping the
bundle, starting the program, deleting a slice. Library plumbing (``host_lines``) is never printed; the
host logs keep everything.

Host output goes to stdout, or to stderr for machine formats (``-o json`` stays one clean document);
tpuctl's own lines always go to stderr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuctl.cli import host_lines

if TYPE_CHECKING:
    from rich.console import Console

    from tpuctl.cli.render import Output, Progress
    from tpuctl.services.run.model import PhaseUpdate

#: Worker prefix colours, cycled; picked so neighbours differ on dark and light terminals.
_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


class RunConsole:
    """Implements ``tpuctl.services.run.model.LaunchObserver`` for a person at a console."""

    def __init__(self, out: Output, hosts: int, *, verbose: bool = False) -> None:
        self._out = out
        self._verbose = verbose
        self._lines: Console = out.err if out.machine else out.out
        self._width = len(str(max(hosts - 1, 0)))
        #: The status line (a spinner on a terminal): stopped when the hosts talk, back for a phase.
        self.spinner: Progress | None = None
        self._phase: PhaseUpdate | None = None

    def line(self, worker: int, text: str) -> None:
        shown = host_lines.shown(text)
        if shown is not None:
            self._host_line(worker, shown)

    def status(self, text: str) -> None:
        self._tpuctl_line(text)

    def phase(self, update: PhaseUpdate) -> None:
        if self._out.machine:
            return
        text = phase_line(update)
        if update.ended:
            self._phase = None
            if self.spinner is not None:
                self.spinner.stop()
            self._tpuctl_line(text)
            if self.spinner is not None and not self._verbose:
                self.spinner.show("running…")  # until the program says something (JAX starts slowly)
            return
        if self._verbose and (self._phase is None or self._phase.title != update.title):
            self._tpuctl_line(text)  # its details follow
        self._phase = update
        if self.spinner is not None and not self._verbose:
            self.spinner.show(text)

    def detail(self, worker: int | None, text: str) -> None:
        if not self._verbose:
            return
        if worker is None:
            self._tpuctl_line(text)
            return
        shown = host_lines.shown(text)
        if shown is not None:
            self._host_line(worker, shown)

    def _host_line(self, worker: int, text: str) -> None:
        from rich.markup import escape

        if self.spinner is not None:
            self.spinner.stop()  # a live status line on stderr would tear the lines printed to stdout
        colour = _COLOURS[worker % len(_COLOURS)]
        self._lines.print(f"[{colour}]w{worker:<{self._width}}[/] | {escape(text)}", soft_wrap=True)

    def _tpuctl_line(self, text: str) -> None:
        from rich.markup import escape

        if not self._out.machine:
            self._out.err.print(f"[dim]tpuctl:[/] {escape(text)}")


def phase_line(update: PhaseUpdate) -> str:
    """``setting up 4 hosts: runtime (cpu)… 4/4 done in 12.3 s``: the phase, its count, its outcome."""
    count = f" {update.done}/{update.total}" if update.done is not None and update.total is not None else ""
    return f"{update.title}…{count}" + (f" {update.outcome}" if update.outcome else "")
