"""A command's session: the backend, the cloud client, the ledger and the catalog, opened once and closed.

With the simulator backend and no ``sim_url``, a simulator server is started in-process on an ephemeral
loopback port for the life of the session; its state lives in the state dir, so one command sees what the
previous one did.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.catalog import Catalog
from tpuctl.settings import Backend, Settings
from tpuctl.store.paths import ensure_private_dir

if TYPE_CHECKING:
    from tpuctl.cloud.base import TpuCloud
    from tpuctl.store.ledger import Ledger


@dataclass
class Session:
    """What a service needs from the outside world. Build with ``open_session``; close when done."""

    settings: Settings
    catalog: Catalog
    cloud: TpuCloud
    ledger: Ledger
    state_dir: Path
    clock: Callable[[], float] = time.time
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def backend(self) -> Backend:
        return self.settings.resolved_backend

    @property
    def project(self) -> str:
        return self.cloud.project

    def describe_backend(self) -> dict[str, Any]:
        return {"backend": self.backend.value, "project": self.project, "endpoint": self.cloud.endpoint}

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


def open_session(settings: Settings, *, catalog: Catalog | None = None) -> Session:
    """Open the backend the settings choose: the simulator (in-process or ``sim_url``) or Google."""
    from tpuctl.cloud.tpu_api import TpuApiCloud
    from tpuctl.store.ledger import Ledger

    state_dir = ensure_private_dir(settings.resolved_state_dir)
    closers: list[Callable[[], None]] = []
    cloud: TpuCloud
    if settings.resolved_backend is Backend.SIM:
        base_url, project = _simulator(settings, state_dir, closers)
        cloud = TpuApiCloud.for_simulator(project=project, base_url=base_url)
    else:
        assert settings.project is not None  # load_settings guarantees it for gcp
        cloud = TpuApiCloud.for_google(project=settings.project)
    closers.append(cloud.close)
    ledger = Ledger(state_dir)
    closers.append(ledger.close)
    return Session(
        settings=settings,
        catalog=catalog or Catalog.load(),
        cloud=cloud,
        ledger=ledger,
        state_dir=state_dir,
        _closers=closers,
    )


def _simulator(settings: Settings, state_dir: Path, closers: list[Callable[[], None]]) -> tuple[str, str]:
    from tpuctl.sim import SimServer, load_world

    world = load_world(settings.sim_world) if settings.sim_world else None
    if settings.sim_url:
        from tpuctl.sim import SimAdminClient

        admin = SimAdminClient(settings.sim_url)
        try:
            project = admin.status().get("project", "tpuctl-sim")
        finally:
            admin.close()
        return settings.sim_url.rstrip("/"), str(project)
    server = SimServer(state_dir, world)
    url = server.start()
    closers.append(server.stop)
    return url, server.world.project
