#!/usr/bin/env python3
"""Benchmark: host setup restoring the run's environment from the bucket, against the disk's write floor.

What is judged is what every host of a recovery, and every host but the builder, does: set up on a fresh
VM whose environment is already in the run's bucket (``tpuctl.hosts.envstore``: the image's ``python3``
streams the archive from the simulator's bucket into ``tar -x``). One run, interleaved paired rounds:

- (a) a ``tpuctl run`` of a trivial program on a one-host slice of its own (``--type v5e-8``, created for
  the run and deleted after it, so each round's host is a fresh VM with an empty disk); its figure is the
  setup time the run recorded (the running segment's ``setup_s``: the setup script's start to its end).
  The program, run in the restored environment, counts that tree's files and bytes.
- (b) right after, on the same disk (the directory the simulated VMs' disks are in), the floor: the same
  tree (the archive's directories, files of the same sizes, its links) written by a Python loop with
  nothing to download, unpack or resolve.

Both sides are fsync-free (tar does no fsync; the floor does none): each starts after the previous
round's files are gone and ``sync`` has written everything back, and each ends with its bytes in the
page cache. The judged figure is the median of the rounds' ratios (setup / floor), target <= 1.5x: a
ratio is robust to the load of a shared machine, which slows both sides of a round alike.

Before the rounds, once, the builder's setup (the first run: builds the environment from the simulator's
package mirror, which ``scripts/setup`` primed, and stores it in the bucket): reported, not judged.

Writes docs/bench/setup.json (or --out). Run from the repository root:
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
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_machine import machine  # scripts/ is on sys.path: the scripts run by path

TARGET_RATIO = 1.5
WORLD = """\
speed: 1000
zones:
  us-central1-a: {v5e: {on_demand: 64}}
quotas:
  default:
    on_demand: {zone: -1, region: -1}
latency: {base_ms: 0, jitter_ms: 0}
"""
#: Run with the restored environment's python: counts that tree as the host has it.
PROGRAM = """\
import json, os, sys
files = size = 0
for top, dirs, names in os.walk(sys.prefix):
    for name in names:
        path = os.path.join(top, name)
        if os.path.isfile(path) and not os.path.islink(path):
            files += 1
            size += os.path.getsize(path)
print("bench-env " + json.dumps({"prefix": sys.prefix, "files": files, "bytes": size}), flush=True)
"""


def tpuctl(env: dict[str, str], *args: str, as_json: bool = True) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "tpuctl", *args, *(["-o", "json"] if as_json else [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"tpuctl {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout) if as_json else done.stdout


def quiesce(state_dir: Path) -> None:
    """Wait until the previous round's VM disk is wiped, then write everything back. Every simulated disk
    is a directory on this machine's one disk: the previous round's 700 MB, still being removed or
    written back, would slow this round, which no fresh VM on a disk of its own would meet."""
    from tpuctl.sim.vms.layout import vm_root_for

    disks = vm_root_for(state_dir) / "disks"
    give_up = time.monotonic() + 120
    while disks.is_dir() and any(disks.iterdir()) and time.monotonic() < give_up:
        time.sleep(0.2)
    os.sync()


def setup_round(env: dict[str, str], program: Path) -> tuple[float, dict[str, Any]]:
    """(setup seconds, the environment the program counted) of one run on a fresh one-host slice."""
    quiesce(Path(env["TPUCTL_STATE_DIR"]))
    run = tpuctl(env, "run", str(program), "--type", "v5e-8", "--zone", "us-central1-a")["run"]
    described = tpuctl(env, "runs", "describe", run["run_id"])["run"]
    running = [s for s in described["segments"] if s["kind"] == "running"]
    setup_s = running[0]["detail"].get("setup_s") if running else None
    if not isinstance(setup_s, float):
        raise SystemExit(f"run {run['run_id']} recorded no setup time: {running}")
    log = tpuctl(env, "runs", "logs", run["run_id"], "--worker", "0", as_json=False)
    counted = [
        json.loads(line.split("bench-env ", 1)[1]) for line in log.splitlines() if "bench-env " in line
    ]
    if not counted:
        raise SystemExit(f"run {run['run_id']}'s program printed no count:\n{log[-3000:]}")
    return setup_s, counted[-1]


def stored_archive(state_dir: Path) -> Path:
    """The environment's archive as the simulator's bucket keeps it (the one the runs restored)."""
    from gcp_storage_emulator.settings import STORAGE_DIR

    from tpuctl.sim.storage import DEFAULT_BUCKET, storage_dir_for, stored_objects

    objects = storage_dir_for(state_dir) / str(STORAGE_DIR) / DEFAULT_BUCKET
    stored = stored_objects(storage_dir_for(state_dir), prefix="tpuctl/envs/")
    records = [name for name in stored if name.endswith("/stored.json")]
    if len(records) != 1:
        raise SystemExit(f"expected one stored environment in the bucket, found {records}")
    archive: str = json.loads((objects / records[0]).read_bytes())["archive"]
    return objects / archive


def tree_of(archive: Path) -> list[tarfile.TarInfo]:
    """The archive's members (directories, files, links), in its order: what a restore writes."""
    with tarfile.open(archive, "r:") as tar:
        return [m for m in tar.getmembers() if m.name not in (".", "./")]


