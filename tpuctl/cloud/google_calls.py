"""How tpuctl calls a Google client library, whichever API: one call translated at the boundary
(``translate_errors``) and retried by tpuctl's own policy (the libraries' methods have no default retry).
``TpuApiCloud`` and ``ComputeCloud`` both call through here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tpuctl.cloud.retry import RetryPolicy, Sleep, call_with_retry
from tpuctl.cloud.translate import translate_errors

T = TypeVar("T")


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
