"""OS Login against respx: the v1 client's request and response shapes of Google's REST reference
(users.importSshPublicKey, users.sshPublicKeys.patch, users.getLoginProfile), auth, and errors as
tpuctl.errors kinds; and ``OsLoginAccess``: the project's setting from its metadata, the caller from the
credentials or tokeninfo, and a key authorized with an expiry, a refusal naming OS Login and its roles."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import respx

from tpuctl.cloud.oslogin import (
    GOOGLE_OSLOGIN_URL,
    ImportedKey,
    LoginProfile,
    OsLoginAccess,
    OsLoginClient,
    OsLoginEndpoints,
    PosixAccount,
    metadata_says,
)
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
    got = client.import_ssh_public_key(EMAIL, KEY + "\n", "my-project")
    assert got.primary == PosixAccount(USER, 2001234567, f"/home/{USER}")
    request = route.calls.last.request
    assert request.url.params["projectId"] == "my-project"
    assert json.loads(request.content) == {"key": KEY}
    client.import_ssh_public_key(EMAIL, KEY, "my-project", expires_at=1_700_000_000.25)
    assert json.loads(route.calls.last.request.content) == {
        "key": KEY,
        "expirationTimeUsec": "1700000000250000",
    }
    assert request.headers["authorization"] == "Bearer t0ken"
    assert "t0ken" not in repr(client)


@respx.mock
def test_login_profile_lists_accounts_primary_first_and_keys(client: OsLoginClient) -> None:
    route = respx.get(PROFILE_URL).mock(return_value=httpx.Response(200, json=profile(primary_second=True)))
    got = client.login_profile(EMAIL, "my-project")
    assert got == LoginProfile(
        f"users/{EMAIL}",
        (PosixAccount(USER, 2001234567, f"/home/{USER}"), PosixAccount("other", 2001234568, "/home/other")),
        (ImportedKey(FP, KEY, None),),
    )
    assert route.calls.last.request.url.params["projectId"] == "my-project"


@respx.mock
def test_a_profile_without_accounts_says_what_to_ask_for(client: OsLoginClient) -> None:
    respx.post(IMPORT_URL).mock(return_value=httpx.Response(200, json={"loginProfile": {"name": "users/x"}}))
    with pytest.raises(CloudError, match="no POSIX account") as info:
        _ = client.import_ssh_public_key(EMAIL, KEY, "my-project").primary
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


# --- OsLoginAccess ----------------------------------------------------------------------------------------

BASE = "http://127.0.0.1:8600"
SA = "runner@my-project.iam.gserviceaccount.com"


class _UserCreds(_Creds):
    """A user's credentials: a token, no service account."""

    token = "t0ken"


class _ServiceAccountCreds(_Creds):
    token = "t0ken"
    service_account_email = SA


def access(creds: object, http: httpx.Client) -> OsLoginAccess:
    return OsLoginAccess(OsLoginEndpoints.at(BASE), cast(Any, creds), http, retry=FAST, sleep=lambda s: None)


def project(*items: tuple[str, str]) -> dict[str, Any]:
    metadata = {"kind": "compute#metadata", "items": [{"key": k, "value": v} for k, v in items]}
    return {"name": "my-project", "commonInstanceMetadata": metadata}


@pytest.mark.parametrize(
    ("items", "says"),
    [
        ((("enable-oslogin", "TRUE"),), True),
        ((("enable-oslogin", "true"), ("ssh-keys", "x")), True),
        ((("enable-oslogin", "FALSE"),), False),
        ((("enable-oslogin", "1"),), False),  # gcloud reads only "true" as on
        ((("ssh-keys", "x"),), None),
        ((), None),
    ],
)
def test_the_projects_setting_is_read_from_its_common_instance_metadata(
    items: tuple[tuple[str, str], ...], says: bool | None
) -> None:
    with respx.mock(base_url=BASE) as mock, httpx.Client() as http:
        route = mock.get("/compute/v1/projects/my-project").mock(
            return_value=httpx.Response(200, json=project(*items))
        )
        assert access(_UserCreds(), http).project_says("my-project") is says
        assert route.calls.last.request.headers["authorization"] == "Bearer t0ken"
    assert metadata_says(dict(items)) is says


def test_a_project_the_caller_may_not_read_is_a_permission_error() -> None:
    with respx.mock(base_url=BASE) as mock, httpx.Client() as http:
        mock.get("/compute/v1/projects/my-project").mock(
            return_value=error(403, "PERMISSION_DENIED", "Required 'compute.projects.get' permission")
        )
        with pytest.raises(PermissionDeniedError, match=r"compute\.projects\.get"):
            access(_UserCreds(), http).project_says("my-project")


