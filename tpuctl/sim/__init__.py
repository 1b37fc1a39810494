"""The local simulated TPU cloud: an HTTP server on 127.0.0.1 speaking the TPU API v2 and v2alpha1 REST
surfaces (with their discovery documents), the Cloud Quotas quotaInfos surface, a metadata-server
lookalike and an admin API, with state in SQLite.

``SimServer`` runs it; ``SimAdminClient`` drives its admin API; ``World`` / ``load_world`` /
``default_world`` describe what it simulates. Names are imported lazily so that ``import tpuctl.sim``
costs nothing until one is used (the CLI starts a server for every command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuctl.sim.admin import SimAdminClient
    from tpuctl.sim.server import SimServer
    from tpuctl.sim.world import World, default_world, load_world

__all__ = ["SimAdminClient", "SimServer", "World", "default_world", "load_world"]

_HOMES = {
    "SimAdminClient": "tpuctl.sim.admin",
    "SimServer": "tpuctl.sim.server",
    "World": "tpuctl.sim.world",
    "default_world": "tpuctl.sim.world",
    "load_world": "tpuctl.sim.world",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tpuctl.sim' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)
