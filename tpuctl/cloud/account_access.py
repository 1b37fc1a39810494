"""Whether another account (the hosts' service account) may do something, asked of Google without acting
as it (docs/google-facts.md#bucket-access).

- Policy Troubleshooter (``POST {troubleshooter}/v1/iam:troubleshoot`` with ``{"accessTuple":
  {"principal", "fullResourceName", "permission"}}``) answers ``access``: ``GRANTED``, ``NOT_GRANTED``, or
  ``UNKNOWN_CONDITIONAL`` / ``UNKNOWN_INFO_DENIED`` when it cannot tell (a condition, policies the caller
  may not read). It sees every policy that applies, the folder's and organization's and groups' included,
  which reading the project's and the bucket's policies would miss. (The caller's own permissions are
  Cloud Storage's testIamPermissions: ``tpuctl.cloud.buckets``.)
- Which account a project's VMs run as by default: its Compute Engine default service account, as
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

GOOGLE_TROUBLESHOOTER_URL = "https://policytroubleshooter.googleapis.com"


class Access(StrEnum):
    """Policy Troubleshooter's verdict, with both of its can't-tell states as one."""

    GRANTED = "granted"
    NOT_GRANTED = "not granted"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class AccountEndpoints:
    """Where the two questions go: Policy Troubleshooter and Compute Engine."""

    troubleshooter: str
    compute: str

    @classmethod
    def at(cls, base_url: str) -> AccountEndpoints:
        """Both at one URL (the simulator serves them together)."""
        base = base_url.rstrip("/")
        return cls(base, base)


class AccountAccess:
    """The questions above, each one call with the caller's credentials."""

    def __init__(
        self,
        endpoints: AccountEndpoints,
        credentials: Credentials | None,
        http: httpx.Client,
        *,
        retry: RetryPolicy | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        self.endpoints = endpoints
        self._calls = JsonCalls(credentials, http, retry or RetryPolicy(), sleep)

    def __repr__(self) -> str:  # never show the credentials
        return f"AccountAccess(endpoints={self.endpoints!r})"

    def bucket_access(self, account: str, bucket: str, permission: str) -> Access:
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
