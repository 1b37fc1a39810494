"""What a simulated host's metadata server answers: every key (the path after ``/computeMetadata/v1/``)
and its text, for one host of a node row.

Shapes are GCE's (https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys) and a TPU VM's
attributes (agent-worker-number, accelerator-type, worker-network-endpoints ``unknown:unknown:IP,...``,
tpu-env: the keys JAX's GCE TPU cluster detection reads, jax/_src/clusters/cloud_tpu_cluster.py).

A host of a node made by a multislice queued resource (``multisliceParams``) also publishes in ``tpu-env`` the
Megascale keys Google's queued resources set up for multislice (docs/multislice-facts.md; JAX's
``BaseTpuCluster`` reads them, env first, then tpu-env): ``MEGASCALE_COORDINATOR_ADDRESS`` (worker 0 of slice
0, the host JAX makes process 0), ``MEGASCALE_NUM_SLICES``, ``MEGASCALE_SLICE_ID`` (the node's place among the
queued resource's slices) and ``MEGASCALE_PORT``. A single-slice node publishes none of them.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from tpuctl.catalog import Catalog
from tpuctl.sim.engine.plans import accelerator_by_api_name
from tpuctl.sim.engine.records import LEGACY_ENDPOINT_IP, endpoints, host_addresses, qr_row
from tpuctl.sim.iam import access_token, default_service_account
from tpuctl.sim.vms.layout import host_address

SCOPES = "https://www.googleapis.com/auth/cloud-platform\n"
#: The Megascale port a multislice host publishes. Unconfirmed: no public document shows the tpu-env of a
#: queued-resource multislice VM; launchers that set the variable themselves use ports of their own
#: (8081 has been seen). JAX does not read it (libtpu does), so nothing here depends on its value.
MEGASCALE_PORT = "8080"


@dataclass(frozen=True)
class Megascale:
    """Where a multislice node sits among its queued resource's slices: what its hosts' tpu-env says."""

    coordinator: str  # the address of worker 0 of slice 0
    num_slices: int
    slice_id: int


def megascale_of(conn: sqlite3.Connection, catalog: Catalog, row: sqlite3.Row) -> Megascale | None:
    """The Megascale keys of the node in ``row``, None unless a multislice queued resource made it.

    The slice id is the node's place among the multislice nodes of its queued resource's plan (the order
    the request named them, ``<prefix>-0 .. <prefix>-(N-1)``), not parsed from its name. The coordinator
    is derived from this node's own row, so every read answers the same, also after slice 0's node is
    gone: the queued resource's nodes are inserted in plan order in one transaction, each taking the next
    consecutive host numbers (Timeline._try_provision, records.insert_node), so slice 0's worker 0 is this
    node's first host number less the hosts of the plan entries between them."""
    if not row["multislice"] or not row["queued_resource"]:
        return None
    qr = qr_row(conn, row["project"], row["zone"], row["queued_resource"])
    if qr is None:  # a queued resource is deleted only after its nodes are
        return None
    plan: list[dict[str, object]] = json.loads(qr["plan"])
    names = [str(p["node_id"]) for p in plan]
    slices = [i for i, p in enumerate(plan) if p.get("multislice")]
    if row["node_id"] not in names or names.index(row["node_id"]) not in slices:
        return None
    own = names.index(row["node_id"])
    between = 0
    for entry in plan[slices[0] : own]:
        accel = accelerator_by_api_name(catalog, str(entry["accelerator_type"]))
        assert accel is not None, entry  # the plan was validated when the queued resource was created
        between += accel.hosts
    base = row["host_base"]
    coordinator = LEGACY_ENDPOINT_IP if base is None else host_address(int(base) - between)
    return Megascale(coordinator=coordinator, num_slices=len(slices), slice_id=slices.index(own))


def tpu_vm_instance_name(uid: str, worker: int) -> str:
    """A TPU API worker's Compute Engine instance name (its metadata ``instance/name``, its ``hostname``
    guest attribute), in the form Google's TPU VMs have: ``t1v-n-<8 hex>-w-<worker>``."""
    return f"t1v-n-{int(uid) % 16**8:08x}-w-{worker}"


