"""The provider boundary: one interface (``TpuCloud``) and the plain data that crosses it.

Everything above this layer (services, CLI) sees only these dataclasses and ``tpuctl.errors``; never a
proto, a google.api_core exception or an httpx response. There is ONE implementation of ``TpuCloud`` for
the TPU API (``tpuctl.cloud.tpu_api.TpuApiCloud``), used against Google and the simulator alike: only the
endpoint and the credentials differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from tpuctl.catalog import CapacityType, Surface

#: Label keys tpuctl puts on every slice it creates, to tie the slice to tpuctl and its owner.
LABEL_MANAGED_BY = "managed-by"
LABEL_MANAGED_BY_VALUE = "tpuctl"
LABEL_OWNER = "tpuctl-owner"
LABEL_LEDGER = "tpuctl-ledger"  # the identity of the ledger whose tpuctl created the slice
LABEL_REQUEST = "tpuctl-request"
LABEL_RUN = "tpuctl-run"

#: Node states of a dead slice: it will not run again, and it holds its quota until it is deleted. The one
#: definition of "dead" (``Node.is_dead``); the sets below add to it, never restate it.
DEAD_NODE_STATES = frozenset({"PREEMPTED", "TERMINATED"})
#: Node states from which a slice does not become READY by itself: dead, stopped, or going away.
NEVER_READY_NODE_STATES = DEAD_NODE_STATES | {"STOPPED", "STOPPING", "DELETING", "HIDDEN"}
#: Queued-resource states of a dead request: it places nothing, and holds quota until it is deleted.
DEAD_QUEUED_STATES = frozenset({"FAILED", "SUSPENDED"})

#: The network a slice's hosts join when none is named: the one Google creates in every new project
#: (an organization policy or its owner may have removed it: docs/google-facts.md#networks).
DEFAULT_NETWORK = "default"
#: The scope a host's service account is given: all of Google Cloud, narrowed by the account's IAM roles
#: alone (Google's recommendation; docs/google-facts.md#networks).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


@dataclass(frozen=True)
class VpcNetwork:
    """A VPC network: its name, and the project that holds it when that is not the slice's own (a Shared
    VPC's host project)."""

    name: str
    project: str | None = None

    def path(self, project: str) -> str:
        """``projects/P/global/networks/N``: P is the host project, else the slice's ``project``."""
        return f"projects/{self.project or project}/global/networks/{self.name}"

    @property
    def text(self) -> str:
        """As the user wrote it (the name, or the host-project path)."""
        return self.name if self.project is None else self.path(self.project)


@dataclass(frozen=True)
class VpcSubnetwork:
    """A subnetwork: its name, and where it is when the user said so (a host project, a region). A
    subnetwork is regional and belongs to its network's project."""

    name: str
    project: str | None = None
    region: str | None = None

    def path(self, project: str, region: str) -> str:
        """``projects/P/regions/R/subnetworks/S``: its own project and region where given."""
        return f"projects/{self.project or project}/regions/{self.region or region}/subnetworks/{self.name}"

    @property
    def text(self) -> str:
        if self.project is not None and self.region is not None:
            return self.path(self.project, self.region)
        return self.name if self.region is None else f"regions/{self.region}/subnetworks/{self.name}"


@dataclass(frozen=True)
class HostNetwork:
    """Where a slice's hosts sit on the network: the VPC network (None: the project's ``default``), its
    subnetwork (None: the network's own in the zone's region, which only an auto-mode network has), and
    the network tags firewall rules select them by."""

    network: VpcNetwork | None = None
    subnetwork: VpcSubnetwork | None = None
    tags: tuple[str, ...] = ()

    def network_path(self, project: str) -> str:
        """The network's full path; ``project`` is the slice's."""
        return (self.network or VpcNetwork(DEFAULT_NETWORK)).path(project)

    def subnetwork_path(self, project: str, region: str) -> str | None:
        """The subnetwork's full path, in ``region`` unless it names its own (None where none was named).
        A subnetwork belongs to its network's project: a Shared VPC host's, where the network names one."""
        if self.subnetwork is None:
            return None
        host = self.network.project if self.network is not None else None
        return self.subnetwork.path(host or project, region)

    def to_dict(self) -> dict[str, Any]:
        return {
            "network": None if self.network is None else self.network.text,
            "subnetwork": None if self.subnetwork is None else self.subnetwork.text,
            "tags": list(self.tags),
        }


