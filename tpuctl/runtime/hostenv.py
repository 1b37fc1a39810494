"""The worker environment contract, and the environment a *simulated* host needs.

Pure Python with no JAX import: the launcher (on the CLI side) calls :func:`sim_host_env` to build the
environment of each simulated host process, and the runtime reads the same variables back through
:class:`WorkerEnv`. Keeping both directions in one module keeps the variable names in one place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# The contract every host gets, on Google and on the simulator alike
# (docs/architecture.md, "The worker contract").
RUN_ID = "TPUCTL_RUN_ID"
WORKER_ID = "TPUCTL_WORKER_ID"
NUM_WORKERS = "TPUCTL_NUM_WORKERS"
ACCELERATOR_TYPE = "TPUCTL_ACCELERATOR_TYPE"
TOPOLOGY = "TPUCTL_TOPOLOGY"
CHECKPOINT_DIR = "TPUCTL_CHECKPOINT_DIR"
RESTART_COUNT = "TPUCTL_RESTART_COUNT"
#: Multislice (``tpuctl run --slices N``): which slice this host is in (0..N-1) and how many there are.
#: Every run gets them (0 and 1 on one slice). WORKER_ID is then the job-wide process index, slice by
#: slice (slice_id * hosts per slice + the host's worker number in its slice), as JAX numbers processes
#: (jax/_src/clusters/cloud_tpu_cluster.py, BaseTpuCluster.get_process_id), and NUM_WORKERS every host
#: of every slice.
SLICE_ID = "TPUCTL_SLICE_ID"
NUM_SLICES = "TPUCTL_NUM_SLICES"

# Only on the simulator.
SIM = "TPUCTL_SIM"
COORDINATOR_ADDRESS = "TPUCTL_COORDINATOR_ADDRESS"
COORDINATOR_PORT = "TPUCTL_COORDINATOR_PORT"
CHIPS_PER_HOST = "TPUCTL_CHIPS_PER_HOST"

# Where a host finds its metadata server, as unmodified on-VM code does: google-auth reads
# GCE_METADATA_HOST, JAX's cloud_tpu_cluster.get_metadata reads GCE_METADATA_IP, tensorstore's GCE
# credentials GCE_METADATA_ROOT (all "host[:port]", no scheme); on a real TPU VM none is set and the name
# metadata.google.internal answers.
METADATA_HOST = "GCE_METADATA_HOST"
METADATA_IP = "GCE_METADATA_IP"
METADATA_ROOT = "GCE_METADATA_ROOT"
DEFAULT_METADATA_HOST = "metadata.google.internal"

# Relative to the bundle root: the directory holding our sitecustomize.py.
SITECUSTOMIZE_SUBDIR = Path("tpuctl") / "runtime" / "_sitecustomize"


def sim_host_env(
    run_id: str,
    worker_id: int,
    num_workers: int,
    chips_per_host: int,
    coordinator_port: int,
    accelerator_type: str,
    topology: str,
    checkpoint_dir: str,
    restart_count: int,
    bundle_dir: str | os.PathLike[str],
    *,
    metadata_host: str | None = None,
    base_pythonpath: str | None = None,
) -> dict[str, str]:
    """Return the variables a simulated host process needs, to be laid over the launcher's environment.

    Every simulated host is one local process whose CPU devices stand in for the host's chips; the
    processes join one `jax.distributed` job over loopback, with worker 0 as coordinator (its address
    from the metadata server's ``worker-network-endpoints``, the port ``coordinator_port``). An unmodified
    script calling ``jax.distributed.initialize()`` then sees ``process_count() == num_workers`` and
    ``device_count() == num_workers * chips_per_host``.

    ``bundle_dir`` is the directory the user's script and the ``tpuctl`` package were unpacked into.
    ``metadata_host`` ("host:port" of the host's metadata server) sets ``GCE_METADATA_HOST``,
    ``GCE_METADATA_IP`` and ``GCE_METADATA_ROOT``; the simulated cluster reads its process id and count
    there.
    ``base_pythonpath`` (default: nothing) is appended after our two entries so a caller can keep an
    existing PYTHONPATH.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if not 0 <= worker_id < num_workers:
        raise ValueError(f"worker_id must be in [0, {num_workers}), got {worker_id}")
    if chips_per_host < 1:
        raise ValueError(f"chips_per_host must be >= 1, got {chips_per_host}")
    if not 0 < coordinator_port < 65536:
        raise ValueError(f"coordinator_port must be a TCP port, got {coordinator_port}")
    if restart_count < 0:
        raise ValueError(f"restart_count must be >= 0, got {restart_count}")

    bundle = Path(bundle_dir).resolve()
    # The bundle root first so the user's script can `import tpuctl.runtime...` from the bundle; the
    # sitecustomize dir so Python runs our startup hook (site imports the first `sitecustomize` found).
    path_entries = [str(bundle), str(bundle / SITECUSTOMIZE_SUBDIR)]
    if base_pythonpath:
        path_entries.append(base_pythonpath)

    env = {
        RUN_ID: run_id,
        WORKER_ID: str(worker_id),
        NUM_WORKERS: str(num_workers),
        ACCELERATOR_TYPE: accelerator_type,
        TOPOLOGY: topology,
        CHECKPOINT_DIR: checkpoint_dir,
        RESTART_COUNT: str(restart_count),
        SIM: "1",
        COORDINATOR_PORT: str(coordinator_port),
        CHIPS_PER_HOST: str(chips_per_host),
        # A simulated host has no accelerator: force the CPU backend so a stray GPU/TPU plugin on the
        # machine running the simulator is never picked up, and give it one CPU device per chip
        # (jax >= 0.4.38 reads this into `jax_num_cpu_devices`).
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": str(chips_per_host),
        # Cross-process CPU collectives: gloo over TCP is jax's default in 0.10 but older releases
        # defaulted to none (then any cross-process psum fails), so say it explicitly.
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        "PYTHONPATH": os.pathsep.join(path_entries),
        # Host logs are collected line by line by the launcher; don't let them sit in a buffer.
        "PYTHONUNBUFFERED": "1",
    }
    if metadata_host:
        env[METADATA_HOST] = env[METADATA_IP] = env[METADATA_ROOT] = metadata_host
    return env


def metadata_host(env: Mapping[str, str] | None = None) -> str:
    """The metadata server's "host[:port]": ``GCE_METADATA_HOST``, else ``GCE_METADATA_IP``, else
    ``metadata.google.internal`` (the precedence google-auth gives its own variable)."""
    e = os.environ if env is None else env
    return e.get(METADATA_HOST) or e.get(METADATA_IP) or DEFAULT_METADATA_HOST


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r} is not an integer") from exc


@dataclass(frozen=True)
class WorkerEnv:
    """The worker environment as seen by a program on a host (defaults make a 1-host local run)."""

    run_id: str
    worker_id: int
    num_workers: int
    accelerator_type: str
    topology: str
    checkpoint_dir: str
    restart_count: int
    metadata_host: str
    sim: bool
    coordinator_address: str | None
    chips_per_host: int | None
    slice_id: int = 0
    num_slices: int = 1

    @property
    def launched_by_tpuctl(self) -> bool:
        return self.run_id != ""

    @property
    def hosts_per_slice(self) -> int:
        return max(1, self.num_workers // max(1, self.num_slices))

    @property
    def generation(self) -> str:
        """Generation prefix of the accelerator type: ``v5litepod-16`` -> ``v5litepod``."""
        return self.accelerator_type.rsplit("-", 1)[0] if self.accelerator_type else ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerEnv:
        e = os.environ if env is None else env
        chips = _int(e, CHIPS_PER_HOST, 0)
        return cls(
            run_id=e.get(RUN_ID, ""),
            worker_id=_int(e, WORKER_ID, 0),
            num_workers=_int(e, NUM_WORKERS, 1),
            accelerator_type=e.get(ACCELERATOR_TYPE, ""),
            topology=e.get(TOPOLOGY, ""),
            checkpoint_dir=e.get(CHECKPOINT_DIR, ""),
            restart_count=_int(e, RESTART_COUNT, 0),
            metadata_host=metadata_host(e),
            sim=e.get(SIM, "") == "1",
            coordinator_address=e.get(COORDINATOR_ADDRESS) or None,
            chips_per_host=chips or None,
            slice_id=_int(e, SLICE_ID, 0),
            num_slices=_int(e, NUM_SLICES, 1),
        )
