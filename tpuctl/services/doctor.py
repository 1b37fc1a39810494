"""`tpuctl doctor`: every check of the setup, each on its own, so one failure does not hide the others.

The checks run in order (config file, profile, backend, credentials, project, API, quotas, OS Login,
Compute Engine permission, guest attributes, bucket, what the backstop needs, state dir, ledger); one
that needs what an earlier one failed to give is *skipped*, not failed again. A check may *warn*:
something that stops part of tpuctl, not all of it (no Compute Engine permission: TPU API slices still
work). The command's exit code is the first failure's own (no credentials: 13), so a script learns the
same thing from doctor as from the command that would have failed; a warning alone exits 0.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tpuctl.errors import EXIT_ERROR, TpuctlError

if TYPE_CHECKING:
    from tpuctl.backends.base import Backend
    from tpuctl.cloud.base import TpuCloud
    from tpuctl.cloud.oslogin import OsLoginAccess
    from tpuctl.settings import Settings

OK: Final = "ok"
WARN: Final = "warn"
FAIL: Final = "FAIL"
SKIPPED: Final = "skipped"


class Warned(Exception):
    """Raised by a check that passes with a reservation: what does not work, and how to fix it."""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class Check:
    """One row of the report."""

    check: str
    status: str  # OK | WARN | FAIL | SKIPPED
    detail: str
    fix: str | None = None
    exit_code: int | None = None  # a failure's own exit code

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status, "ok": self.status == OK, "detail": self.detail,
                "fix": self.fix}  # fmt: skip


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    @property
    def exit_code(self) -> int:
        """0, or the first failure's exit code."""
        return next((c.exit_code or EXIT_ERROR for c in self.checks if c.status == FAIL), 0)

    def run(self, name: str, fn: Callable[[], str], *, needs: bool = True) -> bool:
        """Run ``fn`` as check ``name`` (skipped unless ``needs``); whether it passed."""
        if not needs:
            self.checks.append(Check(name, SKIPPED, "needs an earlier check to pass"))
            return False
        try:
            detail = fn()
        except Warned as warned:
            self.checks.append(Check(name, WARN, warned.message, warned.fix))
            return False
        except TpuctlError as exc:
            self.checks.append(Check(name, FAIL, exc.message, exc.fix, exc.exit_code))
            return False
        except Exception as exc:  # a check reports whatever went wrong; doctor itself goes on
            self.checks.append(Check(name, FAIL, f"{type(exc).__name__}: {exc}", None, EXIT_ERROR))
            return False
        self.checks.append(Check(name, OK, detail))
        return True


def diagnose(
    load_settings: Callable[[], Settings],
    environ: Mapping[str, str] = os.environ,
    *,
    backend: Backend | None = None,
) -> Report:
    """Every check, in order; ``load_settings`` builds the settings as the command would; ``backend``, when
    given, is checked instead of the one the settings choose."""
    from tpuctl.settings import default_config_path

    report = Report()
    found: dict[str, Any] = {}

    def config() -> str:
        settings = found["settings"] = load_settings()
        path = settings.config_file or default_config_path(environ)
        return f"{path}" + ("" if Path(path).exists() else " (not there: defaults apply)")

    settings_ok = report.run("config file", config)
    settings: Settings | None = found.get("settings")
    report.run("profile", lambda: _profile(settings), needs=settings_ok)
    backend_ok = report.run("backend", lambda: _backend(found, settings, backend), needs=settings_ok)
    closers: list[Callable[[], None]] = []
    try:
        cloud_ok = report.run("credentials", lambda: _credentials(found, closers), needs=backend_ok)
        cloud: TpuCloud | None = found.get("cloud")
        given = settings.project if settings is not None else None
        report.run(
            "project", lambda: given or (cloud.project if cloud else ""), needs=bool(given) or cloud_ok
        )
        reached = report.run(
            "api reachable",
            lambda: f"{len(cloud.list_zones())} zones listed" if cloud else "",
            needs=cloud_ok,
        )
        report.run(
            "quotas readable",
            lambda: f"{len(cloud.quota_limits())} quota limits" if cloud else "",
            needs=reached,
        )
        report.run("os login", lambda: _os_login(found, closers), needs=reached)
        compute = report.run("compute permission", lambda: _compute_permission(found, closers), needs=reached)
        report.run("guest attributes", lambda: _guest_attributes(found), needs=compute)
        report.run("bucket", lambda: _bucket(found, closers), needs=cloud_ok)
        report.run("backstop", lambda: _backstop(settings), needs=settings_ok)
    finally:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                close()
    state_ok = report.run("state dir", lambda: _state_dir(found, settings), needs=settings_ok)
    report.run("ledger", lambda: _ledger(settings), needs=state_ok)
    return report


