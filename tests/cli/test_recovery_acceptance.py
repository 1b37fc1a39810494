"""Recovery's first acceptance case, end to end on the simulator's VMs: `tpuctl run --example lm --type
v5e-16 --spot`, preempted mid-run just after its zone stocks out, recovers on a new slice in another
zone, restores from the bucket and ends with the uninterrupted run's parameters, bit for bit, while no
checkpoint file ever exists on a host's disk. Slow (4 hosts set up twice): run with --slow."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from recovery_helpers import (
    HOST_XLA_ENV,
    V5E_16_ARGS,
    V5E_OTHER,
    V5E_ZONE,
    WORLD,
    Chaos,
    Preempt,
    fast_jax_env,
    final_hash,
    run_reference,
)

from tpuctl.sim import SimAdminClient
from tpuctl.sim.storage import stored_objects
from tpuctl.sim.vms.layout import vm_root_for
from tpuctl.testing.cli import Cli

#: What orbax writes for a step (its metadata and tensorstore's OCDBT files): none may be on a host.
_CHECKPOINT_MARKERS = ("_CHECKPOINT_METADATA", "manifest.ocdbt", "_METADATA", "_sharding")


@pytest.fixture
def admin(
    serve_sim: Callable[..., SimAdminClient],
    state_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> SimAdminClient:
    world = tmp_path / "world.yaml"
    world.write_text(yaml.safe_dump(WORLD))
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(state_dir))
    for key, value in fast_jax_env(tmp_path / "jax-cache").items():
        monkeypatch.setenv(key, value)
    return serve_sim(WORLD)


#: Where a host keeps installed software (its venvs, uv and its cache): no checkpoint goes there, and
#: walking it twice a second would cost more than the run.
_SOFTWARE_DIRS = frozenset({"envs", "tools", ".cache", "site-packages"})


@contextlib.contextmanager
def watching_host_disks(state_dir: Path) -> Iterator[dict[str, Any]]:
    """Walks every host disk of the state, again and again while the block runs, for checkpoint files;
    yields {"found": set of paths, "walks": count}."""
    disks = vm_root_for(state_dir) / "disks"
    seen: dict[str, Any] = {"found": set(), "walks": 0}
    halt = threading.Event()

    def walk() -> None:
        while not halt.wait(0.1):
            for root, dirs, files in os.walk(disks):
                dirs[:] = [d for d in dirs if d not in _SOFTWARE_DIRS]
                for name in (*dirs, *files):
                    if name in _CHECKPOINT_MARKERS or name.startswith("ocdbt.process"):
                        seen["found"].add(os.path.join(root, name))
            seen["walks"] += 1

    thread = threading.Thread(target=walk, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        halt.set()
        thread.join(timeout=30)


@pytest.mark.slow
def test_a_v5e_16_spot_run_preempted_after_a_stockout_recovers_elsewhere_bit_identical_from_the_bucket(
    admin: SimAdminClient, cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    reference = run_reference(
        tmp_path / "reference",
        V5E_16_ARGS,
        hosts=4,
        accelerator_type="v5litepod-16",
        topology="4x4",
        extra_env=fast_jax_env(tmp_path / "jax-cache"),
    )
    plan = [Preempt(1, 6, notice=True, stockout=V5E_ZONE)]
    chaos = Chaos(admin, state_dir, plan).start()
    with watching_host_disks(state_dir) as disks:
        try:
            result = cli(
                "run", "--example", "lm", "--type", "v5e-16", "--spot",
                "--checkpoint-every", "4", *HOST_XLA_ENV, "-o", "json", "--", *V5E_16_ARGS,
            )  # fmt: skip
        finally:
            chaos.join(check=False)
    assert result.code == 0, result.stderr[-4000:]
    chaos.check()
    run = cli("runs", "describe", result.json["run"]["run_id"], "-o", "json").json["run"]
    assert final_hash(state_dir / "runs" / run["run_id"] / "worker-0.log") == reference
    (preemption,) = run["recovery"]["preemptions"]
    assert preemption["zone"] == V5E_ZONE and preemption["new_zone"] == V5E_OTHER
    assert preemption["restored_step"] == preemption["checkpoint_step"] is not None
    # The checkpoints were in the bucket, and never on a host's disk.
    prefix = f"tpuctl/runs/{run['run_id']}/checkpoints/"
    stored = stored_objects(state_dir / "sim-gcs", prefix=prefix)
    assert any(name.endswith("/_CHECKPOINT_METADATA") for name in stored), stored[:20]
    assert disks["walks"] > 10 and disks["found"] == set()
    assert admin.status()["nodes"] == []
