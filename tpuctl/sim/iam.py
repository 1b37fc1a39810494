"""Who calls the simulator, and whether they may: authentication and IAM as Google's front ends answer
them (docs/google-facts.md#permission-errors).

Every API request carries an OAuth access token (``Authorization: Bearer TOKEN``); none, or one the
simulator did not issue, is 401 UNAUTHENTICATED. The simulator's tokens name their account:

- ``ADC_TOKEN``: the simulated Application Default Credentials, i.e. the account logged in on this
  machine: the world's ``principal``. tpuctl's clients of the simulator send it;
- ``access_token(email)``: an account's own token, what a host's metadata server hands the host's service
  account (and what a test sends to act as someone else).

A request then needs its permission on the project it names, from the roles the project's IAM policy
(``World.iam_bindings``) grants the caller (``tpuctl.cloud.iam.PREDEFINED_ROLES`` says what each role
holds); without it the answer is 403 PERMISSION_DENIED naming the permission, in each API's own words
(the shapes below). A project nobody granted the caller anything on answers the same 403.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from tpuctl.cloud.iam import role_grants
from tpuctl.sim.api_errors import ERROR_INFO_TYPE, ApiError
from tpuctl.sim.world import World

#: The access token of the simulated Application Default Credentials (the world's principal).
ADC_TOKEN = "ya29.sim-adc"
_ACCOUNT_TOKEN_PREFIX = "ya29.sim."

#: Google's 401 texts: no credential at all, and one it does not accept.
MISSING_CREDENTIALS = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie "
    "or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)
INVALID_CREDENTIALS = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
    "valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)

#: How an API words its auth errors: most Google APIs (``google``: status, ErrorInfo details), or
#: Compute Engine's own body (``compute``: ``errors[]`` with a reason).
Dialect = Literal["google", "compute"]


def access_token(email: str) -> str:
    """The token the simulator accepts as ``email``'s."""
    encoded = base64.urlsafe_b64encode(email.encode()).decode("ascii").rstrip("=")
    return _ACCOUNT_TOKEN_PREFIX + encoded


def default_service_account(project: str) -> str:
    """The project's default compute service account, the one its VMs run as unless told otherwise (on
    Google the name carries the project's number; the simulator has none, so its id)."""
    return f"{project}-compute@developer.gserviceaccount.com"


def member(email: str) -> str:
    """The IAM member an account is: ``serviceAccount:`` for a service account, else ``user:``."""
    kind = "serviceAccount" if email.endswith(".gserviceaccount.com") else "user"
    return f"{kind}:{email}"


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The bearer token of a request (headers lower-cased), or None."""
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def account_of(world: World, token: str | None) -> str | None:
    """The account a token stands for, None for no token or one the simulator did not issue."""
    if token is None:
        return None
    if token == ADC_TOKEN:
        return world.principal
    if not token.startswith(_ACCOUNT_TOKEN_PREFIX):
        return None
    encoded = token[len(_ACCOUNT_TOKEN_PREFIX) :]
    try:
        email = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return email if "@" in email else None


def allowed(world: World, project: str, email: str, permission: str) -> bool:
    """Whether ``email`` holds ``permission`` on ``project`` through any of its roles there."""
    who = {member(email), "allAuthenticatedUsers"}
    return any(
        role_grants(binding.role, permission)
        for binding in world.iam_bindings(project)
        if who & set(binding.members)
    )


@dataclass(frozen=True)
class Guard:
    """How one API authenticates and authorizes: its service name and its errors' dialect."""

    service: str
    dialect: Dialect

    def caller(self, world: World, headers: Mapping[str, str]) -> str:
        """The calling account; 401 without a token the simulator issued."""
        token = bearer_token(headers)
        email = account_of(world, token)
        if email is None:
            raise self.unauthenticated(token_given=token is not None)
        return email

    def check(
        self, world: World, headers: Mapping[str, str], project: str, permission: str, path: str
    ) -> str:
        """The caller, once it holds ``permission`` on ``project`` (``path``: what it asked for, the
        resource a denial names); 401 or 403 otherwise."""
        email = self.caller(world, headers)
        if not allowed(world, project, email, permission):
            listing = permission.endswith(".list")
            # Compute Engine names the project for any list (observed); the others the list's parent.
            resource = (
                f"projects/{project}" if listing and self.dialect == "compute" else _resource(path, listing)
            )
            raise self.denied(permission, resource)
        return email

    def unauthenticated(self, *, token_given: bool) -> ApiError:
        message = INVALID_CREDENTIALS if token_given else MISSING_CREDENTIALS
        reason = "ACCESS_TOKEN_TYPE_UNSUPPORTED" if token_given else "CREDENTIALS_MISSING"
        details = [
            {
                "@type": ERROR_INFO_TYPE,
                "reason": reason,
                "domain": "googleapis.com",
                "metadata": {"service": self.service},
            }
        ]
        if self.dialect == "compute":
            # Here, not at the top: the compute package imports the engine, which imports this module.
            from tpuctl.sim.compute.errors import ComputeError

            return ComputeError(
                401, message, "required", location=("Authorization", "header"), details=details
            )
        return ApiError(401, "UNAUTHENTICATED", message, details)

    def denied(self, permission: str, resource: str) -> ApiError:
        if self.dialect == "compute":
            from tpuctl.sim.compute.errors import ComputeError  # (see unauthenticated)

            return ComputeError(403, f"Required '{permission}' permission for '{resource}'", "forbidden")
        message = (
            f"Permission '{permission}' denied on resource '//{self.service}/{resource}' "
            "(or it may not exist)."
        )
        info = {
            "@type": ERROR_INFO_TYPE,
            "reason": "IAM_PERMISSION_DENIED",
            "domain": "iam.googleapis.com",
            "metadata": {"permission": permission, "resource": resource},
        }
        return ApiError(403, "PERMISSION_DENIED", message, [info])


