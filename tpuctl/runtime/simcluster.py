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

Which hosts, and which one this is: JAX's two TPU clusters, in JAX's order.

- ``GceTpuCluster``'s way, when ``agent-worker-number`` answers 200 (JAX asks it 6 times, 0.5 s apart, and
  we wait as long: a Compute Engine VM may not publish it, docs/google-facts.md#worker-identity): the process
  id is that number, the workers are ``worker-network-endpoints``.
- Else ``GkeTpuCluster``'s way, when ``TPU_PROCESS_ADDRESSES`` or ``TPU_WORKER_HOSTNAMES`` is set (GKE
  injects them; tpuctl's launcher derives them on Compute Engine slices, tpuctl/hosts/worker_identity.py):
  the process id is ``TPU_WORKER_ID``, the workers that list.
- Else the slice is not detected, as JAX would not detect it: ``jax.distributed.initialize()`` then asks
  for a coordinator address.

Several slices (multislice), as JAX's ``BaseTpuCluster``: ``MEGASCALE_COORDINATOR_ADDRESS``,
``MEGASCALE_NUM_SLICES`` and ``MEGASCALE_SLICE_ID``, each read from the process environment when set there
(even empty), else from the ``tpu-env`` attribute (``KEY: 'value'`` lines; a multislice queued resource's
VMs publish them there, the simulator's too). ``tpu-env`` is asked at most once per detection, and not at
all when the environment sets all three. An empty or absent value is JAX's default: 1 slice, slice 0, no
Megascale coordinator. The workers found above are then the ones of this host's slice.

The process count is the number of workers in the slice times the number of slices; the process id is
the id in the slice plus the slice id times the workers in a slice. The coordinator:
``TPUCTL_COORDINATOR_ADDRESS`` when set (an explicit override), else the host of
``MEGASCALE_COORDINATOR_ADDRESS`` (before any ``:``, as JAX splits it; Google makes it the host of process
0), else worker 0 of the slice, with port ``TPUCTL_COORDINATOR_PORT`` (the backend sets it; JAX's own fixed
port otherwise); JAX's ``JAX_COORDINATOR_PORT`` (``override_coordinator_port``) wins over both ports.

Names. On Compute Engine slices ``worker-network-endpoints`` is bare INSTANCE NAMES
(docs/google-facts.md#metadata-server), which a real VM resolves through the VPC's internal DNS: its resolver
is the metadata server, with the search domain ``ZONE.c.PROJECT.internal``. Simulated VMs are loopback
addresses of one machine, whose resolver knows none of those names, and the simulator changes no
machine-global state (/etc/hosts, resolv.conf). So :func:`resolve` asks what a real VM's resolver is, this
host's metadata server, at the simulator's own name-service path (``/tpuctl-sim/v1/resolve/<name>``, not a
Google path; served by ``tpuctl.sim.vpc_dns``, which answers per the asking VM's project and zone as the VPC's
zonal DNS does). It does not try the machine's own resolver (getaddrinfo) first: that would send made-up names
to the machine's real DNS (a query leaving the machine, slow to fail) and could answer from the machine's own
/etc/hosts or search domains what the simulated VPC would not. An IP literal is used as it is (the TPU
API's ``name:id:ip`` triples). A name that does not resolve is a RuntimeError naming it, and the
coordinator is handed to JAX as an address, never as a name gRPC would then fail to resolve.

Nothing happens on import: registering is an explicit call, made either by the sitecustomize hook when
``jax._src.clusters`` is first imported, or by :func:`tpuctl.runtime.dist.init`.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpuctl.runtime import hostenv

CLUSTER_NAME = "tpuctl_sim"
#: JAX's fixed coordinator port on Cloud TPU (cloud_tpu_cluster.coordinator_port), when the backend
#: set no TPUCTL_COORDINATOR_PORT.
JAX_TPU_COORDINATOR_PORT = 8482
_METADATA_ROOT = "/computeMetadata/v1/"
_ATTRIBUTES = "instance/attributes/"
#: JAX's GkeTpuCluster reads these (TPU_PROCESS_ADDRESSES first).
TPU_PROCESS_ADDRESSES = "TPU_PROCESS_ADDRESSES"
TPU_WORKER_HOSTNAMES = "TPU_WORKER_HOSTNAMES"
TPU_WORKER_ID = "TPU_WORKER_ID"
#: JAX's BaseTpuCluster reads these, each from the environment first, else from tpu-env.
MEGASCALE_COORDINATOR_ADDRESS = "MEGASCALE_COORDINATOR_ADDRESS"
MEGASCALE_NUM_SLICES = "MEGASCALE_NUM_SLICES"
MEGASCALE_SLICE_ID = "MEGASCALE_SLICE_ID"
_MEGASCALE_KEYS = (MEGASCALE_COORDINATOR_ADDRESS, MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID)
#: The simulated VPC's name service, next to the metadata server (tpuctl.sim.vpc_dns.PREFIX).
RESOLVE_PATH = "/tpuctl-sim/v1/resolve/"
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
    when it is not published, or the server did not answer in JAX's number of tries."""
    value = published(key, sleep=sleep)
    if value is None:
        raise RuntimeError(
            f"the metadata server at {hostenv.metadata_host()} does not publish {_ATTRIBUTES}{key}"
        )
    return value


def published(key: str, *, sleep: Callable[[float], None] = time.sleep) -> str | None:
    """The instance attribute ``key``, or None when the metadata server answers anything but 200 every
    one of JAX's tries (JAX's ``get_metadata``). RuntimeError naming the server and the key when the
    server cannot be reached at all (a simulated host's ``GCE_METADATA_HOST`` must name its server)."""
    status, text = _ask(_METADATA_ROOT + _ATTRIBUTES + key, key, retry_refusals=True, sleep=sleep)
    return text.strip() if status == 200 else None


def worker_addresses(endpoints: str) -> list[str]:
    """``worker-network-endpoints`` -> the workers' addresses or names, in worker order, parsed as JAX
    parses them (one parser for the launcher and this detector: ``worker_identity``, bundled with the
    runtime). Raises WorkerIdentityError (a RuntimeError) for an entry JAX would refuse."""
    from tpuctl.hosts.worker_identity import worker_hostnames

    return worker_hostnames(endpoints)


def resolve(address: str, *, sleep: Callable[[float], None] = time.sleep) -> str:
    """``address`` as an IP address: an IP literal as it is, a name through the simulated VPC's name
    service at this host's metadata server (see the module docstring). RuntimeError naming ``address``
    when it does not resolve, or naming the server when that cannot be asked (after JAX's tries)."""
    try:
        ipaddress.ip_address(address)
        return address
    except ValueError:
        pass
    path = RESOLVE_PATH + urllib.parse.quote(address, safe="")
    status, text = _ask(path, repr(address), retry_refusals=False, sleep=sleep, what="the name service of ")
    if status == 200:
        return text.strip()
    raise RuntimeError(f"worker address {address!r} does not resolve on this simulated VPC: {text.strip()}")


def _ask(
    path: str,
    subject: str,
    *,
    retry_refusals: bool,
    sleep: Callable[[float], None],
    what: str = "",
) -> tuple[int, str]:
    """GET ``path`` on this host's metadata server with ``Metadata-Flavor: Google``, up to JAX's 6 tries
    0.5 s apart: again after a connection failure, and after a non-200 answer when ``retry_refusals``.
    The last (status, text); RuntimeError naming the server and ``subject`` when it never answered."""
    host = hostenv.metadata_host()
    hostname, _, port = host.rpartition(":") if ":" in host else (host, "", "80")
    last: BaseException | None = None
    answer: tuple[int, str] | None = None
    for attempt in range(_TRIES):
        if attempt:
            sleep(_RETRY_S)
        conn = http.client.HTTPConnection(hostname, int(port or 80), timeout=10.0)
        try:
            conn.request("GET", path, headers={"Metadata-Flavor": "Google"})
            response = conn.getresponse()
            answer = response.status, response.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            last = exc
            continue
        finally:
            conn.close()
        if answer[0] == 200 or not retry_refusals:
            return answer
    if answer is not None:
        return answer
    raise RuntimeError(
        f"{hostenv.SIM}=1 but {what}the metadata server at {host} did not answer "
        f"{subject if what else _ATTRIBUTES + subject} in {_TRIES} tries ({last}); the simulated host's "
        "GCE_METADATA_HOST must name its metadata server"
    )


def slice_workers(*, sleep: Callable[[float], None] = time.sleep) -> tuple[int, list[str]] | None:
    """(this process's id, every worker's address or name in id order), found as JAX's TPU clusters find
    them (see the module docstring); None when neither of JAX's ways applies."""
    number = published("agent-worker-number", sleep=sleep)
    if number is not None:
        return int(number), worker_addresses(attribute("worker-network-endpoints", sleep=sleep))
    hostnames = os.environ.get(TPU_PROCESS_ADDRESSES)
    if hostnames is None:
        hostnames = os.environ.get(TPU_WORKER_HOSTNAMES)
    if hostnames is None:
        return None
    raw_id = os.environ.get(TPU_WORKER_ID, "")
    if not raw_id.isdigit():
        raise RuntimeError(f"{TPU_WORKER_HOSTNAMES} is set but {TPU_WORKER_ID} is {raw_id!r}, not a number")
    return int(raw_id), [h.strip().split(":")[0] for h in hostnames.split(",")]


@dataclass(frozen=True)
class Slices:
    """What JAX's ``BaseTpuCluster`` reads about the slices of a job, with its defaults for one slice."""

    coordinator: str = ""  # MEGASCALE_COORDINATOR_ADDRESS as given; "" when unset or empty
    num_slices: int = 1
    slice_id: int = 0

    def process_count(self, workers: tuple[int, list[str]]) -> int:
        """JAX's ``get_process_count``: the workers in a slice times the slices."""
        return len(workers[1]) * self.num_slices

    def process_id(self, workers: tuple[int, list[str]]) -> int:
        """JAX's ``get_process_id``: the id in the slice, then the slices before this one."""
        return workers[0] + self.slice_id * len(workers[1])


def parse_tpu_env(text: str) -> dict[str, str]:
    """``tpu-env``'s ``KEY: 'value'`` lines as JAX parses them (``get_tpu_env_value_from_metadata``): split
    at the first ``:``, the key stripped, the value stripped of blanks then of quotes; a later line wins."""
    values: dict[str, str] = {}
    for line in text.split("\n"):
        if ":" in line:
            key, value = line.split(":", 1)
            values[key.strip()] = value.strip().strip("'")
    return values


def slices(*, sleep: Callable[[float], None] = time.sleep) -> Slices:
    """The Megascale keys of this host (see the module docstring), read as JAX's ``get_tpu_env_value``
    reads them: the environment first, else ``tpu-env``, asked at most once here. RuntimeError naming the
    key when a count or id is not a number (JAX's ``int()`` would raise)."""
    env = {key: os.environ[key] for key in _MEGASCALE_KEYS if key in os.environ}
    if len(env) < len(_MEGASCALE_KEYS):
        # JAX takes the body of whatever the server answered last; a server without tpu-env answers a
        # not-found text, which names none of these keys: the same as nothing published.
        published_env = parse_tpu_env(published("tpu-env", sleep=sleep) or "")
        env = {key: env[key] if key in env else published_env.get(key, "") for key in _MEGASCALE_KEYS}
    return Slices(
        coordinator=env.get(MEGASCALE_COORDINATOR_ADDRESS, ""),
        num_slices=_number(MEGASCALE_NUM_SLICES, env.get(MEGASCALE_NUM_SLICES, ""), 1),
        slice_id=_number(MEGASCALE_SLICE_ID, env.get(MEGASCALE_SLICE_ID, ""), 0),
    )


def _number(key: str, raw: str, default: int) -> int:
    if not raw:  # JAX: ``if not value: return default``
        return default
    try:
        return int(raw)
    except ValueError:
        raise RuntimeError(f"{key} is {raw!r}, not a number") from None


def coordinator_address(
    override_port: str | None = None,
    workers: tuple[int, list[str]] | None = None,
    found_slices: Slices | None = None,
) -> str:
    """ "host:port" of the coordinator (process 0): see the module docstring for the precedence. The host
    of ``MEGASCALE_COORDINATOR_ADDRESS`` (of ``found_slices``, else of :func:`slices`), else worker 0 (of
    ``workers``, else of :func:`slice_workers`), is resolved to an address (a CE slice names its hosts).
    RuntimeError when the slice is not detected."""
    explicit = os.environ.get(hostenv.COORDINATOR_ADDRESS, "")
    if explicit:
        host, _, port = explicit.rpartition(":")
    else:
        detected = _detected(workers)
        megascale = (slices() if found_slices is None else found_slices).coordinator
        host = resolve((megascale or detected[1][0]).split(":")[0])
        port = os.environ.get(hostenv.COORDINATOR_PORT, "") or str(JAX_TPU_COORDINATOR_PORT)
    return f"{host}:{override_port or port}"


def _detected(workers: tuple[int, list[str]] | None = None) -> tuple[int, list[str]]:
    workers = workers or slice_workers()
    if workers is None:
        raise RuntimeError(
            "this simulated host's slice is not detected: its metadata server publishes no "
            f"agent-worker-number and neither {TPU_PROCESS_ADDRESSES} nor {TPU_WORKER_HOSTNAMES} is set "
            "(tpuctl sets them on Compute Engine slices)"
        )
    return workers


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
        # What is_env_present found, for the calls JAX makes right after it: JAX asks the metadata
        # server about agent-worker-number once per initialize(), and so do we (its absence costs
        # JAX's 6 tries).
        found: tuple[int, list[str]] | None = None
        # The Megascale keys, read on first use after is_env_present (tpu-env once per detection, where
        # JAX asks it once per key).
        found_slices: Slices | None = None

        @classmethod
        def is_env_present(cls) -> bool:
            # Checked at initialize() time, not at registration: the environment is the truth.
            cls.found = slice_workers() if sim_env_present() else None
            cls.found_slices = None
            return cls.found is not None

        @classmethod
        def workers(cls) -> tuple[int, list[str]]:
            return _detected(cls.found)

        @classmethod
        def slices(cls) -> Slices:
            if cls.found_slices is None:
                cls.found_slices = slices()
            return cls.found_slices

        @classmethod
        def get_coordinator_address(
            cls, timeout_secs: int | None, override_coordinator_port: str | None
        ) -> str:
            address = coordinator_address(override_coordinator_port, cls.workers(), cls.slices())
            # JAX's coordinator binds [::]:port unless told otherwise (jax/_src/distributed.py reads
            # JAX_COORDINATOR_BIND_ADDRESS after this call). Simulated VMs share one network namespace,
            # so that would take the port on every VM's address; bind only host 0's own address.
            os.environ.setdefault("JAX_COORDINATOR_BIND_ADDRESS", address)
            return address

        @classmethod
        def get_process_count(cls) -> int:
            return cls.slices().process_count(cls.workers())

        @classmethod
        def get_process_id(cls) -> int:
            return cls.slices().process_id(cls.workers())

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
