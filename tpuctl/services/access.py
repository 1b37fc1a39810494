"""What a new slice needs at creation for tpuctl to reach its hosts, whoever creates it (``pod create``
or a run): a public key in the node's ``ssh-keys`` metadata (how a TPU VM's guest agent authorizes
logins; the state dir's key for ``pod create``, the run's own key for a run) and an external IP per
host, unless a ProxyCommand (e.g. an IAP tunnel) reaches the internal addresses. The API's default for
an omitted ``networkConfig`` is no external IP, so it is asked for explicitly.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.cloud.base import Node
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
    IPs unless ``proxy_command``."""
    extra = ssh_key_metadata(session, plan=plan, public_openssh=public_openssh)
    return dataclasses.replace(
        placement, metadata={**placement.metadata, **extra}, external_ips=proxy_command is None
    )


def authorizes_tpuctl(session: Session, node: Node, *, public_openssh: str | None = None) -> bool:
    """Whether ``node``'s metadata lets tpuctl in with ``public_openssh`` (a run's key; None: the state
    dir's): its ``ssh-keys`` carry the key, or the node turns OS Login on (then the key is registered
    with the OS Login API instead)."""
    if node.metadata.get("enable-oslogin", "").strip().upper() == "TRUE":
        return True
    key = (public_openssh or _state_dir_key(session)).split()[:2]
    for line in node.metadata.get("ssh-keys", "").splitlines():
        _user, _, value = line.partition(":")
        if value.split()[:2] == key:
            return True
    return False


def _state_dir_key(session: Session) -> str:
    from tpuctl.hosts.ssh import ensure_key_pair

    return ensure_key_pair(session.state_dir).public_openssh
