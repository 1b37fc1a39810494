"""Before anything is created: can the run's hosts and its caller use the checkpoint bucket?

A host whose service account may not write the bucket fails at its first gs:// access (JAX's compilation
cache, the first checkpoint) with a 403 traceback, after the slice was paid for. So the run asks first:
the caller's own permissions through Cloud Storage's testIamPermissions (``tpuctl.cloud.buckets``), the
hosts' account's through Policy Troubleshooter (``tpuctl.cloud.account_access``). A definite no is a
usage error (exit 2) that names the bucket, the account and the role to grant; where Google cannot tell
(a condition, policies the caller may not read, a project whose default account the caller may not look
up) the run goes ahead, as it would have without the check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tpuctl.cloud.account_access import Access, AccountAccess
from tpuctl.cloud.buckets import WRITE_PERMISSIONS, BucketClient
from tpuctl.cloud.iam import ROLES_REFERENCE, role_for
from tpuctl.errors import CloudError, NotFoundError, UsageError

if TYPE_CHECKING:
    from tpuctl.services.session import Session

#: What a run's hosts do in the bucket: write, read back, list, and overwrite or delete old checkpoints
#: (``WRITE_PERMISSIONS``), and read the bucket's own metadata (orbax's cleanup asks whether the bucket
#: has a hierarchical namespace).
HOSTS_NEED = (*WRITE_PERMISSIONS, "storage.buckets.get")
#: What the caller does there: puts a run's files in and reads its checkpoints' records back.
CALLER_NEEDS = ("storage.objects.create", "storage.objects.get", "storage.objects.list")


def check_bucket(session: Session, bucket: str, service_account: str | None) -> None:
    """Raise UsageError when the caller or the hosts' account (``service_account``, else the project's
    default) surely cannot use ``bucket``; return quietly when they can or Google cannot tell."""
    _check_caller(session.buckets(), bucket)
    closers: list[Callable[[], None]] = []
    access = session.backend.open_account_access(session.cloud, closers)
    try:
        account = service_account or _default_account(access, session.project)
        if account is not None:
            _check_hosts(access, bucket, account)
    finally:
        while closers:
            closers.pop()()


def _check_caller(buckets: BucketClient, bucket: str) -> None:
    try:
        held = buckets.held_permissions(bucket, CALLER_NEEDS)
    except NotFoundError:
        raise UsageError(
            f"the checkpoint bucket gs://{bucket} does not exist (or you may not see it)",
            field="bucket",
            value=bucket,
            fix=f"create it (`gcloud storage buckets create gs://{bucket} --location REGION`), or name "
            "another with --bucket",
        ) from None
    except CloudError:
        return  # cannot ask: the run goes ahead as it would have without the check
    lacking = [p for p in CALLER_NEEDS if p not in held]
    if lacking:
        raise _refusal(bucket, "your account", "your account", None, lacking)


def _check_hosts(access: AccountAccess, bucket: str, account: str) -> None:
    lacking: list[str] = []
    for permission in HOSTS_NEED:
        try:
            verdict = access.bucket_access(account, bucket, permission)
        except CloudError:
            return  # Policy Troubleshooter refused or is not enabled: cannot tell
        if verdict is Access.UNKNOWN:
            return
        if verdict is Access.NOT_GRANTED:
            lacking.append(permission)
    if lacking:
        raise _refusal(bucket, f"the hosts' service account {account}", account, account, lacking)


def _default_account(access: AccountAccess, project: str) -> str | None:
    try:
        return access.default_service_account(project)
    except CloudError:
        return None  # a caller without Compute Engine's projects.get: the hosts' account is unknown


def _refusal(bucket: str, who: str, grantee: str, account: str | None, lacking: list[str]) -> UsageError:
    roles = sorted({role_for(p) or ROLES_REFERENCE for p in lacking})
    # The caller's own e-mail is the account gcloud is logged in as (a shell fills it in).
    member = f"serviceAccount:{account}" if account else "user:$(gcloud config get account)"
    commands = " and ".join(
        f"`gcloud storage buckets add-iam-policy-binding gs://{bucket} --member={member} --role={role}`"
        for role in roles
        if role.startswith("roles/")
    )
    return UsageError(
        f"{who} cannot use the checkpoint bucket gs://{bucket}: it lacks {', '.join(lacking)}",
        field="bucket",
        value=bucket,
        fix=f"grant {grantee} {' and '.join(roles)} on gs://{bucket} ({commands}), or name a bucket it can "
        "write with --bucket",
    )
