"""The worker-environment contract and the pieces of the runtime that must not need jax."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.runtime import dist, hostenv
from tpuctl.runtime.hostenv import WorkerEnv, sim_host_env


def _env(**kw: object) -> dict[str, str]:
    args: dict[str, object] = dict(
        run_id="r-1",
        worker_id=1,
        num_workers=4,
        chips_per_host=4,
        coordinator_port=12345,
        accelerator_type="v5litepod-16",
        topology="4x4",
        checkpoint_dir="/ck",
        restart_count=2,
        bundle_dir="/bundle",
    )
    args.update(kw)
    return sim_host_env(**args)  # type: ignore[arg-type]


def test_sim_host_env_is_exactly_the_contract() -> None:
    env = _env()
    assert env == {
        "TPUCTL_RUN_ID": "r-1",
        "TPUCTL_WORKER_ID": "1",
        "TPUCTL_NUM_WORKERS": "4",
        "TPUCTL_ACCELERATOR_TYPE": "v5litepod-16",
        "TPUCTL_TOPOLOGY": "4x4",
        "TPUCTL_CHECKPOINT_DIR": "/ck",
        "TPUCTL_RESTART_COUNT": "2",
        "TPUCTL_SIM": "1",
        "TPUCTL_COORDINATOR_PORT": "12345",
        "TPUCTL_CHIPS_PER_HOST": "4",
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": "4",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        "PYTHONPATH": os.pathsep.join(["/bundle", "/bundle/tpuctl/runtime/_sitecustomize"]),
        "PYTHONUNBUFFERED": "1",
    }
    assert all(isinstance(v, str) for v in env.values())


def test_sim_host_env_options() -> None:
    env = _env(metadata_host="127.16.0.2:8080", base_pythonpath="/x:/y")
    assert env["GCE_METADATA_HOST"] == env["GCE_METADATA_IP"] == env["GCE_METADATA_ROOT"] == "127.16.0.2:8080"
    assert env["PYTHONPATH"].split(os.pathsep)[-2:] == ["/x", "/y"]


def test_sitecustomize_dir_in_env_exists_in_the_package() -> None:
    repo = Path(__file__).resolve().parents[2]
    path = _env(bundle_dir=repo)["PYTHONPATH"].split(os.pathsep)[1]
    assert (Path(path) / "sitecustomize.py").is_file()


@pytest.mark.parametrize(
    "bad",
    [
        {"worker_id": 4},
        {"worker_id": -1},
        {"num_workers": 0},
        {"chips_per_host": 0},
        {"coordinator_port": 0},
        {"coordinator_port": 70000},
        {"restart_count": -1},
    ],
)
def test_sim_host_env_rejects_nonsense(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        _env(**bad)


def test_worker_env_round_trip_and_defaults() -> None:
    w = WorkerEnv.from_env({**_env(), "TPUCTL_COORDINATOR_ADDRESS": "127.16.0.9:5"})
    assert (w.run_id, w.worker_id, w.num_workers, w.restart_count) == ("r-1", 1, 4, 2)
    assert w.sim and w.coordinator_address == "127.16.0.9:5" and w.chips_per_host == 4
    assert w.generation == "v5litepod" and w.launched_by_tpuctl
    local = WorkerEnv.from_env({})
    assert (local.worker_id, local.num_workers, local.sim, local.launched_by_tpuctl) == (0, 1, False, False)
    assert local.metadata_host == hostenv.DEFAULT_METADATA_HOST == "metadata.google.internal"
    with pytest.raises(ValueError, match="TPUCTL_NUM_WORKERS"):
        WorkerEnv.from_env({"TPUCTL_NUM_WORKERS": "two"})


def test_metadata_host_follows_google_auth_then_jax() -> None:
    assert hostenv.metadata_host({}) == "metadata.google.internal"
    assert hostenv.metadata_host({"GCE_METADATA_IP": "10.0.0.1"}) == "10.0.0.1"
    both = {"GCE_METADATA_HOST": "127.16.0.2:8080", "GCE_METADATA_IP": "10.0.0.1"}
    assert hostenv.metadata_host(both) == "127.16.0.2:8080"
    assert WorkerEnv.from_env(both).metadata_host == "127.16.0.2:8080"


def test_libtpu_flags_table_and_user_override() -> None:
    assert {"v4", "v5litepod", "v5p", "v6e"} <= set(dist.LIBTPU_FLAGS)
    args = dist.libtpu_init_args("v6e")
    assert "--xla_tpu_scoped_vmem_limit_kib=98304" in args.split()
    # A flag the user set keeps the user's value and is not repeated.
    mine = "--xla_tpu_scoped_vmem_limit_kib=65536 --my_flag=1"
    merged = dist.libtpu_init_args("v6e", mine).split()
    assert merged[:2] == mine.split()
    assert sum(a.startswith("--xla_tpu_scoped_vmem_limit_kib") for a in merged) == 1
    assert dist.libtpu_init_args("v2", "--a=1") == "--a=1"  # unknown generation: untouched


def test_importing_the_runtime_does_not_import_jax(run_py: Callable[..., Any]) -> None:
    code = (
        "import sys, tpuctl.runtime, tpuctl.runtime.hostenv, tpuctl.runtime.dist; "
        "heavy = [m for m in ('jax', 'optax', 'orbax') if m in sys.modules]; print(heavy)"
    )
    proc = run_py(["-c", code], timeout=60)
    assert proc.returncode == 0, proc.describe()
    assert proc.stdout.strip() == "[]"


def test_lazy_submodule_access() -> None:
    import tpuctl.runtime as rt

    assert rt.hostenv is hostenv
    with pytest.raises(AttributeError):
        _ = rt.nonexistent
    assert "train" in dir(rt)
    assert sys.modules["tpuctl.runtime.hostenv"] is hostenv
