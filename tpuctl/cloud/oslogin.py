"""OS Login from tpuctl's side: whether a project turns it on, who the caller is, and the caller's SSH key
imported (with an expiry) into the caller's OS Login profile.

Where OS Login is on for a VM, its guest ignores the ``ssh-keys`` metadata and lets in the keys imported
for a Google account, who logs in as that account's POSIX username (docs/google-facts.md#os-login). Whether
it is on: the VM's own ``enable-oslogin`` metadata (a TPU API node's metadata, a Compute Engine instance's)
decides where it is set, else the project's common instance metadata (``enable-oslogin`` in Compute Engine
``projects.get``), else it is off; :func:`metadata_says` reads one level, as gcloud does (a value of
``true`` in any case is on, any other value is off).

Shapes from Google's REST reference, https://cloud.google.com/compute/docs/oslogin/rest/v1/users (and the
google-api-python-client ``oslogin_v1.users`` pages):

- ``POST {base}/v1/users/{user}:importSshPublicKey?projectId=P`` with body ``SshPublicKey``
  (``{"key": "<openssh public key>", "expirationTimeUsec": "<int64>"}``) ->
  ``ImportSshPublicKeyResponse`` ``{"loginProfile": LoginProfile, "details": "..."}``;
- ``PATCH {base}/v1/users/{user}/sshPublicKeys/{fingerprint}?updateMask=expirationTimeUsec`` with body
  ``SshPublicKey`` -> ``SshPublicKey`` (gcloud's ``os-login ssh-keys update --ttl``);
- ``GET {base}/v1/users/{user}/loginProfile[?projectId=P]`` -> ``LoginProfile``
  ``{"name", "posixAccounts": [PosixAccount], "sshPublicKeys": {fingerprint: SshPublicKey}}``;
- ``PosixAccount``: ``primary``, ``username``, ``uid`` and ``gid`` (int64, so JSON strings),
  ``homeDirectory``, ``shell``, ``gecos``, ``systemId``, ``accountId``, ``operatingSystemType``, ``name``;
- ``SshPublicKey``: ``key``, ``expirationTimeUsec`` (int64 string, microseconds since the epoch; absent:
  never expires), ``fingerprint``, ``name``.

``{user}`` is the account's email (``users/{user}`` in the reference; the ``@`` is sent as is, as
Google's clients do). Errors become ``tpuctl.errors`` through :mod:`tpuctl.cloud.translate`, as every
cloud client here does; a refusal names OS Login and the roles it needs. The caller owns the
``httpx.Client`` (one per CLI process).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.credentials import caller_email
from tpuctl.cloud.google_calls import JsonCalls
from tpuctl.cloud.retry import RetryPolicy, Sleep
from tpuctl.errors import CloudError, PermissionDeniedError

if TYPE_CHECKING:
    import httpx
    from google.auth.credentials import Credentials

GOOGLE_OSLOGIN_URL = "https://oslogin.googleapis.com"

#: The metadata key that turns OS Login on or off (instance or project metadata).
ENABLE_OSLOGIN = "enable-oslogin"

#: An imported key whose expiry is this close to the one asked for is left as it is.
_EXPIRY_SLACK_S = 60.0


def roles_fix(email: str, project: str) -> str:
    """What to grant ``email`` so that OS Login lets it in on ``project``'s VMs."""
    member = ("serviceAccount:" if email.endswith(".gserviceaccount.com") else "user:") + email
    return (
        f"grant {email} roles/compute.osAdminLogin (login with sudo, which a --setup using sudo needs) or "
        f"roles/compute.osLogin (login without sudo) on project {project}: `gcloud projects "
        f"add-iam-policy-binding {project} --member={member} --role=roles/compute.osAdminLogin`"
    )


def metadata_says(metadata: Mapping[str, str]) -> bool | None:
    """One metadata level's say on OS Login: True or False where it sets ``enable-oslogin``, None where
    it leaves it to the level above (gcloud's reading: ``true`` in any case is on, anything else off)."""
    value = metadata.get(ENABLE_OSLOGIN)
    return None if value is None else value.strip().lower() == "true"


@dataclass(frozen=True)
class PosixAccount:
    """The account an OS Login user logs in as on a VM."""

    username: str
    uid: int
    home: str


