"""Google's identity issuer as a verifier of ID tokens sees it: who signs them, where the keys are, and
the audiences gcloud and IAP put in them (docs/google-facts.md#identity-tokens).

A backend says where its issuer publishes its keys (``Backend.identity_issuer``): Google's URLs, or the
simulator's own issuer serving the same documents at the same paths. Nothing else differs: a token is
verified by the same google-auth call against either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: The ``iss`` of Google's ID tokens (google-auth accepts it with and without the scheme).
GOOGLE_ISSUERS: Final = ("https://accounts.google.com", "accounts.google.com")
#: The ``iss`` of the JWT that Identity-Aware Proxy signs into ``x-goog-iap-jwt-assertion``.
IAP_ISSUER: Final = "https://cloud.google.com/iap"
#: The header IAP forwards its signed JWT in.
IAP_HEADER: Final = "x-goog-iap-jwt-assertion"
#: gcloud's own OAuth client (``CLOUDSDK_CLIENT_ID`` in the Cloud SDK's core/config.py): the audience of
#: the ID token that `gcloud auth print-identity-token` prints for a user account, and what its stored
#: user credentials refresh with.
GCLOUD_CLIENT_ID: Final = "32555940559.apps.googleusercontent.com"
#: Its installed-app "secret", published in the same file (an installed app cannot keep one).
GCLOUD_CLIENT_SECRET: Final = "ZmssLNjJy2998hD4CTg2ejr2"

#: Where Google's issuer and IAP publish their keys, and Google's token endpoint (paths kept by the
#: simulator: ``CERTS_PATH`` etc. below, under its own URL).
GOOGLE_CERTS_URL: Final = "https://www.googleapis.com/oauth2/v1/certs"
GOOGLE_IAP_KEYS_URL: Final = "https://www.gstatic.com/iap/verify/public_key"
GOOGLE_TOKEN_URL: Final = "https://oauth2.googleapis.com/token"
CERTS_PATH: Final = "/oauth2/v1/certs"
JWKS_PATH: Final = "/oauth2/v3/certs"
IAP_KEYS_PATH: Final = "/iap/verify/public_key"
TOKEN_PATH: Final = "/token"


@dataclass(frozen=True)
class IdentityIssuer:
    """Where ID tokens' signing keys are published: ``certs_url`` (Google's issuer: key id -> x509
    certificate, PEM) and ``iap_keys_url`` (IAP's: key id -> public key, PEM)."""

    certs_url: str = GOOGLE_CERTS_URL
    iap_keys_url: str = GOOGLE_IAP_KEYS_URL

    @classmethod
    def google(cls) -> IdentityIssuer:
        return cls()

    @classmethod
    def at(cls, base_url: str) -> IdentityIssuer:
        """An issuer serving Google's documents under ``base_url`` (the simulator's)."""
        base = base_url.rstrip("/")
        return cls(certs_url=base + CERTS_PATH, iap_keys_url=base + IAP_KEYS_PATH)
