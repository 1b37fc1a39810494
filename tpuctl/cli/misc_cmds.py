"""`tpuctl quota` and `tpuctl doctor`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tpuctl.cli import remote
from tpuctl.cli.context import build_settings, make_output, session
from tpuctl.cli.options import OutputOpt, server_of, type_given_once

if TYPE_CHECKING:
    from tpuctl.catalog import Catalog, Generation


def register(app: typer.Typer) -> None:
    app.command("quota")(quota)
    app.command("doctor")(doctor)


def quota(
    ctx: typer.Context,
    type_argument: Annotated[
        str | None,
        typer.Argument(metavar="[TYPE]", help="Only the quotas of this generation or type: v5e, v6e-8, ..."),
    ] = None,
    type_option: Annotated[
        str | None,
        typer.Option("--type", "--accelerator-type", metavar="TYPE", help="The same, as an option."),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Also list quotas with nothing in use and a zero limit.")
    ] = False,
    output: OutputOpt = None,
) -> None:
    """TPU quota limits (Cloud Quotas) against what the existing slices use, per zone and region: the TPU
    API's and Compute Engine's (per TPU family), which are separate pools. With TYPE, only the quotas a
    slice of that generation draws on (e.g. `tpuctl quota v5e`)."""
    from tpuctl.catalog import Catalog
    from tpuctl.services.quota import QuotaBook, generation_uses

    out = make_output(ctx, output)
    wanted = type_given_once(type_argument, type_option, command="quota")
    # Checked before the backend opens: a typo is exit 2 with the generations listed.
    generation = None if wanted is None else _generation(Catalog.load(), wanted)
    server = server_of(build_settings(ctx))
    if server is not None:
        with remote.client(server) as api:
            answer = api.quota()
        remote.banner(out, answer.served_by, server)
        every = answer.uses
    else:
        with session(ctx, out) as sess:
            every = QuotaBook.from_cloud(sess.cloud, sess.catalog).all_uses()
    uses = [u for u in every if all_ or u.in_use or u.limit != 0]
    if generation is not None:
        uses = generation_uses(uses, generation)
    # A per-family quota's row without a family is its limit for every family without a row of its own.
    per_family = {u.quota_id for u in uses if u.tpu_family}

    def limit_text(limit: int | None) -> str | int:
        return "unknown" if limit is None else "unlimited" if limit < 0 else limit

    out.rows(
        "quota",
        ("QUOTA", "FAMILY", "LOCATION", "LIMIT", "IN USE", "AVAILABLE", "UNIT", "HELD BY PREEMPTED", "API"),
        (
            (
                u.quota_id,
                u.tpu_family or ("(others)" if u.quota_id in per_family else ""),
                u.location,
                limit_text(u.limit),
                u.in_use,
                limit_text(u.limit) if u.available is None else u.available,
                u.unit,
                u.preempted_holding or "",
                u.surface.value,
            )
            for u in uses
        ),
        key="quotas",
        records=[u.to_dict() for u in uses],
        # Ids are long (TPUS-PER-TPU-FAMILY-per-project-region): never cut, never dropped.
        keep=frozenset({"QUOTA", "FAMILY", "LOCATION"}),
        drop=("API", "HELD BY PREEMPTED"),
    )


def _generation(catalog: Catalog, name: str) -> Generation:
    """The generation a name says: a generation (``v5e``, ``v5litepod``) or a type of it (``v5e-16``)."""
    import re

    if re.search(r"-[0-9]+$", name.strip()):
        return catalog.resolve(name).generation
    return catalog.generation(name.strip())


def doctor(ctx: typer.Context, output: OutputOpt = None) -> int:
    """Check the setup: config file, profile, backend, credentials, project, API reachable, quotas
    readable, state dir. Every check runs; exit 0 if all pass, else the first failure's exit code."""
    from tpuctl.cli.context import global_options
    from tpuctl.services.doctor import diagnose

    out = make_output(ctx, output)
    report = diagnose(lambda: build_settings(ctx), backend=global_options(ctx).given_backend)
    records = [c.to_dict() for c in report.checks]
    out.rows(
        "doctor",
        ("CHECK", "STATUS", "DETAIL", "FIX"),
        ((c.check, c.status, c.detail, c.fix or "") for c in report.checks),
        key="checks",
        records=records,
        extra={"ok": report.ok},
    )
    return report.exit_code
