"""How tpuctl calls a Google client library, whichever API: credentials for the backend, and one call
translated at the boundary (``translate_errors``) and retried by tpuctl's own policy (the libraries'
methods have no default retry). ``TpuApiCloud`` and ``ComputeCloud`` both call through here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from tpuctl.cloud.retry import PollTimeout, RetryPolicy, Sleep, call_with_retry, poll_until
from tpuctl.cloud.translate import translate_errors
from tpuctl.errors import TransientError

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

T = TypeVar("T")


def credentials_for(backend: str) -> Credentials:
    """Anonymous on the simulator; Application Default Credentials on Google (``UnauthenticatedError``
    with the fix when there are none)."""
    if backend == "sim":
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()  # type: ignore[no-untyped-call]
    from tpuctl.cloud.quotas import _default_credentials

    return _default_credentials()


@dataclass(frozen=True)
class GoogleCalls:
    """One client's calls: ``read`` retries every transient failure; ``mutate`` treats a broken
    connection as ambiguous and retries only an idempotent mutation."""

    policy: RetryPolicy
    sleep: Sleep | None = None

    def read(self, action: str, resource: str, fn: Callable[[], T]) -> T:
        def attempt() -> T:
            with translate_errors(action, resource, mutating=False):
                return fn()

        return call_with_retry(attempt, policy=self.policy, idempotent=True, sleep=self.sleep)

    def mutate(
        self, action: str, resource: str, fn: Callable[[], T], *, zone: str | None, idempotent: bool = False
    ) -> T:
        def attempt() -> T:
            with translate_errors(action, resource, mutating=True, zone=zone):
                return fn()

        return call_with_retry(attempt, policy=self.policy, idempotent=idempotent, sleep=self.sleep)


@dataclass(frozen=True)
class OperationPolling:
    """How a long-running operation is polled: a growing interval up to a cap, and a deadline after which
    the operation is left running on the server (a ``TransientError`` that says so)."""

    timeout_s: float
    initial_interval_s: float
    max_interval_s: float
    sleep: Sleep | None = None

    def until_done(
        self,
        get: Callable[[], T],
        is_done: Callable[[T], bool],
        *,
        what: str,
        name: str,
        on_poll: Callable[[T, float], None] | None = None,
    ) -> T:
        try:
            return poll_until(
                get,
                is_done,
                timeout_s=self.timeout_s,
                initial_interval_s=self.initial_interval_s,
                max_interval_s=self.max_interval_s,
                on_poll=on_poll,
                sleep=self.sleep,
            )
        except PollTimeout as exc:
            raise TransientError(
                f"{what}: operation {name} is still running after {exc.elapsed_s:.0f}s",
                fix="it continues on the server: check its state later (tpuctl pod list / describe)",
            ) from None
