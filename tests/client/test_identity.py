"""The CLI's ID tokens, from credentials files of a served simulator's principals, as google-auth gets
them from Google's: a service account key (the server's audience) and gcloud-style user credentials
(gcloud's client as audience); held until near expiry; none at all is an error naming the fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.auth import jwt

from tpuctl.client.identity import IdentityTokens, NoIdentityError
from tpuctl.cloud.identity import GCLOUD_CLIENT_ID
from tpuctl.sim import SimServer
from tpuctl.sim.issuer import issuer_of
from tpuctl.testing.cli import Cli

SERVER = "http://tpuctl.test:8471"


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    with SimServer(tmp_path_factory.mktemp("idp")) as server:
        yield server


def credentials(idp: SimServer, email: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{email}.json"
    path.write_text(json.dumps(issuer_of(idp.engine).credentials_file(email, idp.url)))
    return path


def test_a_service_account_key_and_user_credentials_give_tokens_held_until_near_expiry(
    idp: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    sa = "ci@proj.iam.gserviceaccount.com"
    key = tmp_path / "ci.json"
    made = cli("sim", "credentials", sa, "--out", str(key), env={"TPUCTL_SIM_URL": idp.url})
    assert made.code == 0 and oct(key.stat().st_mode & 0o777) == "0o600", made.stderr
    assert cli("sim", "credentials", sa, "--out", str(tmp_path / "x.json")).code == 2  # no served simulator
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    tokens = IdentityTokens(SERVER)
    first = tokens.token()
    claims = jwt.decode(first.token, verify=False)
    assert (claims["email"], claims["aud"]) == (sa, SERVER) and "service account key" in first.source
    assert tokens.token() is first  # held, not fetched again
    tokens.forget()
    assert tokens.token() is not first

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials(idp, "a1@example.com", tmp_path)))
    user = jwt.decode(IdentityTokens(SERVER).token().token, verify=False)
    assert (user["email"], user["aud"]) == ("a1@example.com", GCLOUD_CLIENT_ID)


def test_revoked_credentials_and_none_at_all_are_errors_naming_the_fix(
    idp: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = credentials(idp, "a1@example.com", tmp_path)
    info = json.loads(path.read_text())
    path.write_text(json.dumps({**info, "refresh_token": "1//revoked"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    with pytest.raises(NoIdentityError, match="invalid_grant") as caught:
        IdentityTokens(SERVER).token()
    assert caught.value.exit_code == 13

    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")  # no metadata server here
    monkeypatch.setattr("tpuctl.client.identity.shutil.which", lambda name: None)  # nor gcloud
    with pytest.raises(NoIdentityError, match="gcloud is not installed") as none:
        IdentityTokens(SERVER).token()
    assert "gcloud auth login" in (none.value.fix or "")
