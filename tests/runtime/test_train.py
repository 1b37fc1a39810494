"""The bundled train step, the mesh and the step-keyed data, on one process with 4 CPU devices.

All checks run in one subprocess (scripts/train_checks.py) whose JSON report the tests below read:
jax must see 4 devices from its start, and one process pays jax start-up and compiles once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest


@pytest.fixture(scope="module")
def report(
    run_py: Callable[..., Any], scripts_dir: Path, once_per_run: Callable[[str, Callable[[], Any]], Any]
) -> dict[str, Any]:
    def checks() -> dict[str, Any]:
        proc = run_py([str(scripts_dir / "train_checks.py")], env={"JAX_NUM_CPU_DEVICES": "4"}, timeout=180)
        assert proc.returncode == 0, proc.describe()
        out: dict[str, Any] = json.loads(proc.stdout)
        return out

    found: dict[str, Any] = once_per_run("train-checks", checks)  # one run, whichever worker asks
    return found


def test_four_devices_and_mesh(report: dict[str, Any]) -> None:
    assert report["device_count"] == 4
    assert report["mesh_axes"] == ["dcn", "data", "model"]
    assert report["mesh_shape"] == {"dcn": 1, "data": 2, "model": 2}
    assert report["one_slice_order"], "one slice must keep the device order of the plain (data, model) mesh"
    assert (
        report["bad_mesh_error"] == "model_parallel=3 must divide the device count 4; choose one of [1, 2, 4]"
    )


def test_slices_from_the_environment_need_as_many_processes(report: dict[str, Any]) -> None:
    assert report["two_slices_one_process_error"].startswith(
        "TPUCTL_NUM_SLICES=2 does not divide the job's 1 processes"
    )


def test_loss_decreases_over_20_steps(report: dict[str, Any]) -> None:
    losses = report["replicated"]["losses"]
    assert len(losses) == 20 and report["replicated"]["step"] == 20
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert all(np.isfinite(report["replicated"]["grad_norms"]))


def test_matches_plain_jit_optax_step(report: dict[str, Any]) -> None:
    np.testing.assert_allclose(report["replicated"]["losses"][:3], report["plain_losses"], rtol=1e-5)
    assert report["plain_param_diff"] < 1e-5


def test_fsdp_matches_replicated_and_really_shards(report: dict[str, Any]) -> None:
    np.testing.assert_allclose(report["fsdp"]["losses"], report["replicated"]["losses"], rtol=1e-4)
    assert report["fsdp"]["param_diff"] < 1e-5
    specs = report["fsdp"]["specs"]
    assert all(s == "P()" for s in report["replicated"]["specs"].values())
    # Large params: largest divisible axis over "model"; the 32-element norm scales stay replicated.
    assert specs["['embed']"] == "P('model', None)"  # (64, 32)
    assert specs["['head']"] == "P(None, 'model')"  # (32, 64)
    assert specs["['layers'][0]['ln1']"] == "P()"
    # Adam's moments follow their params.
    assert "P('model', None)" in report["fsdp"]["mu_specs"]


def test_grad_accum_2_matches_accum_1(report: dict[str, Any]) -> None:
    np.testing.assert_allclose(report["accum"]["losses"][:5], report["replicated"]["losses"][:5], rtol=1e-5)
    assert report["accum"]["param_diff"] < 1e-5


def test_bf16_compute_keeps_fp32_master_weights(report: dict[str, Any]) -> None:
    bf16 = report["bf16"]
    assert bf16["param_dtypes"] == ["float32"]
    assert bf16["opt_dtypes"] == ["float32"]
    assert bf16["hlo_has_bf16_dot"] and not report["f32_hlo_has_bf16_dot"]
    # Close to the fp32 run, but not identical (it really computed in bf16).
    np.testing.assert_allclose(bf16["losses"][:5], report["replicated"]["losses"][:5], rtol=2e-2)
    assert 0 < bf16["param_diff"] < 0.2
    assert bf16["losses"][-1] < 0.5 * bf16["losses"][0]


def test_data_is_keyed_by_step(report: dict[str, Any]) -> None:
    d = report["data"]
    assert d["same_step_equal"] and d["next_step_differs"]
    assert d["rows_slice_equal"], "a process generating only its rows must get the same rows"
    assert d["sharded_equal"] == [True, True, True], "global arrays must match the numpy batch on any mesh"
    assert d["targets_are_shifted_inputs"]
    assert d["dtype"] == "int32" and d["shape"] == [16, 16]


# The same 4 CPU devices as one slice of 2 x 2 and as two slices of 1 x 2 (device ids: slice 0 holds 0 and
# 1, slice 1 holds 2 and 3).
IN_SLICE, ACROSS = "{{0,1},{2,3}}", "{{0,2},{1,3}}"


@pytest.mark.parametrize("sharding", ["replicated", "fsdp"])
def test_two_slices_give_the_gradients_of_one(report: dict[str, Any], sharding: str) -> None:
    dcn = report["dcn"][sharding]
    assert dcn["loss_two"] == pytest.approx(dcn["loss_one"], rel=1e-6)
    # Float reassociation only: the sums are grouped differently, nothing else changes.
    assert dcn["grad_diff"] <= 1e-6 * dcn["grad_scale"], dcn["grad_diff"]
    # Training on two slices follows the one-slice run of the same step.
    ref = report[sharding]["losses"][: len(dcn["losses"])]
    np.testing.assert_allclose(dcn["losses"], ref, rtol=1e-5)
    assert dcn["param_diff"] < 1e-5


@pytest.mark.parametrize("sharding", ["replicated", "fsdp"])
def test_params_are_never_split_across_slices(report: dict[str, Any], sharding: str) -> None:
    specs = report["dcn"][sharding]["param_specs"]
    assert all("dcn" not in s for s in specs), specs
    expected = ["P()"] if sharding == "replicated" else ["P('model', None)", "P()", "P(None, 'model')"]
    assert specs == expected


@pytest.mark.parametrize("sharding", ["replicated", "fsdp"])
def test_gradients_reduce_within_each_slice_then_across(report: dict[str, Any], sharding: str) -> None:
    dcn = report["dcn"][sharding]
    ops = dcn["collectives"]
    # Nothing spans all four devices: every collective stays in a slice or pairs one device per slice.
    assert {c["groups"] for c in ops} == {IN_SLICE, ACROSS}, ops
    across = [c for c in ops if c["groups"] == ACROSS]
    assert {c["op"] for c in across} == {"all-reduce"}
    # Within the slice first: what crosses the DCN is only ever the output of an in-slice reduction
    # (the reduce-scatter of a gradient, the all-reduce of the loss), never a device's own gradient.
    for c in across:
        assert set(c["fed_by"]) <= {f"reduce-scatter {IN_SLICE}", f"all-reduce {IN_SLICE}"}, c
    # Each device carries half of every gradient (the slice has 2 devices) plus the loss, not all of it.
    assert sum(c["elements"] for c in across) == dcn["param_elements"] // 2 + 1
    # Then back to every device of the slice: all of each replicated gradient (an FSDP one stays a shard).
    after = [c for c in ops if f"all-reduce {ACROSS}" in c["fed_by"]]
    assert {(c["op"], c["groups"]) for c in after} == {("all-gather", IN_SLICE)}, after
    assert sum(c["elements"] for c in after) == dcn["replicated_elements"]
