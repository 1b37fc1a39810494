"""The placement flags: one definition, one meaning and one parse for every command that creates a slice
(`pod create`, `run`).

Each flag is an ``Annotated`` option type here, and a command takes it by declaring a parameter of that
type under the name in ``PLACEMENT_PARAMS``; ``placement_choices`` turns the given values into
``PlacementChoices`` once, before anything is contacted (a bad value is exit 2 naming the flag). The
hosts' network flags go into the settings instead (``network_settings``), where the environment and the
profile can give them too. A test compares the commands' option sets, so they cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from tpuctl.services.placement_choices import PlacementChoices

CAPACITY_TYPE_HELP = (
    "Allowed capacity type (repeatable): on-demand, spot, preemptible, reserved; queued: through a queued "
    "resource (= --queued). --spot and --preemptible add to the same set (both: whichever is cheaper). "
    "Default: the profile's capacity_types, else on-demand."
)
API_HELP = (
    "The Google API that places the slice: tpu (the Cloud TPU API; the default for v6e, v5p and older) "
    "or compute (Compute Engine: TPU7x's only path, and a choice for v6e and v5p). Default: the profile's "
    "api where the generation offers it."
)

ZonesOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--zone",
        help="A zone to consider (repeatable; default: every zone that offers the type). For `run --pod`: "
        "the zone of that slice.",
    ),
]
RegionOpt = Annotated[str | None, typer.Option("--region", help="Consider the zones of this region only.")]
CapacityTypeOpt = Annotated[list[str] | None, typer.Option("--capacity-type", help=CAPACITY_TYPE_HELP)]
SpotOpt = Annotated[
    bool,
    typer.Option("--spot", help="Allow spot capacity (= --capacity-type spot; adds to the allowed set)."),
]
PreemptibleOpt = Annotated[
    bool,
    typer.Option(
        "--preemptible",
        help="Allow preemptible capacity (= --capacity-type preemptible; adds to the allowed set).",
    ),
]
ReservedOpt = Annotated[
    str | None,
    typer.Option("--reserved", help="Allow reserved capacity from this reservation (implies reserved)."),
]
MaxPriceOpt = Annotated[
    str | None,
    typer.Option(
        "--max-price", metavar="USD", help="Price cap in USD per hour for the whole request (all slices)."
    ),
]
QueuedOpt = Annotated[
    bool,
    typer.Option(
        "--queued",
        help="Wait for capacity: through a queued resource until it is ACTIVE (TPU API), or as a "
        "flex-start VM or MIG (Compute Engine).",
    ),
]
ValidForOpt = Annotated[
    str | None,
    typer.Option(
        "--valid-for",
        metavar="DURATION",
        help="With --queued: give up after this long, e.g. 2h, 30m, 1h30m (flex-start: at most 2h, the "
        "default).",
    ),
]
StrategyOpt = Annotated[
    str | None,
    typer.Option(
        "--strategy",
        help="cheapest (default: one zone at a time, cheapest first, failing over) or race (queue in the "
        "top --race-k zones at once, keep the first ACTIVE).",
    ),
]
RaceKOpt = Annotated[
    str | None,
    typer.Option("--race-k", metavar="K", help="How many zones --strategy race queues in (default 3)."),
]
ApiOpt = Annotated[str | None, typer.Option("--api", metavar="tpu|compute", help=API_HELP)]
NetworkOpt = Annotated[
    str | None,
    typer.Option(
        "--network",
        metavar="NETWORK",
        help="The hosts' VPC network: NAME, or a Shared VPC's projects/HOST_PROJECT/global/networks/NAME "
        "(default: the profile's network, else the project's default network).",
    ),
]
SubnetworkOpt = Annotated[
    str | None,
    typer.Option(
        "--subnetwork",
        metavar="SUBNETWORK",
        help="The hosts' subnetwork: NAME (in the slice's region), or "
        "projects/HOST_PROJECT/regions/REGION/subnetworks/NAME, which also keeps placement in REGION.",
    ),
]
TagsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--tags", metavar="TAG,...", help="Network tags on every host, for firewall rules (repeatable)."
    ),
]
ServiceAccountOpt = Annotated[
    str | None,
    typer.Option(
        "--service-account",
        metavar="EMAIL",
        help="The service account the hosts act as, with the cloud-platform scope (default: the profile's, "
        "else the project's Compute Engine default service account).",
    ),
]

#: The parameter each placement flag is declared under, on every command that creates a slice.
PLACEMENT_PARAMS = (
    "zone",
    "region",
    "capacity_type",
    "spot",
    "preemptible",
    "reserved",
    "max_price",
    "queued",
    "valid_for",
    "strategy",
    "race_k",
    "api",
    "network",
    "subnetwork",
    "tags",
    "service_account",
)


def placement_choices(
    *,
    zone: list[str] | None,
    region: str | None,
    capacity_type: list[str] | None,
    spot: bool,
    preemptible: bool,
    reserved: str | None,
    max_price: str | None,
    queued: bool,
    valid_for: str | None,
    strategy: str | None,
    race_k: str | None,
    api: str | None,
) -> PlacementChoices:
    """The placement flags' values, each parsed once (``tpuctl.params``); the network flags go to the
    settings (``network_settings``)."""
    from tpuctl import params
    from tpuctl.services.placement import Strategy
    from tpuctl.services.placement_choices import PlacementChoices

    types, queued_type = params.capacity_types(capacity_type or [], spot=spot, preemptible=preemptible)
    return PlacementChoices(
        zones=tuple(params.zone(z, "zones") for z in zone or ()),
        region=None if region is None else params.region(region),
        capacity_types=tuple(types),
        reserved=reserved,
        max_price=None if max_price is None else params.usd(max_price, "max_price", per_hour=True),
        queued=queued or queued_type,
        valid_for_s=None if valid_for is None else params.duration(valid_for, "valid_for"),
        strategy=Strategy.CHEAPEST if strategy is None else params.strategy(strategy),
        race_k=None if race_k is None else params.whole(race_k, "race_k"),
        surface=None if api is None else params.api(api),
    )


def network_settings(
    *, network: str | None, subnetwork: str | None, tags: list[str] | None, service_account: str | None
) -> dict[str, Any]:
    """The network flags as settings (``build_settings``): a flag wins over the environment and the
    profile, and each is parsed by the settings, as the environment's and the profile's are."""
    return {"network": network, "subnetwork": subnetwork, "tags": tags, "service_account": service_account}


def host_network_words(placement: dict[str, Any]) -> str | None:
    """The plan's line for the hosts' network and service account (a placement request's ``to_dict``);
    None when every one is the default."""
    parts = [
        f"{label} {placement[key] if not isinstance(placement[key], list) else ','.join(placement[key])}"
        for key, label in (
            ("network", "network"),
            ("subnetwork", "subnetwork"),
            ("tags", "tags"),
            ("service_account", "service account"),
        )
        if placement.get(key)
    ]
    return "hosts: " + ", ".join(parts) if parts else None
