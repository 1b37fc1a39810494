"""Who a request is made by: the principal and their role in each workspace they belong to.

Services take the actor from their ``Session`` (``Session.actor``) and never ask where it came from: the
server builds one per request from a verified ID token and the workspace file; a command without a server
runs as ``local_actor()`` (the machine's user, admin of the implicit workspace, seeing everything).

Contract every service keeps:
- what it writes for a run, a slice, an attempt or a cost event carries a principal and a workspace: the
  actor's for a new run or a slice made outside a run, the run's own for everything done for a run (a
  replica that recovers a run writes as the run's owner, not as itself);
- what it reads is limited to ``Actor.visible`` (None: all): a run or slice of another workspace is not
  found, exactly as one that does not exist (``NameNotFoundError``, 404 on the API), never "forbidden";
- what it changes needs ``Actor.may_change`` on the target's workspace: ``ForbiddenError`` (403) when the
  actor sees the workspace but only as a viewer.
"""

from __future__ import annotations

import getpass
from collections.abc import Mapping
from dataclasses import dataclass, field

from tpuctl.errors import UsageError
from tpuctl.store.records import LOCAL_WORKSPACE
from tpuctl.teams.workspaces import Role


class ForbiddenError(UsageError):
    """The actor may see the target but not change it (a viewer's mutating request): HTTP 403."""

    exit_code = 13  # EXIT_PERMISSION
    kind = "forbidden"


@dataclass(frozen=True)
class Actor:
    """A principal (an email on a server; the OS user's name locally) and their role per workspace."""

    principal: str
    roles: Mapping[str, Role] = field(default_factory=dict)
    #: True: sees every workspace, also rows written before workspaces existed (a local user, the
    #: server's own replica). False: only ``roles``' workspaces.
    sees_all: bool = False

    @property
    def visible(self) -> frozenset[str] | None:
        """The workspaces whose runs, slices and costs this actor may read; None: all of them."""
        return None if self.sees_all else frozenset(self.roles)

    def role(self, workspace: str | None) -> Role | None:
        """The actor's role in ``workspace`` (None, a row from before workspaces: the local one)."""
        ws = workspace or LOCAL_WORKSPACE
        if ws in self.roles:
            return self.roles[ws]
        return Role.ADMIN if self.sees_all else None

    def may_see(self, workspace: str | None) -> bool:
        return self.role(workspace) is not None

    def may_change(self, workspace: str | None) -> bool:
        role = self.role(workspace)
        return role is not None and role.may_change

    def check_change(self, workspace: str | None, what: str) -> None:
        """``ForbiddenError`` unless the actor may change ``what`` in ``workspace``. Call only after the
        target was found through ``visible`` (an invisible one is not found, not forbidden)."""
        if not self.may_change(workspace):
            ws = workspace or LOCAL_WORKSPACE
            raise ForbiddenError(
                f"{self.principal} is a viewer of workspace {ws} and may not {what}",
                field="workspace",
                value=ws,
                fix="ask an admin of that workspace to make you a member",
            )

    def submit_workspace(self, asked: str | None) -> str:
        """The workspace a new run or slice of this actor goes into: ``asked`` (``--workspace``), else the
        only one the actor may change. Exit 2 naming the choices when that is ambiguous or not allowed."""
        changeable = sorted(ws for ws, role in self.roles.items() if role.may_change)
        if asked is not None:
            if not self.may_see(asked):
                raise UsageError(
                    f"{self.principal} is not a member of workspace {asked}",
                    field="--workspace",
                    value=asked,
                    fix=f"choose one of: {', '.join(changeable) or '(none)'}",
                )
            self.check_change(asked, "start runs or slices there")
            return asked
        if self.sees_all and not changeable:
            return LOCAL_WORKSPACE
        if len(changeable) == 1:
            return changeable[0]
        raise UsageError(
            f"{self.principal} may submit to {len(changeable)} workspaces; say which",
            field="--workspace",
            fix=f"add --workspace with one of: {', '.join(changeable) or '(none)'}",
        )


def local_actor() -> Actor:
    """A command run without a server: this machine's user, admin of the implicit local workspace, seeing
    every row of its ledger (as before workspaces)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        name = "local"
    return Actor(principal=name, roles={LOCAL_WORKSPACE: Role.ADMIN}, sees_all=True)


#: The server's own supervisors (replicas): they see all and write each run's rows as the run's owner.
def replica_actor(replica_id: str) -> Actor:
    return Actor(principal=f"replica:{replica_id}", roles={}, sees_all=True)
