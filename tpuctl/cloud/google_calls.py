"""How tpuctl calls Google, whichever API: one call translated at the boundary (``translate_errors``) and
retried by tpuctl's own policy (the libraries' methods have no default retry). ``TpuApiCloud`` and
``ComputeCloud`` call their client libraries through ``GoogleCalls``; the APIs tpuctl speaks JSON to
itself go through ``JsonCalls``."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tpuctl.cloud.credentials import fresh
from tpuctl.cloud.retry import RetryPolicy, Sleep, call_with_retry
from tpuctl.cloud.translate import error_from_http_response, translate_errors
from tpuctl.errors import CloudError

if TYPE_CHECKING:
    import httpx
    from google.auth.credentials import Credentials

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


class JsonCalls:
    """JSON calls to a Google API that has no client library here (OS Login, Policy Troubleshooter, Cloud
    Storage's bucket IAM), over ``http`` with the credentials' bearer token (None: none), translated at
    the same boundary and retried by the same policy as the libraries' calls. Every call must be
    idempotent (a read, or a write that may be repeated)."""

    def __init__(
        self, credentials: Credentials | None, http: httpx.Client, retry: RetryPolicy, sleep: Sleep | None
    ) -> None:
        self._credentials = credentials
        self._http = http
        self._retry = retry
        self._sleep = sleep

    def call(
        self,
        method: str,
        url: str,
        what: str,
        *,
        params: Mapping[str, str | list[str]],
        body: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        request = functools.partial(self._request, method, url, what, params=params, body=body)
        return call_with_retry(request, policy=self._retry, idempotent=True, sleep=self._sleep)

    def auth_headers(self) -> dict[str, str]:
        """The credentials' headers (a bearer token), for a call whose body is not JSON."""
        if self._credentials is None:
            return {}
        creds: Any = fresh(self._credentials)  # google-auth is untyped
        headers: dict[str, str] = {}
        creds.apply(headers)  # the bearer token, and x-goog-user-project where the credentials name one
        return headers

    def _request(
        self,
        method: str,
        url: str,
        what: str,
        *,
        params: Mapping[str, str | list[str]],
        body: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        with translate_errors(what, mutating=method != "GET"):
            response = self._http.request(
                method, url, params=dict(params), json=body, headers=self.auth_headers()
            )
            if response.is_error:
                raise error_from_http_response(
                    response.status_code, response.content, what=what, mutating=method != "GET"
                )
            try:
                data = json.loads(response.content)
            except ValueError:
                raise CloudError(
                    f"{what}: the response (HTTP {response.status_code}) is not valid JSON",
                    fix="check that the endpoint is Google's",
                ) from None
            if not isinstance(data, dict):
                raise CloudError(f"{what}: expected a JSON object, got {type(data).__name__}")
            return data
