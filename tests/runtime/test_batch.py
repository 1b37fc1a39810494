"""The batch rule across slice types: the global batch stays, the gradient accumulation follows the
device count (bounded rows per device), and a device count that cannot keep the batch is refused."""

from __future__ import annotations

import pytest

from tpuctl.runtime.batch import BatchPlan, BatchSplitError, plan_batch


@pytest.mark.parametrize(
    ("devices", "grad_accum", "rows"),
    [(16, 1, 2), (8, 1, 4), (4, 2, 4), (2, 4, 4), (1, 8, 4), (32, 1, 1)],
)
def test_fewer_devices_accumulate_more_and_the_global_batch_stays(
    devices: int, grad_accum: int, rows: int
) -> None:
    plan = plan_batch(32, devices, device_batch=4)
    assert plan == BatchPlan(32, devices, grad_accum)
    assert plan.device_batch == rows and devices * grad_accum * rows == 32


def test_without_a_bound_the_accumulation_is_the_fewest_that_divides_at_least_the_minimum() -> None:
    assert plan_batch(32, 8).grad_accum_steps == 1
    assert plan_batch(32, 8, min_grad_accum=3).grad_accum_steps == 4  # 4 rows: 3 micro-batches cannot
    assert (
        plan_batch(24, 4, device_batch=4).describe()
        == "global batch 24 = 4 devices x 2 micro-batches x 3 rows"
    )


def test_a_device_count_that_cannot_keep_the_batch_is_refused_saying_what_to_change() -> None:
    with pytest.raises(BatchSplitError) as info:
        plan_batch(32, 12)
    assert "32 does not split evenly over 12 devices" in str(info.value)
    assert "least common multiple" in str(info.value)
    with pytest.raises(BatchSplitError, match="do not split into 8 or more equal micro-batches"):
        plan_batch(32, 8, min_grad_accum=8)
    with pytest.raises(BatchSplitError, match="of 1 or more"):
        plan_batch(32, 0)
