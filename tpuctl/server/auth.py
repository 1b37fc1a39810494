"""Who asks the server: every request but the health checks carries a Google-signed ID token, verified by
google-auth (``id_token.verify_token``) against the issuer's published keys, the same call on Google and
the simulator (only the keys' URL comes from the backend: ``Backend.identity_issuer``).

Accepted tokens (docs/teams.md#identity):
- ``Authorization: Bearer <ID token>`` from Google's issuer, with ``email_verified``, whose audience is
  the server's own (``--audience``; a service account or a VM mints one for it) or gcloud's client id
  (what `gcloud auth print-identity-token` gives a user, who cannot ask for another audience);
- with ``--iap-audience``, IAP's signed header (``x-goog-iap-jwt-assertion``, ES256, IAP's keys) for
  that backend service, which wins over a bearer token (IAP strips the caller's own).

The principal is the token's email; the actor is the principal with its roles from the workspace file.
``GET /metrics`` also takes the workspace file's scrape token (a plain bearer token whose SHA-256 the file
holds), for a Prometheus scraper that has no Google identity; it reads metrics only.

No token, or one that fails verification: 401 with ``WWW-Authenticate: Bearer``. A verified principal
that belongs to no workspace: 403 on every request (it may see nothing, and saying so beats an empty
answer that looks like a server without runs).

Without a workspace file (one user, on loopback) nothing is verified and the actor is the server's own
session's (``local_actor``: the machine's user, seeing everything), as before teams.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from tpuctl.cloud.identity import (
    GCLOUD_CLIENT_ID,
    GOOGLE_ISSUERS,
    IAP_HEADER,
    IAP_ISSUER,
    IdentityIssuer,
)
from tpuctl.errors import EXIT_PERMISSION, UsageError
from tpuctl.teams.actor import Actor, ForbiddenError

if TYPE_CHECKING:
    from google.auth.transport import Request, Response

    from tpuctl.teams.workspaces import Workspaces

#: How long fetched keys are used before they are fetched again (a key id not among them refetches at
#: once: the issuer rotated).
CERTS_MAX_AGE_S: Final = 300.0
#: The one path the workspace file's scrape token opens.
METRICS_PATH: Final = "/metrics"
#: Who a request with the scrape token is (it sees the metrics of every workspace).
SCRAPER: Final = "(metrics scraper)"
#: Clock skew allowed between the issuer and this machine when checking ``iat`` and ``exp``.
CLOCK_SKEW_S: Final = 10


class NotAuthenticated(UsageError):
    """No identity, or one the server cannot verify: HTTP 401 (exit 13 in the CLI)."""

    exit_code = EXIT_PERMISSION
    kind = "unauthenticated"
    status: Final = 401


@dataclass(frozen=True)
class AuthConfig:
    """How a server with a workspace file authenticates."""

    workspaces: Workspaces
    #: The server's own audience (``--audience``; default: its URL).
    audience: str
    issuer: IdentityIssuer = field(default_factory=IdentityIssuer.google)
    #: The IAP backend service this server sits behind (``/projects/NUMBER/global/backendServices/ID``).
    iap_audience: str | None = None


class Authenticator:
    """Verifies a request's token and builds its actor (thread-safe: handlers run on a thread pool)."""

    def __init__(self, config: AuthConfig, *, request: Request | None = None) -> None:
        import google.auth.transport.requests

        self.config = config
        self._keys = _KeyCache(request or google.auth.transport.requests.Request())

    def actor_of(self, headers: Mapping[str, str]) -> Actor:
        """The actor of a request with ``headers`` (lower-case names); ``NotAuthenticated`` (401) or
        ``ForbiddenError`` (403: a principal in no workspace)."""
        return self.actor_for(self.principal_of(headers))

    def actor_for(self, email: str) -> Actor:
        """A verified principal's actor: its roles in the workspace file; 403 when it has none."""
        roles = self.config.workspaces.roles_of(email)
        if not roles:
            raise ForbiddenError(
                f"{email} is not a member of any workspace of this server",
                field="principal",
                value=email,
                fix="ask a workspace admin to add you to the server's workspace file",
            )
        return Actor(principal=email, roles=dict(roles))

    def scraper(self, path: str, headers: Mapping[str, str]) -> Actor | None:
        """The scraper's actor when ``path`` is ``/metrics`` and the bearer token is the workspace file's
        scrape token; None otherwise (the request is authenticated as any other)."""
        import hashlib
        import hmac

        expected = self.config.workspaces.metrics.scrape_token_sha256
        token = _bearer(headers)
        if path != METRICS_PATH or expected is None or token is None:
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        return Actor(principal=SCRAPER, sees_all=True) if hmac.compare_digest(digest, expected) else None

    def principal_of(self, headers: Mapping[str, str]) -> str:
        """The verified email of the caller."""
        config = self.config
        iap = headers.get(IAP_HEADER)
        if config.iap_audience is not None and iap:
            claims = self._verify(iap, [config.iap_audience], config.issuer.iap_keys_url, (IAP_ISSUER,))
            return _email(claims, verified_flag=False)
        token = _bearer(headers)
        if token is None:
            raise NotAuthenticated(
                "this server needs a Google ID token (Authorization: Bearer)", fix=LOGIN_FIX
            )
        claims = self._verify(
            token, [config.audience, GCLOUD_CLIENT_ID], config.issuer.certs_url, GOOGLE_ISSUERS
        )
        return _email(claims, verified_flag=True)

    def _verify(
        self, token: str, audiences: list[str], certs_url: str, issuers: tuple[str, ...]
    ) -> dict[str, Any]:
        try:
            try:
                claims = self._verify_once(token, audiences, certs_url)
            except ValueError as exc:
                if "Certificate for key id" not in str(exc):
                    raise
                self._keys.forget(certs_url)  # the issuer rotated its keys since we fetched them
                claims = self._verify_once(token, audiences, certs_url)
        except ValueError as exc:  # a bad signature, audience, time or shape: google-auth's words
            raise NotAuthenticated(f"the ID token was refused: {exc}", fix=LOGIN_FIX) from None
        except Exception as exc:  # the keys could not be fetched: the server cannot tell
            raise NotAuthenticated(
                f"cannot verify the ID token: the issuer's keys at {certs_url} could not be read ({exc})",
                fix="retry; if it persists, the server cannot reach its identity issuer",
            ) from None
        if claims.get("iss") not in issuers:
            raise NotAuthenticated(
                f"the ID token's issuer {claims.get('iss')!r} is not accepted", fix=LOGIN_FIX
            )
        return claims

    def _verify_once(self, token: str, audiences: list[str], certs_url: str) -> dict[str, Any]:
        from google.oauth2 import id_token

        request = self._keys.request(certs_url)
        claims = id_token.verify_token(
            token, request, audience=audiences, certs_url=certs_url, clock_skew_in_seconds=CLOCK_SKEW_S
        )
        return dict(claims)


