"""A run on the console: one line per phase, details only with -v, plumbing never, the status line kept
out of the hosts' lines, and no wait of tpuctl's without a word for more than a few seconds."""

from __future__ import annotations

import io
from itertools import pairwise

from rich.console import Console

from tpuctl.cli.render import Output, Progress
from tpuctl.cli.run_console import QUIET_LIMIT_S, RunConsole
from tpuctl.services.run.model import PhaseUpdate
from tpuctl.testing.clock import FakeClock, wait_for

SETUP = "setting up 4 hosts: runtime (cpu)"
GLOO = "[Gloo] Rank 1 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3"


def _output(*, terminal: bool = False, fmt: str = "table") -> tuple[Output, io.StringIO, io.StringIO]:
    stdout, stderr = io.StringIO(), io.StringIO()
    out = Output(
        fmt=fmt,
        _stdout=Console(file=stdout, width=200, highlight=False),
        _stderr=Console(file=stderr, width=200, highlight=False, force_terminal=terminal, color_system=None),
    )
    return out, stdout, stderr


def _attempt(console: RunConsole) -> None:
    """What one attempt tells the console: the slice made, every host set up with its details, the
    program's lines (plumbing among them)."""
    console.phase(PhaseUpdate("creating tpu-a (v5litepod-16, 4 hosts)"))
    console.detail(None, "creating tpu-a (v5litepod-16, 4 hosts): first choice us-central1-a")
    console.phase(
        PhaseUpdate("creating tpu-a (v5litepod-16, 4 hosts)", outcome="READY in us-central1-a, 1.2 s")
    )
    console.detail(None, "shipping bundle abc to 4 hosts")
    console.phase(PhaseUpdate(SETUP, done=0, total=4))
    for worker in range(4):
        console.detail(worker, "[tpuctl-setup] $ uv venv --quiet /very/long/path")
        console.detail(worker, "[tpuctl-setup] done: /very/long/path")
        console.phase(PhaseUpdate(SETUP, done=worker + 1, total=4))
    console.phase(PhaseUpdate(SETUP, done=4, total=4, outcome="done in 12.3 s"))
    console.line(0, "step 1 loss 6.2")
    console.line(1, GLOO)
    console.line(2, "W1127 04:30:11.855330 585 preemption_notifier.cc:90] SIGTERM caught at 2026-11-27")
    console.status("tpu-a (us-central1-a) was preempted")


def test_one_line_per_phase_and_no_details_without_verbose() -> None:
    out, stdout, stderr = _output()
    _attempt(RunConsole(out, 4))
    assert stderr.getvalue().splitlines() == [
        "tpuctl: creating tpu-a (v5litepod-16, 4 hosts)… READY in us-central1-a, 1.2 s",
        "tpuctl: setting up 4 hosts: runtime (cpu)… 4/4 done in 12.3 s",
        "tpuctl: tpu-a (us-central1-a) was preempted",
    ]
    assert stdout.getvalue().splitlines() == ["w0 | step 1 loss 6.2"]


def test_verbose_shows_each_phase_as_it_begins_and_its_details() -> None:
    out, stdout, stderr = _output()
    _attempt(RunConsole(out, 4, verbose=True))
    told = stderr.getvalue().splitlines()
    assert told[:4] == [
        "tpuctl: creating tpu-a (v5litepod-16, 4 hosts)…",
        "tpuctl: creating tpu-a (v5litepod-16, 4 hosts): first choice us-central1-a",
        "tpuctl: creating tpu-a (v5litepod-16, 4 hosts)… READY in us-central1-a, 1.2 s",
        "tpuctl: shipping bundle abc to 4 hosts",
    ]
    assert told[4] == "tpuctl: setting up 4 hosts: runtime (cpu)… 0/4"  # once, not once per host done
    assert told[5:] == ["tpuctl: setting up 4 hosts: runtime (cpu)… 4/4 done in 12.3 s",
                        "tpuctl: tpu-a (us-central1-a) was preempted"]  # fmt: skip
    lines = stdout.getvalue().splitlines()
    assert lines.count("w2 | [tpuctl-setup] $ uv venv --quiet /very/long/path") == 1
    assert len(lines) == 9 and lines[-1] == "w0 | step 1 loss 6.2"  # 4 x 2 setup lines; no plumbing


def test_on_a_terminal_the_status_line_shows_the_phase_and_leaves_before_host_lines() -> None:
    out, _stdout, stderr = _output(terminal=True)
    console = RunConsole(out, 4)
    spinner = Progress(out, "run r")
    console.spinner = spinner
    console.line(0, "an early line")  # the hosts talk: the status line goes
    assert spinner._status is None
    console.phase(PhaseUpdate(SETUP, done=1, total=4))  # a phase brings it back, with the count
    assert spinner._status is not None and "1/4" in str(spinner._status.renderable.text)
    console.phase(PhaseUpdate(SETUP, done=4, total=4, outcome="done in 2.0 s"))
    assert "setting up 4 hosts: runtime (cpu)… 4/4 done in 2.0 s" in stderr.getvalue()
    assert spinner._status is not None and str(spinner._status.renderable.text) == "running…"
    console.line(0, "step 1")
    assert spinner._status is None


def test_machine_formats_get_host_lines_on_stderr_and_nothing_else() -> None:
    out, stdout, stderr = _output(fmt="json")
    _attempt(RunConsole(out, 4, verbose=False))
    assert stdout.getvalue() == ""
    assert stderr.getvalue().splitlines() == ["w0 | step 1 loss 6.2"]


