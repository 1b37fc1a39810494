#!/usr/bin/env python3
"""Measure the longest silence on a tpuctl command's console, piped and under a terminal.

Runs the command once with stdout and stderr on one pipe (as ``2>&1 | cat`` or CI sees it) and once on a
pseudo-terminal (as a person sees it), timestamps every chunk of output as it arrives, and prints one JSON
document per run: the longest silence between outputs (counting from the start to the first output) and
the lines before and after it. On a terminal a live status line redrawn in place is output too (it tells
the person that something is happening), so the pty figures also give ``longest_silence_between_lines_s``,
the longest wait for a new line to scroll by. ``longest_silence_before_the_program_spoke`` is the same
up to the program's first line: tpuctl's own part (placing, creating, setting up, starting the program).

The default command is the README demo's run, on a fresh state dir in a temp dir, so it includes the first
setup of a host and the simulator's start::

    scripts/console_gaps.py                      # the demo run, piped then on a pty
    scripts/console_gaps.py --mode pipe --repeat 2
    scripts/console_gaps.py -- .venv/bin/tpuctl pod create v5e-8 --name x
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEMO_RUN = (
    str(REPO / ".venv" / "bin" / "tpuctl"),
    "run",
    "--example",
    "lm",
    "--type",
    "v5e-8",
    "--",
    "--steps",
    "30",
)
#: Escape sequences that style text (colours, bold): not text a person reads.
_STYLE = re.compile(r"\x1b\[[0-9;]*m")
#: The others (cursor moves, erasing a line: the status line's redraws) end what was drawn before them.
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-Za-z]")
#: A line of the program's output on the console (``w0 | ...``).
_HOST_LINE = re.compile(r"(^|[\r\n])w\d+ *\| ")
#: Variables that would make rich treat a pipe as a terminal, or a terminal as a pipe.
_CONSOLE_OVERRIDES = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES")


@dataclass
class Chunk:
    at_s: float  # seconds since the command started
    text: str  # as read, escape sequences removed


@dataclass
class Recording:
    mode: str
    command: list[str]
    exit_status: int
    total_s: float
    chunks: list[Chunk] = field(default_factory=list)


def record(command: list[str], mode: str, env: dict[str, str]) -> Recording:
    """Run ``command`` once with its console on a pipe or a pty; every chunk read, with its time."""
    started = time.monotonic()
    if mode == "pipe":
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )
        assert proc.stdout is not None
        reader, closer = proc.stdout.fileno(), proc.stdout.close
    else:
        reader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=follower,
            stderr=follower,
            env=env,
            start_new_session=True,
        )
        os.close(follower)
        closer = lambda: os.close(reader)  # noqa: E731
    chunks: list[Chunk] = []
    while True:
        ready, _, _ = select.select([reader], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(reader, 65536)
        except OSError:  # a pty reads EIO once its last writer has gone
            break
        if not data:
            break
        chunks.append(
            Chunk(
                time.monotonic() - started, _CONTROL.sub("\r", _STYLE.sub("", data.decode(errors="replace")))
            )
        )
    status = proc.wait()
    closer()
    return Recording(mode, command, status, time.monotonic() - started, chunks)


def _last_line(texts: list[str]) -> str:
    lines = [ln.strip() for ln in re.split(r"[\r\n]", "\n".join(texts)) if ln.strip()]
    return lines[-1] if lines else "(start)"


def _first_line(texts: list[str]) -> str:
    lines = [ln.strip() for ln in re.split(r"[\r\n]", "\n".join(texts)) if ln.strip()]
    return lines[0] if lines else "(end)"


def longest_silence(chunks: list[Chunk], total_s: float) -> dict[str, Any]:
    """The longest wait for the next chunk (from the start, and to the end), with the text either side."""
    times = [0.0, *(c.at_s for c in chunks), total_s]
    gaps = [(times[i + 1] - times[i], i) for i in range(len(times) - 1)]
    gap, index = max(gaps)
    texts = [c.text for c in chunks]
    return {
        "seconds": round(gap, 2),
        "from_s": round(times[index], 2),
        "before": _last_line(texts[:index]),
        "after": _first_line(texts[index : index + 50]) if index < len(chunks) else "(end)",
    }


def line_arrivals(chunks: list[Chunk]) -> list[Chunk]:
    """One entry per completed line (its newline's arrival), blank lines and status redraws left out."""
    lines: list[Chunk] = []
    pending = ""
    for chunk in chunks:
        pending += chunk.text
        *done, pending = pending.split("\n")
        for text in done:
            shown = (
                text.rstrip("\r").split("\r")[-1].strip()
            )  # a redrawn status line leaves only its last drawing
            if shown:
                lines.append(Chunk(chunk.at_s, shown))
    return lines


def until_the_program(chunks: list[Chunk]) -> tuple[list[Chunk], float] | None:
    """The chunks before the program's first line (``w0 | ...``) and that line's time: tpuctl's own
    part of the run (placing, creating, setting up, starting), where every silence is tpuctl's."""
    for index, chunk in enumerate(chunks):
        if _HOST_LINE.search(chunk.text):
            return chunks[:index], chunk.at_s
    return None


def report(rec: Recording) -> dict[str, Any]:
    lines = line_arrivals(rec.chunks)
    result: dict[str, Any] = {
        "mode": rec.mode,
        "exit_status": rec.exit_status,
        "total_s": round(rec.total_s, 1),
        "lines": len(lines),
        "longest_silence": longest_silence(rec.chunks, rec.total_s),
    }
    setup = until_the_program(rec.chunks)
    if setup is not None:
        result["longest_silence_before_the_program_spoke"] = longest_silence(*setup)
    if rec.mode == "pty":
        result["longest_silence_between_lines"] = longest_silence(lines, rec.total_s)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=("pipe", "pty", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode, each on a fresh state dir")
    parser.add_argument("--keep", action="store_true", help="keep each run's state dir (its path is printed)")
    parser.add_argument("--transcript", type=Path, help="also write each run's output, timestamped, here")
    parser.add_argument("command", nargs="*", help="the tpuctl command (default: the README demo's run)")
    args = parser.parse_args(argv)
    command = args.command or list(DEMO_RUN)
    modes = ("pipe", "pty") if args.mode == "both" else (args.mode,)
    for _ in range(args.repeat):
        for mode in modes:
            state = tempfile.mkdtemp(prefix="tpuctl-gaps.")
            env = {k: v for k, v in os.environ.items() if k not in _CONSOLE_OVERRIDES}
            env["TPUCTL_STATE_DIR"] = state
            if mode == "pty":
                env["TERM"] = "xterm-256color"  # a terminal that draws rich's live status line
            for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "TPUCTL_PROJECT"):
                env.pop(name, None)  # the simulator, as in the demo
            rec = record(command, mode, env)
            result = report(rec)
            result["state_dir"] = state if args.keep else None
            print(json.dumps(result), flush=True)
            if args.transcript:
                with args.transcript.open("a") as f:
                    f.write(f"=== {mode} {' '.join(command)}\n")
                    for chunk in rec.chunks:
                        f.write(f"{chunk.at_s:8.2f} {chunk.text!r}\n")
            if not args.keep:
                shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
