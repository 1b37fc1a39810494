"""OS Login v1 client against respx: the request and response shapes of Google's REST reference
(users.importSshPublicKey, users.getLoginProfile), auth, and errors as tpuctl.errors kinds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import respx

from tpuctl.cloud.oslogin import GOOGLE_OSLOGIN_URL, LoginProfile, OsLoginClient, PosixAccount
from tpuctl.cloud.retry import RetryPolicy
from tpuctl.errors import CloudError, NotFoundError, PermissionDeniedError, TransientError

EMAIL = "ada.lovelace@example.com"
USER = "ada_lovelace_example_com"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOzN2jzV2j1xLq tpuctl"
FP = "2b9c7f3b6c0e4b1f8a5d3e2c1b0a99887766554433221100ffeeddccbbaa9988"
IMPORT_URL = f"{GOOGLE_OSLOGIN_URL}/v1/users/{EMAIL}:importSshPublicKey"
PROFILE_URL = f"{GOOGLE_OSLOGIN_URL}/v1/users/{EMAIL}/loginProfile"
FAST = RetryPolicy(max_attempts=3, initial_wait_s=0.0, max_wait_s=0.0, deadline_s=5.0)


def profile(*, primary_second: bool = False) -> dict[str, Any]:
    """A LoginProfile as the API returns it (uid/gid are int64: JSON strings)."""
    accounts = [
        {
            "primary": True,
            "username": USER,
            "uid": "2001234567",
            "gid": "2001234567",
            "homeDirectory": f"/home/{USER}",
            "shell": "/bin/bash",
            "gecos": "",
            "systemId": "",
            "accountId": "my-project",
            "operatingSystemType": "LINUX",
            "name": f"users/{EMAIL}/projects/my-project",
        },
        {"username": "other", "uid": "2001234568", "homeDirectory": "/home/other", "accountId": "other-p"},
    ]
    if primary_second:
        accounts.reverse()
    return {
        "name": f"users/{EMAIL}",
        "posixAccounts": accounts,
        "sshPublicKeys": {FP: {"key": KEY, "fingerprint": FP, "name": f"users/{EMAIL}/sshPublicKeys/{FP}"}},
    }


def error(code: int, status: str, message: str) -> httpx.Response:
    return httpx.Response(code, json={"error": {"code": code, "status": status, "message": message}})


class _Creds:
    """google-auth credentials, as far as the client uses them."""

    def __init__(self) -> None:
        self.valid = True

    def apply(self, headers: dict[str, str]) -> None:
        headers["authorization"] = "Bearer t0ken"


@pytest.fixture
def client() -> Iterator[OsLoginClient]:
    with httpx.Client() as http:
        creds = cast(Any, _Creds())  # duck-typed google-auth credentials
        yield OsLoginClient(GOOGLE_OSLOGIN_URL, creds, http, retry=FAST, sleep=lambda s: None)


@respx.mock
def test_import_sends_the_key_and_returns_the_primary_account(client: OsLoginClient) -> None:
    route = respx.post(IMPORT_URL).mock(
        return_value=httpx.Response(200, json={"loginProfile": profile(primary_second=True), "details": ""})
    )
    account = client.import_ssh_public_key(EMAIL, KEY + "\n", "my-project")
    assert account == PosixAccount(USER, 2001234567, f"/home/{USER}")
    request = route.calls.last.request
    assert request.url.params["projectId"] == "my-project"
    assert json.loads(request.content) == {"key": KEY}
    assert request.headers["authorization"] == "Bearer t0ken"
    assert "t0ken" not in repr(client)


@respx.mock
def test_login_profile_lists_accounts_primary_first_and_key_fingerprints(client: OsLoginClient) -> None:
    route = respx.get(PROFILE_URL).mock(return_value=httpx.Response(200, json=profile(primary_second=True)))
    got = client.login_profile(EMAIL, "my-project")
    assert got == LoginProfile(
        f"users/{EMAIL}",
        (PosixAccount(USER, 2001234567, f"/home/{USER}"), PosixAccount("other", 2001234568, "/home/other")),
        (FP,),
    )
    assert route.calls.last.request.url.params["projectId"] == "my-project"


@respx.mock
def test_a_profile_without_accounts_says_what_to_ask_for(client: OsLoginClient) -> None:
    respx.post(IMPORT_URL).mock(return_value=httpx.Response(200, json={"loginProfile": {"name": "users/x"}}))
    with pytest.raises(CloudError, match="no POSIX account") as info:
        client.import_ssh_public_key(EMAIL, KEY, "my-project")
    assert "roles/compute.osLogin" in (info.value.fix or "")


@pytest.mark.parametrize(
    ("response", "kind"),
    [
        (error(403, "PERMISSION_DENIED", "The caller does not have permission"), PermissionDeniedError),
        (error(404, "NOT_FOUND", "User not found"), NotFoundError),
        (error(400, "INVALID_ARGUMENT", "Invalid key format"), CloudError),
        (httpx.Response(200, text="<html>not json</html>"), CloudError),
    ],
)
@respx.mock
def test_errors_become_tpuctl_errors_naming_the_user(
    client: OsLoginClient, response: httpx.Response, kind: type[CloudError]
) -> None:
    respx.post(IMPORT_URL).mock(return_value=response)
    with pytest.raises(kind) as info:
        client.import_ssh_public_key(EMAIL, KEY, "my-project")
    assert type(info.value) is kind
    assert EMAIL in str(info.value) and "my-project" in str(info.value)


@respx.mock
def test_unavailable_is_retried_then_transient(client: OsLoginClient) -> None:
    route = respx.get(PROFILE_URL).mock(
        side_effect=[error(503, "UNAVAILABLE", "try again"), httpx.Response(200, json=profile())]
    )
    assert client.login_profile(EMAIL).primary.username == USER
    assert route.call_count == 2 and "projectId" not in route.calls.last.request.url.params
    route.mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(TransientError):
        client.login_profile(EMAIL)
    assert route.call_count == 2 + FAST.max_attempts


def test_simulator_has_no_auth_and_bad_emails_are_refused() -> None:
    with respx.mock(base_url="http://127.0.0.1:8500") as mock, httpx.Client() as http:
        route = mock.get(f"/v1/users/{EMAIL}/loginProfile").mock(
            return_value=httpx.Response(200, json=profile())
        )
        OsLoginClient("http://127.0.0.1:8500/", None, http).login_profile(EMAIL)
        assert "authorization" not in route.calls.last.request.headers
        with pytest.raises(CloudError, match="not a user email"):
            OsLoginClient("http://127.0.0.1:8500", None, http).login_profile("users/x/y")