def _profile(settings: Settings | None) -> str:
    assert settings is not None
    return settings.profile or "default (none chosen)"


def _backend(found: dict[str, Any], settings: Settings | None, given: Backend | None) -> str:
    from tpuctl.backends import open_backend

    assert settings is not None
    backend: Backend = given or open_backend(settings)
    found["backend"] = backend
    where = f" at {settings.sim_url}" if settings.sim_url else ""
    return f"{backend.name}{where}"


def _credentials(found: dict[str, Any], closers: list[Callable[[], None]]) -> str:
    from tpuctl.store.paths import ensure_private_dir

    backend: Backend = found["backend"]
    settings: Settings = found["settings"]
    cloud = backend.open_cloud(ensure_private_dir(settings.resolved_state_dir), closers)
    closers.append(cloud.close)
    found["cloud"] = cloud
    return f"found, for {cloud.endpoint}"


def _os_login(found: dict[str, Any], closers: list[Callable[[], None]]) -> str:
    """Whether OS Login is on for the project and, where it is, the account runs log in as: a failure
    where it is on and tpuctl cannot tell who the caller is or may not read the caller's profile."""
    from tpuctl.cloud.oslogin import roles_fix
    from tpuctl.errors import PermissionDeniedError
    from tpuctl.services.access import project_os_login

    cloud: TpuCloud = found["cloud"]
    access = _access(found, closers)
    setting = project_os_login(access, cloud.project)
    if not setting.enabled:
        return f"{setting.describe()}: runs log in as tpuctl through their slices' ssh-keys metadata"
    email = access.caller()
    try:
        profile = access.client.login_profile(email, cloud.project)
    except PermissionDeniedError as exc:
        raise PermissionDeniedError(
            f"OS Login is on for project {cloud.project}, and it refused to show the profile of {email}: "
            f"{exc.message}",
            code=exc.code,
            fix=roles_fix(email, cloud.project),
        ) from None
    who = profile.primary.username if profile.accounts else "its POSIX account (made at the first import)"
    return (
        f"{setting.describe()}: runs import their key for {email} and log in as {who}, which takes "
        "roles/compute.osAdminLogin or roles/compute.osLogin on the project"
    )


def _access(found: dict[str, Any], closers: list[Callable[[], None]]) -> OsLoginAccess:
    """The backend's OS Login access (it also reads the project's metadata), opened once."""
    if "access" not in found:
        backend: Backend = found["backend"]
        found["access"] = backend.open_os_login(found["cloud"], closers)
    access: OsLoginAccess = found["access"]
    return access


def _compute_permission(found: dict[str, Any], closers: list[Callable[[], None]]) -> str:
    """Whether Compute Engine answers the caller (``projects.get``, which the project's settings below
    need too): a refusal warns, since TPU API slices work without it (docs/google-facts.md#two-surfaces)."""
    from tpuctl.errors import PermissionDeniedError

    cloud: TpuCloud = found["cloud"]
    try:
        found["project_metadata"] = _access(found, closers).project_metadata(cloud.project)
    except PermissionDeniedError as exc:
        raise Warned(
            f"Compute Engine refused the caller on project {cloud.project} ({exc.message}): its TPU slices "
            "(TPU7x and later, and any made with --api compute) cannot be listed, made or reached, and the "
            "project's OS Login and guest attributes settings cannot be read; TPU API slices still work",
            fix=f"grant roles/compute.admin (to make Compute Engine slices) or at least "
            f"roles/compute.viewer (to read them and the project's settings) on project {cloud.project}",
        ) from None
    return f"Compute Engine answers for project {cloud.project} (compute.projects.get)"


