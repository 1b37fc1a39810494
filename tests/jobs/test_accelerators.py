"""SkyPilot's accelerator names and forms resolve like tpuctl's own."""

from __future__ import annotations

import pytest

from tpuctl.catalog import Catalog
from tpuctl.errors import UsageError
from tpuctl.jobs.accelerators import accelerator_set, resolve_name
from tpuctl.jobs.model import AcceleratorChoice, Resources


@pytest.mark.parametrize(
    ("name", "resolved"),
    [("tpu-v5litepod-16", "v5e-16"), ("tpu-v5e-16", "v5e-16"), ("tpu-v6e-8", "v6e-8"), ("v5e-8", "v5e-8"),
     ("tpu-v6e-8:1", "v6e-8"), ("TPU-V4-8", "v4-8")],
)  # fmt: skip
def test_names(name: str, resolved: str) -> None:
    assert resolve_name(name, Catalog.load()) == resolved


def test_an_unknown_one_says_what_is_near_in_the_users_spelling() -> None:
    with pytest.raises(UsageError) as caught:
        resolve_name("tpu-v6f-8", Catalog.load())
    assert "'tpu-v6f-8'" in caught.value.message and "did you mean v6e-8?" in caught.value.message
    assert caught.value.fix is not None and "tpu-v5litepod-16" in caught.value.fix


def test_a_count_above_1_points_at_slices() -> None:
    with pytest.raises(UsageError, match="its count is 1") as caught:
        resolve_name("tpu-v6e-8:2", Catalog.load())
    assert caught.value.fix is not None and "slices: N" in caught.value.fix


def test_forms_and_how_they_rank() -> None:
    one = accelerator_set(Resources(accelerators="tpu-v6e-8"))
    listed = accelerator_set(Resources(accelerators=["tpu-v6e-8", "tpu-v5e-16"]))
    a_set = accelerator_set(Resources(accelerators={"tpu-v6e-8": None, "tpu-v5e-16": None}))
    any_of = accelerator_set(Resources(any_of=[AcceleratorChoice(accelerators="tpu-v6e-8")]))
    ordered = accelerator_set(Resources(ordered=[AcceleratorChoice(accelerators="a"),
                                                 AcceleratorChoice(accelerators="b")]))  # fmt: skip
    assert one is not None and (one.names, one.preference) == (("tpu-v6e-8",), "ordered")
    assert listed is not None and listed.preference == "ordered"
    assert listed.places[1] == ("resources", "accelerators", 1)
    assert a_set is not None and a_set.preference == "cheapest"
    assert any_of is not None and any_of.preference == "cheapest"
    assert any_of.places == (("resources", "any_of", 0, "accelerators"),)
    assert ordered is not None and (ordered.names, ordered.preference) == (("a", "b"), "ordered")
    assert accelerator_set(Resources()) is None
