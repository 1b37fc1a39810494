#!/usr/bin/env python3
"""Benchmark the bundled train step against a plain ``jax.jit`` + optax step on the same model and batch.

Both steps train the same transformer (tpuctl.runtime.models.lm) with the same optimizer, on the same
device, in the same process. Each is compiled and warmed up, then the two are timed in alternation (one
step of each per round, ``block_until_ready`` after every step) so that machine-load drift hits both
alike; we report medians. Also reported: tokens/s, achieved FLOP/s (XLA's cost analysis of the compiled
step, and the 6N-per-token model estimate), and the peak of a large f32 / bf16 matmul measured here.

    .venv/bin/python scripts/bench_step.py [--out docs/bench/step.json] [--steps 20] ...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", default="docs/bench/step.json", help="where to write the JSON figures")
    p.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant after compiling")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--matmul-n", type=int, default=2048, help="size of the square matmul for the peak")
    return p.parse_args(argv)


def _median_time(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_peak(n: int, dtype: Any) -> dict[str, float]:
    import jax
    import jax.numpy as jnp

    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (n, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, b).block_until_ready()
    t = _median_time(lambda: mm(a, b).block_until_ready(), 7)
    return {"n": n, "seconds": t, "tflops": 2.0 * n**3 / t / 1e12}


def _cost_flops(compiled: Any) -> float | None:
    try:
        cost = compiled.cost_analysis()
        if isinstance(cost, list):
            cost = cost[0]
        flops = float(cost.get("flops", 0.0))
        return flops if flops > 0 else None
    except Exception:  # cost analysis is best-effort and backend-dependent
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp
    import optax

    from tpuctl.runtime import dist, train
    from tpuctl.runtime.models import lm

    compute_dtype = jnp.bfloat16 if args.compute_dtype == "bfloat16" else jnp.float32
    cfg = lm.LMConfig(
        vocab=args.vocab,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        d_ff=4 * args.d_model,
        seq_len=args.seq_len,
    )
    loss_fn = lm.make_loss_fn(cfg)
    opt = train.make_optimizer(1e-3, warmup_steps=10, total_steps=1000)
    params = lm.init_params(cfg, 0)
    # One device for both: the plain step is the single-device program a user writes by hand.
    device = jax.devices()[0]
    n_batches = 4
    host_batches = [lm.batch_for_step(s, args.batch, cfg.seq_len, cfg.vocab, 0) for s in range(n_batches)]

    # --- the bundled step, on a 1x1x1 mesh over the same device ------------------------------------
    mesh = jax.sharding.Mesh([[[device]]], dist.MESH_AXES)
    bundled = train.make_train_step(loss_fn, opt, mesh, compute_dtype=compute_dtype)
    b_state = bundled.init(params)
    b_batches = [jax.device_put(b, bundled.batch_sharding) for b in host_batches]
    # jit-wrapped: it has .lower, which the step's Callable annotation does not show.
    b_fn = cast(jax.stages.Wrapped, bundled.compiled(b_state))
    b_compiled = b_fn.lower(b_state, b_batches[0]).compile()

    # --- the plain step, written directly -----------------------------------------------------------
    def plain_loss(p: Any, batch: Any) -> jax.Array:
        if compute_dtype != jnp.float32:
            p = jax.tree.map(lambda x: x.astype(compute_dtype), p)
        return loss_fn(p, batch).astype(jnp.float32)

    def plain_update(p: Any, s: Any, batch: Any) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(plain_loss)(p, batch)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    plain_step = jax.jit(plain_update, donate_argnums=(0, 1))
    p_params = jax.device_put(jax.tree.map(jnp.asarray, params), device)
    p_opt = opt.init(p_params)
    p_batches = [jax.device_put(b, device) for b in host_batches]
    p_compiled = plain_step.lower(p_params, p_opt, p_batches[0]).compile()

    state: dict[str, Any] = {"b": b_state, "p": (p_params, p_opt), "i": 0}

    def run_bundled() -> None:
        s, m = b_fn(state["b"], b_batches[state["i"] % n_batches])
        jax.block_until_ready((s, m))
        state["b"] = s

    def run_plain() -> None:
        pp, po = state["p"]
        pp, po, loss = plain_step(pp, po, p_batches[state["i"] % n_batches])
        jax.block_until_ready((pp, po, loss))
        state["p"] = (pp, po)

    for _ in range(args.warmup):
        run_bundled()
        run_plain()
        state["i"] += 1
    times: dict[str, list[float]] = {"bundled": [], "plain": []}
    for r in range(args.steps):
        # Alternate which goes first so neither always inherits the other's cache state.
        order = (("bundled", run_bundled), ("plain", run_plain))
        for name, fn in order if r % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
        state["i"] += 1

    tokens = args.batch * cfg.seq_len
    b_med, p_med = statistics.median(times["bundled"]), statistics.median(times["plain"])
    # Paired per round: both steps of a round ran back to back under the same machine load, so their
    # ratio is robust to load that drifts over the run (other jobs on a shared machine).
    paired = statistics.median(p / b for p, b in zip(times["plain"], times["bundled"], strict=True))
    flops_model = cfg.train_flops_per_token() * tokens
    flops_xla = {"bundled": _cost_flops(b_compiled), "plain": _cost_flops(p_compiled)}
    peaks = {
        "float32": matmul_peak(args.matmul_n, jnp.float32),
        "bfloat16": matmul_peak(args.matmul_n, jnp.bfloat16),
    }
    peak = peaks[args.compute_dtype]["tflops"]

    def figures(name: str, med: float) -> dict[str, Any]:
        xla = flops_xla[name]
        return {
            "median_step_s": med,
            "min_step_s": min(times[name]),
            "tokens_per_s": tokens / med,
            "tflops_model_estimate": flops_model / med / 1e12,
            "tflops_xla_cost": (xla / med / 1e12) if xla else None,
            "xla_flops_per_step": xla,
            "fraction_of_matmul_peak": (flops_model / med / 1e12) / peak,
        }

    result: dict[str, Any] = {
        "what": "bundled tpuctl.runtime.train step vs plain jax.jit+optax step, same model/batch/device",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "device": str(device),
            "device_kind": device.device_kind,
            "jax": jax.__version__,
            "optax": optax.__version__,
            "python": sys.version.split()[0],
        },
        "config": {
            "batch": args.batch,
            "seq_len": cfg.seq_len,
            "vocab": cfg.vocab,
            "d_model": cfg.d_model,
            "layers": cfg.n_layers,
            "heads": cfg.n_heads,
            "d_ff": cfg.d_ff,
            "params": cfg.n_params,
            "compute_dtype": args.compute_dtype,
            "timed_steps": args.steps,
            "warmup": args.warmup,
            "plain_step_donates": True,
        },
        "bundled": figures("bundled", b_med),
        "plain": figures("plain", p_med),
        "throughput_ratio_bundled_over_plain": p_med / b_med,
        "throughput_ratio_paired_median": paired,
        "target_ratio": 0.95,
        "matmul_peak": peaks,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    print(
        f"device {device.device_kind} ({os.cpu_count()} cpus), model {cfg.n_params / 1e6:.2f}M params, "
        f"batch {args.batch}x{cfg.seq_len} tokens, {args.compute_dtype}"
    )
    print(
        f"{'variant':<10}{'median ms':>11}{'tokens/s':>12}{'TFLOP/s(6N)':>13}{'TFLOP/s(XLA)':>14}"
        f"{'of peak':>9}"
    )
    for name in ("bundled", "plain"):
        f = result[name]
        xla = f"{f['tflops_xla_cost']:.4f}" if f["tflops_xla_cost"] else "n/a"
        print(
            f"{name:<10}{f['median_step_s'] * 1e3:>11.2f}{f['tokens_per_s']:>12.0f}"
            f"{f['tflops_model_estimate']:>13.4f}{xla:>14}{f['fraction_of_matmul_peak']:>9.1%}"
        )
    for dt, pk in peaks.items():
        print(f"matmul peak {dt:<9} n={pk['n']}: {pk['tflops']:.4f} TFLOP/s")
    ratio = result["throughput_ratio_bundled_over_plain"]
    print(
        f"throughput ratio bundled/plain: {ratio:.3f}x of medians, {paired:.3f}x paired per round "
        f"(target >= 0.95x) -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
