"""The bundled optimizer step: AdamW + clipping + warmup-cosine, jitted with explicit shardings.

``make_train_step(loss_fn, optimizer, mesh)`` turns a user's ``loss_fn(params, batch) -> scalar`` into a
sharded training step:

- the batch's leading axis is split over every device of the mesh (("data", "model")), so no device
  repeats another's work whatever ``model_parallel`` is;
- params (and the optimizer state that mirrors them) are either replicated, or FSDP-sharded over the
  "model" axis: each large param's largest divisible axis is split, small ones stay replicated. With
  "data" spanning hosts and "model" within a host this is hybrid sharding (HSDP): the all-gathers of
  FSDP stay on the fast intra-host links and only the gradient reduction crosses hosts;
- optional bf16 compute with float32 master weights and float32 optimizer state;
- optional gradient accumulation over micro-batches with ``lax.scan``;
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

BATCH_AXES: tuple[str, str] = ("data", "model")
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
    """(B, ...) -> (n, B/n, ...), micro-batch j holding rows j, j+n, j+2n, ...

    Strided rather than contiguous on purpose: each device holds a contiguous block of rows, so strided
    micro-batches draw equally from every device and the split needs no data movement, whereas
    contiguous chunks would put each micro-batch on a fraction of the devices.
    """
    if x.shape[0] % n:
        raise ValueError(f"batch size {x.shape[0]} is not divisible by grad_accum_steps={n}")
    return jnp.swapaxes(x.reshape(x.shape[0] // n, n, *x.shape[1:]), 0, 1)


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
        missing = [a for a in BATCH_AXES if a not in self.mesh.axis_names]
        if missing:
            raise ValueError(f"mesh needs axes {BATCH_AXES}, missing {missing}; use dist.make_mesh()")

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

    def _loss_and_grads(self, params: PyTree, batch: PyTree) -> tuple[jax.Array, PyTree]:
        def compute_loss(master: PyTree, mb: PyTree) -> jax.Array:
            # The cast sits inside the differentiated function, so gradients come back in the master
            # weights' float32 even when the forward and backward passes run in bf16.
            p = master if self.compute_dtype == jnp.float32 else _cast_floats(master, self.compute_dtype)
            return self.loss_fn(p, mb).astype(jnp.float32)

        grad_fn = jax.value_and_grad(compute_loss)
        n = self.grad_accum_steps
        if n == 1:
            return grad_fn(params, batch)  # type: ignore[no-any-return]

        micro = jax.tree.map(lambda x: _split_micro(x, n), batch)
        micro = jax.lax.with_sharding_constraint(micro, NamedSharding(self.mesh, P(None, BATCH_AXES)))
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)

        def body(carry: tuple[jax.Array, PyTree], mb: PyTree) -> tuple[tuple[jax.Array, PyTree], None]:
            loss_sum, grad_sum = carry
            loss, grads = grad_fn(params, mb)
            return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

        (loss_sum, grad_sum), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micro)
        # Equal-sized micro-batches: the mean of their mean losses is the full batch's mean loss.
        return loss_sum / n, jax.tree.map(lambda g: g / n, grad_sum)

    def _step(self, state: TrainState, batch: PyTree) -> tuple[TrainState, dict[str, jax.Array]]:
        loss, grads = self._loss_and_grads(state.params, batch)
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
