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
