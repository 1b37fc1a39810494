"""tpuctl's errors: every failure a user can see is one of these.

Each error carries a message that says what failed, an optional ``fix`` that says what to do about it,
and the process exit code the CLI maps it to. Vendor exceptions (google.api_core, httpx) never leave
the cloud boundary: ``tpuctl.cloud.translate`` turns them into the classes below in one place.

Hierarchy, with exit codes::

    TpuctlError                      1   anything else tpuctl knows it cannot do
    ├── UsageError                   2   bad input: a flag, an argument, a value
    │   ├── ConfigError              2   a bad config or world file (names file, field, value)
    │   └── UnknownAcceleratorError  2   a type or size the catalog does not have
    ├── CloudError                   10  the provider refused or failed a request
    │   ├── NotFoundError            11
    │   ├── AlreadyExistsError       12
    │   ├── PermissionDeniedError    13
    │   ├── UnauthenticatedError     13
    │   ├── RateLimitedError         14  retryable
    │   ├── TransientError           14  retryable (5xx, resets, timeouts)
    │   │   └── AmbiguousError       14  a mutation may or may not have happened: look before retrying
    │   ├── QuotaExceededError       4
    │   └── StockoutError            5   no capacity in the zone
    ├── InfeasibleError              3   no candidate can take the request
    │   ├── NoQuotaError             4   quota short everywhere
    │   ├── NoCapacityError          5   not offered, or no capacity, anywhere
    │   └── OverPriceCapError        6   every candidate costs more than the cap
    ├── BudgetExceededError          7
    ├── RunFailedError               8   the user's program failed (carries the host)
    │   └── HostKeyMismatchError     8   a host's SSH key is not the one its node published
    ├── LeaseHeldError               9   another supervisor holds the run's lease (names it, and when it ends)
    ├── LeaseLostError               9   this supervisor's lease on the run is gone: it must stop acting
    ├── SecretKeyError               1   a run's secret cannot be decrypted with the key in force
    └── InterruptedByUser            130
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpuctl.timefmt import iso

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INFEASIBLE = 3
EXIT_QUOTA = 4
EXIT_CAPACITY = 5
EXIT_PRICE_CAP = 6
EXIT_BUDGET = 7
EXIT_RUN_FAILED = 8
EXIT_LEASE_HELD = 9
EXIT_CLOUD = 10
EXIT_NOT_FOUND = 11
EXIT_ALREADY_EXISTS = 12
EXIT_PERMISSION = 13
EXIT_RETRYABLE = 14
EXIT_UNREACHABLE = 15
EXIT_INTERRUPTED = 130


class TpuctlError(Exception):
    """Base of every error tpuctl raises on purpose."""

    exit_code: int = EXIT_ERROR
    #: A short machine-readable kind, stable across releases (used in JSON error output).
    kind: str = "error"

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def to_dict(self) -> dict[str, Any]:
        """The error as JSON-ready data: ``{"error": kind, "message", "fix", "exit_code", ...}``."""
        data: dict[str, Any] = {
            "error": self.kind,
            "message": self.message,
            "exit_code": self.exit_code,
        }
        if self.fix:
            data["fix"] = self.fix
        data.update(self.details())
        return data

    def details(self) -> dict[str, Any]:
        """Extra structured fields for ``to_dict``; subclasses add theirs."""
        return {}

    def __str__(self) -> str:
        return self.message if not self.fix else f"{self.message} Fix: {self.fix}"


class UsageError(TpuctlError):
    """Bad input from the user. ``field`` names the flag or argument, ``value`` what was given."""

    exit_code = EXIT_USAGE
    kind = "usage"

    def __init__(
        self, message: str, *, field: str | None = None, value: object = None, fix: str | None = None
    ) -> None:
        super().__init__(message, fix=fix)
        self.field = field
        self.value = value

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.field is not None:
            out["field"] = self.field
        if self.value is not None:
            out["value"] = str(self.value)
        return out


class ConfigError(UsageError):
    """A config or world file is unreadable or invalid. ``path`` is the file."""

    kind = "config"

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        field: str | None = None,
        value: object = None,
        fix: str | None = None,
    ) -> None:
        super().__init__(message, field=field, value=value, fix=fix)
        self.path = path

    def details(self) -> dict[str, Any]:
        out = super().details()
        if self.path is not None:
            out["path"] = self.path
        return out


class NameNotFoundError(UsageError):
    """A name the user gave (a run, a slice) matches nothing: exit 11, as the cloud's own not-found is, so
    a script tells "no such thing" from a bad flag the same way for every command; ``field`` and ``value``
    say which argument named it."""

    exit_code = EXIT_NOT_FOUND
    kind = "not_found"


class UnknownAcceleratorError(UsageError):
    """An accelerator type or size the catalog does not know."""

    kind = "unknown_accelerator"


class CloudError(TpuctlError):
    """The provider refused or failed a request. ``code`` is the google.rpc code when known."""

    exit_code = EXIT_CLOUD
    kind = "cloud"
    retryable = False

    def __init__(self, message: str, *, code: int | None = None, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.code = code

    def details(self) -> dict[str, Any]:
        return {"code": self.code} if self.code is not None else {}


class NotFoundError(CloudError):
    exit_code = EXIT_NOT_FOUND
    kind = "not_found"


class AlreadyExistsError(CloudError):
    exit_code = EXIT_ALREADY_EXISTS
    kind = "already_exists"


class PermissionDeniedError(CloudError):
    exit_code = EXIT_PERMISSION
    kind = "permission_denied"


class UnauthenticatedError(CloudError):
    exit_code = EXIT_PERMISSION
    kind = "unauthenticated"


class NetworkError(CloudError):
    """The cloud refused the hosts' network or subnetwork (it does not exist, is not in the slice's
    region, or the network needs a subnetwork named): no other zone cures it."""

    kind = "network"


class UnreachableError(TpuctlError):
    """The endpoint tpuctl was told to use does not answer (a ``TPUCTL_SIM_URL`` with no simulator behind
    it): a setup problem, not a cloud error and not a bug."""

    exit_code = EXIT_UNREACHABLE
    kind = "unreachable"


class RateLimitedError(CloudError):
    exit_code = EXIT_RETRYABLE
    kind = "rate_limited"
    retryable = True


class TransientError(CloudError):
    exit_code = EXIT_RETRYABLE
    kind = "transient"
    retryable = True


class AmbiguousError(TransientError):
    """A mutating request may or may not have taken effect (timeout, reset): look before retrying."""

    kind = "ambiguous"


class QuotaExceededError(CloudError):
    """The provider rejected a request for quota (HTTP 429 with a QuotaFailure detail)."""

    exit_code = EXIT_QUOTA
    kind = "quota_exceeded"

    def __init__(
        self,
        message: str,
        *,
        quota_id: str | None = None,
        limit: float | None = None,
        location: str | None = None,
        code: int | None = None,
        fix: str | None = None,
    ) -> None:
        super().__init__(message, code=code, fix=fix)
        self.quota_id = quota_id
        self.limit = limit
        self.location = location

    def details(self) -> dict[str, Any]:
        out = super().details()
        out.update({"quota_id": self.quota_id, "limit": self.limit, "location": self.location})
        return out


class StockoutError(CloudError):
    """No capacity for the request in the zone (the create operation failed with code 8)."""

    exit_code = EXIT_CAPACITY
    kind = "stockout"

    def __init__(self, message: str, *, zone: str | None = None, code: int | None = 8) -> None:
        super().__init__(
            message, code=code, fix="try another zone, another capacity type, or a queued resource (--queued)"
        )
        self.zone = zone

    def details(self) -> dict[str, Any]:
        out = super().details()
        out["zone"] = self.zone
        return out


class InfeasibleError(TpuctlError):
    """No candidate placement can take the request. ``attempts`` is the failover history."""

    exit_code = EXIT_INFEASIBLE
    kind = "infeasible"

    def __init__(
        self, message: str, *, fix: str | None = None, attempts: Sequence[dict[str, Any]] = ()
    ) -> None:
        super().__init__(message, fix=fix)
        self.attempts = list(attempts)

    def details(self) -> dict[str, Any]:
        return {"attempts": self.attempts} if self.attempts else {}


class NoQuotaError(InfeasibleError):
    exit_code = EXIT_QUOTA
    kind = "no_quota"


class NoCapacityError(InfeasibleError):
    exit_code = EXIT_CAPACITY
    kind = "no_capacity"


class OverPriceCapError(InfeasibleError):
    exit_code = EXIT_PRICE_CAP
    kind = "over_price_cap"


class BudgetExceededError(TpuctlError):
    exit_code = EXIT_BUDGET
    kind = "budget_exceeded"


class RunFailedError(TpuctlError):
    """The user's program failed. ``worker`` names the host that failed first."""

    exit_code = EXIT_RUN_FAILED
    kind = "run_failed"

    def __init__(
        self,
        message: str,
        *,
        worker: int | None = None,
        returncode: int | None = None,
        fix: str | None = None,
    ) -> None:
        super().__init__(message, fix=fix)
        self.worker = worker
        self.returncode = returncode

    def details(self) -> dict[str, Any]:
        return {"worker": self.worker, "returncode": self.returncode}


