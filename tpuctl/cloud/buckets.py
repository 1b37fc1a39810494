"""What tpuctl reads of a Cloud Storage bucket: where it is, and what the caller may do in it.

Two JSON-API calls, both reads (docs/google-facts.md#cloud-storage-buckets):

- ``GET {base}/storage/v1/b/{bucket}?fields=name,location,locationType,customPlacementConfig`` -> the
  bucket's ``location`` (upper case: ``US-CENTRAL1``, ``US``, ``NAM4``), ``locationType`` (``region``,
  ``dual-region``, ``multi-region``) and, for a configurable dual-region, its
  ``customPlacementConfig.dataLocations``; it takes ``storage.buckets.get``;
- ``GET {base}/storage/v1/b/{bucket}/iam/testPermissions?permissions=P&permissions=Q`` -> ``{"permissions":
  [the ones the caller holds]}`` (the key is absent when it holds none); any caller may ask.

And three calls on objects, for the team server's ledger copies
(https://cloud.google.com/storage/docs/json_api/v1/objects): ``POST {base}/upload/storage/v1/b/{bucket}/o
?uploadType=media&name=N`` (insert; ``storage.objects.create``), ``GET .../b/{bucket}/o?prefix=P`` (list;
``storage.objects.list``), ``GET .../b/{bucket}/o/{name}?alt=media`` (the bytes; ``storage.objects.get``)
and ``DELETE .../b/{bucket}/o/{name}`` (``storage.objects.delete``).

The JSON calls go through ``google_calls.JsonCalls``: errors become ``tpuctl.errors`` through
:mod:`tpuctl.cloud.translate` (404: the bucket does not exist; 403: the caller may not read it). The
caller owns the ``httpx.Client``.
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.google_calls import JsonCalls
from tpuctl.cloud.retry import RetryPolicy, Sleep, call_with_retry
from tpuctl.cloud.translate import error_from_http_response, translate_errors
from tpuctl.errors import CloudError, NotFoundError

if TYPE_CHECKING:
    import httpx
    from google.auth.credentials import Credentials

GOOGLE_STORAGE_URL = "https://storage.googleapis.com"

#: What a run's hosts do in its checkpoint bucket: write, read back, list, and overwrite or delete old
#: checkpoints (orbax replaces and garbage-collects them).
WRITE_PERMISSIONS = (
    "storage.objects.create",
    "storage.objects.get",
    "storage.objects.list",
    "storage.objects.delete",
)


@dataclass(frozen=True)
class StoredObject:
    """One object of a bucket, as objects.list answers it."""

    name: str
    size: int
    updated: str  # RFC 3339, as the API answers


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
        self._calls: JsonCalls | None = None

    def __repr__(self) -> str:  # never show the credentials
        return f"BucketClient(base_url={self.base_url!r})"

    def location(self, bucket: str) -> BucketLocation:
        """Where ``bucket`` is (``NotFoundError`` when it does not exist)."""
        answer = self._get(
            f"/storage/v1/b/{_quoted(bucket)}",
            f"read the location of bucket gs://{bucket}",
            {"fields": "name,location,locationType,customPlacementConfig"},
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
            {"permissions": asked},
        )
        held = answer.get("permissions") or []
        return frozenset(str(p) for p in held if str(p) in asked)

    def put_object(self, bucket: str, name: str, data: bytes) -> StoredObject:
        """Write ``data`` as ``name`` (replacing what was there); retried as an idempotent write: the same
        bytes under the same name again change nothing a reader sees."""
        what = f"write gs://{bucket}/{name}"
        answer = self._raw(
            "POST",
            f"{self.base_url}/upload/storage/v1/b/{_quoted(bucket)}/o",
            what,
            params={"uploadType": "media", "name": name},
            content=data,
        )
        return _stored(json.loads(answer), what)

    def list_objects(self, bucket: str, prefix: str) -> list[StoredObject]:
        """The objects whose names start with ``prefix``, every page read."""
        out: list[StoredObject] = []
        token = ""
        while True:
            params: dict[str, str | list[str]] = {"prefix": prefix}
            if token:
                params["pageToken"] = token
            answer = self._get(f"/storage/v1/b/{_quoted(bucket)}/o", f"list gs://{bucket}/{prefix}", params)
            out.extend(_stored(item, f"list gs://{bucket}/{prefix}") for item in answer.get("items") or [])
            token = str(answer.get("nextPageToken") or "")
            if not token:
                return out

    def get_object(self, bucket: str, name: str) -> bytes:
        """The bytes of ``name`` (``NotFoundError`` when there is none)."""
        return self._raw(
            "GET",
            f"{self.base_url}/storage/v1/b/{_quoted(bucket)}/o/{_quoted(name)}",
            f"read gs://{bucket}/{name}",
            params={"alt": "media"},
        )

    def delete_object(self, bucket: str, name: str) -> None:
        """Delete ``name``; one already gone is not an error (a retried delete finds it gone)."""
        with contextlib.suppress(NotFoundError):
            self._raw(
                "DELETE",
                f"{self.base_url}/storage/v1/b/{_quoted(bucket)}/o/{_quoted(name)}",
                f"delete gs://{bucket}/{name}",
                params={},
            )

    def _raw(
        self, method: str, url: str, what: str, *, params: Mapping[str, str], content: bytes | None = None
    ) -> bytes:
        """One call whose body is bytes (media upload and download), translated and retried as the JSON
        calls are."""

        def attempt() -> bytes:
            with translate_errors(what, mutating=method != "GET"):
                headers = self._calls_or_open().auth_headers()
                if content is not None:
                    headers["Content-Type"] = "application/octet-stream"
                response = self._http.request(
                    method, url, params=dict(params), content=content, headers=headers
                )
                if response.is_error:
                    raise error_from_http_response(
                        response.status_code, response.content, what=what, mutating=method != "GET"
                    )
                return response.content

        return call_with_retry(attempt, policy=self._retry, idempotent=True, sleep=self._sleep)

    def _calls_or_open(self) -> JsonCalls:
        if self._calls is None:  # the credentials are looked up at the first call
            self._calls = JsonCalls(self._credentials(), self._http, self._retry, self._sleep)
        return self._calls

    def _get(self, path: str, what: str, params: Mapping[str, str | list[str]]) -> dict[str, Any]:
        if self._calls is None:  # the credentials are looked up at the first call
            self._calls = JsonCalls(self._credentials(), self._http, self._retry, self._sleep)
        return self._calls.call("GET", self.base_url + path, what, params=params)


def _quoted(bucket: str) -> str:
    return urllib.parse.quote(bucket, safe="")


def _stored(item: Any, what: str) -> StoredObject:
    if not isinstance(item, dict) or "name" not in item:
        raise CloudError(f"{what}: the answer is not an object's metadata")
    return StoredObject(
        name=str(item["name"]), size=int(item.get("size") or 0), updated=str(item.get("updated") or "")
    )