def write_floor(tree: list[tarfile.TarInfo], into: Path) -> float:
    """Seconds to write ``tree`` under ``into`` (a new directory): its directories, its files with as many
    bytes each, its links, in the archive's order, with nothing to download or unpack. No fsync, as tar
    does none."""
    block = bytes(max((m.size for m in tree if m.isfile()), default=0))
    started = time.perf_counter()
    into.mkdir()
    for member in tree:
        path = into / member.name
        if member.isdir():
            path.mkdir(exist_ok=True)
        elif member.issym():
            os.symlink(member.linkname, path)
        elif member.islnk():  # a file uv linked from its cache twice: tar makes it a link again
            os.link(into / member.linkname, path)
        elif member.isfile():
            with open(path, "wb") as f:
                f.write(memoryview(block)[: member.size])
    return time.perf_counter() - started


def measure(env: dict[str, str], program: Path, rounds: int) -> dict[str, Any]:
    from tpuctl.sim.vms.layout import vm_root_for

    state = Path(env["TPUCTL_STATE_DIR"])
    builder_s, built = setup_round(env, program)  # the first run: builds and stores the environment
    tree = tree_of(stored_archive(state))
    files = [m for m in tree if m.isfile()]
    sizes = {m.name: m.size for m in files}
    # What the program counts in the restored tree: a hard link is a file of its target's size there, and
    # the setup adds its empty marker (``.complete``) once the archive is in place.
    expected = {
        "files": len(files) + sum(1 for m in tree if m.islnk()) + 1,
        "bytes": sum(sizes.values()) + sum(sizes.get(m.linkname, 0) for m in tree if m.islnk()),
    }
    floor_dir = vm_root_for(state) / "bench-floor"  # beside the VMs' disks: the same disk
    pairs: list[tuple[float, float]] = []
    for i in range(rounds):
        setup_s, counted = setup_round(env, program)
        if {k: counted[k] for k in expected} != expected:
            raise SystemExit(f"round {i}: the restored tree {counted} is not the archive's {expected}")
        quiesce(state)
        floor_s = write_floor(tree, floor_dir)
        shutil.rmtree(floor_dir)  # as a deleted VM's disk is wiped; the next round's quiesce waits for it
        pairs.append((setup_s, floor_s))
        print(f"round {i}: setup {setup_s:.3f} s, floor {floor_s:.3f} s, ratio {setup_s / floor_s:.2f}x")
    ratios = [s / f for s, f in pairs]
    return {
        "builder_setup_s": round(builder_s, 3),
        "builder_env": built,
        "rounds_s": [round(s, 3) for s, _ in pairs],
        "write_floor_rounds_s": [round(f, 3) for _, f in pairs],
        "ratios": [round(r, 3) for r in ratios],
        "median_ratio": round(statistics.median(ratios), 3),
        "median_s": round(statistics.median(s for s, _ in pairs), 3),
        "min_s": round(min(s for s, _ in pairs), 3),
        "max_s": round(max(s for s, _ in pairs), 3),
        "write_floor_s": round(statistics.median(f for _, f in pairs), 3),
        "written_mib": round(sum(m.size for m in files) / 2**20),
        "written_files": len(files),
        "written_dirs": sum(1 for m in tree if m.isdir()),
        "written_links": sum(1 for m in tree if m.issym() or m.islnk()),
        "restored_tree": expected,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("docs/bench/setup.json"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load_at_start = os.getloadavg()

    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-setup-") as tmp:
        root = Path(tmp)
        (root / "world.yaml").write_text(WORLD)
        program = root / "proj" / "count_env.py"
        program.parent.mkdir()
        program.write_text(PROGRAM)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
        env.update({"TPUCTL_STATE_DIR": str(root / "state"), "TPUCTL_SIM_WORLD": str(root / "world.yaml")})
        try:
            figures = measure(env, program, args.rounds)
        finally:
            from tpuctl.sim.vms.layout import vm_root_for
            from tpuctl.sim.vms.procs import discard_vms

            discard_vms(vm_root_for(root / "state"))  # the state's hypervisor and VMs go with it

    doc = {
        "benchmark": (
            "host setup restoring the run's environment from the simulated bucket on a fresh one-host slice "
            "(v5e-8), against writing the same tree to the same disk; interleaved paired rounds"
        ),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_at_start": [round(x, 2) for x in load_at_start],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "durability": "none on either side: no fsync (tar does none), each side starts after sync",
        "target_ratio": TARGET_RATIO,
        **figures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"restore setup vs write floor, {args.rounds} paired rounds: ratios {doc['ratios']}, "
        f"median {doc['median_ratio']:.2f}x (target <= {TARGET_RATIO}x); "
        f"setup median {doc['median_s']:.2f} s, floor median {doc['write_floor_s']:.2f} s "
        f"({doc['written_mib']} MiB in {doc['written_files']} files); "
        f"builder's setup {doc['builder_setup_s']:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
