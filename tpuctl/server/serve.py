"""One `tpuctl server` process: the replica (``replica``) and the API (``app``) served by uvicorn in
this process, on a socket bound here first (a port in use is a plain error, not uvicorn's exit).

SIGTERM and SIGINT: uvicorn stops taking requests and finishes those in flight; then the replica stops
(``Replica.stop``: it adopts nothing more, gives its place among the ledger's servers back, and leaves
its runs' leases to expire for the next server to adopt), and the process exits 0.
"""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from tpuctl.errors import TpuctlError

if TYPE_CHECKING:
    from tpuctl.server.auth import AuthConfig
    from tpuctl.server.listen import Listen
    from tpuctl.services.session import Session
    from tpuctl.teams.workspaces import Workspaces

#: How old a slice's state read from its zone's shared listing may be: a slice watch's own default poll
#: (it sees a preemption no later than it did asking alone).
SLICE_READ_MAX_AGE_S: Final = 1.0


def serve(session: Session, listen: Listen, *, max_runs: int, team: TeamAccess | None = None) -> None:
    """Serve until SIGTERM or SIGINT. ``ReplicaLimitError`` (exit 2) when the ledger has no room for
    another server; ``TpuctlError`` when the address cannot be bound. ``team``: the workspace file and
    audiences that turn authentication on (None: a one-user server on loopback, no tokens)."""
    import dataclasses

    import uvicorn

    from tpuctl.cloud.shared_reads import SharedNodeReads
    from tpuctl.server.app import build_app
    from tpuctl.server.auth import Authenticator
    from tpuctl.server.bundles import BundleStore
    from tpuctl.server.replica import Replica
    from tpuctl.store.records import LeaseOwner

    sock = _bind(listen)
    settings = session.settings
    # Every run's slice watch reads its slice once a second: through one zone listing a second, shared
    # by all of them (``SharedNodeReads``), the replica's reads and CPU grow with its zones, not its runs.
    session = dataclasses.replace(
        session, cloud=SharedNodeReads(session.cloud, max_age_s=SLICE_READ_MAX_AGE_S, clock=session.monotonic)
    )
    replica = Replica(
        session,
        LeaseOwner.of_this_process(),
        listen=str(listen),
        max_runs=max_runs,
        # Often enough that an expired lease is seen within a renewal period of its expiry.
        tick_s=min(settings.lease_renew_every, 2.0),
        workspaces=None if team is None else team.workspaces,
    )
    replica.start()
    try:
        auth = None if team is None else Authenticator(team.config(session, listen))
        app = build_app(session, BundleStore(session.state_dir / "server" / "bundles"), replica, auth=auth)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        server = uvicorn.Server(config)
        print(
            f"tpuctl server: listening on {listen.url} (replica {replica.owner.owner_id}, pid "
            f"{replica.owner.pid}, ledger {settings.resolved_database.text})",
            file=sys.stderr,
            flush=True,
        )
        with _signals_end_quietly():
            server.run(sockets=[sock])
    finally:
        replica.stop()
        sock.close()


@dataclass(frozen=True)
class TeamAccess:
    """A team server's authentication, from `tpuctl server`'s flags: the workspace file (read and
    checked before anything opens), its own audience (None: its URL) and IAP's backend service."""

    workspaces: Workspaces
    audience: str | None = None
    iap_audience: str | None = None

    def config(self, session: Session, listen: Listen) -> AuthConfig:
        from tpuctl.server.auth import AuthConfig

        return AuthConfig(
            workspaces=self.workspaces,
            audience=self.audience or listen.url,
            issuer=session.backend.identity_issuer(session.cloud),
            iap_audience=self.iap_audience,
        )


def _bind(listen: Listen) -> socket.socket:
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((listen.host, listen.port))
    except OSError as exc:
        sock.close()
        raise TpuctlError(
            f"cannot listen on {listen}: {exc.strerror or exc}",
            fix="another process uses that port; pick another with --listen",
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


@contextmanager
def _signals_end_quietly() -> Iterator[None]:
    """uvicorn catches SIGTERM and SIGINT while it serves and raises them again once it has stopped;
    handlers that do nothing here let the stop go on (the replica's, then a normal exit) instead of
    dying on the raised-again signal."""
    before = {sig: signal.signal(sig, lambda signum, frame: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
