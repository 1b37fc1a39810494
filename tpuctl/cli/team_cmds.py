"""`tpuctl workspace list|describe` and `tpuctl audit`: a team server's workspaces (those the caller
belongs to) and its audit log (a workspace admin's), through ``--server``; locally, the implicit
workspace (or a workspace file's) and this machine's ledger."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuctl.cli import remote
from tpuctl.cli.context import build_settings, make_output, session
from tpuctl.cli.options import OutputOpt, server_of

if TYPE_CHECKING:
    from tpuctl.cli.render import Output
    from tpuctl.store.audit import AuditEntry
    from tpuctl.teams.workspaces import Workspace, Workspaces

app = typer.Typer(help="The workspaces (teams' shares) of a server, or the local one.", no_args_is_help=True)

WorkspacesOpt = Annotated[
    str | None,
    typer.Option("--workspaces", metavar="FILE", help="Read this workspace file (without --server)."),
]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="workspace")
    root.command("audit")(audit)


@app.command("list")
def list_workspaces(ctx: typer.Context, workspaces: WorkspacesOpt = None, output: OutputOpt = None) -> None:
    """The workspaces you belong to: project, zones, chip limits, monthly dollars, your role."""
    out = make_output(ctx, output)
    found = _workspaces(ctx, out, workspaces)
    out.rows(
        "workspaces",
        ("WORKSPACE", "PROJECT", "ZONES", "CHIPS", "USD/MONTH", "MEMBERS"),
        (
            (
                ws.name,
                ws.project,
                ", ".join(ws.zones or ()) or "any",
                _chips(ws) or "unlimited",
                ws.usd_per_month,
                len(ws.members),
            )
            for ws in found
        ),
        key="workspaces",
        records=[ws.model_dump(mode="json") for ws in found],
    )


@app.command("describe")
def describe_workspace(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The workspace.")],
    workspaces: WorkspacesOpt = None,
    output: OutputOpt = None,
) -> None:
    """One workspace: its limits, budgets and members with their roles."""
    from tpuctl.services import teams

    out = make_output(ctx, output)
    server = server_of(build_settings(ctx))
    if server is not None:
        _no_file_with_server(workspaces)
        with remote.client(server) as api:
            ws = api.workspace(name).workspace
    else:
        with session(ctx, out) as sess:
            ws = teams.workspace(sess, _local_file(workspaces), name)
    budget = ws.run_budget_usd
    out.fields(
        f"workspace {ws.name}",
        {
            "workspace": ws.name, "project": ws.project, "zones": list(ws.zones or ()) or "any",
            "chips": _chips(ws) or "unlimited", "usd_per_month": ws.usd_per_month,
            "run_budget_usd": {"default": budget.default, "max": budget.max},
            "members": {email: role.value for email, role in sorted(ws.members.items())},
        },
    )  # fmt: skip


def audit(
    ctx: typer.Context,
    since: Annotated[
        str | None, typer.Option("--since", metavar="DUR", help="Only the last DUR: 30m, 6h, 7d.")
    ] = None,
    principal: Annotated[
        str | None, typer.Option("--principal", metavar="EMAIL", help="Only this caller.")
    ] = None,
    limit: Annotated[str, typer.Option("--limit", metavar="N", help="At most N rows, newest first.")] = "100",
    output: OutputOpt = None,
) -> None:
    """The audit log: every request that changed something or was refused (who, what, when, the answer).
    Through --server, a workspace admin sees the rows of the workspaces they administer and those refused
    before any workspace was known; locally, this machine's ledger."""
    import time

    from tpuctl import params
    from tpuctl.services import teams

    out = make_output(ctx, output)
    rows = params.whole(limit, "limit", minimum=1)
    start = None if since is None else time.time() - params.duration(since, "since")
    server = server_of(build_settings(ctx))
    if server is not None:
        with remote.client(server) as api:
            entries = api.audit(since=start, principal=principal, limit=rows).entries
    else:
        with session(ctx, out) as sess:
            entries = teams.audit_log(sess, since=start, principal=principal, limit=rows)
    _audit_rows(out, entries)


def _audit_rows(out: Output, entries: list[AuditEntry]) -> None:
    from tpuctl.timefmt import iso

    out.rows(
        "audit",
        ("AT", "PRINCIPAL", "WORKSPACE", "ACTION", "TARGET", "STATUS", "DETAIL"),
        (
            (
                iso(e.at),
                e.principal,
                e.workspace,
                e.action,
                e.target,
                e.status,
                e.detail.get("message", "") if e.detail else "",
            )
            for e in entries
        ),
        key="entries",
        records=[e.to_dict() for e in entries],
        keep=frozenset({"AT", "PRINCIPAL", "ACTION", "STATUS"}),
        drop=("DETAIL", "TARGET", "WORKSPACE"),
    )


def _workspaces(ctx: typer.Context, out: Output, path: str | None) -> list[Workspace]:
    from tpuctl.services import teams

    server = server_of(build_settings(ctx))
    if server is not None:
        _no_file_with_server(path)
        with remote.client(server) as api:
            return list(api.workspaces().workspaces)
    with session(ctx, out) as sess:
        return teams.workspaces_of(sess, _local_file(path))


def _local_file(path: str | None) -> Workspaces:
    from pathlib import Path

    from tpuctl.teams.workspaces import Workspaces, load_workspaces

    return Workspaces.implicit() if path is None else load_workspaces(Path(path))


def _no_file_with_server(path: str | None) -> None:
    from tpuctl.errors import UsageError

    if path is not None:
        raise UsageError(
            "--workspaces reads a local file; with --server the server's workspaces are shown",
            field="--workspaces",
            value=path,
            fix="drop one of --workspaces and --server",
        )


def _chips(ws: Workspace) -> str:
    """``v5e: 32, v6e: 64 (spot 64, on-demand 16)``; empty: no chip limit."""
    if ws.chips is None:
        return ""
    parts: list[Any] = []
    for generation, limit in sorted(ws.chips.items()):
        by = ", ".join(f"{c.value} {n}" for c, n in sorted(limit.by_capacity.items()))
        total = "any" if limit.total is None else limit.total
        parts.append(f"{generation}: {total}" + (f" ({by})" if by else ""))
    return ", ".join(parts)
