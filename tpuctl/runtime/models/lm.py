"""A small decoder-only transformer LM in plain JAX, and a deterministic synthetic data source.

The model is deliberately tiny by default (seconds per run on a CPU) and has no dependency beyond
jax: parameters are a nested dict of arrays, so every sharding/checkpointing path in the runtime sees
an ordinary pytree.

The data is a learnable synthetic task: each sequence follows ``t[i+1] = (a * t[i] + b) mod vocab`` from
a random start token, with ``a``, ``b`` fixed by the seed. A model that learns the map drives the loss
from ``ln(vocab)`` towards zero, so "the loss went down" is a meaningful check of the training step.
"""

# jax leaves parts of its public API unannotated (PartitionSpec, ShapeDtypeStruct, ...).
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Sharding

Params = dict[str, Any]
Batch = dict[str, jax.Array]


@dataclass(frozen=True)
class LMConfig:
    vocab: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    seq_len: int = 64

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    @property
    def n_params(self) -> int:
        d, f, v = self.d_model, self.d_ff, self.vocab
        per_layer = 2 * d + d * 3 * d + d * d + d * f + f * d
        return v * d + self.seq_len * d + self.n_layers * per_layer + d + d * v

    def train_flops_per_token(self) -> float:
        """Approximate training FLOPs per token: 6 x matmul params + attention (PaLM appendix B)."""
        d, f, v = self.d_model, self.d_ff, self.vocab
        matmul_params = self.n_layers * (d * 3 * d + d * d + 2 * d * f) + d * v
        attention = self.n_layers * 2 * self.seq_len * d  # QK^T and AV, forward, per token
        return 6.0 * matmul_params + 3.0 * 2.0 * attention


def init_params(cfg: LMConfig, seed: int = 0) -> Params:
    """float32 master weights as numpy arrays: scaled-normal matrices (std 1/sqrt(fan_in)), unit norms.

    Drawn on the host with numpy rather than jax.random under jit: the same numbers on every process
    and restart, and no XLA compile (threefry for a dozen arrays costs seconds on a small CPU). Pass
    the result to ``TrainStep.init``, which places it with the step's shardings.
    """
    rng = np.random.default_rng([seed, 0x1417])

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def dense(fan_in: int, fan_out: int) -> np.ndarray:
        return normal((fan_in, fan_out), 1.0 / math.sqrt(fan_in))

    d = cfg.d_model
    embed = normal((cfg.vocab, d), 0.02)
    pos = normal((cfg.seq_len, d), 0.02)
    layers = [
        {
            "ln1": np.ones((d,), np.float32),
            "wqkv": dense(d, 3 * d),
            "wo": dense(d, d),
            "ln2": np.ones((d,), np.float32),
            "w1": dense(d, cfg.d_ff),
            "w2": dense(cfg.d_ff, d),
        }
        for _ in range(cfg.n_layers)
    ]
    return {
        "embed": embed,
        "pos": pos,
        "layers": layers,
        "ln_f": np.ones((d,), np.float32),
        "head": dense(d, cfg.vocab),
    }


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    # Normalise in float32 even under bf16 compute: the mean of squares loses too much in bf16.
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def apply(params: Params, tokens: jax.Array, cfg: LMConfig) -> jax.Array:
    """Logits (float32) for int tokens of shape (batch, seq). Compute dtype follows the params' dtype."""
    _, s = tokens.shape
    h, dh = cfg.n_heads, cfg.d_model // cfg.n_heads
    x = params["embed"][tokens] + params["pos"][:s]
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    for layer in params["layers"]:
        y = _rms_norm(x, layer["ln1"])
        q, k, v = jnp.split(y @ layer["wqkv"], 3, axis=-1)
        q, k, v = (t.reshape(*t.shape[:2], h, dh) for t in (q, k, v))
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(dh)
        att = jnp.where(causal, att, float(np.finfo(np.float32).min))
        prob = jax.nn.softmax(att, axis=-1).astype(v.dtype)
        o = jnp.einsum("bhqk,bkhd->bqhd", prob, v).reshape(x.shape)
        x = x + o @ layer["wo"]
        y = _rms_norm(x, layer["ln2"])
        x = x + jax.nn.gelu(y @ layer["w1"]) @ layer["w2"]
    x = _rms_norm(x, params["ln_f"])
    logits: jax.Array = (x @ params["head"]).astype(jnp.float32)
    return logits


def make_loss_fn(cfg: LMConfig) -> Callable[[Params, Batch], jax.Array]:
    """Mean next-token cross-entropy, as ``loss_fn(params, batch)`` for ``train.make_train_step``."""

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        logits = apply(params, batch["inputs"], cfg)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
        return jnp.mean(nll)

    return loss_fn


def _rule(vocab: int, seed: int) -> tuple[int, int]:
    rng = np.random.default_rng([seed, 0x5EED])
    a = int(rng.integers(1, vocab // 2)) * 2 + 1  # odd, so the map is a permutation for even vocab
    b = int(rng.integers(0, vocab))
    return a % vocab, b


def batch_rows(
    step: int, rows: range | slice, global_batch: int, seq_len: int, vocab: int, seed: int
) -> dict[str, np.ndarray]:
    """Rows ``rows`` of the global batch for ``step`` as numpy arrays: a pure function of its arguments."""
    if isinstance(rows, slice):
        rows = range(*rows.indices(global_batch))
    a, b = _rule(vocab, seed)
    # One generator per (seed, step): all starts of the global batch are drawn and then indexed, so any
    # process, restart or sharding sees the same numbers for the same row.
    starts = np.random.default_rng([seed, step]).integers(0, vocab, size=global_batch, dtype=np.int64)
    tok = np.empty((len(rows), seq_len + 1), dtype=np.int64)
    tok[:, 0] = starts[rows.start : rows.stop : rows.step]
    for i in range(seq_len):
        tok[:, i + 1] = (a * tok[:, i] + b) % vocab
    tok32 = tok.astype(np.int32)
    return {"inputs": tok32[:, :-1], "targets": tok32[:, 1:]}


def batch_for_step(
    step: int, global_batch: int, seq_len: int, vocab: int, seed: int, sharding: Sharding | None = None
) -> dict[str, Any]:
    """The global batch for ``step``: identical for the same arguments in every process and restart.

    With ``sharding`` (a sharding of the (global_batch, seq_len) arrays, e.g. ``TrainStep.batch_sharding``)
    returns global ``jax.Array``s, each process generating only the rows its devices hold; without it,
    numpy arrays of the whole batch.
    """
    if sharding is None:
        return batch_rows(step, range(global_batch), global_batch, seq_len, vocab, seed)
    shape = (global_batch, seq_len)
    cache: dict[tuple[int, int, int], dict[str, np.ndarray]] = {}

    def rows_for(index: tuple[slice, ...]) -> dict[str, np.ndarray]:
        r = range(*index[0].indices(global_batch))
        key = (r.start, r.stop, r.step)
        if key not in cache:  # one call per device; devices replicating the same rows share the work
            cache[key] = batch_rows(step, r, global_batch, seq_len, vocab, seed)
        return cache[key]

    def make(name: str) -> jax.Array:
        def shard(index: tuple[slice, ...] | None) -> np.ndarray:
            assert index is not None  # jax passes None only for shardings without an index map
            return rows_for(index)[name][:, index[1]]

        return jax.make_array_from_callback(shape, sharding, shard)

    return {"inputs": make("inputs"), "targets": make("targets")}
