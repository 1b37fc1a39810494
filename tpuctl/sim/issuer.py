"""The simulator's identity issuer: Google's ID tokens for simulated users and service accounts, signed
with keys of its own and published as Google publishes its keys (docs/google-facts.md#identity-tokens).

- ``/oauth2/v1/certs``: key id -> x509 certificate (PEM), what google-auth's ``verify_token`` reads by
  default; ``/oauth2/v3/certs``: the same keys as a JWK set; ``/iap/verify/public_key``: IAP's ES256
  public keys (key id -> PEM).
- ``/token``: the OAuth token endpoint as google-auth's own flows call it (form-encoded):
  ``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`` with a JWT assertion signed by a service
  account's key (``target_audience`` in its claims: an ID token; ``scope``: an access token), and
  ``grant_type=refresh_token`` for a user's gcloud-style credentials (an access token and an ID token
  whose audience is the OAuth client, gcloud's). Refused grants answer OAuth's JSON error
  (``invalid_grant``, ``invalid_client``, ``unsupported_grant_type``) as Google's endpoint does.
- A VM's metadata server mints one for its service account (``identity_for``; ``tpuctl.sim.metadata``).

State lives in the simulator's state dir (``issuer/`` beside ``sim.db``): the signing keys (``rotate``
adds one and signs with it; the previous one stays published, as Google publishes two), IAP's key, and
each simulated account's credentials (a service account's public key ids, a user's refresh tokens, only
their SHA-256). ``credentials_file`` makes an account and its credentials file: how tests and users act as
a simulated principal (`tpuctl sim credentials EMAIL --out FILE`).

Times are the wall clock's, not the simulator's: google-auth checks ``iat``/``exp`` against the real
time wherever a token is verified.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from google.auth import crypt, jwt

from tpuctl.cloud.identity import (
    CERTS_PATH,
    GCLOUD_CLIENT_ID,
    GCLOUD_CLIENT_SECRET,
    GOOGLE_ISSUERS,
    GOOGLE_TOKEN_URL,
    IAP_ISSUER,
    TOKEN_PATH,
)
from tpuctl.sim.exchange import SimRequest, SimResponse, json_response
from tpuctl.store.paths import ensure_private_dir

if TYPE_CHECKING:
    from tpuctl.sim.engine import SimEngine

#: How long an ID token and an access token live (Google's: one hour).
TOKEN_LIFETIME_S: Final = 3600
#: The longest-lived assertion the token endpoint takes (Google's rule: at most an hour).
MAX_ASSERTION_S: Final = 3600
JWT_BEARER: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"
#: What the simulated user credentials were granted (gcloud's login scopes, less those it no longer needs).
USER_SCOPES: Final = (
    "openid https://www.googleapis.com/auth/userinfo.email https://www.googleapis.com/auth/cloud-platform"
)
#: How many signing keys stay published: the one signing now and the one before it.
_PUBLISHED_KEYS: Final = 2
_SERVICE_ACCOUNT_SUFFIX: Final = ".gserviceaccount.com"


class GrantError(Exception):
    """A refused token request: OAuth's error document and HTTP status, as Google's endpoint answers."""

    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(f"{error}: {description}")
        self.status = status
        self.document = {"error": error, "error_description": description}


@dataclass(frozen=True)
class _Account:
    email: str
    #: A service account's key ids and their public keys (PEM).
    public_keys: dict[str, str]
    #: A user's refresh tokens, as SHA-256 hex.
    refresh_tokens: tuple[str, ...]

    @property
    def is_service_account(self) -> bool:
        return self.email.endswith(_SERVICE_ACCOUNT_SUFFIX)


class Issuer:
    """The issuer whose state is under ``root`` (created on first use). Its changes hold a lock file there:
    every ``Issuer`` of one root is safe with the others, in this process (each request builds its own)
    and in another (a hypervisor's metadata servers)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        with open(ensure_private_dir(self.root) / ".lock", "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
            yield

    # --- published keys -----------------------------------------------------------------------

    def certificates(self) -> dict[str, str]:
        """Key id -> self-signed x509 certificate (PEM) of every published signing key."""
        return {kid: self._certificate(kid) for kid in self._published()}

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid in self._published():
            numbers = self._private_key(kid).public_key().public_numbers()
            keys.append(
                {
                    "kty": "RSA",
                    "alg": "RS256",
                    "use": "sig",
                    "kid": kid,
                    "n": _b64int(numbers.n),
                    "e": _b64int(numbers.e),
                }
            )
        return {"keys": keys}

    def iap_keys(self) -> dict[str, str]:
        """IAP's key id -> EC public key (PEM)."""
        from cryptography.hazmat.primitives import serialization

        kid, key = self._iap_key()
        pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return {kid: pem.decode()}

    def rotate(self) -> str:
        """A new signing key, used from now on; the one before stays published (older ones go)."""
        with self._lock():
            kid = self._new_signing_key()
            for old in self._kids()[:-_PUBLISHED_KEYS]:
                for suffix in (".pem", ".crt"):
                    (self._keys_dir / f"{old}{suffix}").unlink(missing_ok=True)
            return kid

    # --- tokens ---------------------------------------------------------------------------------

    def id_token(self, email: str, audience: str, *, azp: str | None = None, full: bool = True) -> str:
        """An ID token for ``email`` with audience ``audience``; ``full``: with the email claims (a
        metadata server leaves them out unless asked for ``format=full``)."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": GOOGLE_ISSUERS[0],
            "aud": audience,
            "azp": azp or subject_of(email),
            "sub": subject_of(email),
            "iat": now,
            "exp": now + TOKEN_LIFETIME_S,
        }
        if full:
            claims.update(email=email, email_verified=True)
        kid = self._current_kid()
        signer = crypt.RSASigner.from_string(self._private_pem(kid), key_id=kid)
        return str(jwt.encode(signer, claims).decode())

    def iap_token(self, email: str, audience: str) -> str:
        """The JWT IAP would forward for ``email`` to the backend service ``audience``
        (``/projects/NUMBER/global/backendServices/ID``)."""
        from google.auth.crypt import es256

        now = int(time.time())
        claims = {
            "iss": IAP_ISSUER,
            "aud": audience,
            "sub": f"accounts.google.com:{subject_of(email)}",
            "email": email,
            "iat": now,
            "exp": now + 600,
        }
        kid, key = self._iap_key()
        signer = es256.ES256Signer(key, key_id=kid)
        return str(jwt.encode(signer, claims).decode())

    def grant(self, form: dict[str, str]) -> dict[str, Any]:
        """The token endpoint's answer to ``form``; ``GrantError`` for a refused one."""
        grant_type = form.get("grant_type", "")
        needed = {JWT_BEARER: "assertion", "refresh_token": "refresh_token"}.get(grant_type)
        if needed is not None and not form.get(needed):
            raise GrantError("invalid_request", f"Missing required parameter: {needed}")
        if grant_type == JWT_BEARER:
            return self._jwt_bearer(form.get("assertion", ""))
        if grant_type == "refresh_token":
            return self._refresh(form)
        raise GrantError("unsupported_grant_type", f"Invalid grant_type: {grant_type}")

    # --- accounts -------------------------------------------------------------------------------

    def credentials_file(self, email: str, base_url: str, *, project: str | None = None) -> dict[str, Any]:
        """A new credentials document for simulated account ``email`` (made on first use): a service
        account key file for a ``*.gserviceaccount.com`` address, else gcloud-style user credentials
        (``authorized_user``, gcloud's client). Both point their ``token_uri`` at ``base_url``."""
        email = email.strip().lower()
        if "@" not in email:
            raise ValueError(f"{email!r} is not an email address")
        token_uri = base_url.rstrip("/") + TOKEN_PATH
        with self._lock():
            account = self._account(email)
            if account.is_service_account:
                return self._new_service_account_key(account, token_uri, project)
            refresh_token = "1//sim-" + secrets.token_urlsafe(32)
            digest = hashlib.sha256(refresh_token.encode()).hexdigest()
            self._save(_Account(email, account.public_keys, (*account.refresh_tokens, digest)))
        return {
            "type": "authorized_user",
            "client_id": GCLOUD_CLIENT_ID,
            "client_secret": GCLOUD_CLIENT_SECRET,
            "refresh_token": refresh_token,
            "token_uri": token_uri,
            "account": email,
            "universe_domain": "googleapis.com",
        }

    def _new_service_account_key(
        self, account: _Account, token_uri: str, project: str | None
    ) -> dict[str, Any]:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        key_id = secrets.token_hex(20)
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self._save(
            _Account(account.email, {**account.public_keys, key_id: public.decode()}, account.refresh_tokens)
        )
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        base = token_uri.removesuffix(TOKEN_PATH)
        return {
            "type": "service_account",
            "project_id": project or _project_of(account.email),
            "private_key_id": key_id,
            "private_key": private.decode(),
            "client_email": account.email,
            "client_id": subject_of(account.email),
            "auth_uri": base + "/o/oauth2/auth",
            "token_uri": token_uri,
            "auth_provider_x509_cert_url": base + CERTS_PATH,
            "universe_domain": "googleapis.com",
        }

    # --- the grants -----------------------------------------------------------------------------

    def _jwt_bearer(self, assertion: str) -> dict[str, Any]:
        """An assertion's audience must be Google's token endpoint wherever it is sent: google-auth
        signs it so whatever ``token_uri`` says, and Google's endpoint takes no other."""
        try:
            header = _segment(assertion, 0)
            claims = _segment(assertion, 1)
        except ValueError:
            raise GrantError("invalid_grant", "Invalid JWT format.") from None
        email = str(claims.get("iss", "")).lower()
        account = self._find(email)
        public = None if account is None else account.public_keys.get(str(header.get("kid", "")))
        if public is None:
            # Google's words for a key that was deleted or never existed.
            raise GrantError("invalid_grant", "Invalid grant: account not found")
        try:
            verified = jwt.decode(assertion, certs={str(header["kid"]): public}, audience=GOOGLE_TOKEN_URL)
        except ValueError as exc:
            if "audience" in str(exc).lower():
                raise GrantError("invalid_grant", "Invalid JWT: Failed audience check.") from None
            if "expired" in str(exc).lower() or "too early" in str(exc).lower():
                raise GrantError("invalid_grant", _SHORT_LIVED) from None
            raise GrantError("invalid_grant", "Invalid JWT Signature.") from None
        if int(verified["exp"]) - int(verified["iat"]) > MAX_ASSERTION_S:
            raise GrantError("invalid_grant", _SHORT_LIVED)
        target = verified.get("target_audience")
        if target:
            return {"id_token": self.id_token(email, str(target), azp=subject_of(email))}
        if verified.get("scope"):
            from tpuctl.sim.iam import access_token

            return {
                "access_token": access_token(email),
                "expires_in": TOKEN_LIFETIME_S - 1,
                "token_type": "Bearer",
            }
        raise GrantError("invalid_scope", "Invalid OAuth scope or ID token audience provided.")

    def _refresh(self, form: dict[str, str]) -> dict[str, Any]:
        client_id = form.get("client_id", "")
        if client_id != GCLOUD_CLIENT_ID or form.get("client_secret") != GCLOUD_CLIENT_SECRET:
            # The only OAuth client the simulator knows is gcloud's.
            raise GrantError("invalid_client", "The OAuth client was not found.", status=401)
        digest = hashlib.sha256(form.get("refresh_token", "").encode()).hexdigest()
        account = next((a for a in self._accounts() if digest in a.refresh_tokens), None)
        if account is None:
            raise GrantError("invalid_grant", "Token has been expired or revoked.")
        from tpuctl.sim.iam import access_token

        return {
            "access_token": access_token(account.email),
            "expires_in": TOKEN_LIFETIME_S - 1,
            "scope": USER_SCOPES,
            "token_type": "Bearer",
            "id_token": self.id_token(account.email, client_id, azp=client_id),
        }

    # --- storage --------------------------------------------------------------------------------

    @property
    def _keys_dir(self) -> Path:
        return ensure_private_dir(self.root / "signing")

    def _kids(self) -> list[str]:
        """Signing key ids, oldest first (a key id starts with its creation time)."""
        return sorted(p.stem for p in self._keys_dir.glob("*.pem"))

    def _published(self) -> list[str]:
        with self._lock():
            kids = self._kids() or [self._new_signing_key()]
        return kids[-_PUBLISHED_KEYS:]

    def _current_kid(self) -> str:
        return self._published()[-1]

    def _new_signing_key(self) -> str:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        kid = f"{time.time_ns():020d}{secrets.token_hex(4)}"
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _write_private(self._keys_dir / f"{kid}.pem", pem)
        return kid

    def _private_pem(self, kid: str) -> bytes:
        return (self._keys_dir / f"{kid}.pem").read_bytes()

    def _private_key(self, kid: str) -> Any:
        from cryptography.hazmat.primitives import serialization

        return serialization.load_pem_private_key(self._private_pem(kid), password=None)

    def _certificate(self, kid: str) -> str:
        path = self._keys_dir / f"{kid}.crt"
        if path.exists():
            return path.read_text()
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        key = self._private_key(kid)
        name = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, "federated-signon.system.gserviceaccount.com")]
        )
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=14))
            .sign(key, hashes.SHA256())
        )
        pem = cert.public_bytes(serialization.Encoding.PEM).decode()
        path.write_text(pem)
        return pem

    def _iap_key(self) -> tuple[str, Any]:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        path = ensure_private_dir(self.root) / "iap.pem"
        with self._lock():
            if not path.exists():
                key = ec.generate_private_key(ec.SECP256R1())
                _write_private(
                    path,
                    key.private_bytes(
                        serialization.Encoding.PEM,
                        serialization.PrivateFormat.PKCS8,
                        serialization.NoEncryption(),
                    ),
                )
        pem = path.read_bytes()
        return hashlib.sha256(pem).hexdigest()[:8], serialization.load_pem_private_key(pem, password=None)

    def _accounts_dir(self) -> Path:
        return ensure_private_dir(self.root / "accounts")

    def _account(self, email: str) -> _Account:
        return self._find(email) or _Account(email, {}, ())

    def _find(self, email: str) -> _Account | None:
        path = self._accounts_dir() / f"{email}.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return _Account(email, dict(data.get("public_keys", {})), tuple(data.get("refresh_tokens", ())))

    def _accounts(self) -> list[_Account]:
        found = (self._find(p.stem) for p in sorted(self._accounts_dir().glob("*.json")))
        return [a for a in found if a is not None]

    def _save(self, account: _Account) -> None:
        data = {"public_keys": account.public_keys, "refresh_tokens": list(account.refresh_tokens)}
        _write_private(self._accounts_dir() / f"{account.email}.json", json.dumps(data).encode())