@dataclass(frozen=True)
class ImportedKey:
    """One SSH public key in an OS Login profile."""

    fingerprint: str
    key: str  # "keytype base64"
    expires_at: float | None  # epoch seconds; None: never

    def is_key(self, public_openssh: str) -> bool:
        return self.key.split()[:2] == public_openssh.split()[:2]


@dataclass(frozen=True)
class LoginProfile:
    """A user's OS Login profile: the POSIX accounts (primary first) and the imported keys."""

    name: str
    accounts: tuple[PosixAccount, ...]
    keys: tuple[ImportedKey, ...]

    @property
    def primary(self) -> PosixAccount:
        """The account to log in as (the ``primary`` one; the reference marks exactly one)."""
        if not self.accounts:
            raise CloudError(
                f"OS Login profile {self.name or '?'} has no POSIX account",
                fix="ask an administrator to grant roles/compute.osLogin on the project",
            )
        return self.accounts[0]

    def key_of(self, public_openssh: str) -> ImportedKey | None:
        """The profile's entry for ``public_openssh``, if it holds that key."""
        return next((k for k in self.keys if k.is_key(public_openssh)), None)


class OsLoginClient:
    """``import_ssh_public_key``, ``update_key_expiry`` and ``login_profile`` of the OS Login API v1."""

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
        self._caller = JsonCalls(credentials, http, retry or RetryPolicy(), sleep)

    def __repr__(self) -> str:  # never show the credentials
        return f"OsLoginClient(base_url={self.base_url!r})"

    def import_ssh_public_key(
        self, user_email: str, public_key: str, project: str, *, expires_at: float | None = None
    ) -> LoginProfile:
        """Add ``public_key`` ("ssh-ed25519 AAAA... comment") to the user's profile for ``project``, to
        expire at ``expires_at`` (epoch seconds; None: never), and return the profile. Importing a key
        already there adds nothing, so a retry after a lost answer is safe (whether it also moves the
        expiry is not documented: :meth:`update_key_expiry` does)."""
        url = f"{self.base_url}/v1/{_user(user_email)}:importSshPublicKey"
        what = f"import an SSH key into the OS Login profile of {user_email} (project {project})"
        body: dict[str, Any] = {"key": public_key.strip()}
        if expires_at is not None:
            body["expirationTimeUsec"] = _usec(expires_at)
        answer = self._caller.call("POST", url, what, params={"projectId": project}, body=body)
        profile = answer.get("loginProfile")
        if not isinstance(profile, Mapping):
            raise CloudError(f"{what}: the response has no loginProfile")
        return parse_login_profile(profile)

    def update_key_expiry(self, user_email: str, key: ImportedKey, expires_at: float) -> None:
        """Move the expiry of ``key`` (in the user's profile) to ``expires_at``."""
        url = f"{self.base_url}/v1/{_user(user_email)}/sshPublicKeys/{urllib.parse.quote(key.fingerprint)}"
        what = f"extend the OS Login key {key.fingerprint[:12]}... of {user_email}"
        body = {"key": key.key, "expirationTimeUsec": _usec(expires_at)}
        self._caller.call("PATCH", url, what, params={"updateMask": "expirationTimeUsec"}, body=body)

    def login_profile(self, user_email: str, project: str | None = None) -> LoginProfile:
        """The user's login profile (accounts and imported keys)."""
        url = f"{self.base_url}/v1/{_user(user_email)}/loginProfile"
        what = f"read the OS Login profile of {user_email}"
        params = {"projectId": project} if project else {}
        return parse_login_profile(self._caller.call("GET", url, what, params=params))


@dataclass(frozen=True)
class OsLoginEndpoints:
    """Where tpuctl asks OS Login's questions: the OS Login API, the tokeninfo endpoint (who the caller
    is) and Compute Engine (the project's metadata). The simulator serves all three at one URL."""

    oslogin: str
    tokeninfo: str
    compute: str

    @classmethod
    def at(cls, base_url: str) -> OsLoginEndpoints:
        """All three at one server (the simulator's)."""
        base = base_url.rstrip("/")
        return cls(oslogin=base, tokeninfo=f"{base}/tokeninfo", compute=base)


