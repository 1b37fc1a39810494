"""Where a cloud client's credentials come from, and whose they are: Application Default Credentials for
Google, none for a local emulator. A backend picks one of these (``CloudConfig.credentials``); no client
asks which.

Two things beyond the token itself:

- the **quota project** of user credentials: Google bills some APIs' quota to the project a request names
  in ``x-goog-user-project``, and refuses user credentials that name none (Cloud Quotas among them);
  google-auth sends the header when the credentials carry ``quota_project_id``
  (docs/google-facts.md#quota-project);
- **who the caller is** (:func:`caller_email`): OS Login keys are imported into the caller's own profile,
  so tpuctl needs the account's email. A service account's credentials name it; a user's do not, and the
  OAuth tokeninfo endpoint answers it for the access token (docs/google-facts.md#os-login).

google-auth is imported when credentials are first asked for, not when this module is.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpuctl.errors import CloudError, UnauthenticatedError

if TYPE_CHECKING:
    import httpx
    from google.auth.credentials import Credentials

#: Where a client gets its credentials when it first needs them.
CredentialsSource = Callable[[], "Credentials"]

#: The scope every tpuctl call needs (the TPU, Compute Engine, Cloud Quotas, Billing Catalog and OS Login
#: APIs).
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)

#: Google's OAuth 2.0 tokeninfo endpoint: the account (``email``) an access token was issued to.
GOOGLE_TOKENINFO_URL = "https://oauth2.googleapis.com/tokeninfo"

_LOGIN_FIX = "gcloud auth application-default login"


def default_credentials(quota_project: str | None = None) -> Credentials:
    """Application Default Credentials with the cloud-platform scope, billing quota to ``quota_project``
    when given (else to whatever the ADC file or ``GOOGLE_CLOUD_QUOTA_PROJECT`` names);
    ``UnauthenticatedError`` with the fix when there are none."""
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError as exc:  # pragma: no cover - google-auth is a hard dependency
        raise CloudError("google-auth is not installed", fix="pip install 'google-auth>=2.30'") from exc
    try:
        credentials, _project = google.auth.default(scopes=list(SCOPES), quota_project_id=quota_project)
    except google.auth.exceptions.DefaultCredentialsError:
        raise UnauthenticatedError(
            "no Google Cloud credentials found (Application Default Credentials)", code=16, fix=_LOGIN_FIX
        ) from None
    return credentials


def anonymous_credentials() -> Credentials:
    """Credentials that add nothing to a request: for an endpoint that checks none (a test's stand-in)."""
    try:
        from google.auth.credentials import AnonymousCredentials
    except ImportError as exc:  # pragma: no cover - google-auth is a hard dependency
        raise CloudError("google-auth is not installed", fix="pip install 'google-auth>=2.30'") from exc
    return AnonymousCredentials()  # type: ignore[no-untyped-call]


def given(credentials: Credentials) -> CredentialsSource:
    """A source that answers with credentials already in hand (resolved once, shared by clients)."""
    return lambda: credentials


def fresh(credentials: Credentials) -> Credentials:
    """``credentials`` with a valid token (refreshed when it expired or was never fetched; a failure is
    google-auth's, for the caller's ``translate_errors`` to classify)."""
    creds: Any = credentials  # google-auth is untyped
    if not creds.valid:
        import google.auth.transport.requests

        creds.refresh(google.auth.transport.requests.Request())
    return credentials


def caller_email(credentials: Credentials, http: httpx.Client, tokeninfo_url: str) -> str:
    """The email of the account ``credentials`` act as: a service account's own (its key, the VM's
    metadata server or impersonation), else what ``tokeninfo_url`` says the access token was issued to
    (a user's; the token carries the email when the login asked for the email scope, as gcloud's does).
    Anonymous credentials send no token: an endpoint that checks none names its caller itself."""
    from tpuctl.cloud.translate import translate_errors

    with translate_errors("refresh the credentials to learn their account"):
        creds: Any = fresh(credentials)
    email = getattr(creds, "service_account_email", None)
    if isinstance(email, str) and "@" in email:
        return email
    token = getattr(creds, "token", None)
    params = {"access_token": token} if token else {}
    with translate_errors(f"ask {tokeninfo_url} which account the credentials are"):
        response = http.get(tokeninfo_url, params=params)
    try:
        answer = json.loads(response.content) if response.content else {}
    except ValueError:
        answer = {}
    found = answer.get("email") if isinstance(answer, dict) else None
    if response.is_error or not isinstance(found, str) or "@" not in found:
        raise UnauthenticatedError(
            f"cannot tell which Google account the credentials belong to ({tokeninfo_url} answered "
            f"HTTP {response.status_code} without an email)",
            code=16,
            fix=f"{_LOGIN_FIX} (its default scopes include the email one), or use a service account's "
            "credentials (GOOGLE_APPLICATION_CREDENTIALS)",
        )
    return found
