#!/usr/bin/env python3
"""CLI start-up benchmark: median wall time of `tpuctl --help` (target <= 0.20 s) and of
`tpuctl pod list` on the simulator with 10 slices in 8 zones (target <= 1.0 s).

Each figure is the median of N runs of the installed console script as a fresh process, measured from
spawn to exit, the way a user sees it. Writes JSON to docs/bench/cli.json (or --out) and prints a table.

    .venv/bin/python scripts/bench_cli.py [--runs 15] [--out docs/bench/cli.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench_machine import machine  # scripts/ is on sys.path: the scripts run by path

ROOT = Path(__file__).resolve().parent.parent
# 10 slices over 8 zones (two zones hold two slices each).
SLICES = [
    ("v5e-8", "us-central1-a"),
    ("v5e-4", "us-central1-a"),
    ("v6e-8", "us-central1-b"),
    ("v5e-8", "us-south1-a"),
    ("v5e-16", "us-west4-a"),
    ("v5e-8", "us-east1-c"),
    ("v6e-4", "us-east1-d"),
    ("v6e-8", "us-east5-b"),
    ("v6e-8", "us-east5-b"),
    ("v5e-8", "europe-west4-b"),
]


def tpuctl_binary() -> str:
    candidate = Path(sys.executable).with_name("tpuctl")
    if not candidate.exists():
        raise SystemExit(f"no tpuctl next to {sys.executable}: run scripts/setup first")
    return str(candidate)


def time_command(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        samples.append(time.perf_counter() - started)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.decode()[-500:]}")
    return samples


def populate(state_dir: Path) -> None:
    """Create the 10 slices directly through the cloud layer against a fast simulator."""
    from tpuctl.catalog import Catalog
    from tpuctl.cloud.base import NodeRequest
    from tpuctl.cloud.tpu_api import TpuApiCloud
    from tpuctl.sim import SimServer, default_world

    world = default_world().model_copy(update={"speed": 6000.0})
    catalog = Catalog.load()
    with SimServer(state_dir, world) as server:
        cloud = TpuApiCloud.for_simulator(project=world.project, base_url=server.url)
        try:
            for i, (type_name, zone) in enumerate(SLICES):
                accel = catalog.resolve(type_name)
                cloud.create_node(
                    NodeRequest(
                        name=f"bench-{i}",
                        zone=zone,
                        accelerator_type=accel.api_name,
                        runtime_version=accel.runtime_version,
                    )
                )
            listed = cloud.list_nodes(None)
        finally:
            cloud.close()
    zones = {n.zone for n in listed}
    assert len(listed) == 10 and len(zones) == 8, (len(listed), zones)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "cli.json")
    args = parser.parse_args()

    binary = tpuctl_binary()
    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-cli-") as tmp:
        state_dir = Path(tmp) / "state"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
        for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
            env.pop(name, None)
        env["TPUCTL_STATE_DIR"] = str(state_dir)
        env["XDG_CONFIG_HOME"] = str(Path(tmp) / "config")
        populate(state_dir)
        # Warm the OS file cache once; it is the steady state a user sees.
        time_command([binary, "pod", "list"], env, 1)
        help_samples = time_command([binary, "--help"], env, args.runs)
        list_samples = time_command([binary, "pod", "list"], env, args.runs)

    figures = {
        "help_median_s": round(statistics.median(help_samples), 4),
        "help_target_s": 0.20,
        "pod_list_10_slices_8_zones_median_s": round(statistics.median(list_samples), 4),
        "pod_list_target_s": 1.0,
        "runs": args.runs,
        "samples": {
            "help": [round(s, 4) for s in help_samples],
            "pod_list": [round(s, 4) for s in list_samples],
        },
        "machine": machine(
            load_avg_1m=round(os.getloadavg()[0], 2),
            PYTHONDONTWRITEBYTECODE=os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
        ),
        "date": datetime.now(tz=UTC).isoformat(timespec="seconds"),
        "how_to_rerun": ".venv/bin/python scripts/bench_cli.py",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"tpuctl --help                  median {figures['help_median_s']:.3f} s  (target 0.20 s)")
    print(
        f"tpuctl pod list (10 in 8 zones) median {figures['pod_list_10_slices_8_zones_median_s']:.3f} s"
        "  (target 1.0 s)"
    )
    print(f"load average during the run: {figures['machine']['load_avg_1m']}; written to {args.out}")


if __name__ == "__main__":
    main()
