"""Cloud OS Login API v1 client (httpx): register tpuctl's SSH key, learn the user's POSIX account.

Where a project (metadata ``enable-oslogin=TRUE``) or a node enables OS Login, the guest ignores the
``ssh-keys`` metadata and authorizes the keys imported for the caller's Google identity, who logs in as
that identity's POSIX username. Shapes from Google's REST reference,
https://cloud.google.com/compute/docs/oslogin/rest/v1/users (and the google-api-python-client
``oslogin_v1.users`` pages; methods .../v1/users/importSshPublicKey and .../v1/users/getLoginProfile):

- ``POST {base}/v1/users/{user}:importSshPublicKey?projectId=P`` with body ``SshPublicKey``
  (``{"key": "<openssh public key>"}``, optional ``expirationTimeUsec``) ->
  ``ImportSshPublicKeyResponse`` ``{"loginProfile": LoginProfile, "details": "..."}``;
- ``GET {base}/v1/users/{user}/loginProfile[?projectId=P]`` -> ``LoginProfile``
  ``{"name", "posixAccounts": [PosixAccount], "sshPublicKeys": {fingerprint: SshPublicKey}}``;
- ``PosixAccount``: ``primary``, ``username``, ``uid`` and ``gid`` (int64, so JSON strings),
  ``homeDirectory``, ``shell``, ``gecos``, ``systemId``, ``accountId``, ``operatingSystemType``, ``name``.

``{user}`` is the account's email (``users/{user}`` in the reference; the ``@`` is sent as is, as
Google's clients do). Errors become ``tpuctl.errors`` through :mod:`tpuctl.cloud.translate`, as every
cloud client here does. The caller owns the ``httpx.Client`` (one per CLI process).
"""

from __future__ import annotations

import functools
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.retry import RetryPolicy, Sleep, call_with_retry
from tpuctl.cloud.translate import error_from_http_response, translate_errors
from tpuctl.errors import CloudError

if TYPE_CHECKING:
    import httpx
    from google.auth.credentials import Credentials

GOOGLE_OSLOGIN_URL = "https://oslogin.googleapis.com"


@dataclass(frozen=True)
class PosixAccount:
    """The account an OS Login user logs in as on a VM."""

    username: str
    uid: int
    home: str


@dataclass(frozen=True)
class LoginProfile:
    """A user's OS Login profile: the POSIX accounts (primary first) and the imported keys' fingerprints."""

    name: str
    accounts: tuple[PosixAccount, ...]
    key_fingerprints: tuple[str, ...]

    @property
    def primary(self) -> PosixAccount:
        """The account to log in as (the ``primary`` one; the reference marks exactly one)."""
        if not self.accounts:
            raise CloudError(
                f"OS Login profile {self.name or '?'} has no POSIX account",
                fix="ask an administrator to grant roles/compute.osLogin on the project",
            )
        return self.accounts[0]


class OsLoginClient:
    """``import_ssh_public_key`` and ``login_profile`` of the OS Login API v1."""

    def __init__(
        self,
        base_url: str,
        credentials: Credentials | None,
        http: httpx.Client,
        *,
        retry: RetryPolicy | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        """``base_url``: Google's (:data:`GOOGLE_OSLOGIN_URL`) or the simulator's; ``credentials``:
        google-auth credentials (a bearer token on every request), None for the simulator."""
        self.base_url = base_url.rstrip("/")
        self._credentials = credentials
        self._http = http
        self._retry = retry or RetryPolicy()
        self._sleep = sleep

    def __repr__(self) -> str:  # never show the credentials
        return f"OsLoginClient(base_url={self.base_url!r})"

    def import_ssh_public_key(self, user_email: str, public_key: str, project: str) -> PosixAccount:
        """Add ``public_key`` ("ssh-ed25519 AAAA... comment") to the user's profile for ``project`` and
        return the POSIX account to log in as. Importing a key already there changes nothing, so a retry
        after a lost answer is safe."""
        url = f"{self.base_url}/v1/{_user(user_email)}:importSshPublicKey"
        what = f"import an SSH key into the OS Login profile of {user_email} (project {project})"
        call = functools.partial(
            self._request, "POST", url, what, params={"projectId": project}, body={"key": public_key.strip()}
        )
        answer = call_with_retry(call, policy=self._retry, idempotent=True, sleep=self._sleep)
        profile = answer.get("loginProfile")
        if not isinstance(profile, Mapping):
            raise CloudError(f"{what}: the response has no loginProfile")
        return parse_login_profile(profile).primary

    def login_profile(self, user_email: str, project: str | None = None) -> LoginProfile:
        """The user's login profile (accounts and imported keys)."""
        url = f"{self.base_url}/v1/{_user(user_email)}/loginProfile"
        what = f"read the OS Login profile of {user_email}"
        params = {"projectId": project} if project else {}
        call = functools.partial(self._request, "GET", url, what, params=params)
        return parse_login_profile(
            call_with_retry(call, policy=self._retry, idempotent=True, sleep=self._sleep)
        )

    # ----------------------------------------------------------------------------------------------

    def _auth_headers(self) -> dict[str, str]:
        creds: Any = self._credentials  # google-auth is untyped
        if creds is None:
            return {}
        if not creds.valid:  # expired or never fetched
            import google.auth.transport.requests

            creds.refresh(google.auth.transport.requests.Request())
        headers: dict[str, str] = {}
        creds.apply(headers)
        return headers

    def _request(
        self,
        method: str,
        url: str,
        what: str,
        *,
        params: Mapping[str, str],
        body: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        with translate_errors(what, mutating=method != "GET"):
            response = self._http.request(
                method, url, params=dict(params), json=body, headers=self._auth_headers()
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
                    fix="check that the endpoint is the OS Login API",
                ) from None
            if not isinstance(data, dict):
                raise CloudError(f"{what}: expected a JSON object, got {type(data).__name__}")
            return data


def _user(email: str) -> str:
    if not email or "/" in email:
        raise CloudError(f"not a user email for OS Login: {email!r}")
    # '@' stays readable (RFC 3986 allows it in a path segment); anything else odd is escaped.
    return "users/" + urllib.parse.quote(email, safe="@")


def parse_login_profile(profile: Mapping[str, Any]) -> LoginProfile:
    """A LoginProfile JSON object -> :class:`LoginProfile` (the primary account first)."""
    name = str(profile.get("name", ""))
    accounts: list[tuple[bool, PosixAccount]] = []
    for raw in profile.get("posixAccounts") or []:
        if not isinstance(raw, Mapping):
            continue
        username = str(raw.get("username", ""))
        try:
            uid = int(str(raw.get("uid", "")))
        except ValueError:
            raise CloudError(f"OS Login profile {name}: account {username!r} has no numeric uid") from None
        home = str(raw.get("homeDirectory") or f"/home/{username}")
        accounts.append((bool(raw.get("primary")), PosixAccount(username, uid, home)))
    accounts.sort(key=lambda pair: not pair[0])  # stable: the primary first, the rest in order
    keys = profile.get("sshPublicKeys") or {}
    fingerprints = tuple(sorted(keys)) if isinstance(keys, Mapping) else ()
    return LoginProfile(name, tuple(a for _, a in accounts), fingerprints)
