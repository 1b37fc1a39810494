"""Checkpoint checks in one process with 4 CPU devices; prints a JSON report on stdout (logs on stderr).

Run by tests/runtime/test_checkpoint.py in a subprocess, with the checkpoint root as argv[1].
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tpuctl.runtime import dist, train
from tpuctl.runtime.checkpoint import Checkpointer
from tpuctl.runtime.models import lm

CFG = lm.LMConfig(vocab=64, d_model=32, n_layers=1, n_heads=2, d_ff=64, seq_len=16)


def tree_equal(a: Any, b: Any) -> bool:
    la, lb = jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))


def specs(tree: Any) -> list[str]:
    return [str(x.sharding.spec) for x in jax.tree.leaves(tree)]


def state_at(base: train.TrainState, k: int) -> train.TrainState:
    """A distinct state per step number, keeping the base state's shardings."""
    return base._replace(step=base.step + k, params=jax.tree.map(lambda p: p + float(k), base.params))


def largest_data_file(step_dir: Path) -> Path:
    files = [p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: p.stat().st_size)


def checksum_disagreements(mesh: Any) -> list[str]:
    """Leaves whose host-side checksum (numpy, used on CPU) differs from the on-device one (XLA, the
    definition): they must agree so that a step saved on one platform verifies on another, and so that
    steps saved before any change to the host code still verify."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tpuctl.runtime import checkpoint

    rng = np.random.default_rng(3)

    def put(x: Any, *spec: Any) -> Any:
        return jax.device_put(x, NamedSharding(mesh, P(*spec)))

    tree = {
        "long": put(rng.standard_normal(1 << 20, dtype=np.float32)),  # reshaped into blocks of a row
        "odd": put(rng.standard_normal(3000, dtype=np.float32)),  # no block divides it
        "five_k": put(rng.standard_normal(5 * 1024, dtype=np.float32), "data"),
        "matrix": put(rng.standard_normal((256, 4096), dtype=np.float32), "data", "model"),
        "cols": put(rng.integers(0, 2**32, (2, 8192), dtype=np.uint32), None, "model"),
        "bf16": put(jnp.asarray(rng.standard_normal((64, 1024)), jnp.bfloat16), "model"),
        "int8": put(rng.integers(-128, 128, 4096, dtype=np.int8)),
        "bool": put(rng.integers(0, 2, 100).astype(bool)),
        "scalar": put(np.int32(-7)),
    }
    host = checkpoint.checksums(tree)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    device = dict(zip(paths, (int(v) for v in jax.device_get(checkpoint._tree_checksums(tree))), strict=True))
    return sorted(p for p in paths if host[p] != device[p])


def cross_device(root: Path, mesh4: Any) -> dict[str, Any]:
    """A recovery onto a slice type with half the devices: 2 steps on 4 devices (FSDP), a checkpoint, 2
    more on 2 devices (replicated) restored from it, against 2 more on the 4. The batch rule keeps the
    global batch and doubles the accumulation; the trajectories must agree. Then a target of other
    shapes is refused by name instead of starting over."""
    from jax.sharding import Mesh

    from tpuctl.runtime.batch import plan_batch
    from tpuctl.runtime.checkpoint import CheckpointMisfitError

    global_batch = 8
    mesh2 = Mesh(np.asarray(jax.devices()[:2]).reshape(1, 2, 1), dist.MESH_AXES)
    optimizer = train.make_optimizer(1e-2, warmup_steps=0, total_steps=10)

    def step_on(mesh: Any, sharding: train.ParamSharding) -> tuple[Any, train.TrainStep]:
        split = plan_batch(global_batch, mesh.size, device_batch=2)
        loss_fn = lm.make_loss_fn(CFG)
        accum = split.grad_accum_steps
        made = train.make_train_step(
            loss_fn, optimizer, mesh, param_sharding=sharding, grad_accum_steps=accum, fsdp_min_size=256
        )
        return split, made

    def advance(step: train.TrainStep, state: Any, steps: range) -> tuple[Any, list[float]]:
        losses = []
        for s in steps:
            batch = lm.batch_for_step(s, global_batch, CFG.seq_len, CFG.vocab, 0, step.batch_sharding)
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))
        return state, losses

    split4, on4 = step_on(mesh4, "fsdp")
    split2, on2 = step_on(mesh2, "replicated")
    params = lm.init_params(CFG, 0)
    state, _ = advance(on4, on4.init(params), range(2))
    ck = Checkpointer(root / "x", save_interval_steps=1, max_to_keep=2)
    ck.save(2, state, force=True)
    ck.wait()
    stayed, stayed_losses = advance(on4, state, range(2, 4))  # donates ``state``: saved already
    restored = ck.restore_latest(on2.abstract_state(params), refuse_misfit=True)
    assert restored.state is not None
    on_two = {len(x.sharding.device_set) for x in jax.tree.leaves(restored.state)}
    moved, moved_losses = advance(on2, restored.state, range(2, 4))
    out: dict[str, Any] = {
        "splits": [split4.describe(), split2.describe()],
        "restored_step": restored.step,
        "restored_device_counts": sorted(on_two),
        "losses": [stayed_losses, moved_losses],
        "param_diff": max(
            float(np.max(np.abs(a - b)))
            for a, b in zip(
                jax.tree.leaves(jax.device_get(stayed.params)),
                jax.tree.leaves(jax.device_get(moved.params)),
                strict=True,
            )
        ),
    }
    other = lm.LMConfig(**{**CFG.__dict__, "d_model": 16})
    other_step = train.make_train_step(lm.make_loss_fn(other), optimizer, mesh2)
    try:
        ck.restore_latest(other_step.abstract_state(lm.init_params(other, 0)), refuse_misfit=True)
        out["misfit_error"] = None
    except CheckpointMisfitError as exc:
        out["misfit_error"] = str(exc)
    out["misfit_kept"] = ck.all_steps()
    ck.close()
    return out


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    root = Path(sys.argv[1])
    dist.init()
    mesh = dist.make_mesh(2)
    fsdp = train.make_train_step(
        lm.make_loss_fn(CFG), train.make_optimizer(), mesh, param_sharding="fsdp", fsdp_min_size=256
    )
    params = lm.init_params(CFG, 0)
    base = fsdp.init(params)
    target = fsdp.abstract_state(params)
    out: dict[str, Any] = {"checksum_disagreements": checksum_disagreements(mesh)}

    # Round trip, periodic saving and keep-last-N.
    ck = Checkpointer(root / "a", save_interval_steps=2, max_to_keep=2)
    started = [k for k in range(1, 8) if ck.maybe_save(k, state_at(base, k))]
    out["periodic_saved"] = started
    out["forced_saved"] = ck.save(7, state_at(base, 7), force=True)
    out["forced_again"] = ck.save(7, state_at(base, 7), force=True)  # already there: a no-op
    ck.wait()
    out["kept"] = ck.all_steps()
    r = ck.restore_latest(target)
    out["restored_step"] = r.step
    out["restored_equal"] = tree_equal(r.state, state_at(base, 7))
    out["restored_specs_match"] = specs(r.state) == specs(base)
    assert r.state is not None
    out["restored_step_field"] = int(r.state.step)
    out["latest_good_step"] = ck.latest_good_step(target)
    # The same checkpoint into a different layout (e.g. a restart with other sharding flags).
    rep = train.make_train_step(lm.make_loss_fn(CFG), train.make_optimizer(), mesh)
    out["reshard_equal"] = tree_equal(ck.restore(6, rep.abstract_state(params)), state_at(base, 6))
    ck.close()

    # A truncated file in the latest step: fall back to the previous one, say so, drop the bad one.
    ck = Checkpointer(root / "b", save_interval_steps=1, max_to_keep=3)
    for k in (1, 2, 3):
        ck.save(k, state_at(base, k))
    ck.wait()
    victim = largest_data_file(root / "b" / "3")
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    out["b_latest_good_step"] = ck.latest_good_step(target)
    r = ck.restore_latest(target)
    out["b_restored_step"] = r.step
    out["b_skipped"] = [[s.step, s.reason] for s in r.skipped]
    out["b_restored_equal"] = tree_equal(r.state, state_at(base, 2))
    out["b_steps_after"] = ck.all_steps()
    # Training resumes from 2 and saves 3 again.
    out["b_resave_3"] = ck.save(3, state_at(base, 3))
    ck.wait()
    out["b_steps_final"] = ck.all_steps()
    ck.close()

    # A flipped byte (no truncation) is caught by the checksum, not by the reader.
    ck = Checkpointer(root / "c", save_interval_steps=1, max_to_keep=3)
    for k in (1, 2):
        ck.save(k, state_at(base, k))
    ck.wait()
    victim = largest_data_file(root / "c" / "2")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = ck.restore_latest(target)
    out["c_restored_step"] = r.step
    out["c_skipped"] = [[s.step, s.reason] for s in r.skipped]
    ck.close()

    # A step saved before the verification record carried the layout: restores as before, and a target
    # that does not fit is still named (from orbax's metadata).
    ck = Checkpointer(root / "d", save_interval_steps=1, max_to_keep=2)
    ck.save(1, state_at(base, 1))
    ck.wait()
    record_file = root / "d" / "1" / "verify" / "metadata"
    record = json.loads(record_file.read_text())
    out["d_had_layout"] = "layout" in record
    del record["layout"]
    record_file.write_text(json.dumps(record))
    r = ck.restore_latest(target)
    out["d_restored_step"] = r.step
    out["d_restored_equal"] = tree_equal(r.state, state_at(base, 1))
    r = ck.restore_latest(
        train.make_train_step(
            lm.make_loss_fn(lm.LMConfig(**{**CFG.__dict__, "d_model": 16})),
            train.make_optimizer(),
            mesh,
        ).abstract_state(lm.init_params(lm.LMConfig(**{**CFG.__dict__, "d_model": 16}), 0))
    )
    out["d_mismatch_skipped"] = [[s.step, s.reason] for s in r.skipped]
    ck.close()

    # A leaf that does not come back as the target asks (orbax's CPU handler returns a typed PRNG key as
    # its raw words, whose checksum matches) makes the step unreadable instead of resuming with it.
    ck = Checkpointer(root / "e", save_interval_steps=1, max_to_keep=1)
    keyed = {"w": base.params, "key": jax.random.key(0)}
    ck.save(1, keyed)
    ck.wait()
    r = ck.restore_latest(keyed)
    out["e_restored_step"] = r.step
    out["e_skipped"] = [[s.step, s.reason] for s in r.skipped]
    ck.close()

    # Everything unreadable (here: a target of another model): start fresh, delete nothing.
    other = train.make_train_step(
        lm.make_loss_fn(lm.LMConfig(**{**CFG.__dict__, "d_model": 16})), train.make_optimizer(), mesh
    )
    ck = Checkpointer(root / "a", save_interval_steps=1, max_to_keep=2)
    r = ck.restore_latest(
        other.abstract_state(
            lm.init_params(lm.LMConfig(vocab=64, d_model=16, n_layers=1, n_heads=2, d_ff=64, seq_len=16), 0)
        )
    )
    out["mismatch_restored"] = r.step
    out["mismatch_kept"] = ck.all_steps()
    ck.close()

    # A save that crashed half-way leaves only orbax's tmp dir: never a step; cleaned at start-up.
    tmp = root / "a" / "9.orbax-checkpoint-tmp-1234567"
    (tmp / "state").mkdir(parents=True)
    ck = Checkpointer(root / "a", save_interval_steps=1, max_to_keep=2)
    out["tmp_steps"] = ck.all_steps()
    out["tmp_removed"] = not tmp.exists()
    ck.close()
    out["cross_device"] = cross_device(root, mesh)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
