"""Retry policies: what is retried for reads vs mutations, how often, and how long the waits are."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tpuctl.cloud.retry import PollTimeout, RetryPolicy, call_with_retry, is_retryable, poll_until
from tpuctl.errors import (
    AlreadyExistsError,
    AmbiguousError,
    CloudError,
    NotFoundError,
    QuotaExceededError,
    RateLimitedError,
    StockoutError,
    TransientError,
    UsageError,
)

FAST = RetryPolicy(max_attempts=5, initial_wait_s=0.0, max_wait_s=0.0, deadline_s=10.0)


def flaky(errors: list[Exception], result: str = "ok") -> tuple[Callable[[], str], list[int]]:
    """A function that raises ``errors`` in turn, then returns ``result``; and its call counter."""
    calls = [0]

    def fn() -> str:
        calls[0] += 1
        if calls[0] <= len(errors):
            raise errors[calls[0] - 1]
        return result

    return fn, calls


def no_sleep(_: float) -> None:
    pass


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("max_attempts", {"max_attempts": 0}),
        ("initial_wait_s", {"initial_wait_s": -1.0}),
        ("deadline_s", {"deadline_s": float("nan")}),
        ("max_wait_s", {"initial_wait_s": 2.0, "max_wait_s": 1.0}),
    ],
)
def test_policy_is_validated_where_built(field: str, kwargs: dict[str, float]) -> None:
    with pytest.raises(UsageError) as info:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_reads_retry_transient_rate_limited_and_ambiguous() -> None:
    fn, calls = flaky([TransientError("503"), RateLimitedError("429"), AmbiguousError("reset")])
    assert call_with_retry(fn, policy=FAST, idempotent=True, sleep=no_sleep) == "ok"
    assert calls[0] == 4


def test_mutations_retry_refusals_but_not_ambiguous() -> None:
    fn, calls = flaky([TransientError("503"), RateLimitedError("429")])
    assert call_with_retry(fn, policy=FAST, idempotent=False, sleep=no_sleep) == "ok"
    assert calls[0] == 3
    fn, calls = flaky([AmbiguousError("reset after send")])
    with pytest.raises(AmbiguousError):
        call_with_retry(fn, policy=FAST, idempotent=False, sleep=no_sleep)
    assert calls[0] == 1


@pytest.mark.parametrize(
    "error",
    [
        NotFoundError("x"),
        AlreadyExistsError("x"),
        QuotaExceededError("x"),
        StockoutError("x"),
        CloudError("bad request", code=3),
        ValueError("a bug"),
    ],
)
def test_non_retryable_errors_are_raised_at_once(error: Exception) -> None:
    for idempotent in (True, False):
        fn, calls = flaky([error])
        with pytest.raises(type(error)):
            call_with_retry(fn, policy=FAST, idempotent=idempotent, sleep=no_sleep)
        assert calls[0] == 1
        assert not is_retryable(error, idempotent=idempotent)


def test_attempts_are_bounded_and_the_last_error_surfaces() -> None:
    errors: list[Exception] = [TransientError(f"503 #{i}") for i in range(10)]
    fn, calls = flaky(errors)
    with pytest.raises(TransientError, match="503 #2"):
        call_with_retry(
            fn,
            policy=RetryPolicy(max_attempts=3, initial_wait_s=0, max_wait_s=0),
            idempotent=True,
            sleep=no_sleep,
        )
    assert calls[0] == 3


def test_total_deadline_bounds_the_call() -> None:
    fn, calls = flaky([TransientError("503")] * 1000)
    policy = RetryPolicy(max_attempts=1000, initial_wait_s=0.02, max_wait_s=0.02, deadline_s=0.1)
    start = time.monotonic()
    with pytest.raises(TransientError):
        call_with_retry(fn, policy=policy, idempotent=True)
    assert time.monotonic() - start < 0.5
    assert 2 <= calls[0] < 20


def test_waits_are_jittered_exponential_and_capped() -> None:
    waits: list[float] = []
    fn, _ = flaky([TransientError("503")] * 6)
    policy = RetryPolicy(max_attempts=7, initial_wait_s=1.0, max_wait_s=5.0, deadline_s=1000.0)
    seen: list[tuple[int, float]] = []
    call_with_retry(
        fn, policy=policy, idempotent=True, sleep=waits.append, on_retry=lambda n, e, w: seen.append((n, w))
    )
    assert len(waits) == 6 and [n for n, _ in seen] == [1, 2, 3, 4, 5, 6]
    # initial * 2^n plus up to `initial` of jitter, never above the cap.
    assert 1.0 <= waits[0] <= 2.0 and 2.0 <= waits[1] <= 3.0
    assert all(w <= 5.0 for w in waits) and waits[-1] == 5.0
    assert len(set(waits[:2])) == 2


def test_poll_until_grows_its_interval_and_reports_each_poll() -> None:
    states = iter(["PENDING", "RUNNING", "RUNNING", "RUNNING", "RUNNING", "DONE"])
    sleeps: list[float] = []
    polled: list[str] = []
    out = poll_until(
        lambda: next(states),
        lambda s: s == "DONE",
        timeout_s=60,
        initial_interval_s=0.25,
        max_interval_s=2.0,
        on_poll=lambda s, _e: polled.append(s),
        sleep=sleeps.append,
    )
    assert out == "DONE"
    assert polled == ["PENDING", "RUNNING", "RUNNING", "RUNNING", "RUNNING", "DONE"]
    assert sleeps == [0.25, 0.5, 1.0, 2.0, 2.0]


def test_poll_until_times_out_with_the_last_value() -> None:
    with pytest.raises(PollTimeout) as info:
        poll_until(
            lambda: "RUNNING",
            lambda s: s == "DONE",
            timeout_s=0.05,
            initial_interval_s=0.01,
            max_interval_s=0.01,
        )
    assert info.value.last == "RUNNING"


def test_deadlines_count_the_waits_of_a_fake_clock_not_only_real_time() -> None:
    """A backend on a fake clock waits instantly: its 300 s poll and 60 s retry deadline are 300 and 60
    seconds of waiting, reached in a moment, not that much real time spent polling at full speed."""
    waited: list[float] = []
    start = time.monotonic()
    with pytest.raises(PollTimeout) as info:
        poll_until(
            lambda: "RUNNING",
            lambda s: s == "DONE",
            timeout_s=300,
            initial_interval_s=1.0,
            max_interval_s=10.0,
            sleep=waited.append,
        )
    assert 300 <= sum(waited) < 310 and len(waited) < 40
    assert info.value.elapsed_s == sum(waited)
    fn, calls = flaky([TransientError("503")] * 1000)
    retried: list[float] = []
    with pytest.raises(TransientError):
        call_with_retry(
            fn,
            policy=RetryPolicy(max_attempts=1000, initial_wait_s=1.0, max_wait_s=8.0, deadline_s=60.0),
            idempotent=True,
            sleep=retried.append,
        )
    assert sum(retried) < 60 and 5 <= calls[0] < 20  # no attempt whose wait would cross the deadline
    assert time.monotonic() - start < 5.0


def test_poll_until_propagates_errors_at_once() -> None:
    fn, calls = flaky([NotFoundError("gone")])
    with pytest.raises(NotFoundError):
        poll_until(fn, lambda s: True, timeout_s=10, sleep=no_sleep)
    assert calls[0] == 1
