"""A run on the console: the hosts' program output with a coloured worker prefix, tpuctl's own steps, and
one line per phase of each attempt (creating the slice, setting its hosts up) however many hosts it has.

Without ``-v`` a phase is one line, printed when it ends ("setting up 4 hosts: runtime (cpu)… 4/4 done
in 12.3 s"); on a terminal the status line shows it meanwhile, with its count. With ``-v`` its first line
is printed too, and the details under it: each host's setup commands and their output, shipping the
bundle, starting the program, deleting a slice. Library plumbing (``host_lines``) is never printed; the
host logs keep everything.

No wait goes unexplained for long (``tick``, every half second under ``heartbeat``): where the console is
not a terminal (a pipe, CI's log) and tpuctl waits on something, a phase or the program's first line, a
"still …" line comes after ``QUIET_LIMIT_S`` without output, and again after each as long; on a terminal,
the status line comes back whenever the console has been quiet that long, even while the program has the
screen (it leaves again before the program's next line).

Host output goes to stdout, or to stderr for machine formats (``-o json`` stays one clean document);
tpuctl's own lines always go to stderr.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpuctl.cli import host_lines
from tpuctl.words import counted

if TYPE_CHECKING:
    from rich.console import Console

    from tpuctl.cli.render import Output, Progress
    from tpuctl.services.run.model import PhaseUpdate

#: Worker prefix colours, cycled; picked so neighbours differ on dark and light terminals.
_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")
#: The longest the console stays quiet while tpuctl waits: under the 5 s of silence after which a run
#: looks stuck to the person reading it, with room for the second or so between the banner and the
#: console's start (the run is prepared and its imports checked meanwhile, measured 0.8-1.0 s).
QUIET_LIMIT_S = 3.0
#: How often ``heartbeat`` looks at the clock: a "still …" line is at most this late.
_TICK_S = 0.5


@dataclass(frozen=True)
class _Wait:
    """What tpuctl waits on now, since when (by the console's clock), and how far it got ("2/4 done")."""

    what: str
    since: float
    count: str = ""

    def still(self, now: float) -> str:
        """``still setting up 4 hosts: runtime (cpu)… 2/4 done, 8 s``."""
        return (
            f"still {self.what}… " + (f"{self.count}, " if self.count else "") + f"{now - self.since:.0f} s"
        )


class RunConsole:
    """Implements ``tpuctl.services.run.model.LaunchObserver`` for a person at a console."""

    def __init__(
        self,
        out: Output,
        hosts: int,
        *,
        verbose: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out = out
        self._verbose = verbose
        self._lines: Console = out.err if out.machine else out.out
        self._width = len(str(max(hosts - 1, 0)))
        self._starting = f"starting the program on {counted(hosts, 'host')}"
        #: The status line (a spinner on a terminal): stopped when the hosts talk, back for a phase.
        self.spinner: Progress | None = None
        self._phase: PhaseUpdate | None = None
        self._clock = clock
        # The launcher's threads and the heartbeat's print here; one at a time keeps lines whole.
        self._lock = threading.RLock()
        self._said_at = clock()
        #: What tpuctl waits on; None while the program has the screen (its silence is its own).
        self._wait: _Wait | None = _Wait("starting the run", self._said_at)

    def line(self, worker: int, text: str) -> None:
        shown = host_lines.shown(text)
        if shown is not None:
            with self._lock:
                self._wait = None
                self._host_line(worker, shown)

    def status(self, text: str) -> None:
        with self._lock:
            self._tpuctl_line(text)

    def phase(self, update: PhaseUpdate) -> None:
        if self._out.machine:
            return
        with self._lock:
            self._phase_locked(update)

    def _phase_locked(self, update: PhaseUpdate) -> None:
        text = phase_line(update)
        if update.ended:
            self._phase = None
            self._wait = _Wait(self._starting, self._clock())  # or the next phase, which says so
            self._stop_spinner()
            self._tpuctl_line(text)
            if not self._verbose:
                self._show_spinner("running…")  # until the program says something (JAX starts slowly)
            return
        if self._verbose and (self._phase is None or self._phase.title != update.title):
            self._tpuctl_line(text)  # its details follow
        wait = self._wait
        going_on = wait is not None and self._phase is not None and self._phase.title == update.title
        since = wait.since if wait is not None and going_on else self._clock()  # the phase's start
        count = f"{update.done}/{update.total} done" if update.done is not None and update.total else ""
        self._wait = _Wait(update.title, since, count)
        self._phase = update
        if not self._verbose:
            self._show_spinner(text)

    def detail(self, worker: int | None, text: str) -> None:
        if not self._verbose:
            return
        with self._lock:
            if worker is None:
                self._tpuctl_line(text)
                return
            shown = host_lines.shown(text)
            if shown is not None:
                self._host_line(worker, shown)

    def tick(self) -> None:
        """Break a silence of ``QUIET_LIMIT_S`` or more by the clock: piped, with a "still …" line if
        tpuctl is waiting on something (at most one per ``QUIET_LIMIT_S``); on a terminal, by bringing the
        status line back if it had gone. Called by ``heartbeat``, or by a test after moving its clock."""
        if self._out.machine:
            return
        with self._lock:
            now = self._clock()
            if now - self._said_at < QUIET_LIMIT_S:
                return
            if self._out.err.is_terminal:
                if self.spinner is not None and not self.spinner.shown:
                    self.spinner.show("running…")
                return
            if self._wait is not None:
                self._tpuctl_line(self._wait.still(now))

    @contextmanager
    def heartbeat(self) -> Iterator[None]:
        """``tick`` on a thread every ``_TICK_S`` real seconds while the block runs."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(_TICK_S):
                self.tick()

        thread = threading.Thread(target=beat, name="run-console-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _show_spinner(self, text: str) -> None:
        if self.spinner is not None:
            self.spinner.show(text)

    def _stop_spinner(self) -> None:
        if self.spinner is not None:
            self.spinner.stop()

    def _host_line(self, worker: int, text: str) -> None:
        from rich.markup import escape

        self._stop_spinner()  # a live status line on stderr would tear the lines printed to stdout
        colour = _COLOURS[worker % len(_COLOURS)]
        self._lines.print(f"[{colour}]w{worker:<{self._width}}[/] | {escape(text)}", soft_wrap=True)
        self._said_at = self._clock()

    def _tpuctl_line(self, text: str) -> None:
        from rich.markup import escape

        if not self._out.machine:
            self._out.err.print(f"[dim]tpuctl:[/] {escape(text)}")
            self._said_at = self._clock()


def phase_line(update: PhaseUpdate) -> str:
    """``setting up 4 hosts: runtime (cpu)… 4/4 done in 12.3 s``: the phase, its count, its outcome."""
    count = f" {update.done}/{update.total}" if update.done is not None and update.total is not None else ""
    return f"{update.title}…{count}" + (f" {update.outcome}" if update.outcome else "")
