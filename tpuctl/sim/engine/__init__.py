"""The simulated TPU cloud's behaviour: nodes, queued resources, operations, quota, capacity and
preemption, over the SQLite state in ``tpuctl.sim.state``.

``SimEngine`` is a facade over one module per resource, all sharing one ``Context`` (database, clock,
catalog, world in force):

- ``nodes``, ``queued``, ``operations``, ``listings``: the TPU API's resources;
- ``capacity``: quota, pools, reservations and placement (and the Cloud Quotas view);
- ``timeline``: the transitions applied by time (``advance``), which every request runs first;
- ``hosts``: the VMs' signals (preemption, stop, delete), endpoints, metadata, login and host keys;
- ``oslogin``: OS Login's users and their imported keys;
- ``control``: the admin API's status, reset, preempt, stockouts and faults;
- ``plans``, ``records``: request parsing and the rows with their JSON, shared by the others.

Each method that changes anything runs in one ``BEGIN IMMEDIATE`` transaction: checks (quota,
capacity, name clashes) and the write they guard are atomic even across processes. Signals to the VMs'
processes are sent after the transaction commits.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from tpuctl.catalog import Catalog
from tpuctl.sim.engine.capacity import Capacity
from tpuctl.sim.engine.context import Clock, Context
from tpuctl.sim.engine.control import Control
from tpuctl.sim.engine.hosts import Hosts
from tpuctl.sim.engine.listings import Listings
from tpuctl.sim.engine.nodes import Nodes
from tpuctl.sim.engine.operations import Operations
from tpuctl.sim.engine.oslogin import OsLogin
from tpuctl.sim.engine.queued import QueuedResources
from tpuctl.sim.engine.timeline import Timeline
from tpuctl.sim.shapes import node_uid
from tpuctl.sim.state import SimDatabase
from tpuctl.sim.world import Faults, World

__all__ = ["Clock", "SimEngine"]

# Old private name, still probed by a workaround in tests/cloud/test_cloud_tpu_api_sim.py for the int64
# overflow fixed in shapes.node_uid; remove once that workaround is gone.
_node_uid = node_uid


class SimEngine:
    """Everything the simulated cloud does. Thread-safe; several engines may share one database file."""

    def __init__(self, db: SimDatabase, *, clock: Clock = time.time, catalog: Catalog | None = None) -> None:
        self.ctx = Context(db, clock=clock, catalog=catalog)
        #: Every mutating API request this engine was sent (wall time, method, path), for tests that
        #: check who acted on the cloud and when; in memory, this process's requests only.
        self.mutations: list[dict[str, Any]] = []
        self.db = db
        self.clock = clock
        self.catalog = self.ctx.catalog
        self.capacity = Capacity(self.ctx)
        self.timeline = Timeline(self.ctx, self.capacity)
        self.operations = Operations(self.ctx, self.timeline)
        self.nodes = Nodes(self.ctx, self.timeline, self.capacity)
        self.queued = QueuedResources(self.ctx, self.timeline, self.operations)
        self.oslogin = OsLogin(self.ctx)
        self.hosts = Hosts(self.ctx, self.timeline, self.oslogin)
        self.listings = Listings(self.ctx)
        self.control = Control(self.ctx, self.timeline, self.nodes)
        from tpuctl.sim.compute.service import ComputeService  # the compute package imports the engine's

        #: Compute Engine's surface over the same node rows (``tpuctl.sim.compute``).
        self.compute = ComputeService(self.ctx, self.timeline, self.capacity)

    # --- world, faults and time ------------------------------------------------------------------

    def install_world(self, world: World | None) -> World:
        """Make ``world`` the one in force (persisted in the state), or with None keep the persisted one
        (the default world on first start). A different world replaces the old one; state is kept."""
        return self.ctx.install_world(world)

    @property
    def world(self) -> World:
        """The world in force; re-read when another process replaced it (sim reset with a new world)."""
        return self.ctx.world

    def faults(self) -> Faults:
        """The fault rates in force: the world's, unless changed at runtime (admin API)."""
        return self.control.faults()

    def set_faults(
        self, *, transient_error_rate: float | None = None, ambiguous_error_rate: float | None = None
    ) -> Faults:
        return self.control.set_faults(
            transient_error_rate=transient_error_rate, ambiguous_error_rate=ambiguous_error_rate
        )

    def advance(self, now: float | None = None) -> None:
        """Apply every transition due by ``now`` (default: the clock). Cheap when nothing is due."""
        self.timeline.advance(now)

    # --- nodes -----------------------------------------------------------------------------------

    def create_node(self, project: str, zone: str, node_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.nodes.create(project, zone, node_id, body)

    def get_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        return self.nodes.get(project, zone, node_id)

    def list_nodes(self, project: str, zone: str, page_size: int = 0, page_token: str = "") -> dict[str, Any]:
        return self.nodes.list(project, zone, page_size, page_token)

    def delete_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        return self.nodes.delete(project, zone, node_id)

    def stop_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        return self.nodes.stop_or_start(project, zone, node_id, stop=True)

    def start_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        return self.nodes.stop_or_start(project, zone, node_id, stop=False)

    def update_node(
        self, project: str, zone: str, node_id: str, body: dict[str, Any], update_mask: str
    ) -> dict[str, Any]:
        """PATCH: only description, labels, metadata and tags here (GCP also allows network fields)."""
        return self.nodes.update(project, zone, node_id, body, update_mask)

    def simulate_maintenance(
        self, project: str, zone: str, node_id: str, workers: list[str]
    ) -> dict[str, Any]:
        return self.nodes.simulate_maintenance(project, zone, node_id, workers)

    # --- queued resources ------------------------------------------------------------------------

    def create_queued_resource(
        self, project: str, zone: str, qr_id: str, body: dict[str, Any], request_id: str = ""
    ) -> dict[str, Any]:
        return self.queued.create(project, zone, qr_id, body, request_id)

    def get_queued_resource(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        return self.queued.get(project, zone, qr_id)

    def list_queued_resources(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        return self.queued.list(project, zone, page_size, page_token)

    def delete_queued_resource(
        self, project: str, zone: str, qr_id: str, *, force: bool = False, request_id: str = ""
    ) -> dict[str, Any]:
        return self.queued.delete(project, zone, qr_id, force=force, request_id=request_id)

    def reset_queued_resource(self, project: str, zone: str, qr_id: str) -> dict[str, Any]:
        """Put a SUSPENDED or FAILED queued resource back in the queue (its leftover nodes go away)."""
        return self.queued.reset(project, zone, qr_id)

    # --- operations ------------------------------------------------------------------------------

    def get_operation(self, project: str, zone: str, op_id: str) -> dict[str, Any]:
        return self.operations.get(project, zone, op_id)

    def list_operations(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        return self.operations.list(project, zone, page_size, page_token)

    def delete_operation(self, project: str, zone: str, op_id: str) -> dict[str, Any]:
        return self.operations.delete(project, zone, op_id)

    # --- locations, accelerator types, runtime versions, quotas ----------------------------------

    def list_accelerator_types(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        return self.listings.list_accelerator_types(project, zone, page_size, page_token)

    def get_accelerator_type(self, project: str, zone: str, type_name: str) -> dict[str, Any]:
        return self.listings.get_accelerator_type(project, zone, type_name)

    def list_runtime_versions(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        return self.listings.list_runtime_versions(project, zone, page_size, page_token)

    def get_runtime_version(self, project: str, zone: str, version: str) -> dict[str, Any]:
        return self.listings.get_runtime_version(project, zone, version)

    def list_locations(self, project: str, page_size: int = 0, page_token: str = "") -> dict[str, Any]:
        return self.listings.list_locations(project, page_size, page_token)

    def get_location(self, project: str, zone: str) -> dict[str, Any]:
        return self.listings.get_location(project, zone)

    def list_reservations(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> dict[str, Any]:
        return self.listings.list_reservations(project, zone, page_size, page_token)

    def quota_infos(self, project: str) -> list[dict[str, Any]]:
        """Every TPU API quota of the generations this world offers, as Cloud Quotas' QuotaInfo."""
        return self.capacity.quota_infos(project)

    # --- hosts -----------------------------------------------------------------------------------

    def metadata_value(
        self, zone: str, node_id: str, worker: int, path: str, *, project: str | None = None
    ) -> str | None:
        """The text the metadata server answers for ``path`` (after /computeMetadata/v1/) on one host of
        a node, or None when there is no such key. Raises 404 for an unknown node or worker."""
        return self.hosts.metadata_value(zone, node_id, worker, path, project=project)

    def metadata_tree(
        self, zone: str, node_id: str, worker: int, *, project: str | None = None
    ) -> dict[str, str]:
        """Every key the host's metadata server answers, with its text."""
        return self.hosts.metadata_tree(zone, node_id, worker, project=project)

    def resolve_instance(self, project: str, zone: str, name: str) -> str | None:
        """The internal DNS answer for Compute Engine instance ``name`` (``tpuctl.sim.vpc_dns``)."""
        return self.hosts.resolve_instance(project, zone, name)

    def login_keys(self, project: str, zone: str, node_id: str, username: str) -> list[str]:
        """The public keys a host of the node accepts for ``username`` now (ssh-keys or OS Login)."""
        return self.hosts.login_keys(project, zone, node_id, username)

    def host_keys(self, project: str, zone: str, node_id: str) -> list[str | None]:
        """Each worker's SSH host public key, None where the VM has no disk (yet)."""
        return self.hosts.host_keys(project, zone, node_id)

    def instance_names(self, project: str, zone: str, node_id: str) -> list[str]:
        """Each worker's instance name, as its metadata server and its guest attributes give it."""
        return self.hosts.instance_names(project, zone, node_id)

    def import_ssh_public_key(
        self, email: str, body: Mapping[str, Any], project: str | None = None, caller: str | None = None
    ) -> dict[str, Any]:
        """OS Login users.importSshPublicKey (``body``: an SshPublicKey) by ``caller`` (None: the
        world's principal)."""
        return self.oslogin.import_key(email, body, project, caller)

    def update_ssh_public_key(
        self,
        email: str,
        fingerprint: str,
        body: Mapping[str, Any],
        update_mask: str = "",
        caller: str | None = None,
    ) -> dict[str, Any]:
        """OS Login users.sshPublicKeys.patch."""
        return self.oslogin.update_key(email, fingerprint, body, update_mask, caller)

    def login_profile(
        self, email: str, project: str | None = None, caller: str | None = None
    ) -> dict[str, Any]:
        """OS Login users.getLoginProfile."""
        return self.oslogin.login_profile(email, project, caller)

    def tokeninfo(self, email: str) -> dict[str, Any]:
        """OAuth's tokeninfo for a token of ``email``."""
        return self.oslogin.tokeninfo(email)

    def set_endpoints(
        self, zone: str, node_id: str, endpoints: list[dict[str, Any]] | None, *, project: str | None = None
    ) -> dict[str, Any]:
        """Override a node's networkEndpoints (e.g. the ssh endpoints of its simulated hosts); None
        restores the default (each host's own address, port 8470)."""
        return self.hosts.set_endpoints(zone, node_id, endpoints, project=project)

    # --- admin -----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.control.status()

    def note_mutation(self, method: str, path: str, caller: str | None) -> None:
        """A mutating API request as it arrived, with the account that sent it (None: none the
        simulator knows)."""
        self.mutations.append({"at": time.time(), "method": method, "path": path, "caller": caller})

    def reset(self, world: World | None = None) -> World:
        """Forget every node, queued resource, operation, imported OS Login key and stockout; with
        ``world``, put that world in force too. The VMs of forgotten nodes go at the fleet's next sweep."""
        return self.control.reset(world)

    def preempt(
        self, zone: str, node_id: str, *, notice: bool = True, project: str | None = None
    ) -> dict[str, Any]:
        """Preempt a READY node now (any capacity class: this is the operator's hand, not the model)."""
        return self.control.preempt(zone, node_id, notice=notice, project=project)

    def maintain(self, zone: str, node_id: str, *, project: str | None = None) -> dict[str, Any]:
        """Start a host maintenance of a READY node now (``tpuctl.sim.engine.maintenance``)."""
        return self.control.maintain(zone, node_id, project=project)

    def set_stockout(self, zone: str, *, clear: bool = False) -> bool:
        return self.control.set_stockout(zone, clear=clear)
