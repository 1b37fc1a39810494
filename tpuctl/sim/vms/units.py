"""The simulated VM's stand-in for systemd: it runs one service unit (``tpuctl.hosts.service_unit``
reads the same file systemd does) and honours its command, environment, working directory and restart
policy. Output goes to the unit's journal file, which the VM's ``journalctl`` stand-in prints.

What it leaves out of systemd, stricter where unsure: no start-rate limit (``StartLimitBurst``; a unit
that keeps failing restarts every ``RestartSec`` for ever, as systemd does once the limit is raised), no
dependencies between units, no ``User=`` switch (a simulated VM has one user).

Run as ``python -m tpuctl.sim.vms.units UNIT_FILE JOURNAL`` (by the image's ``systemctl --user`` shim
and at the VM's boot, ``tpuctl.sim.vms.systemctl``), with the user's ``HOME`` (``%h``); SIGTERM stops the
running process (SIGTERM, then SIGKILL after ``_STOP_GRACE_S``, as systemd's default ``TimeoutStopSec``
does) and the supervisor.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Final

from tpuctl.hosts.service_unit import ServiceUnit, expand_specifiers, parse

_STOP_GRACE_S: Final = 90.0
#: systemd's exit statuses for a start that failed before the command ran (systemd.exec).
_EXIT_CHDIR: Final = 200
_EXIT_EXEC: Final = 203


class UnitSupervisor:
    """Starts ``unit``'s command and starts it again as its restart policy says, until ``stop``."""

    def __init__(
        self,
        unit: ServiceUnit,
        journal: IO[bytes],
        *,
        wait: Callable[[float], bool] | None = None,
        stop_grace_s: float = _STOP_GRACE_S,
    ) -> None:
        """``wait(seconds)``: waits out RestartSec, True when told to stop meanwhile (a test passes one
        that does not sleep)."""
        self.unit = unit
        self._journal = journal
        self._stopping = threading.Event()
        self._wait = wait or self._stopping.wait
        self._stop_grace_s = stop_grace_s
        self._process: subprocess.Popen[bytes] | None = None
        self.exits: list[int] = []  # every exit code, in order (negative: the killing signal)

    def run(self) -> None:
        """Until the policy says no more, or ``stop``."""
        while not self._stopping.is_set():
            code = self._run_once()
            self.exits.append(code)
            self._note(f"{self.unit.file_name}: main process exited, code {code}")
            if self._stopping.is_set() or not self.unit.restart.restarts_after(code):
                return
            if self._wait(self.unit.restart_sec):
                return
            self._note(f"{self.unit.file_name}: scheduled restart")

    def stop(self) -> None:
        self._stopping.set()
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(self._stop_grace_s)
            except subprocess.TimeoutExpired:
                process.kill()

    def _run_once(self) -> int:
        env = {**os.environ, **self.unit.environment}
        cwd = self.unit.working_directory
        if cwd is not None and not os.path.isdir(cwd):
            # systemd fails the start at its CHDIR step, with status 200 (systemd.exec, "Process Exit Codes").
            self._note(f"{self.unit.file_name}: Changing to the requested working directory failed: {cwd}")
            return _EXIT_CHDIR
        try:
            self._process = subprocess.Popen(
                list(self.unit.exec_start),
                stdin=subprocess.DEVNULL,
                stdout=self._journal,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            self._note(
                f"{self.unit.file_name}: Failed at step EXEC spawning {self.unit.exec_start[0]}: {exc}"
            )
            return _EXIT_EXEC
        self._note(f"Started {self.unit.description}.")
        return self._process.wait()

    def _note(self, line: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        self._journal.write(f"{stamp} systemd: {line}\n".encode())
        self._journal.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuctl.sim.vms.units", description=__doc__)
    parser.add_argument("unit_file", type=Path)
    parser.add_argument("journal", type=Path)
    args = parser.parse_args(argv)
    text = args.unit_file.read_text(encoding="utf-8")
    # %h is the user's home, as the user manager expands it (the shim starts this with the user's HOME).
    unit = expand_specifiers(parse(args.unit_file.name.removesuffix(".service"), text), os.environ["HOME"])
    with open(args.journal, "ab") as journal:
        supervisor = UnitSupervisor(unit, journal)
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=supervisor.stop).start())
        supervisor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
