"""A command's session: the backend, the cloud client, the ledger and the catalog, opened once and closed.

The backend (``tpuctl.backends``) is chosen here, once; services ask it, never which one it is. With the
simulator and no ``sim_url``, a simulator server is started in-process on an ephemeral loopback port for
the life of the session; its state lives in the state dir, so one command sees what the previous one did.

A backend may also be given (``open_session(settings, backend=...)``: a test's in-process simulator,
``tpuctl.testing.backend``). The session's clock, monotonic clock and sleep are the backend's
(``Backend.timekeeping``): on a test's fake clock every wait of the services moves simulated time instead
of sleeping.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.catalog import Catalog
from tpuctl.settings import Settings
from tpuctl.store.paths import ensure_private_dir

if TYPE_CHECKING:
    from tpuctl.backends.base import Backend
    from tpuctl.cloud.base import TpuCloud
    from tpuctl.cloud.buckets import BucketClient
    from tpuctl.cloud.oslogin import OsLoginAccess
    from tpuctl.store.ledger import Ledger
    from tpuctl.teams.actor import Actor


def _local_actor() -> Actor:
    from tpuctl.teams.actor import local_actor

    return local_actor()


@dataclass
class _Opened:
    """The clients a session opens on first use (one lock: two threads never open one twice)."""

    os_login: OsLoginAccess | None = None
    buckets: BucketClient | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Session:
    """What a service needs from the outside world. Build with ``open_session``; close when done."""

    settings: Settings
    backend: Backend
    catalog: Catalog
    cloud: TpuCloud
    ledger: Ledger
    state_dir: Path
    clock: Callable[[], float] = time.time
    #: Elapsed time and deadlines (never goes back): the backend's (``Backend.timekeeping``).
    monotonic: Callable[[], float] = time.monotonic
    #: How the services wait (polls, retries): the backend's.
    sleep: Callable[[float], None] = time.sleep
    #: Who the services act for: what they write is attributed to it, what they read is limited to what it
    #: may see (``tpuctl.teams.actor``). Default: this machine's user, seeing the whole ledger.
    actor: Actor = field(default_factory=_local_actor)
    _closers: list[Callable[[], None]] = field(default_factory=list)
    #: The clients opened on first use, shared by every copy of the session (``dataclasses.replace``:
    #: a server's per-request session with its caller as actor), so none is opened twice.
    _opened: _Opened = field(default_factory=lambda: _Opened(), repr=False)

    @property
    def project(self) -> str:
        return self.cloud.project

    def os_login(self) -> OsLoginAccess:
        """OS Login as the backend reaches it, opened on first use (most commands never log in to a
        host) and closed with the session."""
        opened = self._opened
        with opened.lock:
            if opened.os_login is None:
                opened.os_login = self.backend.open_os_login(self.cloud, self._closers)
            return opened.os_login

    def buckets(self) -> BucketClient:
        """Cloud Storage as the backend reaches it, opened on first use and closed with the session."""
        opened = self._opened
        with opened.lock:
            if opened.buckets is None:
                opened.buckets = self.backend.open_buckets(self.state_dir, self._closers)
            return opened.buckets

    def describe_backend(self) -> dict[str, Any]:
        return {"backend": self.backend.name, "project": self.project, "endpoint": self.cloud.endpoint}

    def close(self) -> None:
        while self._closers:
            closer = self._closers.pop()
            # Closing must not mask the command's own outcome.
            with contextlib.suppress(Exception):
                closer()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_session(
    settings: Settings, *, catalog: Catalog | None = None, backend: Backend | None = None
) -> Session:
    """Open the backend the settings choose (``tpuctl.backends.open_backend``), or ``backend`` when given,
    its cloud and the ledger.

    The catalog carries the backend's refreshed prices (`tpuctl catalog prices --refresh`) when cached:
    a placement's price cap, estimate, budget check and the price recorded in the ledger all use one
    price, the refreshed one."""
    from tpuctl.backends import open_backend
    from tpuctl.services.prices import load_catalog
    from tpuctl.store.ledger import Ledger

    state_dir = ensure_private_dir(settings.resolved_state_dir)
    closers: list[Callable[[], None]] = []
    backend = backend or open_backend(settings)
    cloud = backend.open_cloud(state_dir, closers)
    closers.append(cloud.close)
    timekeeping = backend.timekeeping
    try:
        ledger = Ledger.open(settings.resolved_database, clock=timekeeping.clock)
    except BaseException:
        # A ledger that cannot be opened (a database down, a newer schema): what was opened goes too,
        # without masking why (as ``Session.close``).
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                close()
        raise
    closers.append(ledger.close)
    return Session(
        settings=settings,
        backend=backend,
        catalog=catalog or load_catalog(state_dir, backend.name)[0],
        cloud=cloud,
        ledger=ledger,
        state_dir=state_dir,
        clock=timekeeping.clock,
        monotonic=timekeeping.monotonic,
        sleep=timekeeping.sleep,
        _closers=closers,
    )
