"""What of a host's output a person reads: the program's own lines, without the plumbing of the libraries
under it, and the runtime's event lines in words.

Plumbing is what a library prints about itself that says nothing about the program: Gloo announcing each
peer connection (one line per host pair on the simulator's CPU collectives: dozens on a 16-host start,
and, when hosts print at once, fragments glued to each other), absl's INFO lines from C++ (tensorstore
saying which credentials it found), absl's note that it logs to stderr before being set up, and JAX's
preemption notifier and sync manager, and orbax at JAX's sync point, announcing the SIGTERM tpuctl itself
sent. The host logs keep them
(``runs logs --all`` shows them); the console and ``runs logs`` leave them out. A warning or an error from
C++ (absl's ``W``/``E`` lines) is never plumbing, except the notifier's, which only says the SIGTERM came.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

#: Gloo's line per peer connection, whole (``_GLOO_TEMPLATE`` with its numbers as 0).
_GLOO = re.compile(r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks?\. Expected number of connected peer "
                   r"ranks? is : \d+")  # fmt: skip
#: Where a Gloo line starts, inside a line that others were written into.
_GLOO_START = re.compile(r"(?=\[Gloo\] )")
_GLOO_TEMPLATE = "[Gloo] Rank 0 is connected to 0 peer ranks. Expected number of connected peer ranks is : 0"
#: absl's log line prefix (C++): severity, date, time, thread, file:line.
_ABSL = re.compile(r"^(?P<level>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ (?P<file>[\w.+-]+):\d+\] ")
#: The C++ sources whose warnings are plumbing too: JAX's preemption notifier ("SIGTERM caught at ...") and
#: sync manager, which tell of the stop tpuctl itself asked for.
_NOTIFIER_FILES = frozenset({"preemption_notifier.cc", "preemption_sync_manager.cc"})
_ABSL_STDERR_NOTE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
#: Orbax's warning, on every host and thread, each time it checks a preemption sync point JAX reached
#: (``orbax/checkpoint/_src/multihost/multihost.py``): the SIGTERM again, nine times on a 4-host slice.
_ORBAX_SYNC_POINT = re.compile(r"\[process=\d+\]\[thread=[^\]]*\] Reached preemption sync point, step=\d+$")


def shown(text: str) -> str | None:
    """``text`` as the console shows it, or None for plumbing. A program line that another host's Gloo
    line was glued to comes back without it."""
    if text.startswith(_ABSL_STDERR_NOTE) or _ORBAX_SYNC_POINT.search(text):
        return None
    absl = _ABSL.match(text)
    if absl is not None and (absl["level"] == "I" or absl["file"] in _NOTIFIER_FILES):
        return None
    if "Gloo" not in text and "peer rank" not in text:
        return text
    # Whole Gloo lines out, then what is left cut where each other Gloo line began: two cut lines glued
    # ("[Gloo] Rank 0 is connected to [Gloo] Rank ") are two fragments.
    pieces = [piece for whole in _GLOO.split(text) for piece in _GLOO_START.split(whole) if piece]
    if all(_gloo_fragment(piece) for piece in pieces):
        return None
    return "".join(piece for piece in pieces if not _gloo_fragment(piece)) or None


def _gloo_fragment(piece: str) -> bool:
    """Whether ``piece`` is part of a Gloo line cut where another write came in (``[Gloo] Rank ``,
    ``4``, `` is connected to 7 peer ranks. Expected ...``): its numbers as 0, a part of the template."""
    return re.sub(r"\d+", "0", piece) in _GLOO_TEMPLATE and (piece.strip().isdigit() or len(piece) >= 6)


def event_words(event: dict[str, Any]) -> str:
    """A ``TPUCTL_EVENT`` line's event as a line people read (``runs logs``; ``--raw`` keeps the JSON)."""
    kind = str(event.get("event"))
    rest = {k: v for k, v in event.items() if k != "event" and v is not None}
    say = _SAYINGS.get(kind)
    if say is not None:
        try:
            return f"[tpuctl] {say(rest)}"
        except (KeyError, TypeError, ValueError):
            pass  # a field missing or odd: said as it is, below
    return f"[tpuctl] {kind}" + "".join(f" {k}={v}" for k, v in rest.items())


def _start(e: dict[str, Any]) -> str:
    restored = e.get("restored")
    whence = f"restored step {restored}" if restored is not None else "nothing restored"
    of = f" of {e['steps']}" if e.get("steps") is not None else ""
    restart = f", restart {e['restart_count']}" if e.get("restart_count") else ""
    skipped = ", ".join(f"step {s['step']} ({s['reason']})" for s in e.get("skipped") or [])
    return f"started at step {e['step']}{of} ({whence}{restart})" + (
        f"; skipped {skipped}" if skipped else ""
    )


def _step(e: dict[str, Any]) -> str:
    loss = f", loss {e['loss']}" if "loss" in e else ""
    return f"step {e['step']} took {float(e['dt']):.3f} s{loss}"


def _preempted(e: dict[str, Any]) -> str:
    saved = e.get("checkpoint") == "saved"
    took = f" ({e['save_s']} s to save)" if saved and e.get("save_s") is not None else ""
    why = "a host maintenance" if e.get("reason") == "maintenance" else "a preemption"
    return f"stopped for {why} at step {e['step']}: " + (f"checkpoint saved{took}" if saved else
                                                          "no checkpoint")  # fmt: skip


_SAYINGS: dict[str, Callable[[dict[str, Any]], str]] = {
    "start": _start,
    "step": _step,
    "notice": lambda e: (
        f"preemption notice on host {e.get('worker', '?')} ({e.get('source', 'unknown source')})"
    ),
    "maintenance": lambda e: f"host maintenance notice on host {e.get('worker', '?')} ({e['value']})",
    "preempted": _preempted,
    "done": lambda e: f"done at step {e['step']}",
    "exception": lambda e: f"raised {e['type']}: {e.get('message', '')}".rstrip(": "),
}