class OsLoginAccess:
    """OS Login as a run needs it: the project's setting, the caller, and the caller's key imported."""

    def __init__(
        self,
        endpoints: OsLoginEndpoints,
        credentials: Credentials,
        http: httpx.Client,
        *,
        retry: RetryPolicy | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        self.endpoints = endpoints
        self._credentials = credentials
        self._http = http
        self._calls = JsonCalls(credentials, http, retry or RetryPolicy(), sleep)
        self.client = OsLoginClient(endpoints.oslogin, credentials, http, retry=retry, sleep=sleep)
        self._email: str | None = None

    def __repr__(self) -> str:  # never show the credentials
        return f"OsLoginAccess({self.endpoints!r})"

    def project_says(self, project: str) -> bool | None:
        """The project's say on OS Login (its common instance metadata, Compute Engine ``projects.get``):
        True or False where it sets ``enable-oslogin``, None where it does not. ``PermissionDeniedError``
        when the caller may not read the project (``compute.projects.get``)."""
        return metadata_says(self.project_metadata(project))

    def project_metadata(self, project: str) -> dict[str, str]:
        """The project's common instance metadata (Compute Engine ``projects.get``), key -> value.
        ``PermissionDeniedError`` when the caller may not read the project (``compute.projects.get``)."""
        url = f"{self.endpoints.compute}/compute/v1/projects/{urllib.parse.quote(project)}"
        answer = self._calls.call("GET", url, f"read the metadata of project {project}", params={})
        common = answer.get("commonInstanceMetadata") or {}
        items = (common.get("items") or []) if isinstance(common, Mapping) else []
        return {
            str(i.get("key")): str(i.get("value", "")) for i in items if isinstance(i, Mapping) and "key" in i
        }

    def caller(self) -> str:
        """The email of the account tpuctl acts as (asked once)."""
        if self._email is None:
            self._email = caller_email(self._credentials, self._http, self.endpoints.tokeninfo)
        return self._email

    def authorize_key(self, project: str, public_openssh: str, *, expires_at: float) -> PosixAccount:
        """Import ``public_openssh`` into the caller's profile for ``project`` to expire at ``expires_at``
        (moving the expiry of a key imported before) and return the account to log in as. A refusal names
        OS Login and the roles it needs."""
        email = self.caller()
        try:
            profile = self.client.import_ssh_public_key(email, public_openssh, project, expires_at=expires_at)
            imported = profile.key_of(public_openssh)
            if imported is None:
                raise CloudError(
                    f"OS Login did not record tpuctl's SSH key in the profile of {email}",
                    fix="try again; if it persists, check the profile with `gcloud compute os-login "
                    "describe-profile`",
                )
            if imported.expires_at is not None and imported.expires_at < expires_at - _EXPIRY_SLACK_S:
                self.client.update_key_expiry(email, imported, expires_at)
            return profile.primary
        except PermissionDeniedError as exc:
            raise PermissionDeniedError(
                f"OS Login is on for project {project}, and it refused to take tpuctl's SSH key for "
                f"{email}: {exc.message}",
                code=exc.code,
                fix=roles_fix(email, project),
            ) from None


def _user(email: str) -> str:
    if not email or "/" in email:
        raise CloudError(f"not a user email for OS Login: {email!r}")
    # '@' stays readable (RFC 3986 allows it in a path segment); anything else odd is escaped.
    return "users/" + urllib.parse.quote(email, safe="@")


def _usec(epoch_s: float) -> str:
    return str(int(epoch_s * 1_000_000))


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
    raw_keys = profile.get("sshPublicKeys") or {}
    keys = tuple(_imported_key(fp, raw_keys[fp]) for fp in sorted(raw_keys) if isinstance(raw_keys, Mapping))
    return LoginProfile(name, tuple(a for _, a in accounts), keys)


def _imported_key(fingerprint: str, raw: Any) -> ImportedKey:
    entry: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    usec = entry.get("expirationTimeUsec")
    try:
        expires_at = None if usec in (None, "", "0") else int(str(usec)) / 1_000_000
    except ValueError:
        expires_at = None
    return ImportedKey(str(entry.get("fingerprint") or fingerprint), str(entry.get("key", "")), expires_at)
