"""The LM example across slice types: stopped after step 4 on 4 devices and resumed on 2 (a recovery
onto a type with half the chips), it keeps its global batch, doubles its gradient accumulation and
trains on exactly as a run that never moved; resumed with a model of other shapes, it stops naming the
checkpoint instead of training from step 0 over it. Slow (four JAX processes); the checkpoint-level
check of the same restore is in the default suite (tests/runtime/test_checkpoint.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ARGS = ["-m", "tpuctl.runtime.examples.lm_train", "--steps", "8", "--checkpoint-every", "2", "--batch", "8",
        "--device-batch", "2", "--log-every", "1", "--d-model", "32", "--layers", "1"]  # fmt: skip


def losses(stdout: str) -> dict[int, str]:
    return {int(m[1]): m[2] for m in re.finditer(r"^step (\d+) loss (\S+)", stdout, re.MULTILINE)}


@pytest.mark.slow
def test_resumed_on_half_the_devices_it_trains_on_as_if_it_never_moved(
    run_py: Callable[..., Any], tmp_path: Path
) -> None:
    def lm(devices: int, checkpoints: Path, *extra: str) -> Any:
        env = {"JAX_NUM_CPU_DEVICES": str(devices), "TPUCTL_CHECKPOINT_DIR": str(checkpoints)}
        return run_py([*ARGS, *extra], env=env, timeout=240)

    stayed = lm(4, tmp_path / "stayed")
    assert stayed.returncode == 0, stayed.describe()
    crashed = lm(4, tmp_path / "moved", "--crash-after-step", "4")
    assert crashed.returncode == 3, crashed.describe()
    moved = lm(2, tmp_path / "moved")
    assert moved.returncode == 0, moved.describe()
    assert "global batch 8 = 4 devices x 1 micro-batches x 2 rows" in stayed.stdout
    assert "global batch 8 = 2 devices x 2 micro-batches x 2 rows" in moved.stdout
    assert "restored step 4" in moved.stdout
    after = {s: loss for s, loss in losses(stayed.stdout).items() if s > 4}
    assert len(after) == 4 and losses(moved.stdout) == after

    other = lm(2, tmp_path / "moved", "--d-model", "16")
    assert other.returncode == 2, other.describe()
    assert "cannot resume: checkpoint step 8 in " in other.stderr
    assert "target float32[256, 16]" in other.stderr