def _resource(path: str, listing: bool) -> str:
    """The resource a denial names: ``projects/...`` from the request's path, a list's parent for a
    list, without a custom method's ``:verb``."""
    parts = [p for p in path.split("/") if p]
    start = parts.index("projects") if "projects" in parts else 0
    named = parts[start:]
    if listing and len(named) > 2:
        named = named[:-1]
    return "/".join(named).split(":", 1)[0]


TPU_API = Guard("tpu.googleapis.com", "google")
COMPUTE = Guard("compute.googleapis.com", "compute")
CLOUD_QUOTAS = Guard("cloudquotas.googleapis.com", "google")
OS_LOGIN = Guard("oslogin.googleapis.com", "google")
CLOUD_STORAGE = Guard("storage.googleapis.com", "google")
POLICY_TROUBLESHOOTER = Guard("policytroubleshooter.googleapis.com", "google")


def troubleshoot(world: World, caller: str, body: Mapping[str, object]) -> dict[str, object]:
    """Policy Troubleshooter's ``iam:troubleshoot`` (v1): whether the access tuple's ``principal`` holds
    ``permission`` on ``fullResourceName``. The simulator's resources are its projects' and its buckets
    (every bucket the world's project's); a caller who may not read the project's policy learns nothing
    (``UNKNOWN_INFO_DENIED``), as Google answers a caller it cannot show the policy to."""
    from tpuctl.sim.api_errors import invalid_argument

    raw = body.get("accessTuple")
    access = raw if isinstance(raw, Mapping) else {}
    fields = {k: str(access.get(k) or "") for k in ("principal", "fullResourceName", "permission")}
    for key, value in fields.items():
        if not value:
            raise invalid_argument(f"access_tuple.{key} is required.", f"access_tuple.{key}")
    project = _owning_project(world, fields["fullResourceName"])
    if not allowed(world, project, caller, "resourcemanager.projects.getIamPolicy"):
        return {
            "access": "UNKNOWN_INFO_DENIED",
            "errors": [
                {
                    "code": 7,
                    "message": f"Permission 'resourcemanager.projects.getIamPolicy' denied on resource "
                    f"'//cloudresourcemanager.googleapis.com/projects/{project}'",
                }
            ],
        }
    granted = allowed(world, project, fields["principal"], fields["permission"])
    state = "GRANTED" if granted else "NOT_GRANTED"
    bindings = [b.model_dump() for b in world.iam_bindings(project)]
    return {
        "access": state,
        "explainedPolicies": [
            {
                "access": state,
                "fullResourceName": f"//cloudresourcemanager.googleapis.com/projects/{project}",
                "policy": {"version": 1, "bindings": bindings},
            }
        ],
    }


def _owning_project(world: World, full_name: str) -> str:
    """The project whose policy governs a resource: ``//SERVICE/projects/P/...`` names it; a bucket
    (``//storage.googleapis.com/projects/_/buckets/B``) is the world's project's."""
    parts = full_name.removeprefix("//").split("/")
    if len(parts) >= 3 and parts[1] == "projects" and parts[2] != "_":
        return parts[2]
    return world.project
