"""What a simulated host's metadata server answers: every key (the path after ``/computeMetadata/v1/``)
and its text, for one host of a node row.

Shapes are GCE's (https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys) and a TPU VM's
attributes (agent-worker-number, accelerator-type, worker-network-endpoints ``unknown:unknown:IP,...``,
tpu-env: the keys JAX's GCE TPU cluster detection reads, jax/_src/clusters/cloud_tpu_cluster.py).
"""

from __future__ import annotations

import json
import sqlite3

from tpuctl.sim.engine.records import endpoints, host_addresses

#: A fake token: never a credential anywhere (the simulator's APIs take anonymous requests).
FAKE_TOKEN = "sim-fake-access-token"
SCOPES = "https://www.googleapis.com/auth/cloud-platform\n"


def metadata_values(
    row: sqlite3.Row, worker: int, metadata_port: int, *, compute_agent_worker_number: bool = False
) -> dict[str, str]:
    """Every key the metadata server answers on host ``worker`` of the node in ``row``;
    ``compute_agent_worker_number``: the world's switch of that name (a Compute Engine VM's attribute)."""
    spec = json.loads(row["spec"])
    attributes = _attributes(row, spec, worker)
    scheduling = spec.get("schedulingConfig") or {}
    hostname = f"t1v-n-{int(row['uid']) % 16**8:08x}-w-{worker}"
    address = host_addresses(row)[worker]
    email = f"{row['project']}-compute@developer.gserviceaccount.com"
    values: dict[str, str] = {
        "instance/preempted": "TRUE" if row["preempted_flag"] else "FALSE",
        "instance/maintenance-event": "NONE",
        "instance/name": hostname,
        "instance/hostname": f"{hostname}.{row['zone']}.c.{row['project']}.internal",
        "instance/id": row["uid"],
        "instance/zone": f"projects/{row['project']}/zones/{row['zone']}",
        "instance/scheduling/preemptible": "TRUE"
        if scheduling.get("preemptible") or scheduling.get("spot")
        else "FALSE",
        "instance/network-interfaces/0/ip": address,
        "instance/network-interfaces/0/network": f"projects/{row['project']}/networks/default",
        "instance/service-accounts/default/email": email,
        "instance/service-accounts/default/scopes": SCOPES,
        "instance/service-accounts/default/aliases": "default\n",
        "instance/service-accounts/default/token": json.dumps(
            {"access_token": FAKE_TOKEN, "expires_in": 3599, "token_type": "Bearer"}
        ),
        "project/project-id": row["project"],
        "project/numeric-project-id": str(int(row["uid"]) % 10**12),
    }
    for key, value in attributes.items():
        values[f"instance/attributes/{key}"] = value
    if row["surface"] == "compute":
        from tpuctl.sim.compute.metadata import compute_metadata_values

        return compute_metadata_values(row, worker, values, agent_worker_number=compute_agent_worker_number)
    return values


def _attributes(row: sqlite3.Row, spec: dict[str, object], worker: int) -> dict[str, str]:
    user_metadata = spec.get("metadata") or {}
    assert isinstance(user_metadata, dict)
    hosts = endpoints(row)
    topology = str(row["topology"])
    return {
        **{str(k): str(v) for k, v in user_metadata.items()},
        "agent-worker-number": str(worker),
        "accelerator-type": row["accelerator_type"],
        "worker-network-endpoints": ",".join(f"unknown:unknown:{e.get('ipAddress', '')}" for e in hosts),
        "tpu-env": _tpu_env(row, worker, topology),
    }


def _tpu_env(row: sqlite3.Row, worker: int, topology: str) -> str:
    """The ``tpu-env`` attribute: ``KEY: 'value'`` lines, as a TPU VM's (JAX reads WORKER_ID and
    ACCELERATOR_TYPE from it in cloud_tpu_cluster.py)."""
    fields = {
        "ACCELERATOR_TYPE": row["accelerator_type"],
        "NODE_ID": row["node_id"],
        "TOPOLOGY": topology,
        "WORKER_ID": str(worker),
        "ZONE": row["zone"],
        "NUM_WORKERS": str(row["hosts"]),
    }
    return "".join(f"{key}: '{value}'\n" for key, value in fields.items())
