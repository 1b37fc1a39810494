"""Where credentials come from: Application Default Credentials (with the login fix when there are none),
or none at all for the simulator."""

from __future__ import annotations

from typing import Any

import pytest

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
        asked.append(kwargs["scopes"])
        return creds, "proj"

    monkeypatch.setattr(google.auth, "default", adc)
    assert default_credentials() is creds
    assert asked == [list(SCOPES)]


def test_anonymous_credentials_add_nothing_to_a_request() -> None:
    headers: dict[str, str] = {}
    anonymous_credentials().apply(headers)
    assert headers == {}


def test_given_credentials_are_the_same_object_every_time() -> None:
    creds: Any = object()
    source = given(creds)
    assert source() is creds and source() is creds
