"""Helpers for runtime tests: JAX runs in subprocesses (device counts and the distributed client must be
set before jax starts), simulated hosts are local processes on loopback, each with a metadata server of
its own (tests/runtime/metadata_server.py) that tells it its worker number and the slice's endpoints.

Every child gets a timeout and is killed in a ``finally``; outputs go to files, not pipes, so a chatty
host can never block on a full pipe while we wait on another.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tpuctl.runtime.hostenv import sim_host_env
from tpuctl.testing.metadata_server import MetadataServer, slice_values
from tpuctl.testing.ports import unused_port

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture(scope="session")
def base_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The parent's environment minus anything that steers jax or tpuctl, plus test speed-ups."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUCTL_", "JAX_", "XLA_", "LIBTPU"))}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "JAX_PLATFORMS": "cpu",
            # LLVM optimisation is most of XLA's CPU compile time and these programs are tiny.
            "XLA_FLAGS": "--xla_backend_optimization_level=0",
            # Reruns of the same program (the resume tests) load the executable instead of compiling it.
            "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax-cache")),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@dataclass
class Proc:
    returncode: int | None
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (
            f"rc={self.returncode}\n--- stdout ---\n{self.stdout[-4000:]}\n"
            f"--- stderr ---\n{self.stderr[-4000:]}"
        )


def _kill(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


class Hosts:
    """n simulated hosts running one program, started with ``sim_host_env`` exactly as the launcher would."""

    def __init__(
        self,
        workdir: Path,
        base: dict[str, str],
        num: int,
        chips: int,
        argv: Sequence[str],
        checkpoint_dir: Path | None = None,
        restart_count: int = 0,
        accelerator_type: str = "v5litepod-16",
        topology: str = "4x4",
        env: dict[str, str] | None = None,
        worker_env: Callable[[int], dict[str, str]] | None = None,
    ) -> None:
        """``env`` is laid over every host's environment, then ``worker_env(w)`` over host ``w``'s (e.g.
        its TPUCTL_SLICE_ID)."""
        self.workdir = workdir
        env_extra = dict(env or {})
        port = unused_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[tuple[Path, Path]] = []
        self.metadata: list[MetadataServer] = []
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            for w in range(num):
                self.metadata.append(MetadataServer(slice_values(w, ["127.0.0.1"] * num, accelerator_type)))
                env = dict(base)
                env.update(
                    sim_host_env(
                        run_id="run-test",
                        worker_id=w,
                        num_workers=num,
                        chips_per_host=chips,
                        coordinator_port=port,
                        accelerator_type=accelerator_type,
                        topology=topology,
                        checkpoint_dir=str(checkpoint_dir or workdir / "ckpt"),
                        restart_count=restart_count,
                        bundle_dir=REPO,
                        metadata_host=self.metadata[w].host,
                    )
                )
                env.update(env_extra)
                if worker_env is not None:
                    env.update(worker_env(w))
                out, err = workdir / f"host{w}.out", workdir / f"host{w}.err"
                self.logs.append((out, err))
                with out.open("wb") as fo, err.open("wb") as fe:
                    self.procs.append(
                        subprocess.Popen([sys.executable, *argv], env=env, cwd=workdir, stdout=fo, stderr=fe)
                    )
        except BaseException:
            self.kill()
            raise

    def read(self, w: int) -> tuple[str, str]:
        out, err = self.logs[w]
        return out.read_text(errors="replace"), err.read_text(errors="replace")

    def wait(self, timeout: float) -> list[Proc]:
        deadline = time.monotonic() + timeout
        try:
            for p in self.procs:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.kill()
        return [Proc(p.returncode, *self.read(w)) for w, p in enumerate(self.procs)]

    def kill(self) -> None:
        for p in self.procs:
            _kill(p)
        for m in self.metadata:
            m.close()
        self.metadata = []


@pytest.fixture(scope="session")
def start_hosts(base_env: dict[str, str]) -> Iterator[Callable[..., Hosts]]:
    """``start_hosts(workdir, num, chips, argv, checkpoint_dir=...)`` -> ``Hosts``; ``.wait()`` kills
    whatever is left, and anything still alive at the end of the session is killed here."""
    started: list[Hosts] = []

    def start(workdir: Path, num: int, chips: int, argv: Sequence[str], **kw: object) -> Hosts:
        h = Hosts(workdir, base_env, num, chips, argv, **kw)  # type: ignore[arg-type]
        started.append(h)
        return h

    try:
        yield start
    finally:
        for h in started:
            h.kill()


def run_python(
    base: dict[str, str],
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> Proc:
    """Run ``python argv...`` to completion (killed at ``timeout``)."""
    full = dict(base)
    full.update(env or {})
    p = subprocess.Popen(
        [sys.executable, *argv], env=full, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(p)
        out, err = p.communicate()
        return Proc(None, out.decode(errors="replace"), err.decode(errors="replace") + "\n[timed out]")
    finally:
        _kill(p)
    return Proc(p.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


@pytest.fixture(scope="session")
def run_py(base_env: dict[str, str]) -> Callable[..., Proc]:
    """``run_py(argv, env=..., timeout=...)``: a python subprocess with the clean JAX test environment."""

    def run(argv: Sequence[str], **kw: object) -> Proc:
        return run_python(base_env, argv, **kw)  # type: ignore[arg-type]

    return run


@pytest.fixture(scope="session")
def scripts_dir() -> Path:
    return SCRIPTS


@pytest.fixture(scope="session")
def once_per_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Callable[[], Any]], Any]:
    """``once_per_run(key, compute)``: ``compute()``'s JSON-able value, computed once per test run however
    many xdist workers ask. A module-scoped fixture runs once per worker that runs one of the module's
    tests, and worksteal often splits a module: two JAX runs of the same checks at once on 2 cores. Here
    the first worker computes under a lock and stores the value; the others wait for it, then read it."""
    import fcntl
    import json

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by this run's workers (each has its own basetemp below it)

    def once(key: str, compute: Callable[[], Any]) -> Any:
        stored = base / f"once-{key}.json"
        with (base / f"once-{key}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if stored.exists():
                return json.loads(stored.read_text())
            value = compute()  # raises: nothing stored, and the next worker to ask tries again
            stored.write_text(json.dumps(value))
            return value

    return once


@pytest.fixture(scope="session")
def procs_once_per_run(
    once_per_run: Callable[[str, Callable[[], Any]], Any],
) -> Callable[[str, Callable[[], Sequence[Proc]]], list[Proc]]:
    """``once_per_run`` for a fixture whose value is the finished processes of a run (``Proc``)."""

    def once(key: str, compute: Callable[[], Sequence[Proc]]) -> list[Proc]:
        rows = once_per_run(key, lambda: [[p.returncode, p.stdout, p.stderr] for p in compute()])
        return [Proc(*row) for row in rows]

    return once
