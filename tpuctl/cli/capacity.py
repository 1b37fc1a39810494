"""The capacity flags (`--capacity-type`, `--spot`, `--preemptible`): one meaning on every command that
creates a slice (`pod create`, `run`), and how `run` hands the allowed set to the launcher."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.catalog import CapacityType
    from tpuctl.services.session import Session

# One meaning of the capacity flags on every command that creates a slice (`pod create`, `run`): each
# adds a capacity type to the allowed set, and placement takes the cheapest allowed candidate.
CAPACITY_TYPE_HELP = (
    "Allowed capacity type (repeatable): on-demand, spot, preemptible, reserved. --spot and --preemptible "
    "add to the same set (both: whichever is cheaper). Default: the profile's capacity_types, else on-demand."
)
SPOT_HELP = "Allow spot capacity (= --capacity-type spot; adds to the allowed set)."
PREEMPTIBLE_HELP = "Allow preemptible capacity (= --capacity-type preemptible; adds to the allowed set)."


def run_capacity(
    capacity_types: list[str], *, spot: bool, preemptible: bool
) -> tuple[CapacityType, list[CapacityType]]:
    """What a run's new slice may be created on, from the flags that mean the same as on `pod create`:
    --capacity-type (repeatable), --spot and --preemptible each add to the allowed set. Returns the one
    capacity type for the launcher's request and the allowed set for the session's settings (empty: none
    given, the profile's decide).

    The allocator (the simulator executor's path) reads the set from the settings when the request names
    no capacity type, so with several allowed the request names none (on-demand) and the settings carry
    them all; with one, both say it, so that an explicit on-demand is not replaced by the profile's."""
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
    return (types[0] if len(types) == 1 else CapacityType.ON_DEMAND), types


def check_one_capacity(sess: Session, executor: str | None, allowed: list[CapacityType]) -> None:
    """The SSH executor still creates its slice itself, in one zone on one capacity type, until every
    run places through the allocator (issue 13, item 2): several allowed types are refused there."""
    from tpuctl.errors import UsageError

    ssh = executor == "ssh" or (executor is None and sess.backend.value != "sim")
    if ssh and len(allowed) > 1:
        names = ", ".join(t.value for t in allowed)
        raise UsageError(
            f"runs over SSH create their slice on one capacity type; {names} were allowed",
            field="capacity_types",
            value=names,
            fix="allow one (e.g. --spot), or create the slice with `tpuctl pod create --spot --preemptible` "
            "and run on it with --pod",
        )
