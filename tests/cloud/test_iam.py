"""What a predefined role grants, and which role tpuctl names for a missing permission."""

from __future__ import annotations

import pytest

from tpuctl.cloud.iam import PREDEFINED_ROLES, ROLES_REFERENCE, grant_fix, role_for, role_grants


@pytest.mark.parametrize(
    ("permission", "role"),
    [
        ("tpu.nodes.create", "roles/tpu.admin"),
        ("compute.instances.list", "roles/compute.admin"),
        ("compute.instances.osAdminLogin", "roles/compute.osAdminLogin"),
        ("cloudquotas.quotas.get", "roles/cloudquotas.viewer"),
        ("storage.objects.create", "roles/storage.objectAdmin"),
        ("storage.buckets.get", "roles/storage.legacyBucketReader"),
        ("resourcemanager.projects.getIamPolicy", "roles/iam.securityReviewer"),
        ("bigquery.tables.get", None),
    ],
)
def test_the_role_named_for_a_permission(permission: str, role: str | None) -> None:
    assert role_for(permission) == role
    if role is not None:  # the role named must hold the permission it is named for
        assert role_grants(role, permission)


def test_tpu_admin_holds_no_compute_permission_and_the_basic_roles_hold_both() -> None:
    assert role_grants("roles/tpu.admin", "tpu.nodes.list")
    assert not role_grants("roles/tpu.admin", "compute.instances.list")
    assert role_grants("roles/editor", "compute.instances.create") and role_grants(
        "roles/owner", "tpu.nodes.create"
    )
    assert not role_grants("roles/editor", "resourcemanager.projects.getIamPolicy")
    assert role_grants("roles/viewer", "compute.instances.list")
    assert not role_grants("roles/viewer", "compute.instances.create")
    assert not role_grants("roles/viewer", "storage.objects.get")
    assert not role_grants("roles/no.such", "tpu.nodes.list")


def test_object_creator_writes_but_neither_reads_nor_deletes() -> None:
    assert role_grants("roles/storage.objectCreator", "storage.objects.create")
    assert not role_grants("roles/storage.objectCreator", "storage.objects.delete")
    assert not role_grants("roles/storage.objectCreator", "storage.objects.get")
    assert not role_grants("roles/storage.objectAdmin", "storage.buckets.get")
    assert set(PREDEFINED_ROLES) >= {"roles/storage.objectAdmin", "roles/compute.admin", "roles/tpu.admin"}


def test_grant_fix_names_the_role_or_the_reference() -> None:
    assert grant_fix("compute.instances.list") == (
        "grant the caller roles/compute.admin (it holds compute.instances.list) on the project"
    )
    assert ROLES_REFERENCE in grant_fix("bigquery.tables.get", "a@b.c", "gs://x")
