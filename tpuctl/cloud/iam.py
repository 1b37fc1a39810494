"""Google's IAM as tpuctl meets it: what a predefined role grants, and which role to name when a
permission is missing (docs/google-facts.md#iam-roles).

Both halves are Google facts, cut to the services tpuctl calls (Cloud TPU, Compute Engine, Cloud Quotas,
Cloud Storage, Resource Manager, IAM, OS Login). The client reads ``role_for`` to say what to grant; the
simulator reads ``role_grants`` to decide what a caller may do. Patterns are ``fnmatch`` patterns over
permission names (``tpu.*``: every Cloud TPU permission; ``*.get``: every get).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

#: Each predefined role tpuctl knows: the permissions it grants and, after them, those it does not
#: (a basic role is "everything but ..."). Where Google's list is long, the patterns cover the services
#: above; where a role's reach is unsure, the narrower reading (it grants less).
PREDEFINED_ROLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "roles/owner": (("*",), ()),
    "roles/editor": (("*",), ("*.setIamPolicy", "*.getIamPolicy", "resourcemanager.projects.delete")),
    "roles/viewer": (("*.get", "*.list"), ("storage.objects.*",)),
    "roles/tpu.admin": (("tpu.*",), ()),
    "roles/tpu.viewer": (("tpu.*.get", "tpu.*.list"), ()),
    "roles/compute.admin": (("compute.*",), ()),
    "roles/compute.viewer": (("compute.*.get", "compute.*.list"), ()),
    "roles/compute.osLogin": (("compute.instances.osLogin",), ()),
    "roles/compute.osAdminLogin": (("compute.instances.osLogin", "compute.instances.osAdminLogin"), ()),
    "roles/cloudquotas.viewer": (("cloudquotas.quotas.get",), ()),
    "roles/storage.admin": (("storage.*",), ()),
    "roles/storage.objectAdmin": (("storage.objects.*",), ()),
    "roles/storage.objectUser": (("storage.objects.*",), ("storage.objects.*IamPolicy",)),
    "roles/storage.objectCreator": (("storage.objects.create",), ()),
    "roles/storage.objectViewer": (("storage.objects.get", "storage.objects.list"), ()),
    "roles/storage.legacyBucketReader": (("storage.buckets.get", "storage.objects.list"), ()),
    "roles/iam.securityReviewer": (("*.getIamPolicy",), ()),
    "roles/iam.serviceAccountUser": (("iam.serviceAccounts.actAs", "iam.serviceAccounts.get"), ()),
}

#: The role to grant for a missing permission, first match wins: the role that holds everything tpuctl
#: does with that service (granting the narrowest role that holds the one permission would only move
#: the next 403 one call later).
_ROLE_TO_GRANT: tuple[tuple[str, str], ...] = (
    ("tpu.*", "roles/tpu.admin"),
    ("compute.instances.osAdminLogin", "roles/compute.osAdminLogin"),
    ("compute.instances.osLogin", "roles/compute.osLogin"),
    ("compute.*", "roles/compute.admin"),
    ("cloudquotas.*", "roles/cloudquotas.viewer"),
    ("storage.objects.*", "roles/storage.objectAdmin"),
    ("storage.buckets.get", "roles/storage.legacyBucketReader"),
    ("storage.*", "roles/storage.admin"),
    ("*.getIamPolicy", "roles/iam.securityReviewer"),
    ("iam.serviceAccounts.*", "roles/iam.serviceAccountUser"),
)

#: Where Google lists every role and permission, for a permission this module does not know.
ROLES_REFERENCE = "https://cloud.google.com/iam/docs/roles-permissions"


def role_for(permission: str) -> str | None:
    """The predefined role to grant a caller that lacks ``permission``; None when tpuctl does not know
    one (the fix then points at Google's reference)."""
    return next((role for pattern, role in _ROLE_TO_GRANT if fnmatchcase(permission, pattern)), None)


def role_grants(role: str, permission: str) -> bool:
    """Whether the predefined ``role`` holds ``permission`` (an unknown role holds nothing)."""
    granted, withheld = PREDEFINED_ROLES.get(role, ((), ()))
    return any(fnmatchcase(permission, p) for p in granted) and not any(
        fnmatchcase(permission, p) for p in withheld
    )


def grant_fix(permission: str, who: str = "the caller", where: str = "the project") -> str:
    """The fix that names the role to grant ``who`` for ``permission``."""
    role = role_for(permission)
    if role is None:
        return f"grant {who} a role that holds {permission} on {where} (roles: {ROLES_REFERENCE})"
    return f"grant {who} {role} (it holds {permission}) on {where}"
