"""The tiny LM of the end-to-end tests and its reference: the final parameters of an uninterrupted run on
local processes started as the launcher starts simulated hosts, without tpuctl, for a test to compare a
recovered run against bit for bit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tpuctl.runtime.hostenv import sim_host_env
from tpuctl.testing.metadata_server import MetadataServer, slice_values
from tpuctl.testing.ports import unused_port

#: The checkout (or install) the reference's programs import tpuctl from, as a host's bundle does.
REPO = Path(__file__).resolve().parents[2]

#: The tiny LM: a 2-host v4-16 slice (2 x 4 chips); --step-delay leaves time to preempt between steps.
#: Enough steps that every attempt outlives its preemption: a notice reaches all hosts' sync point a few
#: steps after it lands (more on a loaded machine), and a run that finishes first is simply done.
LM_ARGS = ["--steps", "30", "--checkpoint-every", "4", "--log-every", "5", "--batch", "8", "--seed", "7",
           "--layers", "1", "--d-model", "16", "--heads", "2", "--vocab", "32", "--seq-len", "16",
           "--step-delay", "0.15"]  # fmt: skip
LM_STEPS = 30
#: The same tiny LM with a global batch of 16: one row per device of a v5e-16, two of a v6e-8's.
V5E_16_ARGS = [*LM_ARGS[: LM_ARGS.index("--batch") + 1], "16", *LM_ARGS[LM_ARGS.index("--batch") + 2 :]]
HASH = re.compile(r"final_params_sha256 ([0-9a-f]{64})")


#: What the hosts of a test's run are given (``--env``; a VM's login starts from a clean environment):
#: the same XLA flags as the reference run, so their numbers are the reference's bit for bit.
HOST_XLA_ENV = ("--env", "XLA_FLAGS=--xla_backend_optimization_level=0")


def fast_jax_env(cache_dir: Path) -> dict[str, str]:
    """What simulated hosts inherit to start fast: no LLVM optimisation for these tiny programs, and a
    compilation cache shared by every start (a restart loads the executable instead of compiling)."""
    return {
        "XLA_FLAGS": "--xla_backend_optimization_level=0",
        "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


def run_reference(
    workdir: Path,
    args: list[str],
    *,
    hosts: int = 2,
    chips: int = 4,
    accelerator_type: str = "v4-16",
    topology: str = "2x2x2",
    extra_env: dict[str, str] | None = None,
    timeout: float = 240,
) -> str:
    """The final params hash of an uninterrupted run, on local processes started as the launcher
    starts simulated hosts (same device count and mesh), without tpuctl."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = unused_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TPUCTL_", "JAX_", "XLA_"))}
    procs: list[subprocess.Popen[bytes]] = []
    outs: list[Path] = []
    # Each host has its metadata server (the runtime's sim cluster reads its worker number there).
    servers = [MetadataServer(slice_values(w, ["127.0.0.1"] * hosts, accelerator_type)) for w in range(hosts)]
    try:
        for w in range(hosts):
            env = dict(base)
            env.update(extra_env or {})
            env.update(sim_host_env(
                run_id="reference", worker_id=w, num_workers=hosts, chips_per_host=chips,
                coordinator_port=port, accelerator_type=accelerator_type, topology=topology,
                checkpoint_dir=str(workdir / "ckpt"), restart_count=0, bundle_dir=REPO,
                metadata_host=servers[w].host,
            ))  # fmt: skip
            out = workdir / f"host{w}.log"
            outs.append(out)
            with out.open("wb") as fh:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "tpuctl.runtime.examples.lm_train", *args],
                    env=env, cwd=workdir, stdout=fh, stderr=subprocess.STDOUT,
                ))  # fmt: skip
        deadline = time.monotonic() + timeout
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for server in servers:
            server.close()
    text = outs[0].read_text(errors="replace")
    assert [p.returncode for p in procs] == [0] * hosts, text[-3000:]
    match = HASH.search(text)
    assert match, text[-3000:]
    return match.group(1)
