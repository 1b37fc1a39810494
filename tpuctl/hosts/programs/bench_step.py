"""Host side of ``tpuctl bench step``: time the bundled train step over every device of the slice.

Runs on every host (launched by ``tpuctl run``): joins the job, builds the ("dcn", "data", "model") mesh
over all chips, and trains the runtime's small transformer with ``tpuctl.runtime.train.make_train_step`` on a
global batch sharded over "data". After warm-up, each timed step is dispatched and waited for
(``block_until_ready``); all hosts step in lock-step through the step's collectives, so host 0's timings
are the slice's. Then host 0 alone measures a large matmul on its first device (the others wait at a
barrier, so on the simulator, where every host shares one CPU, the peak is the machine's with nothing
else running). Host 0 prints one line ``TPUCTL_BENCH_STEP {json}`` that the CLI parses.
"""

# jax leaves block_until_ready unannotated.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

RESULT_PREFIX = "TPUCTL_BENCH_STEP "


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_step")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    p.add_argument("--batch-per-device", type=int, default=2, help="sequences per device per step")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--model-parallel", type=int, default=1)
    p.add_argument("--param-sharding", choices=("replicated", "fsdp"), default="replicated")
    p.add_argument("--matmul-n", type=int, default=2048, help="square matmul size for the measured peak")
    return p.parse_args(argv)


def matmul_tflops(n: int, dtype: Any) -> float:
    """Median TFLOP/s of an n x n x n matmul on this process's first local device."""
    import jax
    import jax.numpy as jnp

    device = jax.local_devices()[0]
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.device_put(jax.random.normal(ka, (n, n), jnp.float32).astype(dtype), device)
    b = jax.device_put(jax.random.normal(kb, (n, n), jnp.float32).astype(dtype), device)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, b).block_until_ready()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        mm(a, b).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2.0 * n**3 / statistics.median(times) / 1e12


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from tpuctl.runtime import dist

    worker = dist.init()

    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    from tpuctl.runtime import train
    from tpuctl.runtime.models import lm

    dtype = jnp.bfloat16 if args.compute_dtype == "bfloat16" else jnp.float32
    cfg = lm.LMConfig(
        vocab=args.vocab,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        d_ff=4 * args.d_model,
        seq_len=args.seq_len,
    )
    mesh = dist.make_mesh(args.model_parallel)
    step = train.make_train_step(
        lm.make_loss_fn(cfg),
        train.make_optimizer(1e-3, warmup_steps=1, total_steps=10**6),
        mesh,
        param_sharding=args.param_sharding,
        compute_dtype=dtype,
    )
    global_batch = args.batch_per_device * jax.device_count()
    state = step.init(lm.init_params(cfg, 0))
    batches = [
        lm.batch_for_step(s, global_batch, cfg.seq_len, cfg.vocab, 0, step.batch_sharding) for s in range(2)
    ]

    compile_started = time.perf_counter()
    state, metrics = step(state, batches[0])
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - compile_started
    for i in range(args.warmup):
        state, metrics = step(state, batches[i % 2])
        jax.block_until_ready(metrics)
    times = []
    for i in range(args.steps):
        t = time.perf_counter()
        state, metrics = step(state, batches[i % 2])
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t)

    multihost_utils.sync_global_devices("tpuctl-bench-steps-done")
    peak = matmul_tflops(args.matmul_n, dtype) if jax.process_index() == 0 else None
    multihost_utils.sync_global_devices("tpuctl-bench-peak-done")

    if jax.process_index() == 0:
        step_s = statistics.median(times)
        tokens = global_batch * cfg.seq_len
        flops = cfg.train_flops_per_token() * tokens
        result = {
            "platform": jax.devices()[0].platform,
            "device_kind": jax.devices()[0].device_kind,
            "processes": jax.process_count(),
            "devices": jax.device_count(),
            "accelerator_type": worker.accelerator_type,
            "params": cfg.n_params,
            "global_batch": global_batch,
            "seq_len": cfg.seq_len,
            "compute_dtype": args.compute_dtype,
            "compile_s": compile_s,
            "step_time_s": step_s,
            "step_time_min_s": min(times),
            "tokens_per_step": tokens,
            "tokens_per_s": tokens / step_s,
            "flops_per_step": flops,
            "achieved_tflops": flops / step_s / 1e12,
            "matmul_peak_tflops": peak,
            "matmul_n": args.matmul_n,
            "loss": float(metrics["loss"]),
        }
        print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
