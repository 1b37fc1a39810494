"""What a Compute Engine TPU VM's metadata server answers (docs/google-facts.md#metadata-server): the
instance's own name, id and zone, and the TPU attributes Compute Engine publishes: ``accelerator-type``
(tpu7x-8), ``tpu-env`` (``KEY: 'value'`` lines), ``worker-network-endpoints`` as comma-separated INSTANCE
NAMES (not the TPU API's ``name:id:ip`` triples). ``agent-worker-number`` only when the world says Compute
Engine publishes it (``compute_agent_worker_number``; unc., docs/google-facts.md#worker-identity): by default
it is not, the stricter reading, under which JAX's ``GceTpuCluster`` does not detect the slice and programs
find their peers through the ``TPU_WORKER_*`` variables tpuctl's launcher derives (tpuctl/hosts/follow.py)."""

from __future__ import annotations

import json
import sqlite3

from tpuctl.sim.engine.records import host_addresses


def compute_metadata_values(
    row: sqlite3.Row, worker: int, base: dict[str, str], *, agent_worker_number: bool
) -> dict[str, str]:
    """``base`` (the keys every simulated VM answers) made a Compute Engine instance's;
    ``agent_worker_number``: whether to publish that attribute (see the module docstring)."""
    spec = json.loads(row["spec"])
    compute = spec["compute"]
    names: list[str] = compute["names"]
    name = names[worker]
    project, zone = row["project"], row["zone"]
    values = {k: v for k, v in base.items() if not k.startswith("instance/attributes/")}
    values.update(
        {
            "instance/name": name,
            "instance/hostname": f"{name}.{zone}.c.{project}.internal",
            "instance/id": compute["ids"][worker],
            "instance/machine-type": f"projects/{project}/machineTypes/{compute['machine_type']}",
            "instance/scheduling/preemptible": "TRUE"
            if compute["provisioning_model"] in ("SPOT", "FLEX_START")
            else "FALSE",
            "instance/scheduling/provisioning-model": compute["provisioning_model"],
            "instance/network-interfaces/0/ip": host_addresses(row)[worker],
        }
    )
    attributes = {
        **{str(k): str(v) for k, v in (spec.get("metadata") or {}).items()},
        "accelerator-type": row["accelerator_type"],
        "worker-network-endpoints": ",".join(names),
        "tpu-env": _tpu_env(row, worker, compute["machine_type"]),
    }
    if agent_worker_number:
        attributes["agent-worker-number"] = str(worker)
    for key, value in attributes.items():
        values[f"instance/attributes/{key}"] = value
    return values


def _bounds(topology: str) -> list[int]:
    dims = [int(d) for d in topology.split("x")]
    return [*dims, 1, 1, 1][:3]


def _chips_per_host_bounds(chips: int) -> list[int]:
    # 1 chip: 1,1,1; 4 chips: 2,2,1 (observed: docs/google-facts.md#metadata-server); 8 chips
    # (ct6e-standard-8t): 2,4,1.
    return {1: [1, 1, 1], 2: [1, 2, 1], 4: [2, 2, 1], 8: [2, 4, 1]}.get(chips, [chips, 1, 1])


def _tpu_env(row: sqlite3.Row, worker: int, machine_type: str) -> str:
    """``tpu-env`` with the keys observed on Compute Engine slices (docs/google-facts.md#metadata-server):
    HOST_BOUNDS is the topology divided by each host's chip bounds (v6e 2x4 of two 4-chip VMs: 1,2,1)."""
    chips_per_host = int(row["chips"]) // int(row["hosts"])
    per_host = _chips_per_host_bounds(chips_per_host)
    hosts = [max(1, t // c) for t, c in zip(_bounds(row["topology"]), per_host, strict=True)]
    fields = {
        "TPU_ACCELERATOR_TYPE": row["accelerator_type"],
        "TOPOLOGY": row["topology"],
        "TPU_WORKER_ID": str(worker),
        "HOST_BOUNDS": ",".join(map(str, hosts)),
        "CHIPS_PER_HOST_BOUNDS": ",".join(map(str, per_host)),
    }
    return "".join(f"{key}: '{value}'\n" for key, value in fields.items())
