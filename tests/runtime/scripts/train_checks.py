"""Runs the train-step checks in ONE process with 4 CPU devices and prints a JSON report.

Run by tests/runtime/test_train.py in a subprocess (the device count must be set before jax starts);
one process for all checks so jax start-up and compiles are paid once per check, not once per test.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tpuctl.runtime import dist, train
from tpuctl.runtime.models import lm

CFG = lm.LMConfig(vocab=64, d_model=32, n_layers=1, n_heads=2, d_ff=64, seq_len=16)
BATCH = 16
SEED = 3
STEPS = 20
SNAP = 5  # steps compared between variants (they drift apart slowly afterwards, as floats do)


def host(tree: Any) -> Any:
    return jax.tree.map(np.asarray, jax.device_get(tree))


def max_diff(a: Any, b: Any) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def optimizer() -> optax.GradientTransformation:
    return train.make_optimizer(3e-2, warmup_steps=2, total_steps=STEPS, weight_decay=0.01, clip_norm=1.0)


def run(mesh: jax.sharding.Mesh, **kw: Any) -> dict[str, Any]:
    step = train.make_train_step(lm.make_loss_fn(CFG), optimizer(), mesh, fsdp_min_size=256, **kw)
    state = step.init(lm.init_params(CFG, SEED))
    specs = {
        jax.tree_util.keystr(p): str(x.sharding.spec)
        for p, x in jax.tree_util.tree_flatten_with_path(state.params)[0]
    }
    mu_specs = [str(x.sharding.spec) for x in jax.tree.leaves(state.opt_state) if x.ndim >= 1]
    losses, norms, snaps = [], [], {}
    hlo = ""
    for s in range(STEPS):
        batch = lm.batch_for_step(s, BATCH, CFG.seq_len, CFG.vocab, SEED, step.batch_sharding)
        if s == 0:
            # jit-wrapped: it has .lower, which the step's Callable annotation does not show.
            hlo = cast(jax.stages.Wrapped, step.compiled(state)).lower(state, batch).as_text()
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
        norms.append(float(metrics["grad_norm"]))
        if s + 1 in (3, SNAP):
            snaps[s + 1] = host(state.params)
    return {
        "losses": losses,
        "grad_norms": norms,
        "snaps": snaps,
        "specs": specs,
        "mu_specs": mu_specs,
        "param_dtypes": sorted({str(x.dtype) for x in jax.tree.leaves(state.params)}),
        "opt_dtypes": sorted({str(x.dtype) for x in jax.tree.leaves(state.opt_state) if x.ndim >= 1}),
        "step": int(state.step),
        "hlo_has_bf16_dot": "bf16" in hlo and "dot" in hlo,
    }


def plain(steps: int) -> dict[str, Any]:
    """The same training written directly with jax.jit + optax, on one device."""
    loss_fn = lm.make_loss_fn(CFG)
    opt = optimizer()
    params = jax.tree.map(jnp.asarray, lm.init_params(CFG, SEED))
    opt_state = opt.init(params)

    @jax.jit
    def update(params: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for s in range(steps):
        batch = lm.batch_for_step(s, BATCH, CFG.seq_len, CFG.vocab, SEED)
        params, opt_state, loss = update(params, opt_state, batch)
        losses.append(float(loss))
    return {"losses": losses, "params": host(params)}


def data_checks() -> dict[str, Any]:
    a = lm.batch_for_step(7, BATCH, CFG.seq_len, CFG.vocab, SEED)
    b = lm.batch_for_step(7, BATCH, CFG.seq_len, CFG.vocab, SEED)
    c = lm.batch_for_step(8, BATCH, CFG.seq_len, CFG.vocab, SEED)
    rows = lm.batch_rows(7, range(4, 12), BATCH, CFG.seq_len, CFG.vocab, SEED)
    sharded_equal = []
    for mp in (1, 2, 4):
        mesh = dist.make_mesh(mp)
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "model")))
        g = lm.batch_for_step(7, BATCH, CFG.seq_len, CFG.vocab, SEED, sharding)
        sharded_equal.append(all(np.array_equal(np.asarray(g[k]), a[k]) for k in a))
    shifted = bool(np.array_equal(a["inputs"][:, 1:], a["targets"][:, :-1]))
    return {
        "same_step_equal": all(np.array_equal(a[k], b[k]) for k in a),
        "next_step_differs": not np.array_equal(a["inputs"], c["inputs"]),
        "rows_slice_equal": all(np.array_equal(rows[k], a[k][4:12]) for k in a),
        "sharded_equal": sharded_equal,
        "targets_are_shifted_inputs": shifted,
        "dtype": str(a["inputs"].dtype),
        "shape": list(a["inputs"].shape),
    }


def mesh_checks() -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        dist.make_mesh(3)
    except ValueError as exc:
        out["bad_mesh_error"] = str(exc)
    mesh = dist.make_mesh(2)
    out["mesh_shape"] = dict(mesh.shape)
    out["mesh_axes"] = list(mesh.axis_names)
    # One slice: the devices in the order of the ("data", "model") mesh before there were slices.
    out["one_slice_order"] = mesh.devices.tolist() == np.asarray(jax.devices()).reshape(1, 2, 2).tolist()
    # Slices from the environment: one process cannot hold two of them; the error says why.
    os.environ["TPUCTL_NUM_SLICES"] = "2"
    try:
        dist.make_mesh(1)
    except ValueError as exc:
        out["two_slices_one_process_error"] = str(exc)
    finally:
        del os.environ["TPUCTL_NUM_SLICES"]
    return out


def main() -> None:
    dist.init()
    out: dict[str, Any] = {"device_count": jax.device_count()}
    out.update(mesh_checks())
    mesh = dist.make_mesh(2)

    rep = run(mesh)
    fsdp = run(mesh, param_sharding="fsdp")
    accum = run(mesh, grad_accum_steps=2)
    bf16 = run(mesh, compute_dtype=jnp.bfloat16)
    ref = plain(3)

    out["replicated"] = {k: rep[k] for k in ("losses", "grad_norms", "specs", "step", "param_dtypes")}
    out["plain_losses"] = ref["losses"]
    out["plain_param_diff"] = max_diff(ref["params"], rep["snaps"][3])
    out["fsdp"] = {
        "losses": fsdp["losses"],
        "specs": fsdp["specs"],
        "mu_specs": fsdp["mu_specs"],
        "param_diff": max_diff(fsdp["snaps"][SNAP], rep["snaps"][SNAP]),
    }
    out["accum"] = {
        "losses": accum["losses"],
        "param_diff": max_diff(accum["snaps"][SNAP], rep["snaps"][SNAP]),
    }
    out["bf16"] = {
        "losses": bf16["losses"],
        "param_dtypes": bf16["param_dtypes"],
        "opt_dtypes": bf16["opt_dtypes"],
        "hlo_has_bf16_dot": bf16["hlo_has_bf16_dot"],
        "param_diff": max_diff(bf16["snaps"][SNAP], rep["snaps"][SNAP]),
    }
    out["f32_hlo_has_bf16_dot"] = rep["hlo_has_bf16_dot"]
    out["data"] = data_checks()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
