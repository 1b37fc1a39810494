"""What the team server's VM costs at catalog prices (``data/server_vm_prices.yaml``): its machine type
by the hour, its boot disk by the GB-month, its external address by the hour."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from tpuctl.errors import ConfigError

#: Hours in a month as Google's pricing pages count them.
HOURS_PER_MONTH: Final = 730.0


@dataclass(frozen=True)
class ServerVmCost:
    """USD per month of one always-on server VM, by part; None where the catalog has no price."""

    machine_type: str
    region: str
    disk_gb: int
    machine_usd: float | None
    disk_usd: float | None
    address_usd: float

    @property
    def total_usd(self) -> float | None:
        if self.machine_usd is None or self.disk_usd is None:
            return None
        return round(self.machine_usd + self.disk_usd + self.address_usd, 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine_type": self.machine_type,
            "region": self.region,
            "disk_gb": self.disk_gb,
            "machine_usd_per_month": self.machine_usd,
            "disk_usd_per_month": self.disk_usd,
            "external_ip_usd_per_month": self.address_usd,
            "total_usd_per_month": self.total_usd,
        }


def general_machine_types() -> dict[str, dict[str, Any]]:
    """The general-purpose machine types the catalog knows, by name."""
    return dict(_load()["machine_types"])


def server_vm_cost(machine_type: str, region: str, disk_gb: int) -> ServerVmCost:
    """The monthly cost of an always-on VM of ``machine_type`` in ``region`` with a ``disk_gb`` balanced
    boot disk and an external IPv4 address."""
    data = _load()
    hourly = (data["machine_types"].get(machine_type) or {}).get("usd_per_hour", {}).get(region)
    per_gb = data["balanced_disk_usd_per_gb_month"].get(region)
    return ServerVmCost(
        machine_type=machine_type,
        region=region,
        disk_gb=disk_gb,
        machine_usd=None if hourly is None else round(float(hourly) * HOURS_PER_MONTH, 2),
        disk_usd=None if per_gb is None else round(float(per_gb) * disk_gb, 2),
        address_usd=round(float(data["external_ipv4_usd_per_hour"]) * HOURS_PER_MONTH, 2),
    )


def _load() -> dict[str, Any]:
    from tpuctl.catalog.catalog import _load_yaml

    data = _load_yaml("server_vm_prices.yaml")
    for key in ("machine_types", "balanced_disk_usd_per_gb_month", "external_ipv4_usd_per_hour"):
        if key not in data:
            raise ConfigError(
                f"catalog file server_vm_prices.yaml has no {key}", path="server_vm_prices.yaml"
            )
    return data
