"""A few steps of the bundled step on every host of a simulated multislice job; one RESULT line per host.

Run by tests/runtime/test_multihost.py on hosts started with TPUCTL_NUM_SLICES and each host's
TPUCTL_SLICE_ID. It trains the same steps twice, on the mesh ``dist.make_mesh`` builds from the
environment and on the same devices in the same order as one slice, so every host reports what it saw
of both and the test compares hosts with each other and the slices with one slice.
"""

from __future__ import annotations

import json
from typing import Any

import jax

from tpuctl.runtime import dist, train
from tpuctl.runtime.models import lm

CFG = lm.LMConfig(vocab=64, d_model=32, n_layers=1, n_heads=2, d_ff=64, seq_len=16)
BATCH = 16
SEED = 3
STEPS = 6


def run(mesh: jax.sharding.Mesh) -> dict[str, Any]:
    # FSDP over "model" with "data" > 1: the in-slice reduce-scatter then runs over both in-slice axes.
    optimizer = train.make_optimizer(3e-2, warmup_steps=2, total_steps=STEPS, weight_decay=0.01)
    step = train.make_train_step(
        lm.make_loss_fn(CFG), optimizer, mesh, param_sharding="fsdp", fsdp_min_size=256
    )
    state = step.init(lm.init_params(CFG, SEED))
    losses = []
    for s in range(STEPS):
        batch = lm.batch_for_step(s, BATCH, CFG.seq_len, CFG.vocab, SEED, step.batch_sharding)
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))  # replicated: every host can read it
    return {
        "losses": losses,
        "sha256": train.params_sha256(state.params),  # a collective: every host calls it
        "specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(state.params)}),
    }


def main() -> None:
    worker = dist.init()
    mesh = dist.make_mesh(2)
    # The dcn rows (slices) this host's devices landed in: exactly its own slice.
    local = set(jax.local_devices())
    rows = sorted({int(i) for i in range(mesh.devices.shape[0]) if local & set(mesh.devices[i].flat)})
    one = jax.sharding.Mesh(mesh.devices.reshape(1, -1, mesh.devices.shape[-1]), dist.MESH_AXES)
    out = {
        "process": jax.process_index(),
        "slice_id": worker.slice_id,
        "mesh": dict(mesh.shape),
        "rows": rows,
        "slices": run(mesh),
        "one_slice": run(one),
    }
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
