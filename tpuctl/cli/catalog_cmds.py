"""`tpuctl catalog ...`: accelerator types, prices and zones, from the bundled catalog (no cloud needed)."""

from __future__ import annotations

from typing import Annotated

import typer

from tpuctl.cli.context import make_output
from tpuctl.cli.options import OutputOpt

app = typer.Typer(help="Accelerator types, prices and zones.", no_args_is_help=True)

GenerationOpt = Annotated[
    str | None, typer.Option("--generation", "-g", help="Only this generation (v5e, v6e, v5p, ...).")
]


@app.command("types")
def types(ctx: typer.Context, generation: GenerationOpt = None, output: OutputOpt = None) -> None:
    """Every slice type: chips, hosts, topology, HBM, peak bf16 TFLOP/s and default runtime."""
    from tpuctl.catalog import Catalog

    out = make_output(ctx, output)
    catalog = Catalog.load()
    accels = catalog.types(generation)
    out.rows(
        f"accelerator types (source: {catalog.source}, {catalog.date})",
        ("TYPE", "API NAME", "CHIPS", "HOSTS", "CHIPS/HOST", "TOPOLOGY", "HBM GiB", "PEAK TFLOP/s", "RUNTIME"),
        (
            (
                a.friendly_name,
                a.api_name,
                a.chips,
                a.hosts,
                a.chips_per_host,
                a.topology,
                f"{a.hbm_gib:g}",
                f"{a.peak_bf16_tflops:g}",
                a.runtime_version,
            )
            for a in accels
        ),
        key="types",
        records=[a.to_dict() for a in accels],
        extra={"source": catalog.source, "date": catalog.date},
    )


@app.command("prices")
def prices(ctx: typer.Context, generation: GenerationOpt = None, output: OutputOpt = None) -> None:
    """USD per chip-hour by generation and region, on-demand and spot/preemptible."""
    from tpuctl.catalog import Catalog

    out = make_output(ctx, output)
    catalog = Catalog.load()
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
    out.rows(
        f"prices, USD per chip-hour (source: {table.source}, {table.date})",
        ("GENERATION", "REGION", "ON-DEMAND", "SPOT/PREEMPTIBLE"),
        (
            (r["generation"], r["region"], r["on_demand_per_chip_hour"], r["spot_per_chip_hour"])
            for r in records
        ),
        key="prices",
        records=records,
        extra={"source": table.source, "date": table.date, "unit": "USD per chip-hour"},
    )


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
    records = [
        {"zone": z, "region": region_of_zone(z), "generations": g} for z, g in sorted(by_zone.items())
    ]
    out.rows(
        f"zones (source: {catalog.source}, {catalog.date})",
        ("ZONE", "REGION", "GENERATIONS"),
        ((r["zone"], r["region"], ", ".join(r["generations"])) for r in records),
        key="zones",
        records=records,
    )
