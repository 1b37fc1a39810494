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
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "-v", "--verbose", help="Also each host's setup commands and output, and every step of tpuctl's."
    ),
]


def type_given_once(argument: str | None, option: str | None, *, command: str) -> str | None:
    """TYPE, given as ``command``'s argument or as its --type/--accelerator-type (gcloud's name), at most
    once (two different ones are exit 2); None when neither was given."""
    from tpuctl.errors import UsageError

    if argument is not None and option is not None and argument != option:
        raise UsageError(
            f"two types given: {argument} and --type {option}",
            field="TYPE",
            value=option,
            fix=f"give the type once: `tpuctl {command} TYPE` or `tpuctl {command} --type TYPE`",
        )
    return argument if argument is not None else option
