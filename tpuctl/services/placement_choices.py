"""What a user chose about where a new slice goes and how it is got: the placement flags of every command
that creates a slice (`pod create`, `run`), parsed once at the edge, in one value.

A run keeps its choices in its saved request (``to_dict``/``from_dict``), so that a recovery, `runs
resume` and a background supervisor place its slices as the command that started it did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl import params
from tpuctl.catalog import CapacityType, Catalog, Surface
from tpuctl.cloud.base import HostNetwork
from tpuctl.services.placement import PlacementRequest, Strategy, TypePreference

if TYPE_CHECKING:
    from tpuctl.settings import Settings


@dataclass(frozen=True)
class PlacementChoices:
    """The placement flags' values; None or empty where not given (the settings decide then)."""

    zones: tuple[str, ...] = ()
    region: str | None = None
    #: The allowed capacity types in the order given (``--capacity-type`` plus ``--spot``/``--preemptible``).
    capacity_types: tuple[CapacityType, ...] = ()
    #: A reservation to draw on (``--reserved NAME``: reserved capacity is then allowed too).
    reserved: str | None = None
    max_price: float | None = None  # USD per hour for the whole request
    queued: bool = False  # ``--queued`` or ``--capacity-type queued``
    valid_for_s: float | None = None
    strategy: Strategy = Strategy.CHEAPEST
    race_k: int | None = None
    surface: Surface | None = None  # ``--api``
    #: The hosts' network and service account; None: the settings' (flag, environment or profile).
    network: HostNetwork | None = None
    service_account: str | None = None
    #: The TPU software version of a new slice (a job file's ``accelerator_args.runtime_version``);
    #: None: the type's default.
    runtime_version: str | None = None
    #: The workspace a slice made outside any run goes into (``pod create --workspace``); None: the
    #: actor's only one. A run's slices are its run's, whatever this says.
    workspace: str | None = None

    def request(
        self,
        catalog: Catalog,
        settings: Settings,
        type_name: str,
        *,
        name: str | None = None,
        slices: int = 1,
        runtime_version: str | None = None,
        labels: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        wait: bool = True,
        other_types: Sequence[str] = (),
        type_preference: TypePreference = TypePreference.ORDERED,
    ) -> PlacementRequest:
        """The placement request of a slice of ``type_name`` (or, with ``other_types``, of any of those
        types, ranked by ``type_preference``) placed as chosen (checked: a bad combination is a usage
        error naming the flag)."""
        from tpuctl.services.allocator import build_request

        request = build_request(
            catalog,
            settings,
            type_name,
            name=name,
            zones=self.zones,
            region=self.region,
            capacity_types=self.capacity_types,
            reserved=self.reserved,
            max_price=self.max_price,
            queued=self.queued,
            valid_for_s=self.valid_for_s,
            strategy=self.strategy,
            race_k=self.race_k,
            slices=slices,
            runtime_version=runtime_version or self.runtime_version,
            labels=labels,
            metadata=metadata,
            wait=wait,
            surface=self.surface,
            network=self.network,
            service_account=self.service_account,
            other_types=other_types,
            type_preference=type_preference,
        )
        return request if self.workspace is None else dataclasses.replace(request, workspace=self.workspace)

    # --- the saved form (a run's request) ----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        network = self.network
        # Only when given: a run's saved request (its slices are the run's) stays as it was.
        workspace = {} if self.workspace is None else {"workspace": self.workspace}
        return {
            **workspace,
            "zones": list(self.zones),
            "region": self.region,
            "capacity_types": [c.value for c in self.capacity_types],
            "reserved": self.reserved,
            "max_price": self.max_price,
            "queued": self.queued,
            "valid_for_s": self.valid_for_s,
            "strategy": self.strategy.value,
            "race_k": self.race_k,
            "api": None if self.surface is None else self.surface.value,
            "network": None if network is None else network.to_dict(),
            "service_account": self.service_account,
            "runtime_version": self.runtime_version,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlacementChoices:
        """The choices saved by ``to_dict`` (values written by tpuctl itself, parsed again as flags are)."""
        network = data.get("network")
        return cls(
            zones=tuple(str(z) for z in data.get("zones") or ()),
            region=data.get("region"),
            capacity_types=tuple(CapacityType(c) for c in data.get("capacity_types") or ()),
            reserved=data.get("reserved"),
            max_price=data.get("max_price"),
            queued=bool(data.get("queued")),
            valid_for_s=data.get("valid_for_s"),
            strategy=Strategy(data.get("strategy") or Strategy.CHEAPEST.value),
            race_k=data.get("race_k"),
            surface=None if data.get("api") is None else Surface(data["api"]),
            network=None if network is None else _host_network(network),
            service_account=data.get("service_account"),
            runtime_version=data.get("runtime_version"),
            workspace=data.get("workspace"),
        )


def _host_network(data: Mapping[str, Any]) -> HostNetwork:
    return params.host_network(
        None if data.get("network") is None else params.network(str(data["network"])),
        None if data.get("subnetwork") is None else params.subnetwork(str(data["subnetwork"])),
        params.network_tags(data.get("tags") or ()),
    )
