"""An instance's network interfaces, checked against the project's networks as Compute Engine checks them
at insert (``tpuctl.sim.vpc``), with Google's words: ``Invalid value for field
'resource.networkInterfaces[0].network': '...'. The referenced network resource cannot be found.``"""

from __future__ import annotations

from typing import Any

from tpuctl.sim import vpc
from tpuctl.sim.compute.errors import invalid_field
from tpuctl.sim.world import World


def checked_interfaces(
    world: World, project: str, region: str | None, props: dict[str, Any], field: str
) -> list[dict[str, Any]]:
    """The interfaces of ``props`` (an instance, or a template's properties where ``region`` is None),
    each checked, with the network and subnetwork as full paths where the region is known (the network a
    subnetwork implies, where only the subnetwork was named)."""
    out: list[dict[str, Any]] = []
    for index, nic in enumerate(props.get("networkInterfaces") or []):
        where = f"{field}.networkInterfaces[{index}]"
        if not isinstance(nic, dict):
            raise invalid_field(where, nic, "Must be an object.")
        try:
            found = vpc.attach(
                world,
                project,
                region,
                nic.get("network"),
                nic.get("subnetwork"),
                network_from_subnetwork=True,
                template=region is None,
            )
        except vpc.VpcRefusal as refusal:
            raise invalid_field(
                f"{where}.{refusal.part}" if refusal.part else where, refusal.value, refusal.why
            ) from None
        out.append(
            nic if found is None else {**nic, "network": found.network, "subnetwork": found.subnetwork}
        )
    return out