@dataclass(frozen=True)
class NodeRequest:
    """What to create: one TPU VM slice (a Node)."""

    name: str
    zone: str
    accelerator_type: str  # the API's name, e.g. v5litepod-64
    runtime_version: str
    capacity: CapacityType = CapacityType.ON_DEMAND
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    description: str = ""
    # Reserved capacity: the reservation's name (projects/P/locations/Z/reservations/R or just R).
    reservation: str | None = None
    # External IPs on every host (networkConfig.enableExternalIps): the API's default is none, and a host
    # tpuctl reaches over SSH from outside the VPC needs one.
    external_ips: bool = False
    # Which Google API places it (TPU7x: Compute Engine only; v6e/v5p: either).
    surface: Surface = Surface.TPU_API
    # Compute Engine flex-start (tpuctl's `--queued` there): wait at most this long for capacity; None is
    # not flex-start. The TPU API queues through a QueuedResourceRequest instead.
    flex_valid_for_s: float | None = None
    # The hosts' network, subnetwork and network tags (default: the project's default network).
    network: HostNetwork = field(default_factory=HostNetwork)
    # The service account the hosts act as, with the cloud-platform scope (None: the API's default,
    # the project's Compute Engine default service account).
    service_account: str | None = None
    # Compute Engine: the cloud itself ends the slice at this moment (epoch seconds; a run's backstop
    # past its --max-hours). The TPU API has no such field: a deadman on the slice keeps it there.
    terminate_at: float | None = None


@dataclass(frozen=True)
class NetworkEndpoint:
    ip_address: str
    port: int
    external_ip: str | None = None


#: The guest attribute (its key; the namespace is not documented) in which a TPU API worker names its
#: Compute Engine instance, one per worker (docs/google-facts.md#iap-tcp-forwarding).
HOSTNAME_GUEST_ATTRIBUTE = "hostname"


@dataclass(frozen=True)
class HostIdentity:
    """What one worker's VM tells about itself: the OpenSSH public host keys its guest agent published
    (``"ssh-ed25519 AAAA..."``; empty: nothing published yet) and its Compute Engine instance name, which
    an IAP tunnel targets (docs/google-facts.md#iap-tcp-forwarding). None: not known (a TPU API worker
    whose ``hostname`` guest attribute is missing)."""

    host_keys: tuple[str, ...] = ()
    instance_name: str | None = None


@dataclass(frozen=True)
class Node:
    """A TPU slice as the API reports it."""

    name: str  # short id (the last path segment)
    zone: str
    accelerator_type: str
    state: str  # the API's enum name: CREATING, READY, PREEMPTED, ...
    capacity: CapacityType
    runtime_version: str = ""
    topology: str | None = None
    health: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    network_endpoints: tuple[NetworkEndpoint, ...] = ()
    create_time: datetime | None = None
    queued_resource: str | None = None  # full name of the queued resource that made it, if any
    multislice_node: bool = False
    description: str = ""
    id: str = ""
    # The Google API that holds it: its quota pools, billing and requests are that surface's.
    surface: Surface = Surface.TPU_API

    @property
    def is_tpuctl_managed(self) -> bool:
        return self.labels.get(LABEL_MANAGED_BY) == LABEL_MANAGED_BY_VALUE

    @property
    def is_dead(self) -> bool:
        """Preempted or terminated: nothing runs on it again; it holds quota until deleted."""
        return self.state in DEAD_NODE_STATES


@dataclass(frozen=True)
class QueuedResourceRequest:
    """A queued resource for one node (``node_count == 1``) or a multislice of ``node_count`` nodes."""

    id: str
    zone: str
    node: NodeRequest  # the node template; node.name is the node id when node_count == 1
    node_count: int = 1
    node_id_prefix: str | None = None  # multislice: nodes are <prefix>-0 .. <prefix>-(n-1)
    tier: str = "spot"  # "spot" | "guaranteed"
    valid_for_seconds: float | None = None  # queueingPolicy.validUntilDuration
    reservation: str | None = None


@dataclass(frozen=True)
class QueuedResource:
    id: str
    zone: str
    state: str  # WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE, FAILED, SUSPENDED, ...
    state_initiator: str | None = None
    tier: str | None = None
    node_ids: tuple[str, ...] = ()
    node_count: int = 1
    accelerator_type: str = ""
    error_message: str | None = None
    error_code: int | None = None
    create_time: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class QuotaLimit:
    """One limit from Cloud Quotas (quotaInfos): a quota id, where it applies (and for which TPU family),
    and the limit."""

    quota_id: str
    metric: str
    limit: int  # -1 means unlimited
    zone: str | None = None
    region: str | None = None
    # Compute Engine's per-family quota (TPUS-PER-TPU-FAMILY-per-project-region) has one limit per
    # ``tpu_family`` (CT6E, TPU7X, ...); None: every family without its own row, or no such dimension.
    tpu_family: str | None = None


