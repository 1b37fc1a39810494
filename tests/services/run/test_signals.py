"""The event tap between the hosts' output and the screen: event lines go to the supervisor, the
program's lines (its blank ones included) to the screen, and the blank lines the follower's notice line
may leave around it nowhere."""

from __future__ import annotations

from typing import Any

from tpuctl.runtime.preemption import event_line
from tpuctl.services.run.model import Silent
from tpuctl.services.run.signals import EventTap

FOLLOWER_NOTICE = event_line("notice", worker=0, source="metadata", t=1.0, reporter="follower")
STEP = event_line("step", step=3, dt=0.1)


class Screen(Silent):
    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def line(self, worker: int, text: str) -> None:
        self.lines.append((worker, text))

    def status(self, text: str) -> None:
        pass


def tapped(lines: list[tuple[int, str]]) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(what reached the screen, which events reached the supervisor) for host lines in order."""
    screen, events = Screen(), []

    def on_event(worker: int, event: dict[str, Any], at: float) -> None:
        events.append((worker, str(event["event"])))

    tap = EventTap(screen, on_event)
    for worker, text in lines:
        tap.line(worker, text)
    return screen.lines, events


def test_the_blank_lines_around_the_followers_notice_stay_off_the_screen() -> None:
    # At a line start: the notice's leading newline makes a blank line before it. Mid-line: the
    # program's own newline comes after it, a blank line after it.
    screen, events = tapped(
        [(0, "loss 1.0"), (0, ""), (0, FOLLOWER_NOTICE), (1, "half a"), (1, FOLLOWER_NOTICE), (1, ""),
         (1, "loss 0.9"), (0, "loss 0.8")]
    )  # fmt: skip
    assert screen == [(0, "loss 1.0"), (1, "half a"), (1, "loss 0.9"), (0, "loss 0.8")]
    assert events == [(0, "notice"), (1, "notice")]


def test_the_programs_own_blank_lines_reach_the_screen() -> None:
    screen, events = tapped(
        [(0, "a"), (0, ""), (0, "b"), (0, ""), (0, ""), (0, STEP), (0, "c"), (0, FOLLOWER_NOTICE), (0, "d"),
         (0, "")]
    )  # fmt: skip
    # Every blank line of the program's, in place, but the last: held back for a next line that never came.
    assert screen == [(0, "a"), (0, ""), (0, "b"), (0, ""), (0, ""), (0, "c"), (0, "d")]
    assert events == [(0, "step"), (0, "notice")]
