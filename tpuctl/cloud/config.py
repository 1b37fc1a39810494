"""``CloudConfig``: how a cloud client calls its API, decided by the backend that builds the client.

A backend (``tpuctl.backends``) chooses once where credentials come from, how patient the calls are (retry,
request timeout, operation polling) and whether proxy variables from the environment apply, and hands the
same ``CloudConfig`` to every client it builds (``TpuApiCloud``, ``ComputeCloud``, ``CloudQuotasClient``).
A client takes what it is given and never asks which backend it serves. The defaults are Google's:
Application Default Credentials, the environment's proxies honoured, the patience a rate-limited API needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpuctl.cloud.credentials import CredentialsSource, default_credentials
from tpuctl.cloud.retry import RetryPolicy, Sleep
from tpuctl.errors import UsageError


@dataclass(frozen=True)
class CloudConfig:
    """See the module docstring. Validated when built: a bad value fails before any call."""

    #: The backend's name, recorded with what the clients do (ledger rows, JSON documents). Data only:
    #: no client branches on it.
    backend: str = "gcp"
    credentials: CredentialsSource = default_credentials
    #: One call's retries (which failures are retried is ``retry.py``'s rule, not the backend's).
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    request_timeout_s: float = 30.0
    #: Polling a long-running operation: the first interval, doubled up to the max, until the timeout.
    poll_interval_s: float = 0.2
    poll_max_interval_s: float = 2.0
    operation_timeout_s: float = 1800.0
    #: Whether HTTP(S)_PROXY and friends apply. Not to a simulator on loopback: a proxy would catch it.
    trust_env: bool = True
    #: How waits between tries and polls pass (None: real time; tests pass a fake clock's).
    sleep: Sleep | None = None

    def __post_init__(self) -> None:
        for name in ("request_timeout_s", "poll_interval_s", "operation_timeout_s"):
            value = getattr(self, name)
            if value <= 0:
                raise UsageError(f"{name} must be > 0, got {value!r}", field=name, value=value)

    @property
    def poll_cap_s(self) -> float:
        """The longest wait between polls: the max, or the first interval when the max is below it."""
        return max(self.poll_max_interval_s, self.poll_interval_s)
