"""Cluster auto-detection for simulated TPU hosts.

``jax.distributed.initialize()`` with no arguments asks each registered ``jax._src.clusters.ClusterEnv``
subclass whether it is present. JAX's own detectors need real TPU metadata (GCE/GKE) or a batch
scheduler (Slurm, Open MPI, k8s); none of them recognise a set of local processes standing in for a TPU
slice. :func:`register` adds one that does, reading the variables :func:`hostenv.sim_host_env` sets.

Nothing happens on import: registering is an explicit call, made either by the sitecustomize hook when
``jax._src.clusters`` is first imported, or by :func:`tpuctl.runtime.dist.init`.
"""

# jax leaves parts of its public API unannotated (PartitionSpec, ShapeDtypeStruct, ...).
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import os
import threading
from typing import Any

from tpuctl.runtime import hostenv

CLUSTER_NAME = "tpuctl_sim"

_lock = threading.Lock()
_registered: type[Any] | None = None


def sim_env_present() -> bool:
    """True when this process is a simulated host (the launcher set ``TPUCTL_SIM=1``)."""
    return os.environ.get(hostenv.SIM, "") == "1"


def _required(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise RuntimeError(
            f"{hostenv.SIM}=1 but {name} is not set; the simulated host was launched without "
            "the environment from tpuctl.runtime.hostenv.sim_host_env()"
        )
    return value


def register() -> type[Any] | None:
    """Register the simulated-slice ``ClusterEnv`` with JAX (idempotent; thread-safe).

    Returns the class, or None when this process is not a simulated host (then nothing is registered,
    so JAX's own detection is untouched on real TPU VMs).
    """
    global _registered
    if not sim_env_present():
        return None
    with _lock:
        if _registered is not None:
            return _registered

        from jax._src.clusters import ClusterEnv

        class TpuctlSimCluster(ClusterEnv):
            """A slice of simulated TPU hosts: one local process per host, worker 0 coordinates."""

            name: str = CLUSTER_NAME

            @classmethod
            def is_env_present(cls) -> bool:
                # Checked at initialize() time, not at registration: the environment is the truth.
                return sim_env_present()

            @classmethod
            def get_coordinator_address(
                cls, timeout_secs: int | None, override_coordinator_port: str | None
            ) -> str:
                address = _required(hostenv.COORDINATOR_ADDRESS)
                if override_coordinator_port:
                    # JAX_COORDINATOR_PORT lets a user move the port; keep the host we were given.
                    address = f"{address.rsplit(':', 1)[0]}:{override_coordinator_port}"
                return address

            @classmethod
            def get_process_count(cls) -> int:
                return int(_required(hostenv.NUM_WORKERS))

            @classmethod
            def get_process_id(cls) -> int:
                return int(_required(hostenv.WORKER_ID))

            @classmethod
            def get_local_process_id(cls) -> int | None:
                # None: every process sees all of its CPU devices (one per simulated chip).
                return None

        # __init_subclass__ appended us last. Detection takes the first env that is present, and a
        # simulated slice may well run inside a Slurm job or a k8s pod whose detectors would then win
        # with the wrong process count; when TPUCTL_SIM=1 the launcher's word is the one to trust.
        types = ClusterEnv._cluster_types
        if TpuctlSimCluster in types:
            types.remove(TpuctlSimCluster)
        types.insert(0, TpuctlSimCluster)
        _registered = TpuctlSimCluster
        return TpuctlSimCluster
