"""`tpuctl catalog ...`: accelerator types, prices and zones, from the bundled catalog (no cloud needed)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuctl.cli import remote
from tpuctl.cli.context import make_output
from tpuctl.cli.options import DryRunOpt, OutputOpt, refuse_through_server, server_of

if TYPE_CHECKING:
    from tpuctl.backends.base import Backend
    from tpuctl.catalog import Catalog
    from tpuctl.cli.render import Output
    from tpuctl.services.prices import PriceSource, RefreshResult
    from tpuctl.settings import Settings

app = typer.Typer(help="Accelerator types, prices and zones.", no_args_is_help=True)

GenerationOpt = Annotated[
    str | None, typer.Option("--generation", "-g", help="Only this generation (v5e, v6e, v5p, ...).")
]


@app.command("types")
def types(ctx: typer.Context, generation: GenerationOpt = None, output: OutputOpt = None) -> None:
    """Every slice type: chips, hosts, topology, HBM, peak bf16 TFLOP/s and default runtime."""
    from tpuctl.catalog import Catalog
    from tpuctl.cli.render import human

    out = make_output(ctx, output)
    catalog = Catalog.load()
    accels = catalog.types(generation)
    out.rows(
        f"accelerator types (source: {catalog.source}, {catalog.date})",
        (
            "TYPE",
            "API NAME",
            "CHIPS",
            "HOSTS",
            "CHIPS/HOST",
            "TOPOLOGY",
            "HBM GiB",
            "PEAK TFLOP/s",
            "RUNTIME",
        ),
        (
            (
                a.friendly_name,
                a.api_name,
                a.chips,
                a.hosts,
                a.chips_per_host,
                a.topology,
                human(a.hbm_gib),
                human(a.peak_bf16_tflops),
                a.runtime_version,
            )
            for a in accels
        ),
        key="types",
        records=[a.to_dict() for a in accels],
        extra={"source": catalog.source, "date": catalog.date},
    )


@app.command("prices")
def prices(
    ctx: typer.Context,
    generation: GenerationOpt = None,
    refresh: Annotated[
        bool,
        typer.Option(
            "--refresh",
            help="Pull current TPU SKUs from the Cloud Billing Catalog API and cache them in the state dir "
            "(on the simulator: take the world file's prices).",
        ),
    ] = False,
    billing_url: Annotated[
        str | None,
        typer.Option(
            "--billing-url",
            help="Cloud Billing Catalog API base URL (default $TPUCTL_BILLING_URL, else Google's); "
            "an API key may come from $TPUCTL_BILLING_API_KEY.",
        ),
    ] = None,
    output: OutputOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """USD per chip-hour by generation and region, on-demand and spot/preemptible, from the refreshed
    cache when there is one (else the bundled catalog), with the source and date."""
    from tpuctl.cli.context import backend_for, build_settings, clock, is_dry_run
    from tpuctl.services.prices import load_catalog

    out = make_output(ctx, output)
    settings = build_settings(ctx)
    refreshed = None
    if refresh:
        refreshed = _refresh_prices(
            out,
            settings,
            billing_url,
            dry_run=is_dry_run(ctx, dry_run),
            chosen=backend_for(ctx, settings),
            now=clock(ctx)(),
        )
    server = server_of(settings)
    if server is not None:
        fix = "refresh the prices on the server's machine: tpuctl catalog prices --refresh"
        refuse_through_server(server if refresh else None, "catalog prices --refresh", fix=fix)
        catalog, source = _served_prices(out, server)
    else:
        catalog, source = load_catalog(settings.resolved_state_dir, settings.resolved_backend.value)
    for warning in source.warnings:
        out.warn(warning)
    if refreshed is not None and is_dry_run(ctx, dry_run):
        from tpuctl.catalog import PriceTable

        catalog = dataclasses.replace(
            catalog,
            prices=PriceTable(source=refreshed.source, date=refreshed.date, prices=refreshed.prices),
        )
    gens = [catalog.generation(generation)] if generation else list(catalog.generations.values())
    table = catalog.prices
    records = []
    for gen in gens:
        for region in table.regions(gen.name):
            pair = table.prices[gen.name][region]
            records.append(
                {
                    "generation": gen.name,
                    "region": region,
                    "on_demand_per_chip_hour": pair.get("on_demand"),
                    "spot_per_chip_hour": pair.get("spot"),
                }
            )
    extra: dict[str, Any] = {
        "source": table.source,
        "date": table.date,
        "unit": "USD per chip-hour",
        # A dry-run refresh shows what was fetched, which is not what the cache holds.
        "cached": source.cached and not (refreshed is not None and is_dry_run(ctx, dry_run)),
    }
    if refreshed is not None:
        extra["refresh"] = {**refreshed.to_dict(), "dry_run": is_dry_run(ctx, dry_run)}
    out.rows(
        f"prices, USD per chip-hour (source: {table.source}, {table.date})",
        ("GENERATION", "REGION", "ON-DEMAND USD/CHIP-H", "SPOT/PREEMPTIBLE USD/CHIP-H"),
        (
            (r["generation"], r["region"], r["on_demand_per_chip_hour"], r["spot_per_chip_hour"])
            for r in records
        ),
        key="prices",
        records=records,
        extra=extra,
    )


def _served_prices(out: Output, server: str) -> tuple[Catalog, PriceSource]:
    """The bundled catalog with the prices the server prices with (its refreshed cache, if any)."""
    from tpuctl.catalog import Catalog

    with remote.client(server) as api:
        answer = api.catalog_prices()
    out.note(f"prices of tpuctl server {server} ({answer.served_by.backend.name})")
    return dataclasses.replace(Catalog.load(), prices=answer.table), answer.source


def _refresh_prices(
    out: Output, settings: Settings, billing_url: str | None, *, dry_run: bool, chosen: Backend, now: float
) -> RefreshResult:
    """The refresh itself: Google's catalog, a given Billing-API endpoint, or on the
    simulator its world file. Then a price_change event for every live slice whose price moved."""
    import os

    from tpuctl.services.prices import (
        load_catalog,
        record_price_changes,
        refresh_from_billing,
        refresh_from_world,
    )
    from tpuctl.store.ledger import Ledger

    backend = settings.resolved_backend.value
    state_dir = settings.resolved_state_dir
    url = billing_url or os.environ.get("TPUCTL_BILLING_URL") or None
    project = settings.project or ""
    own = chosen.own_prices() if url is None else None
    if own is not None:
        project = own.project
        out.note(
            "simulator: the simulator serves no billing catalog; its prices come from its world file "
            f"{own.where} (the bundled catalog where the world sets none). Give --billing-url to pull from "
            "a Billing Catalog API endpoint instead."
        )
        result = refresh_from_world(
            own.overrides, own.where, backend=chosen.name, state_dir=state_dir, now=now, write=not dry_run
        )
    else:
        from tpuctl.cloud.billing import GOOGLE_BILLING_URL, CloudBillingCatalogClient

        key = os.environ.get("TPUCTL_BILLING_API_KEY") or None
        if url is None or url.rstrip("/") == GOOGLE_BILLING_URL:
            client = CloudBillingCatalogClient.for_google(api_key=key, quota_project=settings.quota_project)
        else:
            client = CloudBillingCatalogClient(base_url=url, api_key=key)
        with client, out.progress(f"reading TPU SKUs from {client.base_url}"):
            result = refresh_from_billing(
                client, state_dir=state_dir, backend=backend, now=now, write=not dry_run
            )
    out.note(
        f"{'dry run: would cache' if dry_run else 'cached'} {result.path} ({result.date}): "
        + (f"{result.matched} SKUs matched, {result.skipped} skipped" if result.matched else result.source)
        + (
            f"; from the bundled catalog: {', '.join(result.filled_from_bundled)}"
            if result.filled_from_bundled
            else ""
        )
    )
    for warning in result.warnings:
        out.warn(warning)
    if not dry_run:
        catalog, _ = load_catalog(state_dir, backend)
        with Ledger.open(settings.resolved_database) as ledger:
            changes = record_price_changes(ledger, catalog, backend=backend, project=project, now=now)
        result = dataclasses.replace(result, price_changes=tuple(changes))
        for change in changes:
            out.note(
                f"price change recorded for {change['pod']} ({change['zone']}): "
                f"{change['old']} -> {change['new']} USD per chip-hour"
            )
    return result


@app.command("zones")
def zones(ctx: typer.Context, generation: GenerationOpt = None, output: OutputOpt = None) -> None:
    """Zones and the generations each offers."""
    from tpuctl.catalog import Catalog, region_of_zone

    out = make_output(ctx, output)
    catalog = Catalog.load()
    gens = [catalog.generation(generation)] if generation else list(catalog.generations.values())
    by_zone: dict[str, list[str]] = {}
    for gen in gens:
        for zone in gen.zones:
            by_zone.setdefault(zone, []).append(gen.name)
    records = [{"zone": z, "region": region_of_zone(z), "generations": g} for z, g in sorted(by_zone.items())]
    out.rows(
        f"zones (source: {catalog.source}, {catalog.date})",
        ("ZONE", "REGION", "GENERATIONS"),
        ((r["zone"], r["region"], ", ".join(r["generations"])) for r in records),
        key="zones",
        records=records,
    )
