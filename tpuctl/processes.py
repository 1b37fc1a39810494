"""Local processes named by pid and start time, so that a recycled pid is never taken for the process it
once named.

A pid is recorded with its start time (field 22 of ``/proc/<pid>/stat``, in clock ticks since boot) and
the start time is compared again right before the pid is signalled or judged alive. The launcher and
recovery use this for the hosts and supervisors they started (and tpuctl processes that died), the
simulator to signal the local processes that stand in for a node's hosts: a neutral module, below both.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks after boot, or None when it does not exist (or there is
    no /proc to ask)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'; the fields after
    # the LAST ')' are space separated, starting with field 3 (state). starttime is field 22.
    rest = raw.rsplit(")", 1)[-1].split()
    try:
        return int(rest[22 - 3])
    except (IndexError, ValueError):
        return None


def is_same_process(pid: int, start_ticks: int | None) -> bool:
    """True while ``pid`` is alive and is the process that was registered (same start time)."""
    if pid <= 0:
        return False
    current = process_start_ticks(pid)
    if current is None:
        if start_ticks is not None:
            return False
        # No /proc on this platform and none recorded: fall back to "the pid exists".
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return start_ticks is None or current == start_ticks


def is_zombie(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    rest = raw.rsplit(")", 1)[-1].split()
    return bool(rest) and rest[0] == "Z"


def signal_registered(pid: int, start_ticks: int | None, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``pid`` if it is still the registered process; True if it was sent."""
    if not is_same_process(pid, start_ticks):
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
