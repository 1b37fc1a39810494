#!/usr/bin/env python3
"""Benchmark: host setup on a fresh simulated host, with the simulator's package cache warm.

Each round is one `tpuctl run` of a trivial program on a slice of its own (``--type v5e-8``: one host,
created for the run and deleted after it, so every round's host is a fresh VM with an empty disk): the
host's setup bootstraps uv with the image's pip, makes the environment and installs the bundled
runtime's pinned set (CPU JAX, optax, orbax, gcsfs) from the simulator's package mirror, which
`scripts/setup` primed (the "warm cache": nothing comes from the internet; everything is written to the
fresh host's disk). The figure is the setup time the run recorded for its attempt (the running segment's
``setup_s``: from the setup script's start on every host to its end on the last one).

Then, for scale, the write floor: the time to write the bytes of every file in the mirror's wheels (what a
setup unpacks) as new files on the same disk, with nothing to download, decompress or resolve.

Target: <= 2 s. Writes docs/bench/setup.json (or --out). Run from the repository root:
``.venv/bin/python scripts/bench_setup.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_machine import machine  # scripts/ is on sys.path: the scripts run by path

from tpuctl.sim.mirror import default_wheelhouse

WORLD = """\
speed: 1000
zones:
  us-central1-a: {v5e: {on_demand: 64}}
quotas:
  default:
    on_demand: {zone: -1, region: -1}
latency: {base_ms: 0, jitter_ms: 0}
"""
PROGRAM = 'print("ran", flush=True)\n'


def tpuctl(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tpuctl", *args, "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"tpuctl {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def quiesce(state_dir: Path) -> None:
    """Wait until the previous round's VM disk is wiped and written back. Every simulated disk is a
    directory on this machine's one disk: the previous round's 700 MB, still being removed or written
    back, would slow this round's host, which no fresh VM on a disk of its own would meet."""
    from tpuctl.sim.vms.layout import vm_root_for

    disks = vm_root_for(state_dir) / "disks"
    give_up = time.monotonic() + 120
    while disks.is_dir() and any(disks.iterdir()) and time.monotonic() < give_up:
        time.sleep(0.2)
    os.sync()


def one_round(env: dict[str, str], program: Path) -> float:
    """The setup seconds of one run on a fresh one-host slice."""
    quiesce(Path(env["TPUCTL_STATE_DIR"]))
    run = tpuctl(env, "run", str(program), "--type", "v5e-8", "--zone", "us-central1-a")["run"]
    described = tpuctl(env, "runs", "describe", run["run_id"])["run"]
    running = [s for s in described["segments"] if s["kind"] == "running"]
    setup_s = running[0]["detail"].get("setup_s") if running else None
    if not isinstance(setup_s, float):
        raise SystemExit(f"run {run['run_id']} recorded no setup time: {running}")
    return setup_s


def write_floor(wheelhouse: Path, into: Path) -> tuple[float, int, int]:
    """(seconds, bytes, files) to write, as new files in ``into`` (on the disk the VMs' disks are on), the
    bytes of every file in the mirror's wheels: what a host's setup writes, with nothing to download,
    decompress or resolve. No fsync, as uv does none: this is the disk's page-cache write path, which on
    this machine is far slower than memory (see docs/benchmarks.md)."""
    import zipfile

    sizes = [
        info.file_size
        for wheel in sorted(wheelhouse.glob("*.whl"))
        for info in zipfile.ZipFile(wheel).infolist()
        if not info.is_dir()
    ]
    block = bytes(max(sizes, default=0))
    os.sync()
    started = time.perf_counter()
    into.mkdir(parents=True)
    for i, size in enumerate(sizes):
        if i % 256 == 0:
            (into / f"d{i // 256}").mkdir()
        with open(into / f"d{i // 256}" / f"f{i}", "wb") as f:
            f.write(memoryview(block)[:size])
    took = time.perf_counter() - started
    return took, sum(sizes), len(sizes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("docs/bench/setup.json"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-setup-") as tmp:
        root = Path(tmp)
        (root / "world.yaml").write_text(WORLD)
        program = root / "proj" / "trivial.py"
        program.parent.mkdir()
        program.write_text(PROGRAM)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
        env.update({"TPUCTL_STATE_DIR": str(root / "state"), "TPUCTL_SIM_WORLD": str(root / "world.yaml")})
        try:
            rounds = [one_round(env, program) for _ in range(args.rounds)]
            quiesce(Path(env["TPUCTL_STATE_DIR"]))
            floors = []
            for i in range(3):  # each round on a disk with the previous one's files gone, as a new VM's
                floors.append(write_floor(default_wheelhouse(env), root / f"floor{i}"))
                shutil.rmtree(root / f"floor{i}")
        finally:
            from tpuctl.sim.vms.layout import vm_root_for
            from tpuctl.sim.vms.procs import discard_vms

            discard_vms(vm_root_for(root / "state"))  # the state's hypervisor and VMs go with it

    doc = {
        "benchmark": "host setup on a fresh simulated host (v5e-8, one host), package cache warm",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "rounds_s": [round(r, 3) for r in rounds],
        "median_s": round(statistics.median(rounds), 3),
        "min_s": round(min(rounds), 3),
        "max_s": round(max(rounds), 3),
        "target_s": 2.0,
        "write_floor_s": round(statistics.median(f[0] for f in floors), 3),
        "write_floor_rounds_s": [round(f[0], 3) for f in floors],
        "written_mib": round(floors[0][1] / 2**20),
        "written_files": floors[0][2],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"setup on a fresh host: median {doc['median_s']:.2f} s over {len(rounds)} rounds {doc['rounds_s']}; "
        f"writing its {doc['written_mib']} MiB in {doc['written_files']} files to the same disk alone: "
        f"{doc['write_floor_s']:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
