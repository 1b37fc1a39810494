"""FakeClock moves only when told; wait_for is bounded in real time."""

from __future__ import annotations

import threading
import time

import pytest

from tpuctl.testing.clock import DEFAULT_START, FakeClock, WaitTimeout, wait_for


def test_a_frozen_clock_moves_only_by_advance_and_sleep() -> None:
    clock = FakeClock()
    assert clock() == clock.now() == DEFAULT_START
    time.sleep(0.01)
    assert clock.now() == DEFAULT_START
    assert clock.advance(90) == DEFAULT_START + 90
    clock.sleep(10)
    assert clock.now() == DEFAULT_START + 100
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert clock.advance_to(DEFAULT_START + 500) == clock.now() == DEFAULT_START + 500
    with pytest.raises(ValueError, match="back"):
        clock.advance_to(DEFAULT_START)
    assert clock.now() == DEFAULT_START + 500


def test_a_ticking_clock_follows_the_wall_clock_ahead_by_what_was_advanced() -> None:
    clock = FakeClock(ticking=True, start=time.time())
    clock.advance(3600)
    assert clock.now() - time.time() == pytest.approx(3600, abs=0.5)


def test_clock_wait_for_advances_simulated_time_by_steps() -> None:
    clock = FakeClock(start=0.0)
    assert clock.wait_for(lambda: clock.now() >= 25 and "done", timeout=100, step=10) == "done"
    assert clock.now() == 30
    with pytest.raises(WaitTimeout, match="simulated"):
        clock.wait_for(lambda: False, timeout=50, step=10)


def test_real_wait_for_returns_once_true_and_fails_in_bounded_time() -> None:
    done = threading.Event()
    threading.Timer(0.05, done.set).start()
    started = time.monotonic()
    assert wait_for(done.is_set, timeout=5) is True
    assert time.monotonic() - started < 5
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="the flag"):
        wait_for(lambda: False, timeout=0.1, what="the flag")
    assert time.monotonic() - started < 2
