"""Retry and polling policies, built on tenacity (never a hand-written loop).

Which failures are retried is decided by the *translated* error (see ``translate``) and by whether the call
is idempotent:

* Reads (get, list) and mutations made idempotent by a request id (queued-resource create/delete with
  ``requestId``): retry ``RateLimitedError`` and every ``TransientError``, ambiguous ones included —
  repeating them cannot create anything twice.
* Other mutations (node create/delete/start/stop, QR reset): retry only failures where the server
  certainly did not act — ``RateLimitedError`` (429) and a plain ``TransientError`` (503, connection
  refused). An ``AmbiguousError`` (reset or timeout after sending, 500/502/504) is raised to the caller,
  who must look before acting again (``tpuctl.cloud.idempotent`` does that for nodes).
* Nothing else is ever retried (not found, quota, stockout, bad request, permission).

tenacity is imported inside the functions: it costs ~60 ms, and ``tpuctl --help`` must not pay for it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tpuctl.errors import AmbiguousError, RateLimitedError, TransientError, UsageError

T = TypeVar("T")

Sleep = Callable[[float], None]
#: The fix of an operation still running at tpuctl's deadline: the server goes on with it.
OPERATION_GOES_ON = "it continues on the server: check its state later (tpuctl pod list / describe)"


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of one retried call: attempts, jittered exponential waits, and a total deadline.

    ``deadline_s`` bounds the whole call including waits: no attempt starts once the next wait would
    cross it. Validated when built, so a bad value from a config file fails at load time.
    """

    max_attempts: int = 5
    initial_wait_s: float = 0.5
    max_wait_s: float = 8.0
    deadline_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise UsageError(
                f"retry max_attempts must be an integer >= 1, got {self.max_attempts!r}",
                field="max_attempts",
                value=self.max_attempts,
                fix="use 1 (no retries) or more",
            )
        for name in ("initial_wait_s", "max_wait_s", "deadline_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0 or value != value:
                raise UsageError(
                    f"retry {name} must be a number >= 0, got {value!r}",
                    field=name,
                    value=value,
                    fix="use a non-negative number of seconds",
                )
        if self.max_wait_s < self.initial_wait_s:
            raise UsageError(
                f"retry max_wait_s ({self.max_wait_s}) is below initial_wait_s ({self.initial_wait_s})",
                field="max_wait_s",
                value=self.max_wait_s,
                fix="make max_wait_s at least initial_wait_s",
            )

    def wait_for(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt`` (1-based): ``initial * 2^(attempt-1)`` plus up to
        ``initial`` of random jitter (so clients that failed together do not retry together), capped at
        ``max_wait_s``."""
        base = self.initial_wait_s * 2.0 ** min(attempt - 1, 62)
        return min(self.max_wait_s, base + random.uniform(0.0, self.initial_wait_s))

    @classmethod
    def no_retry(cls) -> RetryPolicy:
        return cls(max_attempts=1, initial_wait_s=0.0, max_wait_s=0.0, deadline_s=0.0)

    @classmethod
    def fast(cls, max_attempts: int = 5) -> RetryPolicy:
        """Tiny waits, for tests and for the simulator's injected faults."""
        return cls(max_attempts=max_attempts, initial_wait_s=0.001, max_wait_s=0.01, deadline_s=10.0)


def is_retryable(exc: BaseException, *, idempotent: bool) -> bool:
    """Whether ``exc`` (a translated error) may be retried for a call of this kind."""
    if isinstance(exc, RateLimitedError):
        return True
    if isinstance(exc, AmbiguousError):
        return idempotent
    return isinstance(exc, TransientError)


class _Elapsed:
    """Time since a call started, for its deadline: the real time that passed, or the time it waited
    through ``sleep`` if more. The two agree on a real clock; on a fake clock (a backend whose ``sleep``
    moves simulated time at once) the waits are what passes, so a deadline of 300 s is 300 simulated
    seconds of waiting, not 300 real seconds of polling at full speed. tenacity's own deadlines read the
    real monotonic clock only, so both the waits and the stop go through this."""

    def __init__(self, sleep: Sleep | None) -> None:
        self._sleep = sleep or time.sleep
        self._start = time.monotonic()
        self._waited = 0.0

    def sleep(self, seconds: float) -> None:
        self._sleep(seconds)
        self._waited += seconds

    def __call__(self) -> float:
        return max(time.monotonic() - self._start, self._waited)


def call_with_retry(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    idempotent: bool,
    sleep: Sleep | None = None,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> T:
    """Call ``fn`` and retry it under ``policy``; the last error is re-raised unchanged when it gives up.

    ``on_retry(attempt_number, error, next_wait_s)`` is told before each wait (for logs and tests).
    """
    import tenacity

    def _before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is None or state.outcome is None:
            return
        err = state.outcome.exception()
        if err is not None:
            wait = state.next_action.sleep if state.next_action else 0.0
            on_retry(state.attempt_number, err, float(wait))

    elapsed = _Elapsed(sleep)

    def _stop(state: tenacity.RetryCallState) -> bool:
        # tenacity's stop_after_attempt | stop_before_delay, the deadline on ``elapsed``: no attempt once
        # the next wait would cross it.
        out_of_attempts = state.attempt_number >= policy.max_attempts
        return out_of_attempts or elapsed() + state.upcoming_sleep >= policy.deadline_s

    retrying = tenacity.Retrying(
        stop=_stop,
        wait=lambda state: policy.wait_for(state.attempt_number),
        retry=tenacity.retry_if_exception(lambda e: is_retryable(e, idempotent=idempotent)),
        reraise=True,
        sleep=elapsed.sleep,
        before_sleep=_before_sleep,
    )
    return retrying(fn)


class PollTimeout(Exception):
    """``poll_until`` ran out of time; ``last`` is the last value seen."""

    def __init__(self, last: object, elapsed_s: float) -> None:
        super().__init__(f"not done after {elapsed_s:.1f}s")
        self.last = last
        self.elapsed_s = elapsed_s


def poll_until(
    fn: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout_s: float,
    initial_interval_s: float = 0.25,
    max_interval_s: float = 2.0,
    on_poll: Callable[[T, float], None] | None = None,
    sleep: Sleep | None = None,
) -> T:
    """Call ``fn`` until ``done(result)``, waiting ``initial_interval_s`` growing to ``max_interval_s``.

    Exceptions from ``fn`` propagate at once (``fn`` retries its own transient failures). Raises
    ``PollTimeout`` once ``timeout_s`` has passed without a done result. ``on_poll(result, elapsed_s)``
    is called after every poll (progress display).
    """
    import tenacity

    elapsed = _Elapsed(sleep)

    def _poll() -> T:
        result = fn()
        if on_poll is not None:
            on_poll(result, elapsed())
        return result

    def _give_up(state: tenacity.RetryCallState) -> T:
        last = state.outcome.result() if state.outcome is not None else None
        raise PollTimeout(last, elapsed())

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_result(lambda r: not done(r)),
        wait=tenacity.wait_exponential(
            multiplier=initial_interval_s, min=initial_interval_s, max=max_interval_s
        ),
        stop=lambda state: elapsed() >= timeout_s,
        retry_error_callback=_give_up,
        sleep=elapsed.sleep,
    )
    return retrying(_poll)


@dataclass(frozen=True)
class Polling:
    """How to wait for something the server finishes on its own: :func:`poll_until`'s interval growing
    to a cap, and a deadline after which the wait is a ``TransientError`` (the server goes on)."""

    timeout_s: float
    initial_interval_s: float
    max_interval_s: float
    sleep: Sleep | None = None

    def until(
        self,
        get: Callable[[], T],
        done: Callable[[T], bool],
        *,
        still: str,
        fix: str,
        on_poll: Callable[[T, float], None] | None = None,
    ) -> T:
        """``get()`` until ``done``; past the deadline, ``TransientError("{still} after Ns", fix)``."""
        try:
            return poll_until(
                get,
                done,
                timeout_s=self.timeout_s,
                initial_interval_s=self.initial_interval_s,
                max_interval_s=self.max_interval_s,
                on_poll=on_poll,
                sleep=self.sleep,
            )
        except PollTimeout as exc:
            raise TransientError(f"{still} after {exc.elapsed_s:.0f}s", fix=fix) from None
