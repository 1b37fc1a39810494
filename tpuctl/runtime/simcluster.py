"""Cluster auto-detection for simulated TPU hosts, read from the host's metadata server as JAX does.

``jax.distributed.initialize()`` with no arguments asks each registered ``jax._src.clusters.ClusterEnv``
subclass whether it is present. On a real TPU VM JAX's ``GceTpuCluster`` answers, but only where libtpu
sees chips (``running_in_cloud_tpu_vm``), which a simulated host (CPU devices) never does. So
:func:`register` adds a detector that reads what ``GceTpuCluster`` reads, from the same place
(jax/_src/clusters/cloud_tpu_cluster.py, jax 0.10.2: ``get_metadata`` GETs
``http://$GCE_METADATA_IP/computeMetadata/v1/instance/attributes/<key>`` with ``Metadata-Flavor:
Google``; ``_get_process_id_in_slice`` = ``agent-worker-number``; ``_get_worker_list_in_slice`` = the
comma-separated ``worker-network-endpoints``, each ``name:id:ip`` (the IP is the third field) or a bare
hostname; the process count is the number of endpoints and the coordinator is the first one):

- coordinator: ``TPUCTL_COORDINATOR_ADDRESS`` when set (an explicit override), else host 0's endpoint
  address with port ``TPUCTL_COORDINATOR_PORT`` (the backend sets it; JAX's own fixed port otherwise);
  JAX's ``JAX_COORDINATOR_PORT`` (``override_coordinator_port``) wins over both ports;
- process id: ``agent-worker-number``; process count: the number of ``worker-network-endpoints``.

Nothing happens on import: registering is an explicit call, made either by the sitecustomize hook when
``jax._src.clusters`` is first imported, or by :func:`tpuctl.runtime.dist.init`.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from tpuctl.runtime import hostenv

CLUSTER_NAME = "tpuctl_sim"
#: JAX's fixed coordinator port on Cloud TPU (cloud_tpu_cluster.coordinator_port), when the backend
#: set no TPUCTL_COORDINATOR_PORT.
JAX_TPU_COORDINATOR_PORT = 8482
_ATTRIBUTES = "instance/attributes/"
# JAX's get_metadata tries 6 times, 0.5 s apart; the simulator's server may come up with the host.
_TRIES = 6
_RETRY_S = 0.5

_lock = threading.Lock()
_registered: type[Any] | None = None


def sim_env_present() -> bool:
    """True when this process is a simulated host (the backend set ``TPUCTL_SIM=1``)."""
    return os.environ.get(hostenv.SIM, "") == "1"


def attribute(key: str, *, sleep: Callable[[float], None] = time.sleep) -> str:
    """The instance attribute ``key`` from this host's metadata server (``GCE_METADATA_HOST``, else
    ``GCE_METADATA_IP``, else metadata.google.internal); RuntimeError naming the server and the key
    after JAX's number of tries."""
    from tpuctl.runtime.preemption import MetadataClient

    client = MetadataClient(hostenv.metadata_host(), timeout_s=10.0)
    last: BaseException | None = None
    try:
        for attempt in range(_TRIES):
            if attempt:
                sleep(_RETRY_S)
            try:
                return client.get(_ATTRIBUTES + key).text.strip()
            except (OSError, http.client.HTTPException) as exc:
                last = exc
    finally:
        client.close()
    raise RuntimeError(
        f"{hostenv.SIM}=1 but the metadata server at {client.host} did not answer "
        f"{_ATTRIBUTES}{key} in {_TRIES} tries ({last}); the simulated host's GCE_METADATA_HOST must "
        "name its metadata server"
    )


def worker_addresses(endpoints: str) -> list[str]:
    """``worker-network-endpoints`` -> the workers' addresses, in worker order (JAX's parsing)."""
    addresses = []
    for worker in endpoints.split(","):
        parts = worker.strip().split(":")
        if len(parts) == 1 and parts[0]:
            addresses.append(parts[0])
        elif len(parts) == 3 and parts[2]:
            addresses.append(parts[2])
        else:
            raise ValueError(f"unsupported worker-network-endpoints entry {worker!r} in {endpoints!r}")
    return addresses


def coordinator_address(override_port: str | None = None) -> str:
    """ "host:port" of the coordinator (host 0): see the module docstring for the precedence."""
    explicit = os.environ.get(hostenv.COORDINATOR_ADDRESS, "")
    if explicit:
        host, _, port = explicit.rpartition(":")
    else:
        host = worker_addresses(attribute("worker-network-endpoints"))[0]
        port = os.environ.get(hostenv.COORDINATOR_PORT, "") or str(JAX_TPU_COORDINATOR_PORT)
    return f"{host}:{override_port or port}"


def register() -> type[Any] | None:
    """Register the simulated-slice ``ClusterEnv`` with JAX (idempotent; thread-safe).

    Returns the class, or None when this process is not a simulated host (then nothing is registered,
    so JAX's own detection is untouched on real TPU VMs).
    """
    global _registered
    if not sim_env_present():
        return None
    with _lock:
        if _registered is None:
            _registered = _make_cluster()
        return _registered


def _make_cluster() -> type[Any]:
    from jax._src.clusters import ClusterEnv

    class TpuctlSimCluster(ClusterEnv):
        """A slice of simulated TPU VMs, described by each VM's metadata server."""

        name: str = CLUSTER_NAME

        @classmethod
        def is_env_present(cls) -> bool:
            # Checked at initialize() time, not at registration: the environment is the truth.
            return sim_env_present()

        @classmethod
        def get_coordinator_address(
            cls, timeout_secs: int | None, override_coordinator_port: str | None
        ) -> str:
            address = coordinator_address(override_coordinator_port)
            # JAX's coordinator binds [::]:port unless told otherwise (jax/_src/distributed.py reads
            # JAX_COORDINATOR_BIND_ADDRESS after this call). Simulated VMs share one network namespace,
            # so that would take the port on every VM's address; bind only host 0's own address.
            os.environ.setdefault("JAX_COORDINATOR_BIND_ADDRESS", address)
            return address

        @classmethod
        def get_process_count(cls) -> int:
            return len(worker_addresses(attribute("worker-network-endpoints")))

        @classmethod
        def get_process_id(cls) -> int:
            return int(attribute("agent-worker-number"))

        @classmethod
        def get_local_process_id(cls) -> int | None:
            # None: every process sees all of its CPU devices (one per simulated chip).
            return None

    # __init_subclass__ appended us last. Detection takes the first env that is present, and a
    # simulated slice may well run inside a Slurm job or a k8s pod whose detectors would then win
    # with the wrong process count; when TPUCTL_SIM=1 the backend's word is the one to trust.
    types = ClusterEnv._cluster_types
    if TpuctlSimCluster in types:
        types.remove(TpuctlSimCluster)
    types.insert(0, TpuctlSimCluster)
    return TpuctlSimCluster