@dataclass(frozen=True)
class PlannedRequest:
    """The exact HTTP request a mutation would send (for --dry-run): method, URL and JSON body."""

    method: str
    url: str
    body: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "url": self.url, "body": self.body}


class OperationProgress(Protocol):
    """Told about a long-running operation while it is waited on; the CLI renders it with rich."""

    def update(self, description: str, *, elapsed_s: float) -> None: ...


class TpuCloud(Protocol):
    """The TPU API as tpuctl uses it.

    Contract:
    - Methods raise only ``tpuctl.errors`` classes (CloudError and its subclasses).
    - Mutations that return an Operation wait for it when ``wait`` is true; a failed operation raises the
      translated error (a stockout raises ``StockoutError``).
    - Transient failures of idempotent calls (gets, lists) are retried inside, bounded and jittered;
      mutations are retried only where a request id makes them idempotent, and an ambiguous failure of a
      mutation raises ``AmbiguousError`` so the caller can look before it creates again.
    - ``zone=None`` in a list means every zone (the API's ``locations/-``).
    """

    @property
    def backend(self) -> str:
        """ "sim" or "gcp"."""
        ...

    @property
    def project(self) -> str: ...

    @property
    def endpoint(self) -> str:
        """The API base URL, e.g. https://tpu.googleapis.com or http://127.0.0.1:PORT."""
        ...

    def list_nodes(self, zone: str | None = None) -> list[Node]: ...

    def get_node(self, zone: str, name: str) -> Node: ...

    def host_identities(self, zone: str, name: str) -> list[HostIdentity]:
        """Each worker's SSH host keys and instance name, in worker order, from one guest-attributes read
        per worker (``getGuestAttributes``: the keys under ``hostkeys/``; a TPU API worker's instance name
        in its ``hostname`` item, a Compute Engine VM's is its own name)."""
        ...

    def create_node(
        self,
        request: NodeRequest,
        *,
        request_id: str | None = None,
        wait: bool = True,
        progress: OperationProgress | None = None,
    ) -> Node:
        """The v2 API has no requestId for node create; ``request_id`` (when given) becomes the node's
        ``tpuctl-request`` label, so a caller that lost the response can recognise the node as its own."""
        ...

    def delete_node(
        self, zone: str, name: str, *, wait: bool = True, progress: OperationProgress | None = None
    ) -> None: ...

    def stop_node(self, zone: str, name: str, *, wait: bool = True) -> Node: ...

    def start_node(self, zone: str, name: str, *, wait: bool = True) -> Node: ...

    def create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> QueuedResource:
        """``request_id`` is sent as the API's ``requestId`` (idempotent: retried even after an ambiguous
        failure) and also set as the ``tpuctl-request`` label of the node template; it must therefore be
        a valid label value (lowercase letters, digits, ``-``/``_``, at most 63), e.g. a UUID4."""
        ...

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResource: ...

    def list_queued_resources(self, zone: str | None = None) -> list[QueuedResource]: ...

    def delete_queued_resource(
        self,
        zone: str,
        qr_id: str,
        *,
        force: bool = False,
        wait: bool = True,
        request_id: str | None = None,
    ) -> None:
        """With ``request_id`` the delete is idempotent on the server, so it is retried even after an
        ambiguous failure."""
        ...

    def reset_queued_resource(self, zone: str, qr_id: str) -> QueuedResource: ...

    def list_accelerator_types(self, zone: str) -> list[str]: ...

    def list_runtime_versions(self, zone: str) -> list[str]: ...

    def list_zones(self) -> list[str]: ...

    def quota_limits(self) -> list[QuotaLimit]: ...

    def plan_create_node(
        self, request: NodeRequest, *, request_id: str | None = None
    ) -> list[PlannedRequest]:
        """Every request ``create_node`` would send, in order (a Compute Engine MIG slice needs three)."""
        ...

    def plan_create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> PlannedRequest: ...

    def plan_delete_node(self, zone: str, name: str) -> list[PlannedRequest]: ...

    def plan_delete_queued_resource(
        self, zone: str, qr_id: str, *, force: bool = False, request_id: str | None = None
    ) -> PlannedRequest: ...

    def close(self) -> None: ...
