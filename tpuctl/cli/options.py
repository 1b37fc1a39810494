"""Option types shared by commands (typer Annotated aliases)."""

from __future__ import annotations

from typing import Annotated

import typer

OutputOpt = Annotated[
    str | None, typer.Option("-o", "--output", help="Output format: table, json, yaml or csv.")
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")]
YesOpt = Annotated[bool, typer.Option("-y", "--yes", help="Do not ask for confirmation.")]
ZoneOpt = Annotated[str | None, typer.Option("--zone", help="Zone, e.g. us-central1-a.")]

# One meaning of the capacity flags on every command that creates a slice (`pod create`, `run`): each
# adds a capacity type to the allowed set, and placement takes the cheapest allowed candidate.
CAPACITY_TYPE_HELP = (
    "Allowed capacity type (repeatable): on-demand, spot, preemptible, reserved. --spot and --preemptible "
    "add to the same set (both: whichever is cheaper). Default: the profile's capacity_types, else on-demand."
)
SPOT_HELP = "Allow spot capacity (= --capacity-type spot; adds to the allowed set)."
PREEMPTIBLE_HELP = "Allow preemptible capacity (= --capacity-type preemptible; adds to the allowed set)."
