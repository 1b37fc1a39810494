"""Checkpointing: round trip, periodic and forced saves, keep-last-N, verified restore with fallback.

The checks run in one subprocess with 4 CPU devices (scripts/ckpt_checks.py) so FSDP-sharded states
are saved and restored; its JSON report and its log lines are asserted here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest


@pytest.fixture(scope="module")
def result(
    run_py: Callable[..., Any],
    scripts_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    once_per_run: Callable[[str, Callable[[], Any]], Any],
) -> tuple[dict[str, Any], str]:
    def checks() -> list[Any]:
        root = tmp_path_factory.mktemp("ckpt")
        proc = run_py(
            [str(scripts_dir / "ckpt_checks.py"), str(root)], env={"JAX_NUM_CPU_DEVICES": "4"}, timeout=180
        )
        assert proc.returncode == 0, proc.describe()
        return [json.loads(proc.stdout), proc.stderr]

    report, stderr = once_per_run("ckpt-checks", checks)  # one run, whichever worker asks
    return report, stderr


def test_round_trip_restores_equal_state_with_same_shardings(result: tuple[dict[str, Any], str]) -> None:
    r, _ = result
    assert r["restored_step"] == 7 and r["restored_step_field"] == 7
    assert r["restored_equal"] and r["restored_specs_match"]
    assert r["latest_good_step"] == 7


def test_restore_into_another_sharding(result: tuple[dict[str, Any], str]) -> None:
    assert result[0]["reshard_equal"]


def test_periodic_forced_and_keep_last_n(result: tuple[dict[str, Any], str]) -> None:
    r, _ = result
    assert r["periodic_saved"] == [2, 4, 6]  # save_interval_steps=2
    assert r["forced_saved"] is True and r["forced_again"] is False
    assert r["kept"] == [6, 7]  # max_to_keep=2


def test_truncated_latest_falls_back_and_says_so(result: tuple[dict[str, Any], str]) -> None:
    r, log = result
    assert r["b_latest_good_step"] == 2
    assert r["b_restored_step"] == 2 and r["b_restored_equal"]
    assert [s for s, _ in r["b_skipped"]] == [3]
    assert "checkpoint step 3 unreadable (" in log and "); falling back to step 2" in log
    assert "OUT_OF_RANGE" in r["b_skipped"][0][1] or "read" in r["b_skipped"][0][1]
    # The damaged step is dropped so training can save step 3 again.
    assert r["b_steps_after"] == [1, 2]
    assert r["b_resave_3"] is True and r["b_steps_final"] == [1, 2, 3]


def test_host_checksum_equals_the_device_one(result: tuple[dict[str, Any], str]) -> None:
    assert result[0]["checksum_disagreements"] == []


def test_flipped_byte_caught_by_checksum(result: tuple[dict[str, Any], str]) -> None:
    r, log = result
    assert r["c_restored_step"] == 1
    assert r["c_skipped"][0][0] == 2 and "checksum mismatch" in r["c_skipped"][0][1]
    assert "checkpoint step 2 unreadable (checksum mismatch" in log


def test_incompatible_target_starts_fresh_and_deletes_nothing(result: tuple[dict[str, Any], str]) -> None:
    r, log = result
    assert r["mismatch_restored"] is None
    assert r["mismatch_kept"] == [6, 7]
    assert "no earlier checkpoint; starting fresh" in log
    assert "target float32[64, 16]" in log


def test_unfinished_save_is_not_a_step(result: tuple[dict[str, Any], str]) -> None:
    r, _ = result
    assert r["tmp_steps"] == [6, 7] and r["tmp_removed"]


def test_step_saved_without_layout_in_its_record_still_restores(result: tuple[dict[str, Any], str]) -> None:
    r, _ = result
    assert r["d_had_layout"] is True
    assert r["d_restored_step"] == 1 and r["d_restored_equal"]
    # The layout check falls back to orbax's metadata for such a step and still names the mismatch.
    [[step, reason]] = r["d_mismatch_skipped"]
    assert step == 1 and "target float32[64, 16]" in reason


def test_leaf_restored_as_another_type_is_refused(result: tuple[dict[str, Any], str]) -> None:
    r, _ = result
    assert r["e_restored_step"] is None
    assert r["e_skipped"] == [[1, "restored key is uint32[2], target key<fry>[]"]]


def test_a_checkpoint_restores_onto_half_the_devices_keeping_the_global_batch(
    result: tuple[dict[str, Any], str],
) -> None:
    """A recovery onto another slice type: the state written by 4 devices (FSDP) restores onto 2
    (replicated), the batch rule doubles the accumulation, and training goes on as it would have."""
    x = result[0]["cross_device"]
    assert x["splits"] == [
        "global batch 8 = 4 devices x 1 micro-batches x 2 rows",
        "global batch 8 = 2 devices x 2 micro-batches x 2 rows",
    ]
    assert x["restored_step"] == 2 and x["restored_device_counts"] == [2]
    stayed, moved = x["losses"]
    np.testing.assert_allclose(moved, stayed, rtol=1e-5)
    assert x["param_diff"] < 1e-5


def test_a_checkpoint_of_other_shapes_is_refused_by_name_and_kept(result: tuple[dict[str, Any], str]) -> None:
    x = result[0]["cross_device"]
    assert x["misfit_error"] is not None
    assert x["misfit_error"].startswith("checkpoint step 2 in ")
    assert "holds a train state of other shapes than this run's" in x["misfit_error"]
    assert "target float32[64, 16]" in x["misfit_error"]  # the first difference, named
    assert x["misfit_kept"] == [2]