class HostKeyMismatchError(RunFailedError):
    """A host presented an SSH host key other than the ones expected for it (the node's guest attributes),
    or none was known: tpuctl refuses to log in (no trust on first use). Names the worker, its address and
    both SHA256 fingerprints."""

    kind = "host_key_mismatch"

    def __init__(
        self,
        message: str,
        *,
        worker: int,
        address: str,
        expected: Sequence[str],
        presented: str | None,
        fix: str | None = None,
    ) -> None:
        super().__init__(message, worker=worker, fix=fix)
        self.address = address
        self.expected = tuple(expected)
        self.presented = presented

    def details(self) -> dict[str, Any]:
        out = super().details()
        out.update({"address": self.address, "expected": list(self.expected), "presented": self.presented})
        return out


class Aborted(TpuctlError):
    """The user answered no to a confirmation: nothing was changed (exit 1, not an interruption)."""

    exit_code = EXIT_ERROR
    kind = "aborted"


class SliceDeletedError(TpuctlError):
    """The run's slice was deleted by the user (``pod delete --force``) while the run was on it: a
    deletion, not a preemption (no recovery; the run ends cancelled)."""

    exit_code = EXIT_ERROR
    kind = "slice_deleted"


class LeaseHeldError(TpuctlError):
    """Another supervisor holds a live lease on the run: it may not be claimed until that lease expires
    (by the ledger's clock) or is released. Names the holder and when its lease ends."""

    exit_code = EXIT_LEASE_HELD
    kind = "lease_held"

    def __init__(
        self,
        *,
        run_id: str,
        owner_id: str,
        host: str,
        pid: int,
        generation: int,
        expires_at: float,
        now: float,
    ) -> None:
        self.run_id = run_id
        self.owner_id = owner_id
        self.host = host
        self.pid = pid
        self.generation = generation
        self.expires_at = expires_at
        self.expires_in_s = max(0.0, expires_at - now)
        super().__init__(
            f"run {run_id} is supervised by host {host}, pid {pid} (owner {owner_id}, lease generation "
            f"{generation}); its lease expires at {iso(expires_at)}, in {self.expires_in_s:.1f} s by the "
            "ledger's clock, unless that supervisor renews it",
            fix=f"wait for that supervisor (or for its lease to expire if it is gone), or stop the run with "
            f"`tpuctl runs cancel {run_id}`",
        )

    def details(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "owner": {"owner_id": self.owner_id, "host": self.host, "pid": self.pid},
            "generation": self.generation,
            "expires_at": self.expires_at,
            "expires_in_s": round(self.expires_in_s, 3),
        }


class LeaseLostError(TpuctlError):
    """A renewal or a fenced write found the supervisor's lease gone (expired, released, or claimed by
    another): nothing was written, and the supervisor must stop acting on the run at once."""

    exit_code = EXIT_LEASE_HELD
    kind = "lease_lost"

    def __init__(self, message: str, *, run_id: str, generation: int, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.run_id = run_id
        self.generation = generation

    def details(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "generation": self.generation}


class SecretKeyError(TpuctlError):
    """A run's secret cannot be read with the key in force (another key, a missing or bad key file)."""

    kind = "secret_key"


class InterruptedByUser(TpuctlError):
    exit_code = EXIT_INTERRUPTED
    kind = "interrupted"
