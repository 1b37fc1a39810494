"""Runs the train-step checks in ONE process with 4 CPU devices and prints a JSON report.

Run by tests/runtime/test_train.py in a subprocess (the device count must be set before jax starts);
one process for all checks so jax start-up and compiles are paid once per check, not once per test.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

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
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(train.BATCH_AXES))
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


# One instruction of a compiled HLO module (after /*...*/ comments are dropped): name, result shape,
# opcode, operands, and the rest of the line (attributes such as replica_groups).
INSTRUCTION = re.compile(
    r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = (?P<shape>.*?) "
    r"(?P<op>[a-z][a-z0-9\-]*)\((?P<args>[^)]*)\)(?P<rest>.*)$"
)
COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather")
# Ops that only move or relabel one operand's data: looked through when asking what fed a collective.
PASS_THROUGH = ("bitcast", "copy", "reshape", "get-tuple-element")


def elements(shape: str) -> int:
    """Elements in an HLO result shape, e.g. ``(f32[2,3]{1,0}, f32[])`` -> 7."""
    return sum(
        math.prod(int(n) for n in dims.split(",") if n) for dims in re.findall(r"\[([0-9,]*)\]", shape)
    )


def groups_of(rest: str) -> str:
    """replica_groups in the explicit form, e.g. "{{0,1},{2,3}}" (iota forms such as [2,2]<=[4] expanded)."""
    m = re.search(r"replica_groups=(\{[{}0-9,]*\}|\[[0-9,]+\]<=\[[0-9]+\](?:T\([0-9,]+\))?)", rest)
    assert m, rest
    g = m.group(1)
    if g.startswith("{"):
        return g
    iota = re.fullmatch(r"\[([0-9,]+)\]<=\[([0-9]+)\](?:T\(([0-9,]+)\))?", g)
    assert iota, g
    shape = [int(n) for n in iota.group(1).split(",")]
    ids = np.arange(int(iota.group(2)))
    if iota.group(3):
        raise AssertionError(f"transposed iota groups not expected here: {g}")
    rows = ids.reshape(shape[0], -1)
    return "{" + ",".join("{" + ",".join(str(i) for i in r) + "}" for r in rows) + "}"


def collectives(hlo: str) -> list[dict[str, Any]]:
    """Every collective of a compiled module: op, device groups, elements, and what fed it.

    ``fed_by`` lists, for each operand, the op that produced its data, looking through pure data
    movement and through collectives whose groups are single devices (sums over an axis of size 1).
    """
    instructions = {}
    for line in hlo.splitlines():
        m = INSTRUCTION.match(re.sub(r"/\*.*?\*/", "", line))
        if m:
            instructions[m["name"]] = m
    trivial = re.compile(r"^\{(\{\d+\},?)*\}$")

    def source(name: str) -> str:
        m = instructions.get(name)
        if m is None:
            return "parameter"
        if m["op"] in PASS_THROUGH or (m["op"] in COLLECTIVES and trivial.match(groups_of(m["rest"]))):
            first = re.findall(r"%([\w.\-]+)", m["args"])
            return source(first[0]) if first else m["op"]
        if m["op"] in COLLECTIVES:
            return f"{m['op']} {groups_of(m['rest'])}"
        return m["op"]

    out = []
    for m in instructions.values():
        if m["op"] not in COLLECTIVES or trivial.match(groups_of(m["rest"])):
            continue
        operands = re.findall(r"%([\w.\-]+)", m["args"])
        out.append(
            {
                "op": m["op"],
                "groups": groups_of(m["rest"]),
                "elements": elements(m["shape"]),
                "fed_by": sorted({source(o) for o in operands}),
            }
        )
    return out


def dcn_checks(params: Any, batch_size: int) -> dict[str, Any]:
    """The same 4 devices as 1 slice of 2x2 and as 2 slices of 1x2: gradients, layout, collectives."""
    devices = np.asarray(jax.devices())
    out: dict[str, Any] = {}
    for sharding in ("replicated", "fsdp"):
        grads = {}
        for name, shape in (("one", (1, 2, 2)), ("two", (2, 1, 2))):
            mesh = jax.sharding.Mesh(devices.reshape(shape), dist.MESH_AXES)
            step = train.make_train_step(
                lm.make_loss_fn(CFG), optimizer(), mesh, param_sharding=sharding, fsdp_min_size=256
            )
            state = step.init(params)
            batch = lm.batch_for_step(0, batch_size, CFG.seq_len, CFG.vocab, SEED, step.batch_sharding)
            compiled = jax.jit(step.loss_and_grads).lower(state.params, batch).compile()
            grads[name] = host(compiled(state.params, batch))
            if name == "two":
                out[sharding] = {
                    "collectives": collectives(compiled.as_text() or ""),
                    "param_specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(state.params)}),
                    "param_elements": sum(x.size for x in jax.tree.leaves(state.params)),
                    "replicated_elements": sum(
                        x.size for x in jax.tree.leaves(state.params) if x.sharding.spec == P()
                    ),
                    "losses": [],
                }
                for s in range(SNAP):
                    b = lm.batch_for_step(s, batch_size, CFG.seq_len, CFG.vocab, SEED, step.batch_sharding)
                    state, metrics = step(state, b)
                    out[sharding]["losses"].append(float(metrics["loss"]))
                out[sharding]["snap"] = host(state.params)
        out[sharding]["loss_one"], out[sharding]["loss_two"] = float(grads["one"][0]), float(grads["two"][0])
        out[sharding]["grad_diff"] = max_diff(grads["one"][1], grads["two"][1])
        out[sharding]["grad_scale"] = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(grads["one"][1]))
    return out


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
    dcn = dcn_checks(lm.init_params(CFG, SEED), BATCH)
    for sharding, ref in (("replicated", rep), ("fsdp", fsdp)):
        dcn[sharding]["param_diff"] = max_diff(dcn[sharding].pop("snap"), ref["snaps"][SNAP])
    out["dcn"] = dcn
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