#: What a 401 tells the user to do (the CLI adds which credentials it tried).
LOGIN_FIX: Final = (
    "log in with `gcloud auth login` (a user), set GOOGLE_APPLICATION_CREDENTIALS to a service account "
    "key (CI), or run on a VM whose service account is a workspace member; see docs/teams.md"
)


def _bearer(headers: Mapping[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _email(claims: Mapping[str, Any], *, verified_flag: bool) -> str:
    email = claims.get("email")
    if not isinstance(email, str) or "@" not in email:
        raise NotAuthenticated(
            "the ID token carries no email (a metadata server's token needs format=full)", fix=LOGIN_FIX
        )
    if verified_flag and claims.get("email_verified") is not True:
        raise NotAuthenticated(f"the ID token's email {email} is not verified", fix=LOGIN_FIX)
    return email.lower()


class _KeyCache:
    """The issuer's key documents, fetched at most every ``CERTS_MAX_AGE_S``: ``verify_token`` reads
    them through the request this gives, which answers a fresh copy from memory."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[float, Response]] = {}

    def request(self, url: str) -> Request:
        def fetch(url: str, method: str = "GET", **kwargs: Any) -> Response:
            with self._lock:
                hit = self._cached.get(url)
            if method == "GET" and hit is not None and time.monotonic() - hit[0] < CERTS_MAX_AGE_S:
                return hit[1]
            response: Response = self._request(url, method=method, **kwargs)
            if method == "GET" and response.status == 200:
                with self._lock:
                    self._cached[url] = (time.monotonic(), response)
            return response

        return fetch  # type: ignore[return-value]

    def forget(self, url: str) -> None:
        with self._lock:
            self._cached.pop(url, None)
