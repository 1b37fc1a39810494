"""The simulator's identity issuer, reached as google-auth reaches Google's: its own flows (a service
account's ID token, a user's refresh) against the token endpoint, and ``verify_token`` against the
published certificates."""

# google.oauth2 has no type hints on its constructors.
# mypy: disable-error-code="no-untyped-call"
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import google.auth.transport.requests
import pytest
import requests
from google.auth import exceptions
from google.oauth2 import credentials as user_credentials
from google.oauth2 import id_token, service_account

from tpuctl.cloud.identity import GCLOUD_CLIENT_ID, IdentityIssuer
from tpuctl.sim import SimServer
from tpuctl.sim.issuer import Issuer, issuer_of

SA = "ci@proj.iam.gserviceaccount.com"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """One simulator for the module: its issuer's state is all these tests use."""
    with SimServer(tmp_path_factory.mktemp("issuer")) as served:
        yield served


def _request() -> google.auth.transport.requests.Request:
    return google.auth.transport.requests.Request()


def _verify(server: SimServer, token: str, audience: str) -> dict[str, object]:
    certs = IdentityIssuer.at(server.url).certs_url
    return dict(id_token.verify_token(token, _request(), audience=audience, certs_url=certs))


def test_a_service_account_key_mints_an_id_token_google_auth_verifies(server: SimServer) -> None:
    info = issuer_of(server.engine).credentials_file(SA, server.url)
    assert info["token_uri"] == f"{server.url}/token"
    creds = service_account.IDTokenCredentials.from_service_account_info(info, target_audience="https://srv")
    creds.refresh(_request())
    claims = _verify(server, creds.token, "https://srv")
    assert claims["iss"] == "https://accounts.google.com"
    assert (claims["email"], claims["email_verified"], claims["aud"]) == (SA, True, "https://srv")
    assert claims["azp"] == info["client_id"] == claims["sub"]
    with pytest.raises(ValueError, match="audience"):
        _verify(server, creds.token, "https://another")


def test_user_credentials_refresh_to_an_id_token_for_gclouds_client(server: SimServer) -> None:
    info = issuer_of(server.engine).credentials_file("A1@example.com", server.url)
    creds = user_credentials.Credentials.from_authorized_user_info(info).with_token_uri(info["token_uri"])
    creds.refresh(_request())
    claims = _verify(server, creds.id_token, GCLOUD_CLIENT_ID)
    assert (claims["email"], claims["aud"], claims["azp"]) == (
        "a1@example.com",
        GCLOUD_CLIENT_ID,
        GCLOUD_CLIENT_ID,
    )


def test_refused_grants_answer_oauths_errors(server: SimServer) -> None:
    issuer = issuer_of(server.engine)
    info = issuer.credentials_file(SA, server.url)
    forged = {**info, "private_key": issuer.credentials_file(SA, server.url)["private_key"]}  # another key
    creds = service_account.IDTokenCredentials.from_service_account_info(forged, target_audience="x")
    with pytest.raises(exceptions.RefreshError, match="invalid_grant: Invalid JWT Signature"):
        creds.refresh(_request())
    user = issuer.credentials_file("u@example.com", server.url)
    bad = user_credentials.Credentials.from_authorized_user_info({**user, "refresh_token": "1//nope"})
    with pytest.raises(exceptions.RefreshError, match="invalid_grant"):
        bad.with_token_uri(user["token_uri"]).refresh(_request())
    answer = requests.post(f"{server.url}/token", data={"grant_type": "password"}, timeout=10)
    assert answer.status_code == 400
    assert answer.json()["error"] == "unsupported_grant_type"
    bare = requests.post(f"{server.url}/token", data={"grant_type": "refresh_token"}, timeout=10)
    assert bare.json() == {
        "error": "invalid_request",
        "error_description": "Missing required parameter: refresh_token",
    }


def test_rotation_keeps_the_previous_key_published(tmp_path: Path) -> None:
    issuer = Issuer(tmp_path)
    before = issuer.id_token("a@example.com", "aud")
    first = set(issuer.certificates())
    issuer.rotate()
    after = issuer.id_token("a@example.com", "aud")
    published = issuer.certificates()
    assert first < set(published) and len(published) == 2
    for token in (before, after):
        assert google.auth.jwt.decode(token, certs=published, audience="aud")["email"] == "a@example.com"
    assert {k["kid"] for k in issuer.jwks()["keys"]} == set(published)
    issuer.rotate()
    with pytest.raises(ValueError, match="Certificate for key id"):
        google.auth.jwt.decode(before, certs=issuer.certificates(), audience="aud")


def test_the_certificate_documents_are_served_at_googles_paths(server: SimServer) -> None:
    v1 = requests.get(f"{server.url}/oauth2/v1/certs", timeout=10).json()
    v3 = requests.get(f"{server.url}/oauth2/v3/certs", timeout=10).json()
    assert all(pem.startswith("-----BEGIN CERTIFICATE-----") for pem in v1.values())
    assert {k["kid"] for k in v3["keys"]} == set(v1)
    iap = requests.get(f"{server.url}/iap/verify/public_key", timeout=10).json()
    assert all(pem.startswith("-----BEGIN PUBLIC KEY-----") for pem in iap.values())
    assert json.dumps(v1)  # plain JSON, as google-auth reads it
