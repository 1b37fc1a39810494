"""Option types shared by commands (typer Annotated aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from tpuctl.settings import Settings

OutputOpt = Annotated[
    str | None, typer.Option("-o", "--output", help="Output format: table, json, yaml or csv.")
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")]
YesOpt = Annotated[bool, typer.Option("-y", "--yes", help="Do not ask for confirmation.")]
ZoneOpt = Annotated[str | None, typer.Option("--zone", help="Zone, e.g. us-central1-a.")]
WorkspaceOpt = Annotated[
    str | None,
    typer.Option(
        "--workspace",
        metavar="NAME",
        help="The workspace whose share it uses (default: your only one; locally: default).",
    ),
]
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


def server_of(settings: Settings) -> str | None:
    """The `tpuctl server` a command goes through (``--server``, ``TPUCTL_SERVER``, profile key
    ``server``; parsed by the settings), None for this machine. With a ledger named too it is exit 2:
    through a server, the ledger is the server's."""
    from tpuctl.errors import UsageError

    if settings.server is not None and settings.database is not None:
        raise UsageError(
            f"both a server ({settings.server}) and a ledger ({settings.database.text}) were given",
            field="--server",
            value=settings.server,
            fix="drop --database (TPUCTL_DATABASE_URL) to go through the server, or drop --server "
            "(TPUCTL_SERVER) to use the ledger here",
        )
    return settings.server


def refuse_through_server(server: str | None, what: str, *, fix: str) -> None:
    """Exit 2 for ``what`` when the command goes through a server, which does not carry it yet."""
    from tpuctl.errors import UsageError

    if server is not None:
        raise UsageError(
            f"{what} is not carried through a tpuctl server yet",
            field="--server",
            value=server,
            fix=fix,
        )