def metadata_values(
    row: sqlite3.Row,
    worker: int,
    metadata_port: int,
    *,
    compute_agent_worker_number: bool = False,
    megascale: Megascale | None = None,
) -> dict[str, str]:
    """Every key the metadata server answers on host ``worker`` of the node in ``row``;
    ``compute_agent_worker_number``: the world's switch of that name (a Compute Engine VM's attribute);
    ``megascale``: the node's place in a multislice queued resource (:func:`megascale_of`), if any."""
    spec = json.loads(row["spec"])
    scheduling = spec.get("schedulingConfig") or {}
    hostname = tpu_vm_instance_name(row["uid"], worker)
    address = host_addresses(row)[worker]
    email = host_service_account(row["project"], spec)
    values: dict[str, str] = {
        "instance/preempted": "TRUE" if row["preempted_flag"] else "FALSE",
        "instance/maintenance-event": row["maintenance_event"] or "NONE",
        "instance/name": hostname,
        "instance/hostname": f"{hostname}.{row['zone']}.c.{row['project']}.internal",
        "instance/id": row["uid"],
        "instance/zone": f"projects/{row['project']}/zones/{row['zone']}",
        "instance/scheduling/preemptible": "TRUE"
        if scheduling.get("preemptible") or scheduling.get("spot")
        else "FALSE",
        "instance/network-interfaces/0/ip": address,
        "instance/network-interfaces/0/network": f"projects/{row['project']}/networks/default",
        **_service_account(email),
        "project/project-id": row["project"],
        "project/numeric-project-id": str(int(row["uid"]) % 10**12),
    }
    if row["surface"] == "vm":  # a general-purpose VM: no TPU attribute
        from tpuctl.sim.compute.general import metadata_values as general_metadata_values

        return general_metadata_values(row, values)
    for key, value in _attributes(row, spec, worker, megascale).items():
        values[f"instance/attributes/{key}"] = value
    if row["surface"] == "compute":
        from tpuctl.sim.compute.metadata import compute_metadata_values

        return compute_metadata_values(row, worker, values, agent_worker_number=compute_agent_worker_number)
    return values


def host_service_account(project: str, spec: dict[str, object]) -> str:
    """The account a node's hosts run as: its ``serviceAccount.email``, else the project's default."""
    account = spec.get("serviceAccount")
    email = account.get("email") if isinstance(account, dict) else None
    return str(email) if email and email != "default" else default_service_account(project)


def _service_account(email: str) -> dict[str, str]:
    """The VM's service account, under ``default/`` and under its email, as GCE lists it: clients that
    asked ``default/?recursive=true`` for the email ask for the token by email (tensorstore does). The
    token is the account's own (``tpuctl.sim.iam``): the simulator's APIs and bucket take it as that
    account's."""
    token = {"access_token": access_token(email), "expires_in": 3599, "token_type": "Bearer"}
    keys = {"email": email, "scopes": SCOPES, "aliases": "default\n", "token": json.dumps(token)}
    return {
        f"instance/service-accounts/{who}/{key}": value
        for who in ("default", email)
        for key, value in keys.items()
    }


def _attributes(
    row: sqlite3.Row, spec: dict[str, object], worker: int, megascale: Megascale | None
) -> dict[str, str]:
    user_metadata = spec.get("metadata") or {}
    assert isinstance(user_metadata, dict)
    hosts = endpoints(row)
    topology = str(row["topology"])
    return {
        **{str(k): str(v) for k, v in user_metadata.items()},
        "agent-worker-number": str(worker),
        "accelerator-type": row["accelerator_type"],
        "worker-network-endpoints": ",".join(f"unknown:unknown:{e.get('ipAddress', '')}" for e in hosts),
        "tpu-env": _tpu_env(row, worker, topology, megascale),
    }


def _tpu_env(row: sqlite3.Row, worker: int, topology: str, megascale: Megascale | None) -> str:
    """The ``tpu-env`` attribute: ``KEY: 'value'`` lines, as a TPU VM's (JAX reads the MEGASCALE_* keys
    from it in cloud_tpu_cluster.py), with the Megascale keys on a multislice node's hosts."""
    fields = {
        "ACCELERATOR_TYPE": row["accelerator_type"],
        "NODE_ID": row["node_id"],
        "TOPOLOGY": topology,
        "WORKER_ID": str(worker),
        "ZONE": row["zone"],
        "NUM_WORKERS": str(row["hosts"]),
    }
    if megascale is not None:
        fields.update(
            {
                "MEGASCALE_COORDINATOR_ADDRESS": megascale.coordinator,
                "MEGASCALE_NUM_SLICES": str(megascale.num_slices),
                "MEGASCALE_SLICE_ID": str(megascale.slice_id),
                "MEGASCALE_PORT": MEGASCALE_PORT,
            }
        )
    return "".join(f"{key}: '{value}'\n" for key, value in fields.items())
