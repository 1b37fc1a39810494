"""The capacity flags (`--capacity-type`, `--spot`, `--preemptible`): one meaning on every command that
creates a slice (`pod create`, `run`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.catalog import CapacityType

# One meaning of the capacity flags on every command that creates a slice (`pod create`, `run`): each
# adds a capacity type to the allowed set, and placement takes the cheapest allowed candidate.
CAPACITY_TYPE_HELP = (
    "Allowed capacity type (repeatable): on-demand, spot, preemptible, reserved. --spot and --preemptible "
    "add to the same set (both: whichever is cheaper). Default: the profile's capacity_types, else on-demand."
)
SPOT_HELP = "Allow spot capacity (= --capacity-type spot; adds to the allowed set)."
PREEMPTIBLE_HELP = "Allow preemptible capacity (= --capacity-type preemptible; adds to the allowed set)."
API_HELP = (
    "The Google API that places the slice: tpu (the Cloud TPU API; the default for v6e, v5p and older) "
    "or compute (Compute Engine: TPU7x's only path, and a choice for v6e and v5p). Default: the profile's "
    "api where the generation offers it."
)


def run_capacity(capacity_types: list[str], *, spot: bool, preemptible: bool) -> list[CapacityType]:
    """The capacity types a run's new slice may be placed on, from the flags that mean the same as on
    `pod create`: --capacity-type (repeatable), --spot and --preemptible each add to the allowed set
    (empty: none given, the profile's decide). Queued and reserved capacity are `pod create`'s alone."""
    from tpuctl import params
    from tpuctl.catalog import CapacityType
    from tpuctl.errors import UsageError

    types, queued = params.capacity_types(capacity_types, spot=spot, preemptible=preemptible)
    if queued or CapacityType.RESERVED in types:
        what = "queued" if queued else "reserved"
        raise UsageError(
            f"`tpuctl run` cannot create its slice as {what} capacity",
            field="capacity_types",
            value=what,
            fix="create the slice with `tpuctl pod create --queued/--reserved`, then `tpuctl run --pod NAME`",
        )
    return types