_SHORT_LIVED: Final = (
    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
    "Check your iat and exp values in the JWT claim."
)


def subject_of(email: str) -> str:
    """An account's stable numeric id (``sub``): Google's are 21 digits."""
    return str(int(hashlib.sha256(email.lower().encode()).hexdigest(), 16) % 10**21).rjust(21, "1")


def _project_of(email: str) -> str:
    """``name@PROJECT.iam.gserviceaccount.com`` -> PROJECT."""
    domain = email.partition("@")[2]
    return domain.removesuffix(".iam" + _SERVICE_ACCOUNT_SUFFIX).removesuffix(_SERVICE_ACCOUNT_SUFFIX)


def _b64int(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _segment(token: str, index: int) -> dict[str, Any]:
    part = token.split(".")[index]
    data = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def issuer_of(engine: SimEngine) -> Issuer:
    """The issuer of the simulator ``engine`` serves: its state beside the simulator's database."""
    return Issuer(Path(engine.ctx.db.path).parent / "issuer")


# --- what the simulator serves (routes in ``tpuctl.sim.routes``) ---------------------------------


def certs_v1(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> SimResponse:
    return json_response(issuer_of(engine).certificates())


def certs_v3(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> SimResponse:
    return json_response(issuer_of(engine).jwks())


def iap_public_keys(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> SimResponse:
    return json_response(issuer_of(engine).iap_keys())


def token(engine: SimEngine, request: SimRequest, args: tuple[str, ...]) -> SimResponse:
    """The OAuth token endpoint (``grant``)."""
    form = {str(k): str(v) for k, v in request.body.items()}
    try:
        return json_response(issuer_of(engine).grant(form))
    except GrantError as exc:
        return json_response(exc.document, exc.status)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
