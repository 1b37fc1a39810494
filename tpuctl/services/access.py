"""How tpuctl gets into a slice's hosts, whoever created the slice (``pod create`` or a run).

At creation a slice gets a public key in its ``ssh-keys`` metadata (the state dir's key for ``pod create``,
the run's own key for a run) and an external IP per host, unless a ProxyCommand (e.g. an IAP tunnel)
reaches the internal addresses. The API's default for an omitted ``networkConfig`` is no external IP, so
it is asked for explicitly.

At login (:func:`host_login`), OS Login decides which of two ways lets the key in
(docs/google-facts.md#os-login):

- OS Login off: the guest agent writes the ``ssh-keys`` lines into the user's authorized_keys; tpuctl logs
  in as ``tpuctl``, the user its lines name;
- OS Login on: the guest ignores ``ssh-keys`` and accepts only the keys imported through the OS Login API
  for a Google account, under that account's POSIX username. tpuctl imports its key for the caller (the
  account of its credentials) with an expiry (the ``os_login_key_ttl`` setting) so that a run's keys do not
  pile up in the caller's profile, renews it before a new connection once half of it is spent, and logs in
  as the profile's primary POSIX account.

Whether it is on: the node's own ``enable-oslogin`` metadata (a TPU API node's, a Compute Engine
instance's) where it is set, else the project's (``projects.get``: its common instance metadata; the
``compute.requireOsLogin`` organization policy works through it, setting it TRUE on new projects and
refusing FALSE at either level), else off. A caller who may not read the project's metadata is told so
when a host refuses the key.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpuctl.errors import PermissionDeniedError, UsageError

if TYPE_CHECKING:
    from tpuctl.cloud.base import Node
    from tpuctl.cloud.instances import VmInstance
    from tpuctl.cloud.oslogin import OsLoginAccess
    from tpuctl.hosts.ssh import HostLogin, KeyPair
    from tpuctl.services.placement import PlacementRequest
    from tpuctl.services.session import Session

#: The public key a plan shows in place of the real one (a plan creates no key).
PLAN_PUBLIC_KEY = "<tpuctl public key>"


def ssh_key_metadata(session: Session, *, plan: bool, public_openssh: str | None = None) -> dict[str, str]:
    """The node metadata item that authorizes ``public_openssh`` (None: the state dir's key). A plan shows
    a placeholder and creates no key."""
    from tpuctl.hosts.ssh import DEFAULT_USERNAME, ssh_keys_metadata

    public = PLAN_PUBLIC_KEY if plan else public_openssh or _state_dir_key(session)
    return {"ssh-keys": ssh_keys_metadata(DEFAULT_USERNAME, public)}


def with_host_access(
    session: Session,
    placement: PlacementRequest,
    *,
    proxy_command: str | None,
    plan: bool,
    public_openssh: str | None = None,
) -> PlacementRequest:
    """``placement`` with ``public_openssh`` (None: the state dir's key) in its metadata and external
    IPs unless ``proxy_command``. The ``ssh-keys`` item goes in whether OS Login is on or not: it is
    ignored while OS Login is on, and lets tpuctl in should OS Login be turned off."""
    extra = ssh_key_metadata(session, plan=plan, public_openssh=public_openssh)
    return dataclasses.replace(
        placement, metadata={**placement.metadata, **extra}, external_ips=proxy_command is None
    )


@dataclass(frozen=True)
class OsLoginSetting:
    """Whether OS Login decides who logs in to a node's hosts, and what said so."""

    enabled: bool
    #: Which level decided, for messages ("the metadata of node n", "project p's metadata", ...).
    decided_by: str
    #: Why the project's metadata could not be read, when it could not (then ``enabled`` is a guess).
    unknown: str | None = None

    def describe(self) -> str:
        state = "on" if self.enabled else "off"
        if self.unknown is not None:
            return f"{state}? ({self.decided_by}; {self.unknown})"
        return f"{state} ({self.decided_by})"


def project_os_login(access: OsLoginAccess, project: str) -> OsLoginSetting:
    """``project``'s OS Login setting: its common instance metadata, else off."""
    try:
        says = access.project_says(project)
    except PermissionDeniedError as exc:
        return OsLoginSetting(
            False,
            f"the metadata of project {project} could not be read, so tpuctl assumes off",
            unknown=f"{exc.message}; reading it takes compute.projects.get, e.g. roles/compute.viewer",
        )
    if says is None:
        return OsLoginSetting(False, f"enable-oslogin is set neither on the slice nor on project {project}")
    return OsLoginSetting(says, f"enable-oslogin in the metadata of project {project}")


def node_os_login(node: Node, project: Callable[[], OsLoginSetting]) -> OsLoginSetting:
    """OS Login on ``node``'s hosts: the node's own metadata where it sets it, else the project's
    (``project``: read when needed)."""
    from tpuctl.cloud.oslogin import metadata_says

    says = metadata_says(node.metadata)
    if says is not None:
        return OsLoginSetting(says, f"enable-oslogin in the metadata of {node.name}")
    return project()


def host_login(session: Session, nodes: Sequence[Node], key: KeyPair) -> HostLogin:
    """How tpuctl logs in to the hosts of ``nodes`` with ``key``: through OS Login (the key imported
    for the caller, the login its POSIX name) where it is on, else through the nodes' ``ssh-keys``
    (refused up front, naming the fix, when a node's metadata lacks the key)."""
    # The project's setting is read once, and only where a node's own metadata leaves it open.
    project = functools.cache(lambda: project_os_login(session.os_login(), session.project))
    settings = [node_os_login(node, project) for node in nodes]
    if any(s.enabled for s in settings):
        if not all(s.enabled for s in settings):
            mixed = ", ".join(f"{n.name}: {s.describe()}" for n, s in zip(nodes, settings, strict=True))
            raise UsageError(
                f"OS Login is on for some slices of the run and off for others ({mixed}): tpuctl logs in "
                "to all of them as one user",
                fix="set enable-oslogin alike on every slice (or only on the project)",
            )
        return _os_login_login(session, key, settings[0])
    for node in nodes:
        _refuse_unauthorized(session, node, key)
    return _metadata_login(session, settings[0] if settings else project())


def vm_login(session: Session, vm: VmInstance, key: KeyPair) -> HostLogin:
    """How tpuctl logs in to a general-purpose VM (the team server's) with ``key``: through OS Login where
    the VM's metadata, else the project's, turns it on (the key imported for the caller, as for slices);
    else as the user whose ``ssh-keys`` line carries the key, refused up front when none does."""
    from tpuctl.cloud.oslogin import metadata_says
    from tpuctl.hosts.ssh import HostLogin

    says = metadata_says(vm.metadata)
    setting = (
        OsLoginSetting(says, f"enable-oslogin in the metadata of VM {vm.name}")
        if says is not None
        else project_os_login(session.os_login(), session.project)
    )
    if setting.enabled:
        return _os_login_login(session, key, setting)
    wanted = key.public_openssh.split()[:2]
    for line in vm.metadata.get("ssh-keys", "").splitlines():
        user, _, value = line.strip().partition(":")
        if user and value.split()[:2] == wanted:
            return HostLogin(
                user,
                authorized_by=f"VM {vm.name}'s ssh-keys metadata (OS Login {setting.describe()})",
                refused_fix=f"check that VM {vm.name}'s ssh-keys metadata still has the key",
            )
    raise UsageError(
        f"VM {vm.name} lets tpuctl's key in neither through OS Login ({setting.describe()}) nor through "
        "its ssh-keys metadata",
        field="vm",
        value=vm.name,
        fix=f"set enable-oslogin=TRUE in VM {vm.name}'s metadata (server up creates it so)",
    )


def _os_login_login(session: Session, key: KeyPair, setting: OsLoginSetting) -> HostLogin:
    """The key imported for the caller (expiring after ``os_login_key_ttl``), the login its POSIX name."""
    from tpuctl.cloud.oslogin import roles_fix
    from tpuctl.hosts.ssh import HostLogin

    access = session.os_login()
    project, ttl_s = session.project, session.settings.os_login_key_ttl
    expires_at = [0.0]
    lock = threading.Lock()

    def authorize() -> str:
        with lock:
            until = session.clock() + ttl_s
            account = access.authorize_key(project, key.public_openssh, expires_at=until)
            expires_at[0] = until
            return account.username

    def renew() -> None:
        # Only a key past half its lifetime is imported again: a reconnect costs no call before that.
        if session.clock() >= expires_at[0] - ttl_s / 2:
            authorize()

    username = authorize()
    email = access.caller()
    return HostLogin(
        username,
        authorized_by=f"OS Login ({setting.decided_by}), as {email}'s POSIX account {username}",
        refused_fix=f"OS Login lets {email} in only with an OS Login role: {roles_fix(email, project)}",
        renew=renew,
    )


def _metadata_login(session: Session, setting: OsLoginSetting) -> HostLogin:
    from tpuctl.hosts.ssh import DEFAULT_USERNAME, HostLogin

    fix = (
        "check that tpuctl's key is in the slice's ssh-keys metadata (`tpuctl pod describe`) and that OS "
        "Login is off: where it is on, hosts ignore ssh-keys"
    )
    if setting.unknown is not None:
        fix += (
            f"; tpuctl could not tell whether it is on for project {session.project} ({setting.unknown}): "
            "grant that permission and tpuctl imports its key through OS Login where it is on"
        )
    return HostLogin(
        DEFAULT_USERNAME,
        authorized_by=f"the slice's ssh-keys metadata (OS Login {setting.describe()})",
        refused_fix=fix,
    )


def _refuse_unauthorized(session: Session, node: Node, key: KeyPair) -> None:
    if ssh_keys_authorize(node, key.public_openssh):
        return
    from tpuctl.hosts.ssh import fingerprint

    raise UsageError(
        f"pod {node.name} does not authorize the run's SSH key ({fingerprint(key.public_openssh)}): its "
        "ssh-keys metadata lacks it and OS Login is off",
        field="pod",
        value=node.name,
        fix=f"create the slice with `tpuctl pod create` (which adds the key), or add the line from "
        f"{session.state_dir / 'ssh' / 'tpuctl_ed25519.pub'} (as tpuctl:KEY) to the node's ssh-keys",
    )


def ssh_keys_authorize(node: Node, public_openssh: str) -> bool:
    """Whether ``node``'s ``ssh-keys`` metadata carries ``public_openssh`` (for any user)."""
    key = public_openssh.split()[:2]
    for line in node.metadata.get("ssh-keys", "").splitlines():
        _user, _, value = line.partition(":")
        if value.split()[:2] == key:
            return True
    return False


def _state_dir_key(session: Session) -> str:
    from tpuctl.hosts.ssh import ensure_key_pair

    return ensure_key_pair(session.state_dir).public_openssh
