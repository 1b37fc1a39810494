"""The slices one attempt of a run is on: one node, or the N nodes of a multislice (``--slices N``).

A multislice is what one queued resource with ``multisliceParams`` makes: N nodes of the same type in
one zone, named ``<prefix>-0 .. <prefix>-(N-1)``, joined over the data-center network into one job.
Google provisions them together, and restarts every slice when one is lost (docs/multislice-facts.md,
section 3); so a run treats the set as one thing: started together, lost together, re-placed together.

The run path speaks of a ``SliceSet`` as it spoke of one node: ``name`` (the node's own, or the
multislice's node prefix, which is the request's name), ``zone``, ``capacity`` and ``surface`` (shared by
every slice of one request). What differs per slice is asked of ``nodes``, in slice order: slice ``i``'s
hosts are workers ``i * hosts_per_slice ..`` of the job, as JAX numbers processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpuctl.catalog import CapacityType, Surface
from tpuctl.cloud.base import Node


@dataclass(frozen=True)
class SliceSet:
    """One node, or the nodes of one multislice in slice order (see the module docstring)."""

    name: str
    nodes: tuple[Node, ...]

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError(f"slice set {self.name!r} has no nodes")
        zones = {n.zone for n in self.nodes}
        if len(zones) > 1:
            raise ValueError(f"slice set {self.name!r} spans zones {sorted(zones)}; a multislice is zonal")

    @classmethod
    def single(cls, node: Node) -> SliceSet:
        return cls(node.name, (node,))

    @classmethod
    def multislice(cls, name: str, nodes: Sequence[Node]) -> SliceSet:
        """The nodes of the multislice ``name`` (its node prefix), ordered by their slice index."""
        return cls(name, tuple(sorted(nodes, key=lambda n: _slice_index(n.name))))

    @property
    def count(self) -> int:
        return len(self.nodes)

    @property
    def is_multislice(self) -> bool:
        return len(self.nodes) > 1

    @property
    def zone(self) -> str:
        return self.nodes[0].zone

    @property
    def capacity(self) -> CapacityType:
        return self.nodes[0].capacity

    @property
    def surface(self) -> Surface:
        return self.nodes[0].surface

    @property
    def accelerator_type(self) -> str:
        return self.nodes[0].accelerator_type

    @property
    def state(self) -> str:
        """READY when every slice is; else the first other state (the set runs only whole)."""
        return next((n.state for n in self.nodes if n.state != "READY"), "READY")

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def slice_of(self, worker: int, hosts_per_slice: int) -> str | None:
        """The name of the slice job-wide worker ``worker`` is on (None: no such worker)."""
        index = worker // hosts_per_slice
        return self.nodes[index].name if 0 <= index < len(self.nodes) else None

    def describe(self) -> str:
        """``my-run`` or ``my-run (2 slices: my-run-0, my-run-1)``, for messages."""
        if not self.is_multislice:
            return self.name
        return f"{self.name} ({self.count} slices: {', '.join(self.names)})"


def multislice_prefix(node_name: str) -> str | None:
    """The prefix of a node named as a multislice's nodes are (``<prefix>-<i>``, the API's naming), else
    None."""
    prefix, _, index = node_name.rpartition("-")
    return prefix if prefix and index.isdigit() else None


def _slice_index(node_name: str) -> int:
    if multislice_prefix(node_name) is None:
        raise ValueError(f"node {node_name!r} is not named as a multislice node (<prefix>-<index>)")
    return int(node_name.rpartition("-")[2])
