"""Distributed start-up and the device mesh, for programs running on TPU hosts (real or simulated).

``init()`` joins the job (``jax.distributed``) from the worker environment and sets per-generation libtpu
flags; ``make_mesh()`` lays all global devices out as a ("dcn", "data", "model") mesh, one "dcn" row per
slice (of size 1 on a single slice).
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from tpuctl.runtime import hostenv

if TYPE_CHECKING:
    import numpy as np
    from jax.sharding import Mesh

log = logging.getLogger(__name__)

#: Slices (over the data-center network, slow) outermost; then data parallelism across the hosts of a
#: slice; "model" innermost, on the fastest links. The layout of MaxText's hybrid meshes
#: (``dcn_data_parallelism`` x ``ici_*_parallelism``), with only data parallelism across slices.
MESH_AXES: tuple[str, str, str] = ("dcn", "data", "model")

# Continuation fusion: let XLA overlap all-gathers / all-reduces with the compute around them (the
# all-gathers are what FSDP adds to every layer). Documented as "enabled by default but let's make
# sure" in MaxText's benchmarks/xla_flags_library.py (CF_FOR_ALL_GATHER).
_ASYNC_COLLECTIVE_FUSION = {
    "xla_tpu_enable_async_collective_fusion": "true",
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": "true",
    "xla_tpu_enable_async_collective_fusion_multiple_steps": "true",
    "xla_tpu_overlap_compute_collective_tc": "true",
    "xla_enable_async_all_gather": "true",
}
# Pipeline the gradient all-reduce of data parallelism across iterations, incl. differently sized
# ops (MaxText DATA_PARALLEL_OVERLAP; used in its v5e/v5p/v6e recipes).
_DATA_PARALLEL_OVERLAP = {
    "xla_tpu_enable_data_parallel_all_reduce_opt": "true",
    "xla_tpu_data_parallel_opt_different_sized_ops": "true",
}

# libtpu flags by generation prefix of TPUCTL_ACCELERATOR_TYPE (``v5litepod-16`` -> ``v5litepod``). Data,
# not code: a flag libtpu does not know aborts start-up, so each entry stays small and sourced, and
# anything the user put in LIBTPU_INIT_ARGS wins flag by flag. Generations not listed get nothing.
LIBTPU_FLAGS: dict[str, dict[str, str]] = {
    "v4": {**_ASYNC_COLLECTIVE_FUSION, **_DATA_PARALLEL_OVERLAP},
    "v5litepod": {**_ASYNC_COLLECTIVE_FUSION, **_DATA_PARALLEL_OVERLAP},
    "v5p": {
        **_ASYNC_COLLECTIVE_FUSION,
        **_DATA_PARALLEL_OVERLAP,
        # v5p chips are megacore (2 TensorCores); MaxText's v5p recipes keep all-gathers out of megacore
        # fusions and pipeline them in the backward pass.
        "xla_tpu_megacore_fusion_allow_ags": "false",
        "xla_tpu_enable_ag_backward_pipelining": "true",
        "xla_enable_async_collective_permute": "true",
    },
    "v6e": {
        **_ASYNC_COLLECTIVE_FUSION,
        **_DATA_PARALLEL_OVERLAP,
        # Trillium has more VMEM; MaxText's dense-model v6e recipes raise the scoped limit to 96 MiB
        # (DENSE_VMEM_LIMIT_FLAG) so larger fusions stay on-chip.
        "xla_tpu_scoped_vmem_limit_kib": "98304",
    },
}
LIBTPU_FLAGS["v5e"] = LIBTPU_FLAGS["v5litepod"]  # the short name some tools and docs use

_init_lock = threading.Lock()


def _parse_flags(args: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for tok in args.split():
        name, _, value = tok.lstrip("-").partition("=")
        out[name] = value
    return out


def libtpu_init_args(generation: str, existing: str = "") -> str:
    """LIBTPU_INIT_ARGS for a generation: our table's flags unless ``existing`` already sets them."""
    ours = LIBTPU_FLAGS.get(generation, {})
    theirs = _parse_flags(existing)
    merged = existing.split()
    merged += [f"--{k}={v}" for k, v in ours.items() if k not in theirs]
    return " ".join(merged)


def _on_tpu_vm(worker: hostenv.WorkerEnv) -> bool:
    return not worker.sim and worker.accelerator_type != ""


