"""Distributed start-up and the device mesh, for programs running on TPU hosts (real or simulated).

``init()`` joins the job (``jax.distributed``) from the worker environment and sets per-generation libtpu
flags; ``make_mesh()`` lays all global devices out as a ("data", "model") mesh.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import TYPE_CHECKING

from tpuctl.runtime import hostenv

if TYPE_CHECKING:
    from jax.sharding import Mesh

log = logging.getLogger(__name__)

MESH_AXES: tuple[str, str] = ("data", "model")

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


def _mesh_devices(shape: tuple[int, int]) -> object:
    import jax
    import numpy as np
    from jax.experimental import mesh_utils

    devices = jax.devices()
    slices = {getattr(d, "slice_index", 0) for d in devices}
    if len(slices) > 1:
        # Multislice: only the data axis may cross the (slow) DCN between slices.
        n = len(slices)
        if shape[0] % n:
            raise ValueError(f"data-parallel size {shape[0]} is not divisible by the {n} slices")
        return mesh_utils.create_hybrid_device_mesh((shape[0] // n, shape[1]), (n, 1), devices)
    if devices[0].platform == "tpu":
        # Topology-aware order: the model axis, which carries the most traffic, lands on ICI neighbours.
        return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    # CPU (the simulator) and others: jax.devices() is ordered by process, then local id, so a plain
    # reshape keeps each model group inside one host whenever model_parallel divides the host's devices.
    return np.asarray(devices).reshape(shape)


def _topology_chips(topology: str) -> int | None:
    try:
        return math.prod(int(x) for x in topology.lower().split("x"))
    except ValueError:
        return None


def make_mesh(model_parallel: int = 1) -> Mesh:
    """A ``Mesh`` with axes ("data", "model") of shape (devices // model_parallel, model_parallel).

    The "model" axis is innermost, so with ``model_parallel`` dividing the chips per host its groups stay
    within a host (ICI on a real slice); "data" spans hosts.
    """
    import jax
    from jax.sharding import Mesh

    n = jax.device_count()
    if model_parallel < 1 or n % model_parallel:
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        raise ValueError(
            f"model_parallel={model_parallel} must divide the device count {n}; choose one of {divisors}"
        )
    worker = hostenv.WorkerEnv.from_env()
    chips = _topology_chips(worker.topology) if worker.topology else None
    if chips is not None and chips != n and jax.devices()[0].platform == "tpu":
        # v4/v5p topologies count chips and each chip is one (megacore) device, so these should agree.
        log.warning("TPUCTL_TOPOLOGY=%s names %d chips but JAX sees %d devices", worker.topology, chips, n)
    shape = (n // model_parallel, model_parallel)
    return Mesh(_mesh_devices(shape), MESH_AXES)  # type: ignore[arg-type]
