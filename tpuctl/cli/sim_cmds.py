"""`tpuctl sim ...`: run and steer the built-in simulated TPU cloud."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from tpuctl.cli.context import ONE_OBJECT, build_settings, make_output
from tpuctl.cli.options import OutputOpt, ZoneOpt

if TYPE_CHECKING:
    from tpuctl.sim import SimAdminClient
    from tpuctl.sim.admin import PoolStatus

app = typer.Typer(help="Run and steer the built-in simulated TPU cloud.", no_args_is_help=True)


@contextmanager
def _admin(ctx: typer.Context) -> Iterator[SimAdminClient]:
    """An admin client for the simulator: the running one (sim_url) or one started for this command."""
    from tpuctl.sim import SimAdminClient, SimServer, load_world
    from tpuctl.store.paths import ensure_private_dir

    settings = build_settings(ctx, backend="sim")
    if settings.sim_url:
        client = SimAdminClient(settings.sim_url)
        try:
            yield client
        finally:
            client.close()
        return
    world = load_world(settings.sim_world) if settings.sim_world else None
    server = SimServer(ensure_private_dir(settings.resolved_state_dir), world, vms="hypervisor")
    url = server.start()
    client = SimAdminClient(url)
    try:
        yield client
    finally:
        client.close()
        server.stop()


@app.command("serve")
def serve(
    ctx: typer.Context,
    port_flag: Annotated[
        str, typer.Option("--port", metavar="PORT", help="Port on 127.0.0.1 (0: any free port).")
    ] = "8470",
) -> None:
    """Run the simulator in the foreground on 127.0.0.1 until Ctrl-C.

    Point other commands at it with TPUCTL_SIM_URL=http://127.0.0.1:PORT.
    """
    import time

    from tpuctl import params
    from tpuctl.sim import SimServer, load_world
    from tpuctl.store.paths import ensure_private_dir

    port = params.whole(port_flag, "port", minimum=0, maximum=65535)
    out = make_output(ctx, None)
    settings = build_settings(ctx, backend="sim")
    world = load_world(settings.sim_world) if settings.sim_world else None
    server = SimServer(ensure_private_dir(settings.resolved_state_dir), world, port=port, vms="hypervisor")
    url = server.start()
    out.err.print(f"[black on yellow] sim [/] simulated TPU cloud serving on {url} (Ctrl-C to stop)")
    out.err.print(f"use it from other shells with: export TPUCTL_SIM_URL={url}")
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


@app.command("status")
def status(ctx: typer.Context, output: OutputOpt = None) -> None:
    """Zones, capacity in use and free, stockouts, nodes and the simulated clock."""
    out = make_output(ctx, output, ONE_OBJECT)
    with _admin(ctx) as admin:
        data = admin.status()
    if out.machine:
        out.document({"backend": "sim", **data})
        return
    from tpuctl.backends.sim import SIM_LABEL

    out.backend_banner(SIM_LABEL, data["project"])
    out.note(f"simulated clock: {data['sim_time_s']:.0f} s at speed {data['speed']:g}")
    zones = data["zones"]
    out.rows(
        "zones (free/total chips per generation and pool)",
        ("ZONE", "STOCKOUT", "FREE CHIPS"),
        ((z["zone"], "yes" if z["stockout"] else "", _pools(z["pools"])) for z in zones),
        key="zones",
        records=[dict(z) for z in zones],
    )
    nodes = data["nodes"]
    out.rows(
        "nodes",
        ("NAME", "ZONE", "TYPE", "STATE", "POOL"),
        ((n["name"], n["zone"], n["accelerator_type"], n["state"], n["capacity_class"]) for n in nodes),
        key="nodes",
        records=[dict(n) for n in nodes],
    )


def _pools(pools: list[PoolStatus]) -> str:
    return ", ".join(
        f"{p['generation']} {p['capacity_class']} {p['free_chips']}/{p['capacity_chips']}" for p in pools
    )


@app.command("reset")
def reset(
    ctx: typer.Context,
    yes: Annotated[bool, typer.Option("-y", "--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Forget every simulated node, queued resource and operation (the ledger is kept)."""
    from tpuctl.cli.context import confirm

    out = make_output(ctx, None)
    confirm(ctx, yes, "reset the simulator, deleting every simulated slice?", out)
    with _admin(ctx) as admin:
        admin.reset()
    out.note("simulator reset")


