"""The bundled optimizer step: AdamW + clipping + warmup-cosine, jitted with explicit shardings.

``make_train_step(loss_fn, optimizer, mesh)`` turns a user's ``loss_fn(params, batch) -> scalar`` into a
sharded training step over a ("dcn", "data", "model") mesh (``dist.make_mesh()``):

- the batch's leading axis is split over every device of the mesh (("dcn", "data", "model"), slices
  outermost), so no device repeats another's work whatever ``model_parallel`` is;
- params (and the optimizer state that mirrors them) are either replicated, or FSDP-sharded over the
  "model" axis: each large param's largest divisible axis is split, small ones stay replicated. With
  "data" spanning hosts and "model" within a host this is hybrid sharding (HSDP): the all-gathers of
  FSDP stay on the fast intra-host links and only the gradient reduction crosses hosts. Params are
  never split over "dcn": every slice holds a full copy (MaxText's ``dcn_data_parallelism``);
- gradients are reduced in two explicit levels (``jax.shard_map``): within each slice first (over
  "data" and "model", on ICI), then across slices (over "dcn"), where only a 1/(devices per slice)
  shard of each gradient crosses the data-center network;
- optional bf16 compute with float32 master weights and float32 optimizer state;
- optional gradient accumulation over micro-batches with ``lax.scan`` (how many a slice's device count
  needs to keep the global batch: ``runtime.batch.plan_batch``);
- the train state is donated, so params and optimizer state are updated in place.
"""

# jax leaves parts of its public API unannotated (PartitionSpec, ShapeDtypeStruct, ...).
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

PyTree = Any
LossFn = Callable[[PyTree, PyTree], jax.Array]
ParamSharding = Literal["replicated", "fsdp"]

DCN_AXIS = "dcn"
#: The axes inside one slice, where collectives run on ICI.
SLICE_AXES: tuple[str, str] = ("data", "model")
#: The batch's leading axis is split over all of them, slices outermost (dist.MESH_AXES).
BATCH_AXES: tuple[str, str, str] = (DCN_AXIS, *SLICE_AXES)
#: FSDP shards over an in-slice axis only: gathering params over the DCN every step would be slow.
FSDP_AXIS = "model"


class TrainState(NamedTuple):
    """Everything a step reads and writes; a pytree, so it jits, shards and checkpoints as one value."""

    step: jax.Array  # int32 scalar: number of completed steps
    params: PyTree  # float32 master weights
    opt_state: optax.OptState


def _decay_mask(params: PyTree) -> PyTree:
    # Weight decay on matrices only: decaying norm scales and biases pulls them towards zero for no gain.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(
    learning_rate: float = 3e-4,
    warmup_steps: int = 100,
    total_steps: int = 10_000,
    weight_decay: float = 0.1,
    clip_norm: float = 1.0,
    *,
    b1: float = 0.9,
    b2: float = 0.95,
    final_lr_ratio: float = 0.1,
) -> optax.GradientTransformation:
    """AdamW on a linear-warmup + cosine-decay schedule, after clipping the global gradient norm."""
    if warmup_steps < 0 or total_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and total_steps >= 1, got {warmup_steps}, {total_steps}")
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=learning_rate,
        warmup_steps=warmup_steps,
        # decay_steps counts the warmup too; keep it past the warmup so the cosine part is non-empty.
        decay_steps=max(total_steps, warmup_steps + 1),
        end_value=learning_rate * final_lr_ratio,
    )
    return optax.chain(
        optax.clip_by_global_norm(clip_norm),
        optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay, mask=_decay_mask),
    )


def fsdp_spec(shape: tuple[int, ...], shards: int, min_size: int, axis: str = FSDP_AXIS) -> P:
    """PartitionSpec splitting the largest axis divisible by ``shards``; replicated if small or none fits.

    A function of the shape alone, so a param and the Adam moments that mirror it get the same layout.
    """
    if shards <= 1 or math.prod(shape) < min_size:
        return P()
    candidates = [(size, -i) for i, size in enumerate(shape) if size % shards == 0 and size >= shards]
    if not candidates:
        return P()
    _, neg_i = max(candidates)  # largest axis; on a tie, the first
    spec: list[str | None] = [None] * len(shape)
    spec[-neg_i] = axis
    return P(*spec)


