"""One attempt's event loop, without hosts: a host whose program raised is said by its exception (the
crash hook's event), once, naming the host."""

from __future__ import annotations

import signal
from collections import deque
from pathlib import Path

from tpuctl.hosts.base import HostEvent
from tpuctl.runtime.preemption import event_line
from tpuctl.services.run.attempt import _EventLoop, _Streams, exception_summary
from tpuctl.services.run.hostlog import HostLog


class ScriptedHosts:
    """An executor whose hosts say what the script says; ``stop`` ends the ones still running."""

    def __init__(self, events: list[HostEvent], running: list[int]) -> None:
        self.events = deque(events)
        self.running = running
        self.stops: list[float] = []

    def next_event(self, timeout_s: float) -> HostEvent | None:
        return self.events.popleft() if self.events else None

    def stop(self, grace_s: float = 5.0) -> None:
        self.stops.append(grace_s)
        self.events.extend(HostEvent(w, "exit", returncode=-signal.SIGTERM) for w in self.running)


class Said:
    def __init__(self) -> None:
        self.statuses: list[str] = []

    def line(self, worker: int, text: str) -> None:
        pass

    def status(self, text: str) -> None:
        self.statuses.append(text)


def test_a_host_that_raised_is_said_by_its_exception_naming_the_host(tmp_path: Path) -> None:
    raised = event_line("exception", type="ValueError", message="bad lr", worker=1)
    hosts = ScriptedHosts(
        [HostEvent(1, "line", "Traceback (most recent call last):"), HostEvent(1, "line", raised),
         HostEvent(1, "exit", returncode=1)],
        running=[0],
    )  # fmt: skip
    streams = _Streams(logs={w: HostLog(tmp_path / f"worker-{w}.log") for w in (0, 1)})
    said = Said()
    loop = _EventLoop(said, hosts, 2.0, 2, streams)  # type: ignore[arg-type]
    try:
        failed, timed_out = loop.pump(None, frozenset(), 60.0)
    finally:
        streams.close()
    assert failed == (1, 1) and not timed_out
    assert streams.exceptions == {1: "ValueError: bad lr"}
    assert said.statuses == ["host 1 raised ValueError: bad lr: stopping the other hosts"]
    assert hosts.stops == [2.0]


def test_the_summary_is_the_type_then_the_message_never_the_type_twice() -> None:
    assert (
        exception_summary({"type": "KeyError", "message": "'learning_rate'"}) == "KeyError: 'learning_rate'"
    )
    assert exception_summary({"type": "StopIteration", "message": ""}) == "StopIteration"
    assert exception_summary({}) == "an exception"