def _guest_attributes(found: dict[str, Any]) -> str:
    """The project's ``enable-guest-attributes``: without it (on the project or the instance) a Compute
    Engine VM publishes no SSH host key and tpuctl cannot connect (docs/google-facts.md#guest-attributes).
    tpuctl sets it on every instance it makes, so only a slice made elsewhere depends on the project's."""
    from tpuctl.cloud.compute_shapes import GUEST_ATTRIBUTES_KEY

    cloud: TpuCloud = found["cloud"]
    value = found["project_metadata"].get(GUEST_ATTRIBUTES_KEY)
    if value is not None and value.strip().lower() == "true":
        return f"on for project {cloud.project}: every Compute Engine VM publishes its SSH host keys"
    said = "not set" if value is None else f"{value!r}"
    return (
        f"{GUEST_ATTRIBUTES_KEY} is {said} in the metadata of project {cloud.project}: tpuctl sets it on "
        "every Compute Engine slice it makes, so their hosts publish their SSH host keys; a slice made "
        f"elsewhere (run --pod) needs {GUEST_ATTRIBUTES_KEY}=TRUE in its own metadata or the project's"
    )


def _bucket(found: dict[str, Any], closers: list[Callable[[], None]]) -> str:
    """The bucket runs checkpoint to (the profile's, else the backend's own): it exists and the caller may
    write it (buckets.testIamPermissions); where it is, when the caller may read that."""
    from tpuctl.cloud.buckets import WRITE_PERMISSIONS
    from tpuctl.errors import NotFoundError, PermissionDeniedError
    from tpuctl.store.paths import ensure_private_dir

    settings: Settings = found["settings"]
    backend: Backend = found["backend"]
    name = settings.bucket or backend.default_bucket
    if not name:
        raise Warned(
            "no bucket is named: a run on spot capacity is refused, and no run keeps a checkpoint past its "
            "slice",
            fix="name one every host can write: `bucket: BUCKET` in the profile (or run --bucket BUCKET)",
        )
    bucket = name.removeprefix("gs://").strip("/")
    client = backend.open_buckets(ensure_private_dir(settings.resolved_state_dir), closers)
    try:
        where = f" in {client.location(bucket).location}"
    except PermissionDeniedError:
        # roles/storage.objectAdmin writes objects without storage.buckets.get: the write test decides.
        where = " (its location is hidden from the caller: storage.buckets.get)"
    except NotFoundError:
        raise NotFoundError(
            f"bucket gs://{bucket} does not exist",
            fix=f"create it in the region runs are placed in (`gcloud storage buckets create gs://{bucket} "
            "--location REGION`), or name another",
        ) from None
    missing = [p for p in WRITE_PERMISSIONS if p not in client.held_permissions(bucket, WRITE_PERMISSIONS)]
    if missing:
        raise PermissionDeniedError(
            f"the caller cannot write bucket gs://{bucket}: it lacks {', '.join(missing)}",
            fix=f"grant the caller roles/storage.objectAdmin on gs://{bucket} (`gcloud storage buckets "
            f"add-iam-policy-binding gs://{bucket} --member=user:EMAIL --role=roles/storage.objectAdmin`)",
        )
    return f"gs://{bucket}{where}: the caller can write it ({', '.join(WRITE_PERMISSIONS)})"


def _backstop(settings: Settings | None) -> str:
    """What a run's backstop needs of the hosts' service account (docs/google-facts.md#backstop): said,
    not checked, since whether another account holds a permission takes reading the project's IAM
    policy, which tpuctl does not ask for."""
    assert settings is not None
    account = settings.service_account or "the project's Compute Engine default service account"
    return (
        f"a run's hosts delete its slices when no supervisor is left (after {settings.backstop_grace:g} s, "
        f"backstop_grace): they act as {account}, which needs tpu.nodes.delete (roles/tpu.admin) and, for "
        "Compute Engine slices, compute.instances.delete and compute.instanceGroupManagers.delete "
        "(roles/compute.instanceAdmin.v1); not checked from here"
    )


def _state_dir(found: dict[str, Any], settings: Settings | None) -> str:
    from tpuctl.store.paths import ensure_private_dir

    assert settings is not None
    path = ensure_private_dir(settings.resolved_state_dir)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise TpuctlError(f"state dir {path} is readable by others (mode {mode:o})", fix=f"chmod 700 {path}")
    found["state_dir"] = path
    return f"{path} (mode {mode:o})"


def _ledger(settings: Settings | None) -> str:
    from tpuctl.store.ledger import Ledger

    assert settings is not None
    with Ledger.open(settings.resolved_database) as ledger:
        return str(ledger.integrity_check())
