"""Zones and the TPU machine types each offers through Compute Engine, as the world has them.

TPU machine-type names appear in no discovery document: they are data ``machineTypes.list`` serves, so
the host facts are hard-coded here (docs/google-facts.md#machine-types). v5e's ``ct5lp-hightpu-*`` are
listed where the world offers v5e but refused at insert (docs/google-facts.md#two-surfaces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuctl.catalog import AcceleratorType, Catalog, Generation, Surface
from tpuctl.sim.compute import links
from tpuctl.sim.compute.errors import invalid, invalid_field, not_found
from tpuctl.sim.world import World, region_of

#: (vCPUs, memory GiB) per machine type, docs/google-facts.md#machine-types where it says; others follow the
#: family's per-chip ratio (unc., nothing reads them but a person).
_HOST_FACTS = {
    "tpu7x-standard-4t": (224, 960),
    "ct6e-standard-1t": (44, 176),
    "ct6e-standard-4t": (180, 720),
    "ct6e-standard-8t": (360, 1440),
    "ct5p-hightpu-4t": (208, 448),
    "ct5lp-hightpu-1t": (24, 48),
    "ct5lp-hightpu-4t": (112, 192),
    "ct5lp-hightpu-8t": (224, 384),
}
#: v5e on Compute Engine: listed, never creatable ("This user agent is not allowed to use the machine
#: type", docs/google-facts.md#two-surfaces).
_LISTED_ONLY = {"v5e": ((1, "ct5lp-hightpu-1t"), (4, "ct5lp-hightpu-4t"), (8, "ct5lp-hightpu-8t"))}


@dataclass(frozen=True)
class Machine:
    """One TPU machine type: its generation, chips per VM and whether Compute Engine creates it."""

    name: str
    generation: Generation
    chips: int
    creatable: bool = True

    @property
    def guest_accelerator(self) -> str:
        return self.name.split("-", 1)[0]  # ct6e, ct5p, tpu7x, as machineTypes.list shows

    def single_host_type(self) -> AcceleratorType | None:
        """The slice one VM of this type is on its own (tpu7x-standard-4t alone: tpu7x-8, 2x2x1)."""
        for size, _ in self.generation.sizes:
            accel = AcceleratorType(generation=self.generation, size=size)
            if accel.chips == self.chips:
                return accel
        return None

    def slice_type(self, topology: str) -> AcceleratorType | None:
        """The slice of ``topology`` made of VMs of this type, or None where they cannot make it: the
        generation's multi-host VM size builds any of its topologies; a smaller or larger VM only the
        one-VM topology of its own size (the stricter reading; docs/google-facts.md#machine-types)."""
        for size, shape in self.generation.sizes:
            if shape != topology:
                continue
            accel = AcceleratorType(generation=self.generation, size=size)
            if accel.chips == self.chips or (
                self.chips == self.generation.chips_per_host and accel.chips % self.chips == 0
            ):
                return accel
        return None


def all_machines(catalog: Catalog) -> dict[str, Machine]:
    """Every TPU machine type Compute Engine knows, offered or not."""
    out: dict[str, Machine] = {}
    for gen in catalog.generations.values():
        if gen.compute is not None and Surface.COMPUTE in gen.surfaces:
            for chips, name in gen.compute.machine_types:
                out[name] = Machine(name, gen, chips)
        for chips, name in _LISTED_ONLY.get(gen.name, ()):
            out[name] = Machine(name, gen, chips, creatable=False)
    return out


def zone_machines(catalog: Catalog, world: World, zone: str) -> list[Machine]:
    """The TPU machine types a zone lists: those of the generations the world offers there."""
    offered = world.zones.get(zone, {})
    return sorted(
        (m for m in all_machines(catalog).values() if m.generation.name in offered), key=lambda m: m.name
    )


def check_zone(world: World, zone: str) -> None:
    if zone not in world.zones:
        raise invalid_field("zone", zone, "Unknown zone.")


def check_region(world: World, region: str) -> None:
    if region not in world.regions():
        raise invalid_field("region", region, "Unknown region.")


def machine_in_zone(catalog: Catalog, world: World, zone: str, given: Any, field: str) -> Machine:
    """The machine type an instance asks for (``zones/Z/machineTypes/T``, partial or full URL): one the
    zone lists, and one Compute Engine creates."""
    text = str(given or "")
    if not text:
        raise invalid_field(field, text, "Machine type must be specified.")
    if "/machineTypes/" not in text:
        raise invalid_field(field, text, "The URL is malformed.")
    name = links.short_name(text)
    found = {m.name: m for m in zone_machines(catalog, world, zone)}.get(name)
    url_zone = text.split("/machineTypes/")[0].rsplit("/", 1)[-1]
    if found is None or url_zone != zone:
        raise invalid_field(field, text, f"Machine type with name '{name}' does not exist in zone '{zone}'.")
    if not found.creatable:
        raise invalid(f"This user agent is not allowed to use the machine type [{name}].")
    return found


def machine_by_name(catalog: Catalog, name: Any, field: str) -> Machine:
    """A template's machine type (a bare name): template creation only checks that it exists, so a
    ct5lp template is accepted (docs/google-facts.md#instance-templates). Non-TPU types are unknown here (the
    simulator has no others; stricter than Google, which would take an n2 template)."""
    found = all_machines(catalog).get(str(name or ""))
    if found is None:
        raise invalid_field(field, name, f"Machine type with name '{name}' does not exist.")
    return found


def zone_json(project: str, zone: str) -> dict[str, Any]:
    return {
        "kind": "compute#zone",
        "id": links.resource_id("zone", zone),
        "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
        "name": zone,
        "description": zone,
        "status": "UP",
        "region": links.region_link(project, region_of(zone)),
        "selfLink": links.zone_link(project, zone),
        "availableCpuPlatforms": ["AMD Genoa", "Intel Emerald Rapids"],
        "supportsPzs": False,
    }


def machine_type_json(project: str, zone: str, machine: Machine) -> dict[str, Any]:
    cpus, memory_gib = _HOST_FACTS.get(machine.name, (machine.chips * 45, machine.chips * 180))
    return {
        "kind": "compute#machineType",
        "id": links.resource_id("machineType", machine.name),
        "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
        "name": machine.name,
        "description": f"{cpus} vCPUs, {memory_gib} GB RAM, {machine.chips} TPU chips",
        "guestCpus": cpus,
        "memoryMb": memory_gib * 1024,
        "maximumPersistentDisks": 128,
        "maximumPersistentDisksSizeGb": "263168",
        "zone": zone,
        "selfLink": links.link(project, "zones", zone, "machineTypes", machine.name),
        "isSharedCpu": False,
        "accelerators": [
            {"guestAcceleratorType": machine.guest_accelerator, "guestAcceleratorCount": machine.chips}
        ],
        "architecture": "X86_64",
    }


def machine_not_found(project: str, zone: str, name: str) -> Exception:
    return not_found(links.path(project, "zones", zone, "machineTypes", name))
