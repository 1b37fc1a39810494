"""``tpuctl.params`` values parsed at the edge, one function at a time (the flags end to end are in
tests/cli/test_params.py)."""

from __future__ import annotations

import pytest

from tpuctl import params
from tpuctl.errors import UsageError


def test_a_type_list_keeps_the_order_given() -> None:
    assert params.slice_types(None) == ()
    assert params.slice_types("v5e-16") == ("v5e-16",)
    assert params.slice_types("v5e-16, v6e-8") == ("v5e-16", "v6e-8")


@pytest.mark.parametrize("value", ["v5e-16,", ",v6e-8", "v5e-16,,v6e-8"])
def test_an_empty_type_in_the_list_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(UsageError, match=r"--type .* has an empty type in its list") as info:
        params.slice_types(value)
    assert info.value.field == "type"
