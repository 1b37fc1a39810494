"""Whether an account may use a bucket, asked of Google without touching the bucket
(docs/google-facts.md#bucket-access).

- The caller's own permissions: Cloud Storage's ``buckets.testIamPermissions`` (``GET
  {storage}/storage/v1/b/{bucket}/iam/testPermissions?permissions=P...``) answers which of the asked
  permissions the caller holds on the bucket (``{"permissions": [...]}``; none held: no field). Any caller
  may ask; a bucket that does not exist is 404.
- Another account's (the hosts' service account): Policy Troubleshooter (``POST
  {troubleshooter}/v1/iam:troubleshoot`` with ``{"accessTuple": {"principal", "fullResourceName",
  "permission"}}``) answers ``access``: ``GRANTED``, ``NOT_GRANTED``, or ``UNKNOWN_CONDITIONAL`` /
  ``UNKNOWN_INFO_DENIED`` when it cannot tell (a condition, or policies the caller may not read). It sees
  every policy that applies, the folder's and organization's and groups' included, which reading the
  project's and the bucket's policies would miss.
- Which account the hosts run as by default: the project's Compute Engine default service account, as
  ``projects.get`` names it (``defaultServiceAccount``).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from tpuctl.cloud.google_calls import JsonCalls
from tpuctl.cloud.retry import RetryPolicy, Sleep

if TYPE_CHECKING:
    import httpx
    from google.auth.credentials import Credentials

GOOGLE_STORAGE_URL = "https://storage.googleapis.com"
GOOGLE_TROUBLESHOOTER_URL = "https://policytroubleshooter.googleapis.com"


class Access(StrEnum):
    """Policy Troubleshooter's verdict, with both of its can't-tell states as one."""

    GRANTED = "granted"
    NOT_GRANTED = "not granted"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class BucketEndpoints:
    """Where the three questions go: Cloud Storage, Policy Troubleshooter and Compute Engine."""

    storage: str
    troubleshooter: str
    compute: str

    @classmethod
    def at(cls, base_url: str) -> BucketEndpoints:
        """All three at one URL (the simulator serves them together)."""
        base = base_url.rstrip("/")
        return cls(base, base, base)


class BucketAccess:
    """The questions above, each one call with the caller's credentials."""

    def __init__(
        self,
        endpoints: BucketEndpoints,
        credentials: Credentials | None,
        http: httpx.Client,
        *,
        retry: RetryPolicy | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        self.endpoints = endpoints
        self._calls = JsonCalls(credentials, http, retry or RetryPolicy(), sleep)

    def __repr__(self) -> str:  # never show the credentials
        return f"BucketAccess(endpoints={self.endpoints!r})"

    def caller_lacks(self, bucket: str, permissions: tuple[str, ...]) -> list[str]:
        """Which of ``permissions`` the caller does not hold on ``bucket`` (NotFoundError: no such
        bucket)."""
        url = (
            f"{self.endpoints.storage}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/iam/testPermissions"
        )
        answer = self._calls.call(
            "GET",
            url,
            f"test the caller's permissions on gs://{bucket}",
            params={"permissions": list(permissions)},
        )
        held = {str(p) for p in answer.get("permissions") or []}
        return [p for p in permissions if p not in held]

    def account_access(self, account: str, bucket: str, permission: str) -> Access:
        """Whether ``account`` holds ``permission`` on ``bucket``, as Policy Troubleshooter tells."""
        body = {
            "accessTuple": {
                "principal": account,
                "fullResourceName": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
                "permission": permission,
            }
        }
        answer = self._calls.call(
            "POST",
            f"{self.endpoints.troubleshooter}/v1/iam:troubleshoot",
            f"ask Policy Troubleshooter whether {account} holds {permission} on gs://{bucket}",
            params={},
            body=body,
        )
        verdict = str(answer.get("access", ""))
        if verdict == "GRANTED":
            return Access.GRANTED
        if verdict == "NOT_GRANTED":
            return Access.NOT_GRANTED
        return Access.UNKNOWN

    def default_service_account(self, project: str) -> str | None:
        """The project's Compute Engine default service account, None where ``projects.get`` does not
        name one."""
        url = f"{self.endpoints.compute}/compute/v1/projects/{urllib.parse.quote(project, safe='')}"
        answer = self._calls.call("GET", url, f"read project {project}", params={})
        account = answer.get("defaultServiceAccount")
        return str(account) if account else None
