#!/usr/bin/env python3
"""Benchmark: the simulator's run start-up time over SSH for 1, 4, 16 and 64 hosts.

Start-up = from the moment `tpuctl run` is spawned (a fresh process: CLI import, in-process simulator,
host keys, SSH to every host, bundle, ship, setup check, start) to the moment the LAST host runs the
user's first line. The slice exists already (`--pod`): provisioning is the simulator's speed-scaled
create time, not the launcher's. The trivial program runs with ``--no-runtime-deps`` (the image's
python3, nothing to install); the JAX figure installs the runtime once (first run) and is measured warm.
Target: 64 hosts within 3x the 1-host time.

Measured per host count (``launcher_cpu_s``: the `tpuctl run` process's own CPU time, median of the
warm runs; on this one machine the simulated hosts' login shells and Python start-ups share its cores,
where each real host has its own):
- ``cold_s``: the first run on the slice (the bundle is shipped to every host);
- ``warm_s``: median of the next runs (unchanged bundle: each host's cache hit, nothing shipped);
- ``jax_ready_s``: a program whose first lines are ``import jax; jax.distributed.initialize()``,
  to the moment the last host has joined the job (one run, warm bundle).

For context it also times ``tpuctl pod list`` (any command's fixed cost: Python, CLI import, the in-process
simulator, one API call) and records the load average, since other work on a small machine skews it.

Writes docs/bench/launch.json (or --out) and prints a table. Run from the repository root:
``.venv/bin/python scripts/bench_launch.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_machine import machine  # scripts/ is on sys.path: the scripts run by path

#: (hosts, accelerator type, zone): the smallest slice of each host count the default catalog has.
SHAPES = [
    (1, "v5e-4", "us-central1-a"),
    (4, "v5e-16", "us-central1-a"),
    (16, "v5e-64", "us-central1-a"),
    (64, "v5e-256", "us-central1-a"),
]
WORLD = """\
speed: 1000
zones:
  us-central1-a: {v5e: {on_demand: 512, preemptible: 512}}
quotas:
  default:
    on_demand: {zone: -1, region: -1}
    preemptible: {zone: -1, region: -1}
latency: {base_ms: 0, jitter_ms: 0}
"""
#: The CPU seconds (user + system) of each timed `tpuctl run` process: the launcher's own work, apart from
#: the simulated hosts' (which share this machine's cores, where each real host has its own).
LAUNCHER_CPU_S: list[float] = []
FIRST_LINE = 'import time; print("FIRST", time.time(), flush=True)\n'
JAX_READY = """\
import jax
jax.distributed.initialize()
import time
from typing import Any
print("READY", time.time(), jax.process_index(), jax.process_count(), flush=True)
"""


def tpuctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuctl", *args], env=env, capture_output=True, text=True, timeout=600
    )


def timed_run(env: dict[str, str], pod: str, script: Path, marker: str, hosts: int, *flags: str) -> float:
    """Seconds from spawning `tpuctl run` to the last host's ``marker`` timestamp. The `tpuctl run`
    process's own CPU time is added to ``LAUNCHER_CPU_S``."""
    started = time.time()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = tpuctl(env, "run", str(script), "--pod", pod, *flags)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    LAUNCHER_CPU_S.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"run on {pod} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    stamps = [float(m) for m in re.findall(rf"\| {marker} ([0-9.]+)", done.stdout)]
    if len(stamps) != hosts:
        raise SystemExit(f"expected {hosts} {marker} lines, got {len(stamps)}:\n{done.stdout[-3000:]}")
    return max(stamps) - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("docs/bench/launch.json"))
    parser.add_argument("--reps", type=int, default=5, help="warm runs per host count")
    parser.add_argument("--no-jax", action="store_true", help="skip the jax.distributed start-up figure")
    args = parser.parse_args()

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-launch-") as tmp:
        root = Path(tmp)
        (root / "world.yaml").write_text(WORLD)
        first = root / "first" / "first_line.py"
        first.parent.mkdir()
        first.write_text(FIRST_LINE)
        ready = root / "jax" / "jax_ready.py"
        ready.parent.mkdir()
        ready.write_text(JAX_READY)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
        env.update({"TPUCTL_STATE_DIR": str(root / "state"), "TPUCTL_SIM_WORLD": str(root / "world.yaml")})
        # Context: what any tpuctl command costs here (Python, CLI import, in-process simulator, one call).
        baseline = []
        for _ in range(args.reps):
            started = time.time()
            tpuctl(env, "pod", "list")
            baseline.append(time.time() - started)
        for hosts, type_name, zone in SHAPES:
            pod = f"bench-{hosts}"
            created = tpuctl(env, "pod", "create", type_name, "--zone", zone, "--name", pod)
            if created.returncode != 0:
                raise SystemExit(f"pod create {type_name} failed:\n{created.stderr}")
            bare = "--no-runtime-deps"
            cold = timed_run(env, pod, first, "FIRST", hosts, bare)
            LAUNCHER_CPU_S.clear()
            warm = [timed_run(env, pod, first, "FIRST", hosts, bare) for _ in range(args.reps)]
            launcher_cpu = statistics.median(LAUNCHER_CPU_S)
            jax_ready = None
            if not args.no_jax and hosts <= 16:  # 64 hosts x the JAX stack: more disk than it says
                timed_run(env, pod, ready, "READY", hosts)  # ship this bundle first: measure it warm
                jax_ready = timed_run(env, pod, ready, "READY", hosts)
            tpuctl(env, "pod", "delete", pod, "-y")
            row = {
                "hosts": hosts,
                "accelerator_type": type_name,
                "cold_s": round(cold, 3),
                "warm_s": round(statistics.median(warm), 3),
                "warm_min_s": round(min(warm), 3),
                "warm_max_s": round(max(warm), 3),
                "jax_ready_s": None if jax_ready is None else round(jax_ready, 3),
                "launcher_cpu_s": round(launcher_cpu, 3),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
        from tpuctl.sim.vms.layout import vm_root_for
        from tpuctl.sim.vms.procs import discard_vms

        discard_vms(vm_root_for(root / "state"))  # the state's hypervisor and VMs go with it

    doc = {
        "benchmark": "simulator run start-up over SSH: `tpuctl run --pod` spawned -> last host runs the "
        "first line",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "reps": args.reps,
        "baseline_pod_list_s": round(statistics.median(baseline), 3),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'hosts':>5} {'type':>8} {'cold s':>8} {'warm s':>8} {'jax ready s':>12} {'tpuctl cpu s':>13}")
    for r in results:
        jr = "-" if r["jax_ready_s"] is None else f"{r['jax_ready_s']:.2f}"
        print(
            f"{r['hosts']:>5} {r['accelerator_type']:>8} {r['cold_s']:>8.2f} {r['warm_s']:>8.2f} {jr:>12}"
            f" {r['launcher_cpu_s']:>13.2f}"
        )
    one, last = float(results[0]["warm_s"]), float(results[-1]["warm_s"])
    print(f"64 hosts / 1 host (warm): {last / one:.2f}x (target <= 3x)")
    cpu_one, cpu_last = float(results[0]["launcher_cpu_s"]), float(results[-1]["launcher_cpu_s"])
    print(f"tpuctl's own CPU, 64 hosts / 1 host: {cpu_last / cpu_one:.2f}x")
    print(f"baseline `tpuctl pod list`: {doc['baseline_pod_list_s']:.2f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
