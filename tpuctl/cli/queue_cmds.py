"""`tpuctl queue`: the runs waiting in the server's queue, in the order they will be admitted."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from tpuctl.cli import remote
from tpuctl.cli.context import build_settings, make_output, session
from tpuctl.cli.options import OutputOpt, server_of

if TYPE_CHECKING:
    from tpuctl.server.queue_view import QueuedRun


def register(app: typer.Typer) -> None:
    app.command("queue")(queue)


def queue(ctx: typer.Context, output: OutputOpt = None) -> None:
    """The runs waiting for room in their workspace, first to be admitted first: position, run, workspace,
    principal, priority, waiting since, and why it waits (docs/queue.md says the order). Through
    --server, the server's queue; without one, the ledger's (a local install's workspace has no limits,
    so its runs never wait long)."""
    out = make_output(ctx, output)
    server = server_of(build_settings(ctx))
    runs: list[QueuedRun]
    if server is not None:
        with remote.client(server) as api:
            answer = api.queue()
        remote.banner(out, answer.served_by, server)
        runs = answer.runs
    else:
        from tpuctl.server.queue_view import queue_of
        from tpuctl.services.cost.monthly_spend import this_month_spend
        from tpuctl.teams.workspaces import Workspaces

        with session(ctx, out) as sess:
            runs = queue_of(sess, Workspaces.implicit(), this_month_spend(sess, now=sess.clock()))
    out.rows(
        "queue",
        ("#", "RUN", "WORKSPACE", "PRINCIPAL", "PRIORITY", "TYPE", "WAITING SINCE", "WAITED S", "REASON"),
        (
            (
                r.position, r.run_id, r.workspace, r.principal or "", r.priority, r.accelerator_type or "",
                r.waiting_since, r.waited_s, r.reason or "",
            )
            for r in runs
        ),
        key="queue",
        records=[r.to_dict() for r in runs],
        keep=frozenset({"#", "RUN", "REASON"}),
        drop=("TYPE", "WAITED S", "PRINCIPAL"),
    )  # fmt: skip
