"""``CloudConfig``: what a backend hands its clients, taken as given. The clients apply it whatever the
backend's name (they never read the name but to report it), and a bad value fails when the config is
built, before any call."""

from __future__ import annotations

import pytest

from tpuctl.catalog import Catalog
from tpuctl.cloud.compute import ComputeCloud
from tpuctl.cloud.config import CloudConfig
from tpuctl.cloud.credentials import anonymous_credentials
from tpuctl.cloud.quotas import CloudQuotasClient
from tpuctl.cloud.retry import RetryPolicy
from tpuctl.cloud.tpu_api import TpuApiCloud
from tpuctl.errors import UsageError

LOOPBACK = "http://127.0.0.1:9"


@pytest.mark.parametrize("field", ["request_timeout_s", "poll_interval_s", "operation_timeout_s"])
def test_a_timeout_or_interval_of_zero_is_refused_when_built(field: str) -> None:
    with pytest.raises(UsageError) as err:
        CloudConfig(**{field: 0.0})  # type: ignore[arg-type]
    assert err.value.field == field


def test_the_poll_cap_is_never_below_the_first_interval() -> None:
    assert CloudConfig(poll_interval_s=0.5, poll_max_interval_s=0.1).poll_cap_s == 0.5
    assert CloudConfig(poll_interval_s=0.05, poll_max_interval_s=1.0).poll_cap_s == 1.0


def test_the_defaults_are_googles() -> None:
    config = CloudConfig()
    assert config.trust_env is True and config.retry == RetryPolicy()
    assert (config.request_timeout_s, config.operation_timeout_s) == (30.0, 1800.0)


@pytest.mark.parametrize("trust_env", [True, False])
def test_the_tpu_api_client_applies_the_proxy_choice_it_is_given(trust_env: bool) -> None:
    # The name is not "sim": what counts is what the config says.
    config = CloudConfig(backend="elsewhere", credentials=anonymous_credentials, trust_env=trust_env)
    with TpuApiCloud(project="p", endpoint=LOOPBACK, config=config) as cloud:
        assert cloud._client.transport._session.trust_env is trust_env
        assert cloud.backend == "elsewhere"


@pytest.mark.parametrize("trust_env", [True, False])
def test_the_compute_client_applies_the_proxy_choice_it_is_given(trust_env: bool) -> None:
    config = CloudConfig(backend="elsewhere", credentials=anonymous_credentials, trust_env=trust_env)
    cloud = ComputeCloud(project="p", catalog=Catalog.load(), endpoint=LOOPBACK, config=config)
    try:
        assert cloud._client("instances").transport._session.trust_env is trust_env
        assert cloud.backend == "elsewhere"
    finally:
        cloud.close()


def test_the_quotas_client_takes_the_configs_credentials_retry_timeout_and_proxy_choice() -> None:
    retry = RetryPolicy(max_attempts=2, initial_wait_s=0.0, max_wait_s=0.0, deadline_s=1.0)
    config = CloudConfig(
        credentials=anonymous_credentials, retry=retry, request_timeout_s=7.0, trust_env=False
    )
    client = CloudQuotasClient.from_config(config, base_url=LOOPBACK, service="compute.googleapis.com")
    try:
        assert client.base_url == LOOPBACK and client.service == "compute.googleapis.com"
        assert client._retry is retry and client._timeout_s == 7.0
        http = client._http()
        assert http.trust_env is False
        assert client._auth_headers() == {}  # anonymous: no Authorization header
    finally:
        client.close()


def test_constructing_a_client_resolves_no_credentials() -> None:
    asked: list[str] = []

    def credentials() -> object:
        asked.append("credentials")
        raise AssertionError("credentials resolved before the first call")

    config = CloudConfig(credentials=credentials)  # type: ignore[arg-type]
    TpuApiCloud(project="p", config=config)
    ComputeCloud(project="p", catalog=Catalog.load(), config=config)
    assert asked == []