def init(*, tune_libtpu: bool = True) -> hostenv.WorkerEnv:
    """Join the distributed job described by the worker environment; safe to call more than once.

    - Simulated host (``TPUCTL_SIM=1``): registers tpuctl's cluster detector, then
      ``jax.distributed.initialize()`` finds coordinator / process count / id from the environment.
    - Real TPU VM of a multi-host slice: plain ``jax.distributed.initialize()``, which JAX auto-detects
      from the TPU metadata; before that, sets the generation's libtpu flags.
    - Single host or a plain local run: nothing to join; JAX works as a single process.

    Must run before anything touches a JAX backend (libtpu reads its flags at backend start-up).
    Returns the parsed worker environment.
    """
    worker = hostenv.WorkerEnv.from_env()
    with _init_lock:
        import jax
        from jax._src import xla_bridge  # private, but the only way to ask "backend started yet?"

        if jax.distributed.is_initialized():
            return worker
        backends_started = xla_bridge.backends_are_initialized()

        if _on_tpu_vm(worker) and tune_libtpu:
            if backends_started:
                log.warning("JAX backend already started; libtpu flags for %s not applied", worker.generation)
            else:
                args = libtpu_init_args(worker.generation, os.environ.get("LIBTPU_INIT_ARGS", ""))
                if args:
                    os.environ["LIBTPU_INIT_ARGS"] = args

        if worker.sim:
            from tpuctl.runtime import simcluster

            simcluster.register()
            if backends_started:
                # The CPU client was built without the distributed client: it would never see the
                # other hosts' devices. Fail loudly rather than train on a fraction of the slice.
                raise RuntimeError("tpuctl.runtime.dist.init() must be called before any JAX computation")
            jax.distributed.initialize()
        elif _on_tpu_vm(worker) and worker.num_workers > 1:
            jax.distributed.initialize()
    return worker


class _HasProcess(Protocol):
    @property
    def process_index(self) -> int: ...


_D = TypeVar("_D", bound=_HasProcess)


