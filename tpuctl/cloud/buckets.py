"""What tpuctl reads of a Cloud Storage bucket: where it is, and what the caller may do in it.

Two JSON-API calls, both reads (docs/google-facts.md#cloud-storage-buckets):

- ``GET {base}/storage/v1/b/{bucket}?fields=name,location,locationType,customPlacementConfig`` -> the
  bucket's ``location`` (upper case: ``US-CENTRAL1``, ``US``, ``NAM4``), ``locationType`` (``region``,
  ``dual-region``, ``multi-region``) and, for a configurable dual-region, its
  ``customPlacementConfig.dataLocations``; it takes ``storage.buckets.get``;
- ``GET {base}/storage/v1/b/{bucket}/iam/testPermissions?permissions=P&permissions=Q`` -> ``{"permissions":
  [the ones the caller holds]}`` (the key is absent when it holds none); any caller may ask.

Errors become ``tpuctl.errors`` through :mod:`tpuctl.cloud.translate` (404: the bucket does not exist;
403: the caller may not read it). The caller owns the ``httpx.Client``.
"""

from __future__ import annotations

import functools
import json
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.credentials import fresh
from tpuctl.cloud.retry import RetryPolicy, Sleep, call_with_retry
from tpuctl.cloud.translate import error_from_http_response, translate_errors
from tpuctl.errors import CloudError

if TYPE_CHECKING:
    import httpx
    from google.auth.credentials import Credentials

GOOGLE_STORAGE_URL = "https://storage.googleapis.com"

#: A query string's pairs, as httpx takes them (a name may repeat: ``permissions``).
_Query = list[tuple[str, str | int | float | bool | None]]

#: What a run's hosts do in its checkpoint bucket: write, read back, list, and overwrite or delete old
#: checkpoints (orbax replaces and garbage-collects them).
WRITE_PERMISSIONS = (
    "storage.objects.create",
    "storage.objects.get",
    "storage.objects.list",
    "storage.objects.delete",
)


@dataclass(frozen=True)
class BucketLocation:
    """Where a bucket keeps its objects, as Cloud Storage answers it."""

    name: str
    location: str  # upper case, as the API answers: US-CENTRAL1, US, NAM4
    location_type: str  # region | dual-region | multi-region ("" where the API said nothing)
    #: A configurable dual-region's regions (lower case); empty otherwise.
    data_locations: tuple[str, ...] = ()

    def describe(self) -> str:
        where = self.location + (f" ({', '.join(self.data_locations)})" if self.data_locations else "")
        return f"gs://{self.name} in {where}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.name,
            "location": self.location,
            "location_type": self.location_type,
            "data_locations": list(self.data_locations),
        }


class BucketClient:
    """``location`` and ``held_permissions`` of one Cloud Storage endpoint."""

    def __init__(
        self,
        base_url: str,
        credentials: Callable[[], Credentials | None],
        http: httpx.Client,
        *,
        retry: RetryPolicy | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        """``base_url``: Google's (:data:`GOOGLE_STORAGE_URL`) or the simulator's storage emulator;
        ``credentials``: looked up at the first call (None: no token is sent)."""
        self.base_url = base_url.rstrip("/")
        self._credentials = credentials
        self._http = http
        self._retry = retry or RetryPolicy()
        self._sleep = sleep

    def __repr__(self) -> str:  # never show the credentials
        return f"BucketClient(base_url={self.base_url!r})"

    def location(self, bucket: str) -> BucketLocation:
        """Where ``bucket`` is (``NotFoundError`` when it does not exist)."""
        answer = self._get(
            f"/storage/v1/b/{_quoted(bucket)}",
            f"read the location of bucket gs://{bucket}",
            [("fields", "name,location,locationType,customPlacementConfig")],
        )
        placement = answer.get("customPlacementConfig") or {}
        regions = placement.get("dataLocations") if isinstance(placement, dict) else None
        return BucketLocation(
            name=str(answer.get("name") or bucket),
            location=str(answer.get("location") or "").upper(),
            location_type=str(answer.get("locationType") or "").lower(),
            data_locations=tuple(str(r).lower() for r in regions or ()),
        )

    def held_permissions(self, bucket: str, permissions: Iterable[str]) -> frozenset[str]:
        """Which of ``permissions`` the caller holds on ``bucket`` (buckets.testIamPermissions)."""
        asked = list(permissions)
        answer = self._get(
            f"/storage/v1/b/{_quoted(bucket)}/iam/testPermissions",
            f"test the caller's permissions on bucket gs://{bucket}",
            [("permissions", p) for p in asked],
        )
        held = answer.get("permissions") or []
        return frozenset(str(p) for p in held if str(p) in asked)

    def _get(self, path: str, what: str, params: _Query) -> dict[str, Any]:
        request = functools.partial(self._request, self.base_url + path, what, params)
        return call_with_retry(request, policy=self._retry, idempotent=True, sleep=self._sleep)

    def _request(self, url: str, what: str, params: _Query) -> dict[str, Any]:
        with translate_errors(what):
            response = self._http.get(url, params=params, headers=self._auth_headers())
            if response.is_error:
                raise error_from_http_response(response.status_code, response.content, what=what)
            try:
                data = json.loads(response.content)
            except ValueError:
                raise CloudError(
                    f"{what}: the response (HTTP {response.status_code}) is not valid JSON",
                    fix="check that the endpoint is Cloud Storage's",
                ) from None
            if not isinstance(data, dict):
                raise CloudError(f"{what}: expected a JSON object, got {type(data).__name__}")
            return data

    def _auth_headers(self) -> dict[str, str]:
        credentials = self._credentials()
        if credentials is None:
            return {}
        creds: Any = fresh(credentials)  # google-auth is untyped
        headers: dict[str, str] = {}
        creds.apply(headers)  # the bearer token, and x-goog-user-project where the credentials name one
        return headers


def _quoted(bucket: str) -> str:
    return urllib.parse.quote(bucket, safe="")
