"""Who may do what in the simulated Cloud Storage: the permission each JSON-API request needs, and the
401 and 403 answers Cloud Storage gives without it (docs/google-facts.md#permission-errors,
docs/google-facts.md#bucket-access).

Every bucket the emulator serves belongs to the world's project, and a bucket's IAM is its project's:
an account may do what its roles on the project grant (``tpuctl.sim.iam``). A request carries its
caller's bearer token (a host's comes from its metadata server); none is Cloud Storage's anonymous
caller, who may do nothing here (the simulator has no public buckets). Overwriting an object also needs
``storage.objects.delete``, as on Google, so an account with roles/storage.objectCreator alone can
write each object once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tpuctl.sim import iam
from tpuctl.sim.world import World

#: An answer the emulator sends instead of serving: (HTTP status, JSON body).
Refusal = tuple[int, dict[str, Any]]

_BUCKETS = re.compile(r"^/storage/v1/b/?$")
_BUCKET = re.compile(r"^/storage/v1/b/(?P<bucket>[^/]+)/?$")
_TEST_PERMISSIONS = re.compile(r"^/storage/v1/b/(?P<bucket>[^/]+)/iam/testPermissions$")
_OBJECTS = re.compile(r"^/(?:upload/)?storage/v1/b/(?P<bucket>[^/]+)/o/?$")
_OBJECT = re.compile(r"^/(?:download/)?storage/v1/b/(?P<bucket>[^/]+)/o/(?P<object>.+)$")
_ANY_BUCKET = re.compile(r"^/(?:upload/|download/)?storage/v1/b/(?P<bucket>[^/]+)")
_COPY = re.compile(r"^/storage/v1/b/[^/]+/o/.+/(?:copyTo|rewriteTo)/b/(?P<bucket>[^/]+)/o/(?P<object>.+)$")


@dataclass(frozen=True)
class Need:
    """What one request needs: ``permissions`` on the bucket, about an ``object`` or the bucket itself."""

    permissions: tuple[str, ...]
    about_object: bool = True


def is_test_permissions(path: str) -> bool:
    """Whether the request is buckets.testIamPermissions (answered from the policy, not the emulator)."""
    return _TEST_PERMISSIONS.match(path) is not None


def bucket_of(path: str) -> str | None:
    """The bucket a JSON-API path names, None for the bucket list."""
    match = _ANY_BUCKET.match(path)
    return match["bucket"] if match else None


def need_of(method: str, path: str, name: str | None, exists: Callable[[str], bool]) -> Need | None:
    """The permissions a request needs (None: none, as testIamPermissions). ``name``: the object an
    upload names in its query; ``exists(name)``: whether the bucket holds it already (an overwrite)."""
    if _TEST_PERMISSIONS.match(path):
        return None
    if _BUCKETS.match(path):
        return Need(("storage.buckets.create" if method == "POST" else "storage.buckets.list",), False)
    if _BUCKET.match(path):
        verb = {"GET": "get", "DELETE": "delete"}.get(method, "update")
        return Need((f"storage.buckets.{verb}",), False)
    copy = _COPY.match(path)
    if copy:
        overwrite = ("storage.objects.delete",) if exists(copy["object"]) else ()
        return Need(("storage.objects.get", "storage.objects.create", *overwrite))
    if _OBJECTS.match(path):
        if method == "GET":
            return Need(("storage.objects.list",), False)
        overwrite = ("storage.objects.delete",) if name is not None and exists(name) else ()
        return Need(("storage.objects.create", *overwrite))
    if _OBJECT.match(path):
        verb = {"GET": "get", "HEAD": "get", "DELETE": "delete", "POST": "create"}.get(method, "update")
        return Need((f"storage.objects.{verb}",))
    # Anything else (the XML API, batch requests): the strictest reading, a write that may delete.
    return Need(("storage.objects.create", "storage.objects.delete"))


def refusal(world: World, headers: Mapping[str, str], need: Need) -> Refusal | None:
    """Cloud Storage's 401 or 403 for a request that lacks ``need``, None when the caller holds it."""
    token = iam.bearer_token(headers)
    email = iam.account_of(world, token)
    if token is not None and email is None:
        return _error(401, "Invalid Credentials", "authError", header=True)
    for permission in need.permissions:
        if email is not None and iam.allowed(world, world.project, email, permission):
            continue
        what = "object" if need.about_object else "bucket"
        who = email or "Anonymous caller"
        message = (
            f"{who} does not have {permission} access to the Google Cloud Storage {what}. "
            f"Permission '{permission}' denied on resource (or it may not exist)."
        )
        if email is None:
            return _error(401, message, "required", header=True)
        return _error(403, message, "forbidden")
    return None


def tested_permissions(
    world: World, headers: Mapping[str, str], asked: list[str], *, exists: bool
) -> Refusal:
    """buckets.testIamPermissions: which of ``asked`` the caller holds on the bucket (any caller may
    ask; an unknown token is still 401, a bucket that does not exist 404)."""
    token = iam.bearer_token(headers)
    email = iam.account_of(world, token)
    if token is not None and email is None:
        return _error(401, "Invalid Credentials", "authError", header=True)
    if not exists:
        return _error(404, "The specified bucket does not exist.", "notFound")
    held = [p for p in asked if email is not None and iam.allowed(world, world.project, email, p)]
    body: dict[str, Any] = {"kind": "storage#testIamPermissionsResponse"}
    if held:
        body["permissions"] = held
    return 200, body


def _error(status: int, message: str, reason: str, *, header: bool = False) -> Refusal:
    entry: dict[str, Any] = {"message": message, "domain": "global", "reason": reason}
    if header:
        entry.update({"locationType": "header", "location": "Authorization"})
    return status, {"error": {"code": status, "message": message, "errors": [entry]}}
