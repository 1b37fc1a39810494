"""A user's own packages on the simulator: its package mirror serves the runtime's wheelhouse, and what
that lacks only when the world turns fetch-through on (from the index the user's pip/uv name, here a
static index on loopback over the real flax wheels scripts/setup primes). Off, a run naming such a
package is refused before anything is made, with a fix that works as written."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuctl.sim import SimAdminClient
from tpuctl.sim.fetch_through import package_cache_for
from tpuctl.testing.cli import Cli
from tpuctl.testing.package_index import TEST_WHEELS, served_index, write_simple_index

REPO = Path(__file__).resolve().parents[2]
WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {"us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    "package_fetch_through": True,
}

#: A Dense layer of ones with no bias, applied to [0, 1, 2]: 3.0.
FLAX_PROGRAM = """
import flax.linen as nn
import jax
import jax.numpy as jnp

dense = nn.Dense(1, kernel_init=nn.initializers.ones, bias_init=nn.initializers.zeros)
x = jnp.arange(3.0).reshape(1, 3)
params = dense.init(jax.random.PRNGKey(0), x)
print("FLAX_OUT", float(dense.apply(params, x)[0, 0]), flush=True)
"""


def flax_project(root: Path) -> tuple[Path, Path]:
    root.mkdir()
    (root / "uses_flax.py").write_text(FLAX_PROGRAM)
    (root / "requirements.txt").write_text("flax\n")
    return root / "uses_flax.py", root / "requirements.txt"


def test_off_a_package_the_wheelhouse_lacks_is_refused_before_anything_is_made_and_the_fix_works(
    cli: Cli, tmp_path: Path
) -> None:
    script, requirements = flax_project(tmp_path / "proj")
    refused = cli("run", str(script), "--type", "v5e-8", "--requirements", str(requirements))
    assert refused.code == 2, refused.stderr[-2000:]
    assert "the hosts' package index has no flax" in refused.stderr
    assert "absl-py" in refused.stderr and "`ls " in refused.stderr  # what it has, and how to list it
    assert "package_fetch_through: true" in refused.stderr and "TPUCTL_SIM_WORLD" in refused.stderr
    assert cli("sim", "status", "-o", "json").json["nodes"] == []
    # The same for a plain install in --setup (the fix suggested for a missing module).
    wandb = cli("run", str(script), "--type", "v5e-8", "--setup", "uv pip install wandb")
    assert wandb.code == 2 and "has no wandb" in wandb.stderr, wandb.stderr[-2000:]
    # The fix as written: a copy of the default world file with fetch-through on, named by
    # TPUCTL_SIM_WORLD.
    copied = re.search(r"cp (\S+) my-world.yaml", refused.stderr)
    assert copied is not None and Path(copied[1]).samefile(REPO / "configs" / "world.yaml")
    world = yaml.safe_load(Path(copied[1]).read_text())
    assert world["package_fetch_through"] is False
    world["package_fetch_through"] = True
    copy = tmp_path / "my-world.yaml"
    copy.write_text(yaml.safe_dump(world))
    env = {"TPUCTL_SIM_WORLD": str(copy)}
    planned = cli(
        "run", str(script), "--type", "v5e-8", "--requirements", str(requirements), "--dry-run", env=env
    )
    assert planned.code == 0, planned.stderr[-2000:]


def test_on_a_run_needing_flax_gets_it_from_the_users_index_and_calls_flax_linen(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, tmp_path: Path, state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    if not (TEST_WHEELS / ".tpuctl-primed").is_file():
        pytest.fail(f"the test wheelhouse {TEST_WHEELS} is not primed: run scripts/setup")
    projects = write_simple_index(TEST_WHEELS, tmp_path / "index")
    assert "flax" in projects
    script, requirements = flax_project(tmp_path / "proj")
    with served_index(tmp_path / "index") as index_url:
        # The user's pip names their index; the simulator serving the mirror was started from here.
        monkeypatch.setenv("PIP_INDEX_URL", index_url)
        serve_sim(WORLD)
        result = cli("run", str(script), "--type", "v5e-8", "--requirements", str(requirements))
    assert result.code == 0, result.stderr[-3000:]
    assert "FLAX_OUT 3.0" in result.stdout
    cached = sorted(p.name for p in package_cache_for(state_dir).glob("*.whl"))
    assert cached == sorted(p.name for p in TEST_WHEELS.glob("*.whl"))
