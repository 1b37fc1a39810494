"""Bring your own train.py: what to add so a preemption costs no work (checkpoint on the notice)."""

import json
import os
import sys
import time

from etils import epath  # paths that also take gs:// (checkpoints live in a bucket: a VM's disk dies)

from tpuctl.runtime.preemption import PreemptionWatch, emit, exit_preempted

watch = PreemptionWatch.from_env().install()  # before jax.distributed.initialize(); watch.attach() after
ckpt = epath.Path(os.environ["TPUCTL_CHECKPOINT_DIR"]) / "state.json"
step, loss = json.loads(ckpt.read_text()) if ckpt.exists() else (0, 10.0)
emit("start", step=step, restored=step if ckpt.exists() else None)
while step < int(os.environ.get("STEPS", "100")):
    started = time.perf_counter()
    time.sleep(0.05)  # your training step
    step, loss = step + 1, loss * 0.99
    emit("step", step=step, dt=time.perf_counter() - started)  # steps recomputed, goodput, budget
    if watch.should_stop(step):  # a notice on any host: every host stops at the same step
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        ckpt.write_text(json.dumps([step, loss]))
        sys.exit(exit_preempted(step, saved=True))  # exit 75: "checkpointed, move me"
print(f"done at step {step}, loss {loss:.4f}")
