"""Time for tests: a clock that moves only when told, and a bounded wait for real things.

``FakeClock`` is injected wherever the code under test takes a clock (the simulator's ``SimEngine`` and
``SimServer``, the allocator's ``clock``/``sleep``, ``TpuApiCloud``'s ``sleep``): a test then moves
simulated time with ``advance`` instead of sleeping until a wall clock catches up. ``wait_for`` is for what
no clock can drive, a child process or a file another thread writes: it polls against a real deadline,
so a wait that will never end fails in bounded time instead of hanging the suite.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: 2023-11-14T22:13:20Z: a fixed, recognisable epoch for a frozen clock.
DEFAULT_START = 1_700_000_000.0


class WaitTimeout(AssertionError):
    """A condition was not met in time (an AssertionError, so pytest reports it as a failure)."""


class FakeClock:
    """Epoch seconds that move only by ``advance`` (or ``sleep``, the same, for code that takes a sleep).

    ``ticking=True`` makes it follow the wall clock as well, ``advance`` jumping ahead of it: for a
    simulator served to code that polls it in real time (a CLI command waiting for a node), where a frozen
    clock would never let that wait end. The instance is callable (``clock()`` is ``clock.now()``), so it
    fits every ``Callable[[], float]`` clock parameter; it is safe to use from several threads.
    """

    def __init__(self, start: float = DEFAULT_START, *, ticking: bool = False) -> None:
        self._ticking = ticking
        self._offset = start - time.time() if ticking else start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._offset + (time.time() if self._ticking else 0.0)

    __call__ = now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (never back); returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds!r} s)")
        with self._lock:
            self._offset += seconds
        return self.now()

    def advance_to(self, when: float) -> float:
        """Move time forward to epoch second ``when`` (never back); returns it."""
        with self._lock:
            now = self._offset + (time.time() if self._ticking else 0.0)
            if when < now:
                raise ValueError(f"a clock cannot go back (from {now!r} to {when!r})")
            self._offset += when - now
        return when

    def sleep(self, seconds: float) -> None:
        """An injected ``sleep``: the time passes at once."""
        self.advance(max(seconds, 0.0))

    def wait_for(self, predicate: Callable[[], T], timeout: float = 3600.0, step: float = 1.0) -> T:
        """Advance by ``step`` until ``predicate()`` is true; returns that true value.

        Raises ``WaitTimeout`` once ``timeout`` simulated seconds have passed without it. Only for code
        that reads this clock: nothing here waits for real time to pass.
        """
        if step <= 0:
            raise ValueError(f"step must be > 0, got {step!r}")
        waited = 0.0
        while not (value := predicate()):
            if waited >= timeout:
                raise WaitTimeout(f"condition not met after {waited:g} simulated s")
            self.advance(step)
            waited += step
        return value


def wait_for(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, *, what: str = ""
) -> T:
    """Poll ``predicate`` in real time until it is true; returns that true value.

    For waits on real processes and I/O. Raises ``WaitTimeout`` (naming ``what``) after ``timeout`` real
    seconds, so a condition that never comes fails the test instead of hanging it.
    """
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"{what or 'condition'} not met in {timeout:g} s")
        time.sleep(interval)
    return value
