"""Where credentials come from: Application Default Credentials (with the login fix when there are none),
billing user credentials' quota to a quota project (sent as x-goog-user-project), or none at all for the
simulator."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from tpuctl.cloud.credentials import SCOPES, anonymous_credentials, default_credentials, given
from tpuctl.errors import UnauthenticatedError


def test_no_adc_gives_the_login_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_adc(**_: Any) -> Any:
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_adc)
    with pytest.raises(UnauthenticatedError) as err:
        default_credentials()
    assert err.value.fix == "gcloud auth application-default login"


def test_adc_is_asked_for_the_cloud_platform_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    import google.auth

    asked: list[Any] = []
    creds = object()

    def adc(**kwargs: Any) -> Any:
        asked.append((kwargs["scopes"], kwargs["quota_project_id"]))
        return creds, "proj"

    monkeypatch.setattr(google.auth, "default", adc)
    assert default_credentials() is creds
    assert default_credentials(quota_project="billed") is creds
    assert asked == [(list(SCOPES), None), (list(SCOPES), "billed")]


def test_anonymous_credentials_add_nothing_to_a_request() -> None:
    headers: dict[str, str] = {}
    anonymous_credentials().apply(headers)
    assert headers == {}


def test_given_credentials_are_the_same_object_every_time() -> None:
    creds: Any = object()
    source = given(creds)
    assert source() is creds and source() is creds


def _user_adc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ADC file of user credentials, as `gcloud auth application-default login` writes one."""
    adc = tmp_path / "application_default_credentials.json"
    adc.write_text(
        json.dumps(
            {"type": "authorized_user", "client_id": "id", "client_secret": "secret", "refresh_token": "r"}
        )
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.delenv("GOOGLE_CLOUD_QUOTA_PROJECT", raising=False)


@pytest.mark.parametrize("quota_project", ["billed-project", None])
def test_user_credentials_send_the_quota_project_as_x_goog_user_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quota_project: str | None
) -> None:
    from tpuctl.cloud.quotas import GOOGLE_QUOTAS_URL, CloudQuotasClient

    _user_adc(tmp_path, monkeypatch)
    creds: Any = default_credentials(quota_project=quota_project)
    creds.token, creds.expiry = "t0ken", datetime.datetime.utcnow() + datetime.timedelta(hours=1)  # refreshed
    url = f"{GOOGLE_QUOTAS_URL}/v1/projects/p/locations/global/services/tpu.googleapis.com/quotaInfos"
    with respx.mock:
        route = respx.get(url).mock(return_value=httpx.Response(200, json={"quotaInfos": []}))
        client = CloudQuotasClient(credentials=creds)
        try:
            assert client.list_quota_limits("p") == []
        finally:
            client.close()
    headers = route.calls.last.request.headers
    assert headers["authorization"] == "Bearer t0ken"
    assert headers.get("x-goog-user-project") == quota_project


def test_the_google_backend_bills_quota_to_the_settings_quota_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuctl.backends import open_backend
    from tpuctl.backends.gcp import GcpBackend
    from tpuctl.settings import load_settings

    _user_adc(tmp_path, monkeypatch)
    monkeypatch.delenv("TPUCTL_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no config file: defaults and the flags given
    settings = load_settings({"project": "my-project", "quota_project": "billed-project"})
    backend = open_backend(settings)
    assert isinstance(backend, GcpBackend) and backend.quota_project == "billed-project"
    creds: Any = backend.client_config().credentials()
    assert creds.quota_project_id == "billed-project"