def _cast_floats(tree: PyTree, dtype: Any) -> PyTree:
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _split_micro(x: jax.Array, n: int) -> jax.Array:
    """A device's rows (b, ...) -> (n, b/n, ...), micro-batch j holding its rows j, j+n, j+2n, ...

    Every device holds a contiguous block of the global batch whose length is a multiple of n, so
    micro-batch j is, over all devices, exactly the global rows j, j+n, j+2n, ...: a strided split of
    the global batch, drawing equally from every device and needing no data movement.
    """
    if x.shape[0] % n:
        raise ValueError(
            f"the {x.shape[0]} rows per device are not divisible by grad_accum_steps={n}: the global "
            "batch must be a multiple of the device count times grad_accum_steps"
        )
    return jnp.swapaxes(x.reshape(x.shape[0] // n, n, *x.shape[1:]), 0, 1)


def _fsdp_dim(spec: P) -> int | None:
    """The dimension a param's spec splits over FSDP_AXIS; None for a replicated param."""
    return next((i for i, a in enumerate(spec) if a == FSDP_AXIS), None)


@dataclass
class TrainStep:
    """A compiled training step over a mesh. Build with :func:`make_train_step`.

    ``init(params)`` -> ``TrainState`` placed with the step's shardings (``params`` may also be a
    zero-argument callable, run under jit so large params are created already sharded);
    ``step(state, batch)`` -> ``(new_state, {"loss", "grad_norm"})``; the old state is donated.
    """

    loss_fn: LossFn
    optimizer: optax.GradientTransformation
    mesh: Mesh
    param_sharding: ParamSharding = "replicated"
    compute_dtype: Any = jnp.float32
    grad_accum_steps: int = 1
    fsdp_min_size: int = 1024
    _compiled: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.param_sharding not in ("replicated", "fsdp"):
            raise ValueError(f"param_sharding must be 'replicated' or 'fsdp', got {self.param_sharding!r}")
        if self.grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps must be >= 1, got {self.grad_accum_steps}")
        # Exactly these: the gradients are summed over each of them by name, so an axis more would be
        # one they were never reduced over (and a one-slice mesh still names "dcn", with size 1).
        if tuple(self.mesh.axis_names) != BATCH_AXES:
            raise ValueError(
                f"mesh axes must be {BATCH_AXES}, got {tuple(self.mesh.axis_names)}; use dist.make_mesh()"
            )

    # Shardings -----------------------------------------------------------------------------------

    @property
    def batch_sharding(self) -> NamedSharding:
        """Sharding for every batch leaf: leading (batch) axis over all devices, other axes whole."""
        return NamedSharding(self.mesh, P(BATCH_AXES))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def leaf_sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        if self.param_sharding == "replicated":
            return self.replicated
        spec = fsdp_spec(shape, int(self.mesh.shape[FSDP_AXIS]), self.fsdp_min_size)
        return NamedSharding(self.mesh, spec)

    def state_sharding(self, abstract_state: TrainState) -> TrainState:
        shardings: TrainState = jax.tree.map(lambda x: self.leaf_sharding(tuple(x.shape)), abstract_state)
        return shardings

    def abstract_state(self, params: PyTree | Callable[[], PyTree]) -> TrainState:
        """Shapes, dtypes and shardings of the state ``init(params)`` would make (nothing is computed).

        Handy as the restore target of a checkpoint.
        """
        shapes = (
            jax.eval_shape(self._make_state, params)
            if not callable(params)
            else jax.eval_shape(lambda: self._make_state(params()))
        )
        shardings = self.state_sharding(shapes)
        out: TrainState = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
        )
        return out

    # Init and step -------------------------------------------------------------------------------

    def _make_state(self, params: PyTree) -> TrainState:
        params = jax.tree.map(
            lambda p: (
                jnp.asarray(p, jnp.float32)
                if jnp.issubdtype(jnp.asarray(p).dtype, jnp.floating)
                else jnp.asarray(p)
            ),
            params,
        )
        return TrainState(jnp.zeros((), jnp.int32), params, self.optimizer.init(params))

    def init(self, params: PyTree | Callable[[], PyTree]) -> TrainState:
        """The initial state (step 0), laid out with the step's shardings.

        Every process must pass the same params (e.g. from the same PRNG key): they are taken as the
        global value, not as a per-process shard.
        """
        target = self.abstract_state(params)
        shardings = jax.tree.map(lambda s: s.sharding, target)
        if callable(params):
            fn = params
            state: TrainState = jax.jit(lambda: self._make_state(fn()), out_shardings=shardings)()
        else:
            state = jax.jit(self._make_state, out_shardings=shardings)(params)
        return state

    def param_specs(self, params: PyTree) -> PyTree:
        """The PartitionSpec of every param (a tree like ``params``): ``P()`` or a split over "model"."""
        return jax.tree.map(lambda x: self.leaf_sharding(tuple(x.shape)).spec, params)

    def loss_and_grads(self, params: PyTree, batch: PyTree) -> tuple[jax.Array, PyTree]:
        """The global batch's mean loss and its float32 gradients, laid out like ``params``.

        What the step applies (jit it to check the numbers or read the collectives in its HLO). Every
        device runs ``loss_fn`` on its own rows under ``jax.shard_map`` and the per-device means are
        averaged: within each slice first, then across slices (see :meth:`_sum_over_devices`).
        """
        specs = self.param_specs(params)
        per_device = jax.shard_map(
            lambda p, b: self._device_loss_and_grads(specs, p, b),
            mesh=self.mesh,
            in_specs=(specs, P(BATCH_AXES)),
            # The default check_vma=True makes shard_map verify these: the loss and the replicated
            # gradients must come out reduced over every axis, FSDP ones over all but "model".
            out_specs=(P(), specs),
        )
        loss, grads = per_device(params, batch)
        return loss, grads

    def _varying(self, x: jax.Array) -> jax.Array:
        """``x``, replicated over the whole mesh, typed as differing between devices on every axis.

        Taking gradients with respect to a value shard_map knows to be replicated would make autodiff
        psum them over every axis at once (the transpose of the implicit broadcast); typed as varying,
        the gradients stay this device's own and the reduction is the explicit one below.
        """
        varying: jax.Array = jax.lax.pcast(x, tuple(self.mesh.axis_names), to="varying")
        return varying

    def _device_loss_and_grads(
        self, specs: PyTree, params: PyTree, batch: PyTree
    ) -> tuple[jax.Array, PyTree]:
        """Inside shard_map: this device's params (FSDP shards) and rows -> the reduced loss and grads."""
        low = self.compute_dtype != jnp.float32

        def whole(x: jax.Array, spec: P) -> jax.Array:
            # Cast before gathering: the same values as casting after, half the all-gather bytes in bf16.
            if low and jnp.issubdtype(x.dtype, jnp.floating):
                x = x.astype(self.compute_dtype)
            k = _fsdp_dim(spec)
            # "invarying": the gathered param is the same on every device of the "model" group.
            return x if k is None else jax.lax.all_gather(x, FSDP_AXIS, axis=k, tiled=True, to="invarying")

        full = jax.tree.map(lambda x, spec: self._varying(whole(x, spec)), params, specs)

        def grad_fn(p: PyTree, mb: PyTree) -> tuple[jax.Array, PyTree]:
            loss, grads = jax.value_and_grad(lambda q: self.loss_fn(q, mb).astype(jnp.float32))(p)
            # Gradients of bf16 compute params are bf16; the master weights and their sums are float32
            # (what differentiating through the cast would give).
            return loss, _cast_floats(grads, jnp.float32)

        n = self.grad_accum_steps
        if n == 1:
            loss, grads = grad_fn(full, batch)
        else:
            micro = jax.tree.map(lambda x: _split_micro(x, n), batch)
            zeros = jax.tree.map(lambda p: self._varying(jnp.zeros(p.shape, jnp.float32)), full)

            def body(carry: tuple[jax.Array, PyTree], mb: PyTree) -> tuple[tuple[jax.Array, PyTree], None]:
                loss_sum, grad_sum = carry
                loss, grads = grad_fn(full, mb)
                return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

            init = (self._varying(jnp.zeros((), jnp.float32)), zeros)
            (loss_sum, grad_sum), _ = jax.lax.scan(body, init, micro)
            # Equal-sized micro-batches: the mean of their mean losses is the device's mean loss.
            loss, grads = loss_sum / n, jax.tree.map(lambda g: g / n, grad_sum)

        # Equal row counts on every device: the mean of the devices' means is the global batch's mean.
        devices = self.mesh.size
        mean_loss = jax.lax.psum(jax.lax.psum(loss, SLICE_AXES), DCN_AXIS) / devices
        mean_grads = jax.tree.map(lambda g, spec: self._sum_over_devices(g, spec) / devices, grads, specs)
        return mean_loss, mean_grads

    def _sum_over_devices(self, g: jax.Array, spec: P) -> jax.Array:
        """Sum of every device's ``g``, within each slice first and then across slices; for an FSDP param,
        only this device's shard of the sum.

        1. Within the slice (ICI): an FSDP gradient is reduce-scattered over "model", so each device
           keeps the sum of its own shard; the remaining in-slice axes are reduce-scattered too, over a
           flat, padded copy, so each device holds the slice's sum of 1/k of the gradient (k: devices
           sharing it).
        2. Across slices (DCN): those 1/k pieces are all-reduced over "dcn", so only 1/k of the bytes of
           each gradient leaves a slice.
        3. Within the slice again: all-gathered back over the same axes.

        The usual two-level all-reduce for a fast network inside a group and a slow one between groups
        (as in Huawei HCCL's "Hierarchical Communication Principles", AllReduce: reduce-scatter within
        each server, all-reduce across servers, all-gather within each server,
        https://www.hiascend.com/document/detail/en/CANNCommunityEdition/900/API/hcclug/hcclug_000125.html).
        On TPU, XLA may build the same from one all-reduce over a hybrid mesh (Cloud TPU's
        Multislice overview: "The XLA compiler generates that code"); written out with ``lax``
        collectives, the order is in the program on every backend, the simulator's included, and a test
        can read it in the HLO. On one slice (or one device per slice) it is a plain all-reduce within
        the slice (and a trivial one over "dcn").
        """
        k_fsdp = _fsdp_dim(spec)
        axes: tuple[str, ...] = SLICE_AXES
        if k_fsdp is not None:
            g = jax.lax.psum_scatter(g, FSDP_AXIS, scatter_dimension=k_fsdp, tiled=True)
            axes = tuple(a for a in SLICE_AXES if a != FSDP_AXIS)
        k = math.prod(int(self.mesh.shape[a]) for a in axes)
        if int(self.mesh.shape[DCN_AXIS]) == 1 or k == 1:
            # Both sums are still named, size 1 or not: shard_map's replication check counts on them.
            total: jax.Array = jax.lax.psum(jax.lax.psum(g, axes), DCN_AXIS)
            return total
        flat = g.reshape(-1)
        flat = jnp.pad(flat, (0, -flat.size % k))
        piece = jax.lax.psum_scatter(flat, axes, scatter_dimension=0, tiled=True)
        piece = jax.lax.psum(piece, DCN_AXIS)
        flat = jax.lax.all_gather(piece, axes, axis=0, tiled=True, to="invarying")
        whole: jax.Array = flat[: g.size].reshape(g.shape)
        return whole

    def _step(self, state: TrainState, batch: PyTree) -> tuple[TrainState, dict[str, jax.Array]]:
        loss, grads = self.loss_and_grads(state.params, batch)
        grad_norm = optax.global_norm(grads)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = TrainState(state.step + 1, params, opt_state)
        return new_state, {"loss": loss, "grad_norm": grad_norm}

    def compiled(self, state: TrainState) -> Callable[[TrainState, PyTree], tuple[TrainState, Any]]:
        """The jitted step for this state's structure (cached)."""
        key = jax.tree.structure(state), tuple((x.shape, x.dtype) for x in jax.tree.leaves(state))
        fn = self._compiled.get(key)
        if fn is None:
            shardings = self.state_sharding(state)
            fn = jax.jit(
                self._step,
                in_shardings=(shardings, self.batch_sharding),
                out_shardings=(shardings, self.replicated),
                donate_argnums=(0,),
            )
            self._compiled[key] = fn
        return fn  # type: ignore[no-any-return]

    def step(self, state: TrainState, batch: PyTree) -> tuple[TrainState, dict[str, jax.Array]]:
        return self.compiled(state)(state, batch)  # type: ignore[return-value]

    def __call__(self, state: TrainState, batch: PyTree) -> tuple[TrainState, dict[str, jax.Array]]:
        return self.step(state, batch)


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    *,
    param_sharding: ParamSharding = "replicated",
    compute_dtype: Any = jnp.float32,
    grad_accum_steps: int = 1,
    fsdp_min_size: int = 1024,
) -> TrainStep:
    """The bundled, sharded training step for ``loss_fn(params, batch) -> scalar mean loss``.

    ``loss_fn`` runs on every device separately, with that device's rows of the batch and the whole
    params (inside ``jax.shard_map``): it must be a mean over the rows it is given, with no collectives
    or sharding constraints of its own. Every device gets as many rows, so the average of the
    per-device means the step takes is the global batch's mean. ``mesh`` has the axes of
    ``dist.make_mesh()``.

    ``fsdp_min_size``: params with fewer elements stay replicated under "fsdp" (gathering them would
    cost more than storing them).
    """
    return TrainStep(loss_fn, optimizer, mesh, param_sharding, compute_dtype, grad_accum_steps, fsdp_min_size)


def params_sha256(tree: PyTree) -> str:
    """SHA-256 over every leaf's path, dtype, shape and bytes, in the tree's fixed flatten order.

    Sharded leaves are gathered to every host first (a collective: call it on all processes), so runs
    with different shardings or process counts can be compared bit for bit.
    """
    import hashlib

    import numpy as np
    from jax.experimental import multihost_utils

    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            host = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        else:
            host = np.asarray(leaf)
        h.update(f"{jax.tree_util.keystr(path)}|{host.dtype.str}|{host.shape}|".encode())
        h.update(np.ascontiguousarray(host).tobytes())
    return h.hexdigest()
