"""The exclusive right to supervise a run: an ``flock`` on ``runs/<id>/supervisor.lock`` held for the
supervisor's lifetime (the kernel releases it however the holder dies), with the holder's identity in the
file so ``runs describe`` and ``runs cancel`` can name and signal it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tpuctl.store.paths import ensure_private_dir, private_file

LOCK_FILE = "supervisor.lock"


@dataclass
class Lease:
    """The exclusive right to supervise one run: a held ``flock`` (released by the kernel whatever way
    the holder dies) plus, in the run's detail, who holds it."""

    path: Path
    fh: IO[str]

    @staticmethod
    def acquire(path: Path) -> Lease | None:
        ensure_private_dir(path.parent.parent)
        ensure_private_dir(path.parent)
        fh = private_file(path).open("a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            return None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(supervisor_identity()))
        fh.flush()
        return Lease(path, fh)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
        self.fh.close()


def supervisor_identity() -> dict[str, Any]:
    from tpuctl.processes import process_start_ticks

    pid = os.getpid()
    return {
        "pid": pid,
        "start_ticks": process_start_ticks(pid),
        "host": os.uname().nodename,
        "since": time.time(),
    }


def lease_holder(run_dir: Path) -> dict[str, Any] | None:
    """Who supervises the run now: the lease file's identity while its lock is held, else None."""
    path = run_dir / LOCK_FILE
    if not path.exists():
        return None
    lease = Lease.acquire(path)
    if lease is not None:  # nobody holds it (and we just took it: give it back)
        lease.release()
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        data = {}
    return data if isinstance(data, dict) else {}