def _said_while(
    clock: FakeClock, console: RunConsole, stderr: io.StringIO, seconds: int
) -> list[tuple[float, str]]:
    """Tick the console every simulated second for ``seconds``: each new stderr line, with its time."""
    said: list[tuple[float, str]] = []
    seen = len(stderr.getvalue().splitlines())
    for _ in range(seconds):
        clock.advance(1.0)
        console.tick()
        lines = stderr.getvalue().splitlines()
        said += [(clock.now(), line) for line in lines[seen:]]
        seen = len(lines)
    return said


def test_piped_a_long_phase_says_it_is_still_going_every_few_seconds_and_no_more_often() -> None:
    out, stdout, stderr = _output()
    clock = FakeClock(start=100.0)
    console = RunConsole(out, 4, clock=clock)
    console.phase(PhaseUpdate(SETUP, done=0, total=4))
    console.phase(PhaseUpdate(SETUP, done=1, total=4))  # an update is not a line: the silence goes on
    said = _said_while(clock, console, stderr, 20)
    assert [line for _, line in said] == [
        f"tpuctl: still setting up 4 hosts: runtime (cpu)… 1/4 done, {n:.0f} s"
        for n in (QUIET_LIMIT_S * k for k in range(1, int(20 // QUIET_LIMIT_S) + 1))
    ]
    times = [100.0, *(at for at, _ in said)]
    assert all(later - earlier == QUIET_LIMIT_S for earlier, later in pairwise(times))
    console.phase(PhaseUpdate(SETUP, done=4, total=4, outcome="done in 20.0 s"))
    # Then the program's start-up (JAX starts slowly) until its first line...
    assert [line for _, line in _said_while(clock, console, stderr, 2 * int(QUIET_LIMIT_S) + 1)] == [
        f"tpuctl: still starting the program on 4 hosts… {QUIET_LIMIT_S:.0f} s",
        f"tpuctl: still starting the program on 4 hosts… {2 * QUIET_LIMIT_S:.0f} s",
    ]
    console.line(0, GLOO)  # plumbing is no word from the program
    assert len(_said_while(clock, console, stderr, int(QUIET_LIMIT_S))) == 1
    # ...after which its silences are its own: nothing is added to a program's output.
    console.line(0, "step 1 loss 6.2")
    assert _said_while(clock, console, stderr, 30) == []
    assert stdout.getvalue().splitlines() == ["w0 | step 1 loss 6.2"]


def test_piped_a_phase_that_ends_within_the_limit_adds_nothing() -> None:
    out, _stdout, stderr = _output()
    clock = FakeClock()
    console = RunConsole(out, 1, clock=clock)
    console.phase(PhaseUpdate("creating tpu-a (v5litepod-8, 1 host)"))
    said = _said_while(clock, console, stderr, int(QUIET_LIMIT_S) - 1)
    console.phase(
        PhaseUpdate("creating tpu-a (v5litepod-8, 1 host)", outcome="READY in us-central1-a, 2.0 s")
    )
    assert said == []
    assert stderr.getvalue().splitlines() == [
        "tpuctl: creating tpu-a (v5litepod-8, 1 host)… READY in us-central1-a, 2.0 s"
    ]


def test_on_a_terminal_a_quiet_console_gets_its_status_line_back_and_no_line() -> None:
    out, stdout, stderr = _output(terminal=True)
    clock = FakeClock()
    console = RunConsole(out, 4, clock=clock)
    spinner = Progress(out, "run r")
    console.spinner = spinner
    console.line(0, "mesh dcn=1 data=8 model=1")  # the hosts talk: the status line goes
    clock.advance(QUIET_LIMIT_S - 0.5)
    console.tick()
    assert not spinner.shown
    clock.advance(0.5)
    console.tick()  # the program compiles its first step: the status line says tpuctl is alive
    assert spinner._status is not None and str(spinner._status.renderable.text) == "running…"
    console.line(0, "step 1 loss 6.2")
    assert not spinner.shown
    spinner.stop()
    assert "still" not in stderr.getvalue()
    assert stdout.getvalue().splitlines() == ["w0 | mesh dcn=1 data=8 model=1", "w0 | step 1 loss 6.2"]


def test_machine_formats_get_no_still_lines() -> None:
    out, stdout, stderr = _output(fmt="json")
    clock = FakeClock()
    console = RunConsole(out, 4, clock=clock)
    console.phase(PhaseUpdate(SETUP, done=0, total=4))
    assert _said_while(clock, console, stderr, 10) == []
    assert stdout.getvalue() == ""


def test_the_heartbeat_ticks_on_its_own_while_a_block_runs() -> None:
    out, _stdout, stderr = _output()
    clock = FakeClock()
    console = RunConsole(out, 1, clock=clock)
    console.phase(PhaseUpdate("setting up 1 host: runtime (cpu)", done=0, total=1))
    clock.advance(QUIET_LIMIT_S)
    with console.heartbeat():
        wait_for(lambda: "still setting up 1 host" in stderr.getvalue(), timeout=10)
    assert stderr.getvalue().splitlines() == [
        f"tpuctl: still setting up 1 host: runtime (cpu)… 0/1 done, {QUIET_LIMIT_S:.0f} s"
    ]
