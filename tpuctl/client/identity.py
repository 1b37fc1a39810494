"""The ID token the CLI sends a team server (``Authorization: Bearer``), got by google-auth's standard
means, in this order (docs/teams.md#identity):

1. ``GOOGLE_APPLICATION_CREDENTIALS`` naming a service account key (CI): google-auth's
   ``IDTokenCredentials`` with the server's audience; naming user credentials (``authorized_user``, as
   gcloud keeps them): refreshed, the ID token that comes with the access token (its audience: the OAuth
   client's, gcloud's; the server accepts it for workspace members);
2. on a VM, its metadata server's identity token for the VM's service account and the server's audience;
3. else gcloud's own: `gcloud auth print-identity-token` for the logged-in user.

A token is kept until a minute before it expires. An authorized_user file's ``token_uri`` is honoured
(google-auth's loader always sets Google's): the simulator's credentials files name its own endpoint.
"""

# google.oauth2 has no type hints on its constructors.
# mypy: disable-error-code="no-untyped-call"
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from tpuctl.errors import EXIT_PERMISSION, TpuctlError

if TYPE_CHECKING:
    from google.auth.transport import Request

#: A token this close to its expiry is fetched again.
REFRESH_BEFORE_S: Final = 60.0
_GCLOUD_TIMEOUT_S: Final = 30.0


class NoIdentityError(TpuctlError):
    """No credentials could give an ID token for the server."""

    exit_code = EXIT_PERMISSION
    kind = "unauthenticated"


@dataclass(frozen=True)
class IdToken:
    token: str
    expires_at: float
    #: Where it came from, for messages ("service account key /path", "metadata server", "gcloud").
    source: str


class IdentityTokens:
    """ID tokens for one audience (the server's URL), fetched on first use and again near expiry."""

    def __init__(self, audience: str, *, request: Request | None = None) -> None:
        self.audience = audience
        self._request = request
        self._lock = threading.Lock()
        self._token: IdToken | None = None

    def token(self) -> IdToken:
        with self._lock:
            held = self._token
            if held is None or held.expires_at - REFRESH_BEFORE_S <= time.time():
                held = self._token = self._fetch()
            return held

    def forget(self) -> None:
        """Drop the held token (the server refused it): the next ``token`` fetches a new one."""
        with self._lock:
            self._token = None

    def _fetch(self) -> IdToken:
        import google.auth.transport.requests
        from google.auth import exceptions

        request = self._request or google.auth.transport.requests.Request()
        path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        try:
            if path:
                return self._from_file(path, request)
            from_vm = self._from_metadata(request)
            if from_vm is not None:
                return from_vm
        except (exceptions.GoogleAuthError, ValueError, OSError) as exc:
            where = f"GOOGLE_APPLICATION_CREDENTIALS ({path})" if path else "the metadata server"
            raise NoIdentityError(
                f"cannot get an ID token for {self.audience} from {where}: {exc}",
                fix="check those credentials; docs/teams.md says which ones a team server takes",
            ) from None
        return self._from_gcloud()

    def _from_file(self, path: str, request: Request) -> IdToken:
        from google.oauth2 import credentials as user_credentials
        from google.oauth2 import service_account

        with open(path, encoding="utf-8") as f:
            info: dict[str, Any] = json.load(f)
        kind = info.get("type")
        if kind == "service_account":
            creds = service_account.IDTokenCredentials.from_service_account_info(
                info, target_audience=self.audience
            )
            creds.refresh(request)
            return _token(str(creds.token), f"service account key {path}")
        if kind == "authorized_user":
            user = user_credentials.Credentials.from_authorized_user_info(info)
            if info.get("token_uri"):
                user = user.with_token_uri(info["token_uri"])
            user.refresh(request)
            if not user.id_token:
                raise ValueError("the refresh gave no ID token (the credentials lack the openid scope)")
            return _token(str(user.id_token), f"user credentials {path}")
        raise ValueError(f"credentials of type {kind!r} give no ID token here")

    def _from_metadata(self, request: Request) -> IdToken | None:
        from google.auth import compute_engine
        from google.auth.compute_engine import _metadata

        if not _metadata.ping(request, timeout=1, retry_count=1):  # a laptop: answer soon
            return None
        creds = compute_engine.IDTokenCredentials(request, self.audience, use_metadata_identity_endpoint=True)
        creds.refresh(request)
        return _token(str(creds.token), "the VM's metadata server")

    def _from_gcloud(self) -> IdToken:
        gcloud = shutil.which("gcloud")
        if gcloud is None:
            raise NoIdentityError(
                f"no credentials for {self.audience}: GOOGLE_APPLICATION_CREDENTIALS is not set, this is not "
                "a Google VM, and gcloud is not installed",
                fix="log in with `gcloud auth login`, or set GOOGLE_APPLICATION_CREDENTIALS to a key file",
            )
        done = subprocess.run(
            [gcloud, "auth", "print-identity-token"],
            capture_output=True,
            text=True,
            timeout=_GCLOUD_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0 or not done.stdout.strip():
            raise NoIdentityError(
                f"`gcloud auth print-identity-token` failed: {done.stderr.strip()[:300]}",
                fix="log in with `gcloud auth login`",
            )
        return _token(done.stdout.strip(), "gcloud")


def _token(token: str, source: str) -> IdToken:
    """The token with its expiry, read from its own ``exp`` (not verified here: the server does that)."""
    from google.auth import jwt

    claims = jwt.decode(token, verify=False)
    return IdToken(token, float(claims.get("exp", time.time() + 300)), source)
