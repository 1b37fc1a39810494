"""Where a cloud client's credentials come from: Application Default Credentials for Google, none for a
local emulator. A backend picks one of these (``CloudConfig.credentials``); no client asks which.

google-auth is imported when credentials are first asked for, not when this module is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tpuctl.errors import CloudError, UnauthenticatedError

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

#: Where a client gets its credentials when it first needs them.
CredentialsSource = Callable[[], "Credentials"]

#: The scope every tpuctl call needs (the TPU, Compute Engine, Cloud Quotas and Billing Catalog APIs).
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


def default_credentials() -> Credentials:
    """Application Default Credentials with the cloud-platform scope; ``UnauthenticatedError`` with the
    fix when there are none."""
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError as exc:  # pragma: no cover - google-auth is a hard dependency
        raise CloudError("google-auth is not installed", fix="pip install 'google-auth>=2.30'") from exc
    try:
        credentials, _project = google.auth.default(scopes=list(SCOPES))
    except google.auth.exceptions.DefaultCredentialsError:
        raise UnauthenticatedError(
            "no Google Cloud credentials found (Application Default Credentials)",
            code=16,
            fix="gcloud auth application-default login",
        ) from None
    return credentials


def anonymous_credentials() -> Credentials:
    """Credentials that add nothing to a request: for an endpoint that checks none (the simulator)."""
    try:
        from google.auth.credentials import AnonymousCredentials
    except ImportError as exc:  # pragma: no cover - google-auth is a hard dependency
        raise CloudError("google-auth is not installed", fix="pip install 'google-auth>=2.30'") from exc
    return AnonymousCredentials()  # type: ignore[no-untyped-call]


def given(credentials: Credentials) -> CredentialsSource:
    """A source that answers with credentials already in hand (resolved once, shared by clients)."""
    return lambda: credentials
