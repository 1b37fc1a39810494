"""`tpuctl cost ...`: estimate before spending (every zone x capacity type), report after (from the ledger,
reconciled with the live listing), with the price source and date each used."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuctl.cli import remote
from tpuctl.cli.context import backend_for, build_settings, clock, global_options, is_dry_run, make_output
from tpuctl.cli.options import DryRunOpt, OutputOpt, server_of

if TYPE_CHECKING:
    from tpuctl.backends.base import Backend
    from tpuctl.catalog import Catalog
    from tpuctl.cli.render import Output
    from tpuctl.services.cost import CostReport, CostScope
    from tpuctl.services.cost.estimate import Estimate, EstimateRequest
    from tpuctl.services.cost.reconcile import InBackground
    from tpuctl.services.prices import PriceSource
    from tpuctl.services.session import Session
    from tpuctl.settings import Settings

app = typer.Typer(help="What TPU slices will cost, and what they cost.", no_args_is_help=True)

_BAR_WIDTH = 40
_EIGHTHS = " ▏▎▍▌▋▊▉"


@contextmanager
def cost_session(
    ctx: typer.Context,
    out: Output,
    settings: Settings,
    prices: tuple[Catalog, PriceSource] | None = None,
) -> Iterator[tuple[Session, PriceSource]]:
    """Like ``context.session``, with the catalog's prices from the backend's refreshed cache if present
    (``prices``: that catalog, already loaded)."""
    from tpuctl.services.prices import load_catalog
    from tpuctl.services.session import open_session

    catalog, source = prices or load_catalog(settings.resolved_state_dir, settings.resolved_backend.value)
    with open_session(settings, catalog=catalog, backend=global_options(ctx).given_backend) as sess:
        label = sess.backend.label
        out.backend_banner(label, sess.project, f", state {sess.state_dir}" if label.names_state_dir else "")
        for warning in source.warnings:
            out.warn(warning)
        yield sess, source


# --- estimate ----------------------------------------------------------------------------------------


@app.command("estimate")
def estimate(
    ctx: typer.Context,
    accelerator_type: Annotated[str, typer.Argument(metavar="TYPE", help="e.g. v5e-64, v6e-8, v5p-128.")],
    hours: Annotated[
        str | None,
        typer.Option("--hours", metavar="HOURS", help="How long it would run (default 1; 1.5 = 90 minutes)."),
    ] = None,
    zone: Annotated[
        list[str] | None, typer.Option("--zone", help="Only this zone (repeatable; default: every zone).")
    ] = None,
    region: Annotated[str | None, typer.Option("--region", help="Only the zones of this region.")] = None,
    slices: Annotated[
        str | None, typer.Option("--slices", metavar="N", help="Number of slices (default 1).")
    ] = None,
    output: OutputOpt = None,
) -> None:
    """Every zone x capacity type where TYPE is offered, cheapest first: USD/hour, USD for --hours, the
    saving against on-demand in the same zone, and whether quota fits now. Creates nothing."""
    from tpuctl import params
    from tpuctl.services.cost.estimate import build_estimate_request
    from tpuctl.services.cost.estimate import estimate as run_estimate
    from tpuctl.services.prices import load_catalog

    out = make_output(ctx, output)
    settings = build_settings(ctx)
    # Every flag is checked before a backend is contacted: bad input exits 2 at once.
    catalog, _source = load_catalog(settings.resolved_state_dir, settings.resolved_backend.value)
    request = build_estimate_request(
        catalog,
        settings,
        accelerator_type,
        hours=None if hours is None else params.hours(hours, "hours"),
        zones=zone or [],
        region=region,
        slices=1 if slices is None else params.whole(slices, "slices"),
    )
    server = server_of(settings)
    if server is not None:
        result = _remote_estimate(out, server, request, zones=zone or [], region=region)
    else:
        with cost_session(ctx, out, settings) as (sess, source):
            result = run_estimate(sess, request, source)
    _render_estimate(out, result)


def _remote_estimate(
    out: Output, server: str, request: EstimateRequest, *, zones: list[str], region: str | None
) -> Estimate:
    """The estimate the server makes on its project, for ``request`` (checked here first)."""
    from tpuctl.server.wire_views import EstimateIn
    from tpuctl.services.cost.estimate import Estimate

    body = EstimateIn(accelerator_type=request.placement.accelerator.api_name, hours=request.hours,
                      zones=zones, region=region, slices=request.placement.slices)  # fmt: skip
    with remote.client(server) as api:
        answer = api.cost_estimate(body)
    remote.banner(out, answer.served_by, server)
    for warning in answer.prices.warnings:
        out.warn(warning)
    return Estimate(request=request, rows=answer.rows, not_offered=answer.not_offered, prices=answer.prices,
                    warnings=answer.warnings)  # fmt: skip


#: Capacity types that are one offer under two names when zone and price agree (spot is the newer
#: name of preemptible on TPUs: same price, same preemption); a table shows them as one row.
_TWINS = ("spot", "preemptible")


def _merge_twins(options: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """Each option with the name of its capacity; a spot and a preemptible option with the same zone,
    price and quota verdict become one row "spot/preemptible"."""
    merged: list[tuple[dict[str, Any], str]] = []
    seen: dict[tuple[Any, ...], int] = {}
    for option in options:
        key = (option["zone"], option["usd_per_chip_hour"], option["quota_fits"])
        if option["capacity"] in _TWINS and key in seen:
            first, _ = merged[seen[key]]
            merged[seen[key]] = (first, "/".join(_TWINS))
            continue
        if option["capacity"] in _TWINS:
            seen[key] = len(merged)
        merged.append((option, option["capacity"]))
    return merged


def _each(options: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    return [(option, option["capacity"]) for option in options]


def _render_estimate(out: Output, result: Estimate) -> None:
    data = result.to_dict()
    if out.fmt in ("json", "yaml"):
        out.document(out.envelope(estimate=data))
        return
    hours = result.request.hours
    req = result.request.placement
    what = f"{req.slices} x {req.accelerator.api_name}" if req.slices > 1 else req.accelerator.api_name
    columns = ("ZONE", "CAPACITY", "USD/CHIP-H", "USD/H", f"USD FOR {hours:g} H", "VS ON-DEMAND", "QUOTA")

    def saving(row: dict[str, Any]) -> str:
        if row["saving_usd"] is None or row["capacity"] == "on-demand":
            return "-"
        return f"-{row['saving_usd']:.2f} ({row['saving_pct']:.0f}%)"

    def money(value: float | None) -> str | None:
        return None if value is None else f"{value:.2f}"

    rows = [
        [
            r["zone"],
            capacity,
            r["usd_per_chip_hour"],
            money(r["usd_per_hour"]) if out.fmt != "csv" else r["usd_per_hour"],
            money(r["usd_total"]) if out.fmt != "csv" else r["usd_total"],
            saving(r) if out.fmt != "csv" else r["saving_usd"],
            ("fits" if r["quota_fits"] else "short") if out.fmt != "csv" else r["quota_fits"],
        ]
        for r, capacity in (_merge_twins(data["options"]) if out.fmt != "csv" else _each(data["options"]))
    ]
    out.rows(
        f"{what} ({req.chips} chips) for {hours:g} h, cheapest first",
        columns,
        rows,
        key="options",
        records=data["options"],
    )
    out.note(f"{result.prices.line()}; reserved capacity is not listed (contract prices)")
    if result.price_note:
        out.warn(f"{req.accelerator.generation.name} price: {result.price_note}")
    if result.not_offered:
        out.note(f"not offered in: {', '.join(result.not_offered)}")
    for warning in result.warnings:
        out.warn(warning)


# --- report ------------------------------------------------------------------------------------------


@app.command("report")
def report(
    ctx: typer.Context,
    since: Annotated[
        str | None,
        typer.Option("--since", help="From (UTC): 2026-11-01, 2026-11-01T12:00Z, 7d, today, month."),
    ] = None,
    until: Annotated[str | None, typer.Option("--until", help="Until (exclusive; default now).")] = None,
    group_by: Annotated[
        str | None,
        typer.Option(
            "--group-by",
            help="slice (default), run, workspace, user, zone, region, type, capacity, day or label:KEY.",
        ),
    ] = None,
    workspace: Annotated[
        str | None, typer.Option("--workspace", metavar="NAME", help="Only the slices of this workspace.")
    ] = None,
    user: Annotated[
        str | None,
        typer.Option(
            "--user", metavar="EMAIL", help="Only the slices this principal's runs and commands made."
        ),
    ] = None,
    reconcile: Annotated[
        bool,
        typer.Option(
            "--reconcile/--no-reconcile",
            help="Compare the ledger with the live listing first (default); --no-reconcile stays offline.",
        ),
    ] = True,
    limit: Annotated[
        str | None,
        typer.Option(
            "--limit",
            metavar="N",
            help="Show the N costliest groups (default: 50 in the table, every group with -o json/yaml/csv);"
            " 0 shows all. Totals always cover every group.",
        ),
    ] = None,
    output: OutputOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """What was spent, from the ledger with GCP's billing rules: per group (most expensive first),
    totals, spot savings against on-demand, what preemptions wasted, untracked slices, and a per-day
    chart. With --dry-run the reconciliation records nothing."""
    from tpuctl.services.cost import CostScope, parse_group_by, parse_limit, parse_window
    from tpuctl.services.cost.session_report import session_report

    out = make_output(ctx, output)
    settings = build_settings(ctx)
    group = parse_group_by(group_by)
    keep = parse_limit(limit, table=not out.machine)
    now = clock(ctx)
    start, end_given = parse_window(since, until, now=now())
    # Without --until the window ends when the report is computed (after reconciliation recorded what it
    # saw), not when the command started.
    end = end_given if until is not None else None
    dry = is_dry_run(ctx, dry_run)
    # This machine's user sees the whole ledger: the flags alone narrow it (a server narrows to its
    # reader's workspaces as well).
    scope = CostScope().narrowed(workspace, user)
    server = server_of(settings)
    if server is not None:
        query = {"group_by": group.name, "since": start, "until": end, "limit": keep, "reconcile": reconcile,
                 "dry_run": dry, "workspace": workspace, "user": user}  # fmt: skip
        _render_report(out, _remote_report(out, server, query))
        return
    if reconcile:
        from tpuctl.services.prices import load_catalog

        prices = load_catalog(settings.resolved_state_dir, settings.resolved_backend.value)
        # The report starts now, on a thread, while the session opens and the cloud is listed.
        early = _start_report(settings, prices, group, start, end, keep, now, scope)
        try:
            with cost_session(ctx, out, settings, prices) as (sess, source):
                result = session_report(
                    sess, source, group, start, end, keep, reconcile=True, dry_run=dry, early=early,
                    workspace=workspace, principal=user,
                )  # fmt: skip
        finally:
            early.wait()
    else:
        result = _offline_report(
            out, settings, backend_for(ctx, settings), group, start, end, keep, now, scope
        )
    _render_report(out, result)


def _remote_report(out: Output, server: str, query: dict[str, Any]) -> CostReport:
    """The report the server computes on its ledger (``query``: the parsed flags)."""
    with remote.client(server) as api:
        answer = api.cost_report(query)
    remote.banner(out, answer.served_by, server)
    if not query["reconcile"]:
        out.note("offline: the ledger only, not reconciled with the live listing")
    return answer.report


def _start_report(
    settings: Settings,
    prices: tuple[Catalog, PriceSource],
    group: Any,
    start: float | None,
    end: float | None,
    limit: int | None,
    now: Callable[[], float],
    scope: CostScope,
) -> InBackground[CostReport]:
    """The report over the ledger as it is, computed on a thread from now on (it fails with a
    LedgerError, and is computed again once the session is open, if there is no ledger yet or it must be
    migrated first)."""
    from tpuctl.services.cost import CostService
    from tpuctl.services.cost.reconcile import InBackground

    service = CostService(settings.resolved_database, *prices, clock=now)
    return InBackground(
        lambda: service.report(since=start, until=end, group_by=group, limit=limit, scope=scope),
        name="tpuctl-cost-report",
    )


def _offline_report(
    out: Output,
    settings: Settings,
    backend: Backend,
    group: Any,
    start: float | None,
    end: float | None,
    limit: int | None,
    now: Callable[[], float],
    scope: CostScope,
) -> CostReport:
    from tpuctl.services.budget import expired_slices
    from tpuctl.services.cost import CostService
    from tpuctl.services.prices import load_catalog
    from tpuctl.store.ledger import Ledger

    # ``backend``: only its name and marker; nothing is contacted.
    catalog, source = load_catalog(settings.resolved_state_dir, backend.name)
    out.backend_banner(backend.label, settings.project or "(not contacted)", ", offline")
    out.note("offline: the ledger only, not reconciled with the live listing")
    with Ledger.open(settings.resolved_database) as ledger:
        result = CostService(ledger.url, catalog, source, clock=now).report(
            since=start, until=end, group_by=group, limit=limit, scope=scope
        )
        result.warnings.extend(expired_slices(ledger, now=now()))
    return result


def _money(value: float) -> str:
    return _amount(value, 2)


def _amount(value: float, places: int) -> str:
    """``value`` to ``places`` decimals, or to its second significant digit where that many would show a
    non-zero amount as 0 (a 30 s slice billed 0.0083 hours must not read "0.00" beside its cost)."""
    import math

    if value == 0 or abs(value) >= 10**-places:
        return f"{value:,.{places}f}"
    return f"{value:.{1 - math.floor(math.log10(abs(value)))}f}"


#: What a narrow terminal keeps of the report, and what it loses first (``Output.rows``).
_KEEP = frozenset({"SLICE", "ZONE", "RUN", "WORKSPACE", "USER", "COST USD"})
_DROP = ("SAVED USD", "HOURS", "STATE", "TYPE", "CHIP-H", "SLICES", "WASTE USD", "CAPACITY")


def _render_report(out: Output, result: CostReport) -> None:
    from tpuctl.services.cost import iso

    data = result.to_dict()
    if out.fmt in ("json", "yaml"):
        out.document(out.envelope(**data))
        return
    if out.fmt == "csv":
        out.rows("cost", result.csv_columns(), result.csv_rows(), key="groups", records=data["groups"])
        return
    window = f"{iso(result.since) or 'the beginning'} .. {iso(result.until)}"
    out.out.print(f"[bold]cost report[/], {window} (UTC), by {result.group_by.name}")
    _render_groups(out, result, data["groups"])
    _render_totals(out, result)
    _render_days(out, data["by_day"])
    _render_untracked(out, result)
    for action in result.reconciled:
        verb = "closed" if action["event"] == "gone" else f"marked {action['event']}"
        if not action["recorded"]:
            verb = f"would be {verb} (dry run)"
        out.note(f"{action['name']} ({action['zone']}) {verb} at {action['at']}: {action['reason']}")
    out.note(result.prices.line())
    for generation, note in result.price_notes.items():
        out.warn(f"{generation} price: {note}")
    for warning in result.warnings:
        out.warn(warning)


def _render_groups(out: Output, result: CostReport, records: list[dict[str, Any]]) -> None:
    """The table of groups (the costliest first) and a line for those not shown."""
    lines = result.lines
    title = f"by {result.group_by.name}"
    if result.groups_total > len(lines):
        title += f": the {len(lines)} costliest of {result.groups_total:,}"
    columns, key_cells = _group_keys(result)
    columns += ["CHIP-H", "COST USD", "SAVED USD", "WASTE USD"]
    rows = [
        [
            *cells,
            _amount(line.billed_hours, 2),
            _amount(line.chip_hours, 1),
            _money(line.cost_usd),
            _money(line.spot_savings_usd),
            "unknown" if line.info.get("steps_reported") is False else _money(line.waste_usd),
        ]
        for cells, line in zip(key_cells, lines, strict=True)
    ]
    out.rows(title, columns, rows, key="groups", records=records, keep=_KEEP, drop=_DROP)
    if any(line.info.get("steps_reported") is False for line in lines):
        out.out.print("waste unknown: the program reports no steps (recomputed work cannot be known)")
    rest = result.omitted
    if rest is not None:
        hidden = result.groups_total - len(lines)
        total = result.totals.cost_usd
        share = f", {rest.cost_usd / total:.0%} of the total" if total else ""
        out.out.print(
            f"... and {hidden:,} more {_plural(result.group_by.kind)} costing {_money(rest.cost_usd)} USD"
            f"{share}, not shown: --limit 0 shows them all; -o json and -o csv list every group"
        )


def _group_keys(result: CostReport) -> tuple[list[str], list[list[Any]]]:
    """The columns that name each group (a slice's name, zone, type...; a run or a label's value) and
    their cells, one row per group."""
    lines = result.lines
    if result.group_by.kind == "slice":
        columns = ["SLICE", "ZONE", "TYPE", "CAPACITY", "STATE", "HOURS"]
        key_cells = [
            [
                f"{line.info.get('name', line.key)}"
                + (f"#{line.info['incarnation']}" if line.info.get("incarnation", 1) != 1 else ""),
                line.info.get("zone"),
                line.info.get("accelerator_type"),
                line.info.get("capacity"),
                line.info.get("state"),
            ]
            for line in lines
        ]
        return columns, key_cells
    label = {"run": "RUN", "label": result.group_by.name.upper()}.get(
        result.group_by.kind, result.group_by.kind.upper()
    )
    return [label, "SLICES", "HOURS"], [[line.key, line.slices] for line in lines]


def _render_totals(out: Output, result: CostReport) -> None:
    t = result.totals
    out.out.print(
        f"[bold]total {_money(t.cost_usd)} USD[/] for {_amount(t.chip_hours, 1)} chip-hours on {t.slices} "
        f"slice(s); spot saved {_money(t.spot_savings_usd)} USD against on-demand "
        f"({_money(t.on_demand_usd)} USD)"
    )
    kinds = "".join(f"{kind} {n}, " for kind, n in sorted(result.preemption_kinds.items()))
    out.out.print(
        f"preemptions: {result.preemptions} ({kinds}{result.free_preemptions} in the first minute, not "
        "billed); "
        f"{_waste_words(result)}, quota held after preemption {_amount(t.quota_held_chip_hours, 1)} "
        f"chip-hours ({_money(t.quota_held_usd)} USD at list price, not billed)"
    )


def _waste_words(result: CostReport) -> str:
    """The totals' waste and recomputed work: unknown where a group's is (its program reports no steps),
    as the rows say, rather than a sum that counts the unknown as 0."""
    t = result.totals
    unknown = sum(1 for group in result.groups if group.get("steps_reported") is False)
    if not unknown:
        return f"waste {_money(t.waste_usd)} USD: recomputed work {_money(t.recomputed_usd)} USD"
    if unknown == len(result.groups) and result.groups_total == len(result.groups):
        return "waste unknown: recomputed work unknown (the program reports no steps)"
    runs = f"{unknown} run{'s' if unknown != 1 else ''}"
    return (
        f"waste at least {_money(t.waste_usd)} USD: recomputed work at least {_money(t.recomputed_usd)} "
        f"USD (unknown for {runs} whose program reports no steps)"
    )


def _render_untracked(out: Output, result: CostReport) -> None:
    """Slices billing in the cloud that the ledger does not know (not in the report's figures)."""
    if not result.untracked:
        return
    out.rows(
        "untracked slices (in the cloud, not in the ledger)",
        ("NAME", "ZONE", "TYPE", "STATE", "CAPACITY", "USD/H NOW"),
        (
            [u["name"], u["zone"], u["accelerator_type"], u["state"], u["capacity"], u["usd_per_hour"]]
            for u in result.untracked
        ),
        key="untracked",
        records=result.untracked,
    )
    rate = sum(u["usd_per_hour"] or 0.0 for u in result.untracked)
    out.out.print(f"untracked slices bill {_money(rate)} USD/h now; the report above does not include them")


def _plural(kind: str) -> str:
    return {"slice": "slices", "run": "runs", "day": "days", "capacity": "capacity types",
            "type": "types", "label": "label values"}.get(kind, f"{kind}s")  # fmt: skip


def _render_days(out: Output, days: list[dict[str, Any]]) -> None:
    """A horizontal bar per day (rich), scaled to the most expensive day, with eighth-block precision."""
    if not days:
        return
    from rich.table import Table

    top = max(d["cost_usd"] for d in days) or 1.0
    table = Table(title="per day (UTC)", title_justify="left", box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column(style="cyan")
    for day in days:
        eighths = round(day["cost_usd"] / top * _BAR_WIDTH * 8)
        bar = "█" * (eighths // 8) + (_EIGHTHS[eighths % 8] if eighths % 8 else "")
        table.add_row(day["day"], _money(day["cost_usd"]), bar)
    out.out.print(table)
