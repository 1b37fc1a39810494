"""Built-in example: train the small transformer LM on the synthetic task, with checkpoints.

What ``tpuctl run --example lm`` runs on every host. It uses only the worker environment: joins the
job (``dist.init``), builds a ("dcn", "data", "model") mesh over all chips of all slices (``--slices N``
needs no flag here: the slices come from the environment), trains with the bundled step and
checkpoints to ``TPUCTL_CHECKPOINT_DIR``, resuming from the newest good checkpoint after a restart. The
final ``final_params_sha256`` line lets two runs be compared bit for bit: an interrupted-and-resumed run
must print the same hash as an uninterrupted one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lm_train", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=100, help="train until this many steps are done")
    p.add_argument("--checkpoint-every", type=int, default=50, help="save every N steps (0: only at the end)")
    p.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="default: $TPUCTL_CHECKPOINT_DIR; without either, no checkpoints",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds the params and the data")
    p.add_argument("--batch", type=int, default=32, help="global batch size (sequences)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--model-parallel", type=int, default=1, help="size of the mesh's 'model' axis")
    p.add_argument("--param-sharding", choices=("replicated", "fsdp"), default="replicated")
    p.add_argument("--bf16", action="store_true", help="bf16 compute, fp32 master weights")
    p.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="at least this many micro-batches per step (more where the devices need them)",
    )
    p.add_argument(
        "--device-batch",
        type=int,
        default=None,
        help="at most this many rows per device at once: on a slice with fewer devices the gradient "
        "accumulation grows so that --batch stays the same (default: no bound)",
    )
    p.add_argument(
        "--crash-after-step",
        type=int,
        default=None,
        help="rehearse a failure: once this step's checkpoint is durable, exit hard (code 3) "
        "without a final save",
    )
    p.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        help="sleep this many seconds after each step (rehearsals: time to preempt a short run)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # Orbax and absl log every save at INFO, fsspec every read-ahead cache of a restore, the runtime's
    # checkpointer each restore on every host (process 0 says it below); keep the host log about training.
    for noisy in ("absl", "orbax", "jax", "fsspec", "tpuctl.runtime"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from tpuctl.runtime import dist
    from tpuctl.runtime.preemption import PreemptionWatch

    # Listen for a preemption notice from the start: a SIGTERM during start-up is kept, not fatal.
    watch = PreemptionWatch.from_env().install()
    worker = dist.init()  # before anything touches a JAX backend
    watch.attach()
    try:
        return _train(args, worker, watch)
    finally:
        watch.close()


def _train(args: argparse.Namespace, worker: Any, watch: Any) -> int:
    import time

    import jax
    import jax.numpy as jnp

    from tpuctl.runtime import dist, train
    from tpuctl.runtime.batch import BatchSplitError, plan_batch
    from tpuctl.runtime.checkpoint import Checkpointer, CheckpointMisfitError
    from tpuctl.runtime.models import lm
    from tpuctl.runtime.preemption import emit, exit_preempted

    pid, nproc = jax.process_index(), jax.process_count()
    print(f"process {pid}/{nproc} devices {jax.local_device_count()}/{jax.device_count()}", flush=True)
    # The global batch is the run's on every slice type; the devices of this slice decide how it is
    # split, into as many micro-batches as they need (tpuctl.runtime.batch).
    try:
        split = plan_batch(
            args.batch, jax.device_count(), device_batch=args.device_batch, min_grad_accum=args.grad_accum
        )
    except BatchSplitError as exc:
        print(f"--batch {args.batch}: {exc}", file=sys.stderr)
        return 2
    if pid == 0:
        print(split.describe(), flush=True)

    cfg = lm.LMConfig(
        vocab=args.vocab,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        d_ff=4 * args.d_model,
        seq_len=args.seq_len,
    )
    mesh = dist.make_mesh(args.model_parallel)
    if pid == 0:
        # e.g. "mesh dcn=2 data=4 model=1": slices x data parallelism within a slice x model axis.
        print("mesh " + " ".join(f"{axis}={size}" for axis, size in mesh.shape.items()), flush=True)
    optimizer = train.make_optimizer(
        args.lr, warmup_steps=min(10, args.steps // 10 + 1), total_steps=args.steps
    )
    step = train.make_train_step(
        lm.make_loss_fn(cfg),
        optimizer,
        mesh,
        param_sharding=args.param_sharding,
        compute_dtype=jnp.bfloat16 if args.bf16 else jnp.float32,
        grad_accum_steps=split.grad_accum_steps,
    )

    init_params = lm.init_params(cfg, args.seed)  # host numpy: same on every process
    state = None
    directory = args.checkpoint_dir or worker.checkpoint_dir
    ckpt = None
    restored_step: int | None = None
    skipped: list[dict[str, Any]] = []
    if directory:
        every = args.checkpoint_every if args.checkpoint_every > 0 else max(args.steps, 1)
        ckpt = Checkpointer(directory, save_interval_steps=every, max_to_keep=args.keep)
        try:
            # Any device count restores (the arrays are laid out anew); other shapes are refused, not
            # trained over from step 0.
            restored = ckpt.restore_latest(step.abstract_state(init_params), refuse_misfit=True)
        except CheckpointMisfitError as exc:
            print(f"cannot resume: {exc}", file=sys.stderr)
            return 2
        skipped = [{"step": k.step, "reason": k.reason} for k in restored.skipped]
        restored_step = restored.step
        if restored.step is not None:
            state = restored.state
            if pid == 0:
                print(f"restored step {restored.step} from {directory}", flush=True)
    if state is None:
        state = step.init(init_params)

    first = int(state.step)
    if pid == 0:
        # Where this start begins (the supervisor counts recomputed steps and checkpoint fallbacks).
        emit(
            "start",
            step=first,
            restored=restored_step,
            skipped=skipped,
            restart_count=worker.restart_count,
            steps=args.steps,
            sync=watch.mode,
            t=time.time(),
        )
    for s in range(first, args.steps):
        started = time.perf_counter()
        batch = lm.batch_for_step(s, args.batch, cfg.seq_len, cfg.vocab, args.seed, step.batch_sharding)
        state, metrics = step(state, batch)
        done = s + 1
        if pid == 0:
            # Block on this step's result so its time is the step's, not the dispatch's.
            jax.block_until_ready(metrics)  # type: ignore[no-untyped-call]
            dt = round(time.perf_counter() - started, 6)
            emit("step", step=done, dt=dt, loss=round(float(metrics["loss"]), 6))
        if pid == 0 and (done % args.log_every == 0 or s == first or done == args.steps):
            loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
            print(f"step {done} loss {loss:.4f} grad_norm {grad_norm:.4f}", flush=True)
        if ckpt is not None:
            ckpt.maybe_save(done, state)
            if args.crash_after_step == done:
                ckpt.wait()
                print(f"crashing after step {done} as asked", flush=True)
                os._exit(3)
        if args.step_delay > 0:
            time.sleep(args.step_delay)
        if done < args.steps and watch.should_stop(done):
            # Every host is here at the same step: save it, make it durable, and leave.
            save_started = time.perf_counter()
            if ckpt is not None:
                ckpt.save(done, state, force=True)
                ckpt.close()
            return exit_preempted(
                done,
                saved=ckpt is not None,
                say=pid == 0,
                save_s=time.perf_counter() - save_started,
                reason=watch.notice_source,
            )

    if ckpt is not None:
        ckpt.save(int(state.step), state, force=True)
        ckpt.close()
    digest = train.params_sha256(state.params)
    if pid == 0:
        print(f"final_params_sha256 {digest}", flush=True)
        emit("done", step=int(state.step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
