#!/usr/bin/env python3
"""Benchmark: checkpoint save/restore throughput against a plain sequential write/read of the same bytes.

A train-state-like pytree of float32 arrays (``--mb`` MiB in ``--arrays`` leaves) on the CPU is saved with
``tpuctl.runtime.checkpoint.Checkpointer`` (orbax, checksummed, committed by rename) and restored with
``restore_latest`` (read back and verified), then the same bytes are written to one file on the same disk
as the baseline. Throughput is MiB/s of array bytes; the ratio is checkpoint / plain (target: 0.7 or
better). Both sides are measured alike, so the ratio compares the work and not the setup:

- durable writes on both sides: the baseline writes straight from the arrays' buffers (no ``tobytes``
  copy) and fsyncs; the checkpoint is timed until ``wait()`` says the step is committed (tensorstore
  fsyncs its files, then orbax renames the step into place);
- cold reads on both sides: after writing, every file is fsynced and dropped from the page cache with
  ``posix_fadvise(DONTNEED)`` (no root needed), so neither read is served from memory that the write
  just filled;
- the restore is what a restarted job waits for once it has its ``Checkpointer``: ``restore_latest``
  with everything it does (list the steps, read the verification record, read every array, the
  multi-process vote, verify every array's checksum), into jax arrays. It runs on a fresh
  ``Checkpointer``, as after a restart; building one (which a job needs to save anyway) is timed apart
  and reported as ``checkpointer_open_s``, not counted in the restore. The plain read is the floor:
  ``np.fromfile`` of each array into a new buffer, nothing verified;
- runs interleave checkpoint and plain, alternating which goes first, after one untimed warm-up of each;
  the median of ``--repeat`` is reported with each side's process CPU time (the machine may be shared:
  the load average before and after is recorded, and CPU seconds say how much work each side did);
- two ratios per figure, because the disk is shared and one slow run on either side moves a median-of-each-
  side ratio a lot: ``*_ratio`` is median(checkpoint MiB/s) / median(plain MiB/s), ``*_ratio_paired`` the
  median over rounds of plain seconds / checkpoint seconds of the same round (the two ran back to back,
  so they saw the same disk and load). ``met`` needs both to reach the target.

    .venv/bin/python scripts/bench_checkpoint.py [--mb 256] [--arrays 16] [--repeat 11] [--dir DIR]
        [--out docs/bench/checkpoint.json]
"""

# jax leaves parts of its public API unannotated (ShapeDtypeStruct, block_until_ready).
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_machine import machine  # scripts/ is on sys.path: the scripts run by path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _state(mb: int, arrays: int) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np

    per = max(1, (mb * 1024 * 1024) // (4 * arrays))
    rng = np.random.default_rng(0)
    return {f"w{i:03d}": jnp.asarray(rng.standard_normal(per, dtype=np.float32)) for i in range(arrays)}


def _nbytes(state: dict[str, Any]) -> int:
    return sum(int(v.size) * int(v.dtype.itemsize) for v in state.values())


def _drop_cache(root: Path) -> None:
    """Flush and evict ``root`` (a file or a tree) from the page cache, so the next read goes to disk."""
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


Timing = tuple[float, float]  # (wall seconds, process CPU seconds)


def _timed(start: Timing) -> Timing:
    return time.perf_counter() - start[0], time.process_time() - start[1]


def _now() -> Timing:
    return time.perf_counter(), time.process_time()


def _checkpoint_once(state: dict[str, Any], directory: Path, step: int) -> tuple[Timing, Timing, float]:
    import jax

    from tpuctl.runtime.checkpoint import Checkpointer

    ckpt = Checkpointer(directory, save_interval_steps=1, max_to_keep=1, async_save=False)
    try:
        t0 = _now()
        ckpt.save(step, state, force=True)
        ckpt.wait()
        save = _timed(t0)
    finally:
        ckpt.close()
    _drop_cache(directory)
    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in state.items()}
    t0 = _now()
    ckpt = Checkpointer(directory, save_interval_steps=1, max_to_keep=1, async_save=False)
    open_s = _timed(t0)[0]
    try:
        t0 = _now()
        result = ckpt.restore_latest(target)
        jax.block_until_ready(result.state)
        restore = _timed(t0)
        if result.step != step:
            raise SystemExit(f"restore returned step {result.step}, expected {step}")
    finally:
        ckpt.close()
    return save, restore, open_s


