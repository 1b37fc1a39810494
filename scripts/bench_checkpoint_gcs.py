#!/usr/bin/env python3
"""Benchmark: checkpoint save and restore through gs:// (the runtime's Checkpointer against orbax's own).

Both go through the simulator's bucket (the GCS emulator, on loopback, reached as a simulated host
reaches it: tensorstore through ``TENSORSTORE_GCS_HTTP_URL``, gcsfs through ``FSSPEC_GCS_ENDPOINT_URL``),
with the same state in the same process:

- tpuctl: ``Checkpointer.save(force=True)`` then ``wait()`` (durable: committed in the bucket), and
  ``restore_latest`` by a fresh Checkpointer (as after a restart: it finds the newest step, verifies it);
- bare orbax: ``StandardCheckpointer.save`` + ``wait_until_finished``, and ``restore`` of the same path.

The state is random normal float32 arrays, like trained weights and optimizer moments: orbax's default
zstd compression (which bare orbax uses and tpuctl turns off, as it barely shrinks such data) would
otherwise shrink a regular synthetic array by a quarter and this figure would measure the bytes read, not
what tpuctl adds. One untimed warm-up of each, then ``--rounds`` rounds alternating which goes first;
medians. Ratio = bare time / tpuctl time (1.0: tpuctl adds nothing; target >= 0.9, what tpuctl's
verification and bookkeeping may cost). Writes docs/bench/checkpoint_gcs.json (or --out). Run from the
repository root: ``.venv/bin/python scripts/bench_checkpoint_gcs.py``.
"""

# jax leaves parts of its public API unannotated.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_machine import machine  # scripts/ is on sys.path: the scripts run by path


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _state(mib: int, leaves: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    n = mib * (1 << 20) // 4 // leaves
    keys = jax.random.split(jax.random.key(0), leaves)
    arrays = {f"w{i}": jax.random.normal(keys[i], (n,), dtype=jnp.float32) for i in range(leaves)}
    return arrays | {"step": jnp.int32(7)}


def _tpuctl(directory: str, state: Any, target: Any) -> tuple[float, float]:
    from tpuctl.runtime.checkpoint import Checkpointer

    ckpt = Checkpointer(directory)

    def save_durably() -> None:
        ckpt.save(1, state, force=True)
        ckpt.wait()

    save = _timed(save_durably)
    ckpt.close()
    fresh = Checkpointer(directory)
    restore = _timed(lambda: fresh.restore_latest(target))
    fresh.close()
    return save, restore


def _bare(directory: str, state: Any, target: Any) -> tuple[float, float]:
    import orbax.checkpoint as ocp

    plain = ocp.StandardCheckpointer()
    path = f"{directory}/1"
    save = _timed(lambda: (plain.save(path, state), plain.wait_until_finished()))
    restore = _timed(lambda: plain.restore(path, target))
    plain.close()
    return save, restore


def measure(bucket: str, mib: int, leaves: int, rounds: int) -> dict[str, Any]:
    from tpuctl.runtime.checkpoint import abstract_like

    state = _state(mib, leaves)
    target = abstract_like(state)
    _tpuctl(f"{bucket}/warm-tpuctl", state, target)
    _bare(f"{bucket}/warm-bare", state, target)
    ours: list[tuple[float, float]] = []
    bare: list[tuple[float, float]] = []
    for i in range(rounds):
        order: list[tuple[list[tuple[float, float]], Any]] = [(ours, _tpuctl), (bare, _bare)]
        for into, run in order if i % 2 == 0 else order[::-1]:
            into.append(run(f"{bucket}/{run.__name__.strip('_')}{i}", state, target))
    figures: dict[str, Any] = {}
    for k, what in enumerate(("save", "restore")):
        o = statistics.median(r[k] for r in ours)
        b = statistics.median(r[k] for r in bare)
        # Each round's two runs ran back to back: their ratio cancels the machine's drift between rounds.
        paired = statistics.median(rb[k] / ro[k] for ro, rb in zip(ours, bare, strict=True))
        figures[what] = {
            "tpuctl_median_s": round(o, 4),
            "bare_orbax_median_s": round(b, 4),
            "ratio": round(b / o, 3),
            "paired_ratio": round(paired, 3),
            "tpuctl_rounds_s": [round(r[k], 4) for r in ours],
            "bare_orbax_rounds_s": [round(r[k], 4) for r in bare],
            "tpuctl_mib_s": round(mib / o, 1),
            "bare_orbax_mib_s": round(mib / b, 1),
        }
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=64, help="state size")
    parser.add_argument("--leaves", type=int, default=16, help="arrays in the state")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("docs/bench/checkpoint_gcs.json"))
    args = parser.parse_args()

    from tpuctl.sim import default_world
    from tpuctl.sim.iam import ADC_TOKEN
    from tpuctl.sim.network import caller_storage_env, network_env
    from tpuctl.sim.storage import DEFAULT_BUCKET, StorageEmulator

    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-gcs-") as tmp:
        emulator = StorageEmulator(default_world, Path(tmp))
        url = emulator.start()
        os.environ.update(network_env(mirror_url="http://127.0.0.1:9/", storage_url=url))
        os.environ.update(caller_storage_env(ADC_TOKEN, Path(tmp), default_world().project))
        try:
            figures = measure(f"gs://{DEFAULT_BUCKET}/bench", args.mib, args.leaves, args.rounds)
        finally:
            emulator.stop()
    doc = {
        "benchmark": "checkpoint save (durable) and verified restore through gs:// (the simulator's GCS "
        "emulator): tpuctl's Checkpointer vs orbax's StandardCheckpointer, same state, same bucket",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": {"mib": args.mib, "leaves": args.leaves, "rounds": args.rounds},
        "target_ratio": 0.9,
        **figures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    for what in ("save", "restore"):
        f = figures[what]
        print(
            f"{args.mib} MiB gs:// {what}: tpuctl {f['tpuctl_median_s']:.3f} s, bare orbax "
            f"{f['bare_orbax_median_s']:.3f} s, ratio {f['ratio']:.2f}, paired {f['paired_ratio']:.2f} "
            "(target >= 0.9)"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
