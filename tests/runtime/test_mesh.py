"""dist.slice_groups: how devices that carry no slice index (the simulator's CPU devices) are split into
slices. A pure function of the devices' process indices, so it is tested here without JAX; the mesh built
from it is checked in one process by test_train.py and across processes by test_multihost.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tpuctl.runtime.dist import slice_groups


@dataclass(frozen=True)
class FakeDevice:
    process_index: int
    id: int


def devices(processes: int, per_process: int) -> list[FakeDevice]:
    """As jax.devices() lists them: by process, then local id (global ids numbered the same way)."""
    return [FakeDevice(p, p * per_process + i) for p in range(processes) for i in range(per_process)]


def ids(groups: list[list[FakeDevice]]) -> list[list[int]]:
    return [[d.id for d in g] for g in groups]


def test_one_slice_is_the_devices_as_given() -> None:
    devs = devices(4, 2)[::-1]  # any order: one slice keeps it, as make_mesh did before slices
    assert slice_groups(devs, 1) == [devs]


def test_processes_split_slice_by_slice() -> None:
    # 4 hosts x 2 chips in 2 slices: processes 0-1 are slice 0, 2-3 slice 1 (the worker contract).
    assert ids(slice_groups(devices(4, 2), 2)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # One host per slice.
    assert ids(slice_groups(devices(4, 1), 4)) == [[0], [1], [2], [3]]
    # 6 hosts x 4 chips in 3 slices.
    groups = slice_groups(devices(6, 4), 3)
    assert [sorted({d.process_index for d in g}) for g in groups] == [[0, 1], [2, 3], [4, 5]]
    assert ids(groups) == [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]


def test_order_within_a_slice_is_the_order_given() -> None:
    devs = devices(4, 2)
    shuffled = [devs[i] for i in (5, 0, 7, 3, 1, 4, 2, 6)]
    assert ids(slice_groups(shuffled, 2)) == [[0, 3, 1, 2], [5, 7, 4, 6]]


def test_processes_not_divisible_by_slices_names_both() -> None:
    with pytest.raises(ValueError, match=r"TPUCTL_NUM_SLICES=2 does not divide the job's 3 processes"):
        slice_groups(devices(3, 2), 2)
    # A single process cannot be two slices: what an in-process run with TPUCTL_NUM_SLICES=2 hits.
    with pytest.raises(ValueError, match=r"TPUCTL_NUM_SLICES=2 does not divide the job's 1 processes"):
        slice_groups(devices(1, 4), 2)


def test_unequal_devices_per_slice_are_refused() -> None:
    devs = devices(4, 2)[:-1]  # the last host shows one device fewer
    with pytest.raises(ValueError, match=r"unequal device counts \[4, 3\]"):
        slice_groups(devs, 2)


def test_bad_slice_count_and_process_numbering() -> None:
    with pytest.raises(ValueError, match="TPUCTL_NUM_SLICES=0: need at least 1 slice"):
        slice_groups(devices(2, 1), 0)
    gap = [FakeDevice(0, 0), FakeDevice(2, 1)]
    with pytest.raises(ValueError, match=r"processes \[0, 2\]; expected 0\.\.1"):
        slice_groups(gap, 2)