def test_the_caller_is_the_service_accounts_email_or_what_tokeninfo_says() -> None:
    with respx.mock(base_url=BASE) as mock, httpx.Client() as http:
        tokeninfo = mock.get("/tokeninfo").mock(
            return_value=httpx.Response(200, json={"email": EMAIL, "expires_in": "3599"})
        )
        assert access(_ServiceAccountCreds(), http).caller() == SA
        assert tokeninfo.call_count == 0
        user = access(_UserCreds(), http)
        assert user.caller() == EMAIL and user.caller() == EMAIL
        assert tokeninfo.call_count == 1  # asked once
        assert tokeninfo.calls.last.request.url.params["access_token"] == "t0ken"
        tokeninfo.mock(return_value=httpx.Response(200, json={"scope": "cloud-platform"}))
        with pytest.raises(CloudError, match="cannot tell which Google account") as info:
            access(_UserCreds(), http).caller()
        assert "gcloud auth application-default login" in (info.value.fix or "")


def _profile_with_key(expires_usec: str | None) -> dict[str, Any]:
    body = profile()
    entry: dict[str, Any] = {"key": KEY, "fingerprint": FP}
    if expires_usec is not None:
        entry["expirationTimeUsec"] = expires_usec
    body["sshPublicKeys"] = {FP: entry}
    return body


def test_authorizing_imports_with_the_expiry_and_moves_an_older_one() -> None:
    with respx.mock(base_url=BASE) as mock, httpx.Client() as http:
        mock.get("/tokeninfo").mock(return_value=httpx.Response(200, json={"email": EMAIL}))
        imported = mock.post(f"/v1/users/{EMAIL}:importSshPublicKey").mock(
            return_value=httpx.Response(200, json={"loginProfile": _profile_with_key("2000000000")})
        )
        patched = mock.patch(f"/v1/users/{EMAIL}/sshPublicKeys/{FP}").mock(
            return_value=httpx.Response(200, json={"key": KEY, "fingerprint": FP})
        )
        gate = access(_UserCreds(), http)
        # Imported with the expiry asked for: nothing more to do.
        assert gate.authorize_key("my-project", KEY, expires_at=2000.0).username == USER
        assert json.loads(imported.calls.last.request.content)["expirationTimeUsec"] == "2000000000"
        assert imported.calls.last.request.url.params["projectId"] == "my-project"
        assert patched.call_count == 0
        # The key was there with an earlier expiry (an import leaves it): moved with a patch.
        gate.authorize_key("my-project", KEY, expires_at=3000.0)
        assert patched.call_count == 1
        request = patched.calls.last.request
        assert request.url.params["updateMask"] == "expirationTimeUsec"
        assert json.loads(request.content) == {"key": KEY, "expirationTimeUsec": "3000000000"}


def test_a_refused_import_names_os_login_and_the_roles_it_needs() -> None:
    with respx.mock(base_url=BASE) as mock, httpx.Client() as http:
        mock.get("/tokeninfo").mock(return_value=httpx.Response(200, json={"email": EMAIL}))
        mock.post(f"/v1/users/{EMAIL}:importSshPublicKey").mock(
            return_value=error(403, "PERMISSION_DENIED", "The caller does not have permission")
        )
        with pytest.raises(PermissionDeniedError) as info:
            access(_UserCreds(), http).authorize_key("my-project", KEY, expires_at=2000.0)
    assert "OS Login is on for project my-project" in info.value.message and EMAIL in info.value.message
    fix = info.value.fix or ""
    assert "roles/compute.osAdminLogin" in fix and "roles/compute.osLogin" in fix and "my-project" in fix


def test_a_key_missing_from_the_profile_after_its_import_is_an_error() -> None:
    with respx.mock(base_url=BASE) as mock, httpx.Client() as http:
        mock.get("/tokeninfo").mock(return_value=httpx.Response(200, json={"email": EMAIL}))
        other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB x"
        mock.post(f"/v1/users/{EMAIL}:importSshPublicKey").mock(
            return_value=httpx.Response(200, json={"loginProfile": _profile_with_key(None)})
        )
        with pytest.raises(CloudError, match="did not record tpuctl's SSH key"):
            access(_UserCreds(), http).authorize_key("my-project", other, expires_at=2000.0)