@app.command("preempt")
def preempt(
    ctx: typer.Context,
    pod: Annotated[str, typer.Argument(help="The slice to preempt.")],
    zone: ZoneOpt = None,
    notice: Annotated[
        bool,
        typer.Option(
            "--notice/--no-notice",
            help="Give notice first: SIGTERM to the VMs' processes and the metadata flag, then SIGKILL "
            "and wiped disks after the world's durations.preemption_grace_s (real seconds whatever the "
            "world's speed; 30 s by default, as on GCP).",
        ),
    ] = True,
) -> None:
    """Preempt a simulated slice now, as GCP would."""
    out = make_output(ctx, None)
    with _admin(ctx) as admin:
        chosen_zone = zone or _zone_of(admin, pod)
        admin.preempt(chosen_zone, pod, notice=notice)
    out.note(f"preempted {pod} in {chosen_zone}" + (" with notice" if notice else " without notice"))


@app.command("maintenance")
def maintenance(
    ctx: typer.Context,
    pod: Annotated[str, typer.Argument(help="The slice whose hosts are maintained.")],
    zone: ZoneOpt = None,
) -> None:
    """Start a host maintenance of a simulated slice now, as Google plays one for TPU VMs: its hosts'
    metadata maintenance-event says TERMINATE_ON_HOST_MAINTENANCE for the world's
    durations.maintenance_notice_s (real seconds; 60 by default), then its VMs stop. An on-demand or
    reserved TPU API slice is REPAIRING for durations.maintenance_s and READY again with its disks; a spot
    one, or a Compute Engine one, is TERMINATED."""
    out = make_output(ctx, None)
    with _admin(ctx) as admin:
        chosen_zone = zone or _zone_of(admin, pod)
        admin.maintenance(chosen_zone, pod)
    out.note(f"host maintenance of {pod} in {chosen_zone} noticed")


def _zone_of(admin: SimAdminClient, pod: str) -> str:
    from tpuctl.errors import NotFoundError, UsageError

    # A Compute Engine slice's row is named after its instance or MIG (``instances/NAME``).
    zones = sorted(
        {
            str(n.get("zone"))
            for n in admin.status().get("nodes", [])
            if n.get("name") == pod or str(n.get("name")).endswith(f"/{pod}")
        }
    )
    if not zones:
        raise NotFoundError(f"no simulated slice named {pod!r}", fix="`tpuctl pod list` shows the slices")
    if len(zones) > 1:
        raise UsageError(
            f"{pod!r} exists in several zones ({', '.join(zones)})", field="zone", fix="pass --zone"
        )
    return zones[0]


@app.command("stockout")
def stockout(
    ctx: typer.Context,
    zone: Annotated[str, typer.Argument(help="Zone to stock out, e.g. us-central1-a.")],
    clear: Annotated[bool, typer.Option("--clear", help="End the stockout.")] = False,
) -> None:
    """Make a simulated zone have no capacity (or restore it with --clear)."""
    from tpuctl import params
    from tpuctl.catalog import Catalog

    out = make_output(ctx, None)
    params.zone(zone, "ZONE")
    with _admin(ctx) as admin:
        # The catalog's zones and the world's: a typo must not "succeed" on a zone nothing offers.
        params.zone(zone, "ZONE", known={*Catalog.load().zones(), *admin.world().get("zones", {})})
        admin.stockout(zone, clear=clear)
    out.note(f"{zone}: " + ("stockout cleared" if clear else "stocked out"))


@app.command("credentials")
def credentials(
    ctx: typer.Context,
    email: Annotated[str, typer.Argument(metavar="EMAIL", help="The simulated user or service account.")],
    out_path: Annotated[str, typer.Option("--out", metavar="FILE", help="Write the credentials file here.")],
) -> None:
    """A credentials file for a simulated principal (a service account key for *.gserviceaccount.com,
    else gcloud-style user credentials), for GOOGLE_APPLICATION_CREDENTIALS: `tpuctl --server URL ...`
    then acts as that principal. Needs a served simulator (`tpuctl sim serve`): the file names its URL."""
    import json
    import os
    from pathlib import Path

    from tpuctl.errors import UsageError

    out = make_output(ctx, None)
    if not build_settings(ctx, backend="sim").sim_url:
        raise UsageError(
            "a credentials file names the simulator's token endpoint: it needs a served simulator",
            field="TPUCTL_SIM_URL",
            fix="start one with `tpuctl sim serve` and point at it with TPUCTL_SIM_URL",
        )
    with _admin(ctx) as admin:
        document = admin.credentials(email)
    path = Path(out_path)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)  # a private key: the owner's only
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=2)
    out.note(f"wrote {document['type']} credentials for {email} to {path}")
