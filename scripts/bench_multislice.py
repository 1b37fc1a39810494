#!/usr/bin/env python3
"""Benchmark: the bundled train step on 2 slices x 2 hosts against 1 slice x 4 hosts of the same chips.

Both are `tpuctl bench step` runs on the simulator, in the same simulator and the same process of this
script, alternated round by round so that machine-load drift hits both alike: `v4-16 --slices 2` (two
2-host slices joined over the simulated DCN; the runtime's mesh has a "dcn" axis of 2 and the step
reduces gradients within a slice, then across slices) and `v4-32` (one 4-host slice). Same 16 simulated
chips, same model and global batch. The figure is the ratio of their median tokens/s. On CPU there is
no DCN to be slower than ICI (every host is a process of this machine, every collective goes over
loopback gloo), so the ratio measures what the two-level reduction costs in itself; there is no
target on CPU.

Writes docs/bench/multislice.json (or --out). Run from the repository root:
``.venv/bin/python scripts/bench_multislice.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_machine import machine  # scripts/ is on sys.path: the scripts run by path
from bench_setup import tpuctl

WORLD = """\
speed: 1000
zones:
  us-central2-b: {v4: {on_demand: 64}}
quotas:
  default:
    on_demand: {zone: -1, region: -1}
latency: {base_ms: 0, jitter_ms: 0}
"""
VARIANTS: dict[str, tuple[str, ...]] = {
    "2 slices x 2 hosts (v4-16 --slices 2)": ("v4-16", "--slices", "2"),
    "1 slice x 4 hosts (v4-32)": ("v4-32",),
}


def bench_step(env: dict[str, str], args: argparse.Namespace, shape: tuple[str, ...]) -> dict[str, Any]:
    sizes = ["--steps", str(args.steps), "--batch-per-device", "2", "--seq-len", "64", "--d-model", "128",
             "--layers", "2", "--matmul-n", "512"]  # fmt: skip
    bench: dict[str, Any] = tpuctl(env, "bench", "step", *shape, "--zone", "us-central2-b", *sizes)["bench"]
    return bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("docs/bench/multislice.json"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-multislice-") as tmp:
        root = Path(tmp)
        (root / "world.yaml").write_text(WORLD)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
        env.update({"TPUCTL_STATE_DIR": str(root / "state"), "TPUCTL_SIM_WORLD": str(root / "world.yaml")})
        try:
            for _ in range(args.rounds):
                for name, shape in VARIANTS.items():
                    runs[name].append(bench_step(env, args, shape))
        finally:
            from tpuctl.sim.vms.layout import vm_root_for
            from tpuctl.sim.vms.procs import discard_vms

            discard_vms(vm_root_for(root / "state"))

    figures = {
        name: {
            "tokens_per_s": [round(float(b["tokens_per_s"]), 1) for b in got],
            "median_tokens_per_s": round(statistics.median(float(b["tokens_per_s"]) for b in got), 1),
            "median_step_time_s": round(statistics.median(float(b["step_time_s"]) for b in got), 4),
            "hosts": got[0]["hosts"],
            "devices": got[0]["devices"],
            "slices": got[0]["slices"],
        }
        for name, got in runs.items()
    }
    multi, single = (figures[name]["median_tokens_per_s"] for name in VARIANTS)
    doc = {
        "benchmark": "bundled train step: 2 slices x 2 hosts vs 1 slice x 4 hosts, same 16 chips (simulator)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "config": {
            "rounds": args.rounds,
            "steps": args.steps,
            "batch_per_device": 2,
            "seq_len": 64,
            "d_model": 128,
            "layers": 2,
        },
        "variants": figures,
        "ratio": round(multi / single, 3),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"tokens/s, 2x2 multislice / 1x4 slice: {multi:.0f} / {single:.0f} = {doc['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
