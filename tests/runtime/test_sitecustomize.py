"""The start-up hook: jax.distributed.initialize() finds a simulated slice (TPUCTL_SIM=1 only); the crash
hook is tests/runtime/test_crash.py's; what the detector reads is tests/runtime/test_simcluster.py's."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuctl.runtime.hostenv import sim_host_env

REPO = Path(__file__).resolve().parents[2]

LIST_CLUSTERS = (
    "import jax._src.clusters as c; print(','.join(t.__name__ for t in c.ClusterEnv._cluster_types))"
)


def _sim_env(**extra: str) -> dict[str, str]:
    env = sim_host_env("r", 1, 3, 2, 23456, "v5litepod-8", "2x4", "/tmp/ck", 0, REPO)
    env.update(extra)
    return env


def test_hook_registers_our_cluster_first_when_jax_clusters_load(run_py: Callable[..., Any]) -> None:
    p = run_py(["-c", LIST_CLUSTERS], env=_sim_env(), timeout=60)
    assert p.returncode == 0, p.describe()
    assert p.stdout.strip().split(",")[0] == "TpuctlSimCluster"


def test_no_registration_without_tpuctl_sim(run_py: Callable[..., Any]) -> None:
    env = _sim_env()
    env["TPUCTL_SIM"] = "0"
    p = run_py(["-c", LIST_CLUSTERS], env=env, timeout=60)
    assert p.returncode == 0, p.describe()
    assert "TpuctlSimCluster" not in p.stdout


def test_programs_without_jax_pay_nothing(run_py: Callable[..., Any]) -> None:
    code = "import sys, json; print([m for m in ('jax', 'tpuctl.runtime.simcluster') if m in sys.modules])"
    p = run_py(["-c", code], env=_sim_env(), timeout=30)
    assert p.returncode == 0, p.describe()
    assert p.stdout.strip() == "[]"


def test_shadowed_sitecustomize_still_runs(run_py: Callable[..., Any], tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = '1'\n")
    env = _sim_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(tmp_path)])
    code = "import os; print(os.environ.get('OTHER_SITECUSTOMIZE_RAN'))"
    p = run_py(["-c", code], env=env, timeout=30)
    assert p.returncode == 0, p.describe()
    assert p.stdout.strip() == "1"
