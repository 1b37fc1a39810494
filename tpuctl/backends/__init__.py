"""Backends: the simulator and Google, each behind the one interface of ``tpuctl.backends.base``.

``open_backend(settings)`` chooses once, when a session opens; nothing after that asks which it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.backends.base import Backend
    from tpuctl.settings import Settings


def open_backend(settings: Settings) -> Backend:
    """The backend the settings choose: the simulator (in-process or ``sim_url``) or Google."""
    from tpuctl.settings import Backend as BackendChoice

    if settings.resolved_backend is BackendChoice.SIM:
        from tpuctl.backends.sim import SimBackend

        return SimBackend(
            world_path=settings.sim_world,
            url=settings.sim_url,
            wheelhouse=settings.sim_wheelhouse,
            on_vm=settings.sim_vm is not None,
        )
    from tpuctl.backends.gcp import GcpBackend

    assert settings.project is not None  # load_settings guarantees it for gcp
    return GcpBackend(project=settings.project, quota_project=settings.quota_project)