def _plain_once(state: dict[str, Any], path: Path) -> tuple[Timing, Timing]:
    import numpy as np

    host = [np.asarray(v) for v in state.values()]  # CPU arrays: views, no copy
    t0 = _now()
    with open(path, "wb") as fh:
        for arr in host:
            fh.write(arr.data.cast("B"))
        fh.flush()
        os.fsync(fh.fileno())
    write = _timed(t0)
    _drop_cache(path)
    t0 = _now()
    with open(path, "rb") as fh:
        back = [np.fromfile(fh, dtype=arr.dtype, count=arr.size) for arr in host]
    read = _timed(t0)
    if sum(b.nbytes for b in back) != sum(a.nbytes for a in host):
        raise SystemExit("plain read came back short")
    return write, read


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="MiB of array data (default 256)")
    parser.add_argument("--arrays", type=int, default=16, help="leaves in the pytree (default 16)")
    parser.add_argument("--repeat", type=int, default=11, help="median of N (default 11)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "checkpoint.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    state = _state(args.mb, args.arrays)
    nbytes = _nbytes(state)
    mib = nbytes / (1024 * 1024)
    base = Path(tempfile.mkdtemp(prefix="tpuctl-bench-ckpt-", dir=args.dir))
    saves: list[Timing] = []
    restores: list[Timing] = []
    writes: list[Timing] = []
    reads: list[Timing] = []
    opens: list[float] = []
    loads: list[float] = []  # 1-minute load average at the end of each counted round
    load_before = _load()
    try:
        for i in range(args.repeat + 1):  # round 0 warms up (imports, orbax threads) and is not counted
            ck_dir, plain = base / f"ckpt{i}", base / f"plain{i}.bin"
            plain_first = i % 2 == 1
            if plain_first:
                write, read = _plain_once(state, plain)
                plain.unlink()
            save, restore, open_s = _checkpoint_once(state, ck_dir, step=i + 1)
            shutil.rmtree(ck_dir, ignore_errors=True)
            if not plain_first:
                write, read = _plain_once(state, plain)
                plain.unlink()
            if i:
                saves.append(save)
                restores.append(restore)
                writes.append(write)
                reads.append(read)
                opens.append(open_s)
                loads.append(_load()[0])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load_after = _load()

    def mbps(runs: list[Timing]) -> float:
        return round(mib / statistics.median(wall for wall, _ in runs), 1)

    def cpu(runs: list[Timing]) -> float:
        return round(statistics.median(c for _, c in runs), 3)

    figures = {
        "save_mib_s": mbps(saves),
        "restore_mib_s": mbps(restores),
        "plain_write_mib_s": mbps(writes),
        "plain_read_mib_s": mbps(reads),
    }
    save_ratio = round(figures["save_mib_s"] / figures["plain_write_mib_s"], 3)
    restore_ratio = round(figures["restore_mib_s"] / figures["plain_read_mib_s"], 3)

    def paired(ckpt: list[Timing], plain: list[Timing]) -> float:
        return round(statistics.median(p / c for (c, _), (p, _) in zip(ckpt, plain, strict=True)), 3)

    save_paired, restore_paired = paired(saves, writes), paired(restores, reads)
    result = {
        "benchmark": "checkpoint save/restore (Checkpointer, CPU) vs plain sequential write/read",
        "target_ratio": 0.7,
        "bytes": nbytes,
        "arrays": args.arrays,
        "repeat": args.repeat,
        **figures,
        "save_ratio": save_ratio,
        "restore_ratio": restore_ratio,
        "save_ratio_paired": save_paired,
        "restore_ratio_paired": restore_paired,
        "met": min(save_ratio, restore_ratio, save_paired, restore_paired) >= 0.7,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "checkpointer_open_s": round(statistics.median(opens), 4),
        "cpu_seconds_median": {
            "save": cpu(saves),
            "restore": cpu(restores),
            "plain_write": cpu(writes),
            "plain_read": cpu(reads),
        },
        "seconds": {
            "save": [w for w, _ in saves],
            "restore": [w for w, _ in restores],
            "plain_write": [w for w, _ in writes],
            "plain_read": [w for w, _ in reads],
        },
        "cpu_seconds": {
            "save": [c for _, c in saves],
            "restore": [c for _, c in restores],
            "plain_write": [c for _, c in writes],
            "plain_read": [c for _, c in reads],
        },
        "loadavg_1min_per_round": loads,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "note": (
            "median of --repeat after a warm-up, checkpoint and plain interleaved (alternating which "
            "goes first); *_ratio_paired is the median of per-round plain/checkpoint seconds; both "
            "writes durable (fsync), both reads after fsync + posix_fadvise(DONTNEED) "
            "of the files just written; the restore is restore_latest on a fresh Checkpointer (listing, "
            "record, arrays, vote, checksum of every array), the Checkpointer's construction apart"
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{mib:.0f} MiB in {args.arrays} arrays, median of {args.repeat}; load {load_before} -> {load_after}"
    )
    print(
        f"save    {figures['save_mib_s']:>8} MiB/s  vs write {figures['plain_write_mib_s']:>8} MiB/s  "
        f"ratio {save_ratio} (paired {save_paired})"
    )
    print(
        f"restore {figures['restore_mib_s']:>8} MiB/s  vs read  {figures['plain_read_mib_s']:>8} MiB/s  "
        f"ratio {restore_ratio} (paired {restore_paired})"
    )
    print(
        f"cpu s   save {cpu(saves)} write {cpu(writes)} restore {cpu(restores)} read {cpu(reads)}; "
        f"Checkpointer() {statistics.median(opens):.4f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