def slice_groups(devices: Sequence[_D], num_slices: int) -> list[list[_D]]:
    """The devices of each slice, slice 0 first, for devices that do not know their slice (CPU, GPU).

    Processes are numbered slice by slice (the worker contract: ``TPUCTL_WORKER_ID`` is
    ``slice_id * hosts_per_slice + worker``), so process ``p`` of ``P`` is in slice
    ``p // (P // num_slices)``. Within a slice the devices keep the order given (``jax.devices()``: by
    process, then local id); one slice is the devices as given. Raises ``ValueError``, naming the counts,
    if the processes or devices do not split evenly into ``num_slices``.
    """
    if num_slices < 1:
        raise ValueError(f"TPUCTL_NUM_SLICES={num_slices}: need at least 1 slice")
    if num_slices == 1:
        return [list(devices)]
    processes = sorted({d.process_index for d in devices})
    if processes != list(range(len(processes))):
        raise ValueError(f"devices come from processes {processes}; expected 0..{len(processes) - 1}")
    if len(processes) % num_slices:
        raise ValueError(
            f"TPUCTL_NUM_SLICES={num_slices} does not divide the job's {len(processes)} processes: every "
            "slice must run the same number of hosts; launch with a --slices that divides the host count"
        )
    per_slice = len(processes) // num_slices
    groups: list[list[_D]] = [[] for _ in range(num_slices)]
    for d in devices:
        groups[d.process_index // per_slice].append(d)
    sizes = [len(g) for g in groups]
    if len(set(sizes)) > 1:
        raise ValueError(
            f"slices have unequal device counts {sizes}: every host must expose the same number of "
            "devices (JAX_NUM_CPU_DEVICES / TPUCTL_CHIPS_PER_HOST)"
        )
    return groups


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_model_parallel(model_parallel: int, per_slice: int, num_slices: int) -> None:
    if model_parallel < 1 or per_slice % model_parallel:
        where = f" of each of the {num_slices} slices" if num_slices > 1 else ""
        raise ValueError(
            f"model_parallel={model_parallel} must divide the device count {per_slice}{where}; "
            f"choose one of {_divisors(per_slice)}"
        )


def _mesh_devices(model_parallel: int, worker: hostenv.WorkerEnv) -> np.ndarray:
    """The (num_slices, per_slice // model_parallel, model_parallel) array of devices for the mesh."""
    import jax
    import numpy as np
    from jax.experimental import mesh_utils

    devices = jax.devices()
    if devices[0].platform == "tpu":
        # Real slices: libtpu tells each device its slice; the environment only has to agree with it.
        slice_ids = sorted({d.slice_index for d in devices})
        n = len(slice_ids)
        if worker.num_slices > 1 and n != worker.num_slices:
            raise ValueError(
                f"TPUCTL_NUM_SLICES={worker.num_slices} but JAX's TPU devices come from {n} slice(s): the "
                "slices did not join one multislice job (libtpu reads the MEGASCALE_* variables at start-up)"
            )
        sizes = [sum(d.slice_index == i for d in devices) for i in slice_ids]
        if len(set(sizes)) > 1:
            raise ValueError(f"slices {slice_ids} have unequal device counts {sizes}")
        per = sizes[0]
        _check_model_parallel(model_parallel, per, n)
        inner = (per // model_parallel, model_parallel)
        if n == 1:
            # Topology-aware order: the model axis, which carries the most traffic, lands on ICI
            # neighbours.
            mesh = mesh_utils.create_device_mesh(inner, devices, allow_split_physical_axes=True)
            return mesh.reshape(1, *inner)
        # JAX's hybrid mesh: each slice laid out as above, the slices stacked along the DCN axis, so only
        # "dcn" crosses the (slow) network between slices.
        return mesh_utils.create_hybrid_device_mesh(
            (1, *inner), (n, 1, 1), devices, allow_split_physical_axes=True
        )
    # CPU (the simulator) and others carry no slice index: group by process. jax.devices() is ordered by
    # process, then local id, so a plain reshape of each slice keeps each model group inside one host
    # whenever model_parallel divides the host's devices.
    groups = slice_groups(devices, worker.num_slices)
    per = len(groups[0])
    _check_model_parallel(model_parallel, per, len(groups))
    if worker.num_slices > 1:
        expected = jax.process_index() // (jax.process_count() // worker.num_slices)
        if worker.slice_id != expected:
            # Harmless for the numbers (any grouping trains the same), but the "dcn" axis would not be
            # the slice boundary the launcher meant.
            log.warning(
                "TPUCTL_SLICE_ID=%d but JAX process %d of %d falls in slice %d",
                worker.slice_id,
                jax.process_index(),
                jax.process_count(),
                expected,
            )
    return np.asarray(groups).reshape(len(groups), per // model_parallel, model_parallel)


def _topology_chips(topology: str) -> int | None:
    try:
        return math.prod(int(x) for x in topology.lower().split("x"))
    except ValueError:
        return None


def make_mesh(model_parallel: int = 1) -> Mesh:
    """A ``Mesh`` with axes ("dcn", "data", "model") of shape (slices, per_slice // model_parallel,
    model_parallel), where ``per_slice`` is the device count of one slice.

    Each "dcn" row holds exactly one slice's devices, so only the "dcn" axis crosses the data-center
    network; on one slice it has size 1 and the devices are in the same order as a plain
    ("data", "model") mesh. The slices are the devices' ``slice_index`` on TPU, and elsewhere (the
    simulator's CPU devices) ``TPUCTL_NUM_SLICES`` (default 1) groups of processes, numbered slice by
    slice. The "model" axis is innermost, so with ``model_parallel`` dividing the chips per host its
    groups stay within a host (ICI on a real slice); "data" spans the hosts of a slice.

    Raises ``ValueError`` if ``model_parallel`` does not divide a slice's devices, or if the processes
    or devices do not split evenly into the slices.
    """
    import jax
    from jax.sharding import Mesh

    worker = hostenv.WorkerEnv.from_env()
    devices = _mesh_devices(model_parallel, worker)
    chips = _topology_chips(worker.topology) if worker.topology else None
    per_slice = devices.shape[1] * devices.shape[2]
    if chips is not None and chips != per_slice and jax.devices()[0].platform == "tpu":
        # v4/v5p topologies count a slice's chips and each chip is one (megacore) device, so these
        # should agree.
        log.warning(
            "TPUCTL_TOPOLOGY=%s names %d chips but JAX sees %d devices per slice",
            worker.topology,
            chips,
            per_slice,
        )
    return Mesh(devices, MESH_AXES)
