"""What runs on the TPU hosts: distributed init, mesh, the bundled train step, checkpointing.

Shipped in the run bundle next to the user's script and never imported by the CLI at start-up. Importing
this package is free: submodules (most of which import jax, optax or orbax) load on first attribute
access, e.g. ``from tpuctl.runtime import train`` or ``tpuctl.runtime.dist.init()``.

- ``hostenv``     the worker environment contract; ``sim_host_env()`` for the simulator's launcher (no jax)
- ``simcluster``  jax.distributed auto-detection on simulated hosts (registered by ``_sitecustomize``)
- ``dist``        ``init()``, ``make_mesh()``
- ``train``       ``make_optimizer()``, ``make_train_step()``, ``TrainState``, ``params_sha256()``
- ``checkpoint``  ``Checkpointer`` (orbax, verified restore with fallback)
- ``models.lm``   a small transformer LM and its deterministic synthetic data
"""

from __future__ import annotations

import importlib
from types import ModuleType

_SUBMODULES = frozenset({"checkpoint", "dist", "hostenv", "models", "simcluster", "train"})


def __getattr__(name: str) -> ModuleType:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES)
