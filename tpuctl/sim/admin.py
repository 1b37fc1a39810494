"""``SimAdminClient``: the simulator's admin API over HTTP (``/sim/v1/...``), for `tpuctl sim ...` and
tests.

Errors come back as ``SimAdminError`` (a ``tpuctl.errors.CloudError``) carrying the HTTP status and the
google.rpc status name of the simulator's JSON error.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, TypedDict, cast

import httpx

from tpuctl.errors import CloudError, NotFoundError, UnreachableError


class SimAdminError(CloudError):
    """The admin API refused a request (bad input, unknown node, node not READY, ...)."""

    kind = "sim_admin"

    def __init__(self, message: str, *, http_status: int, status: str) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.status = status


class PoolStatus(TypedDict):
    generation: str
    capacity_class: str  # on_demand | preemptible
    capacity_chips: int  # 0 while the zone is stocked out
    in_use_chips: int
    free_chips: int


class ZoneStatus(TypedDict):
    zone: str
    region: str
    stockout: bool
    pools: list[PoolStatus]


class ReservationStatus(TypedDict):
    name: str
    zone: str
    generation: str
    chips: int
    in_use_chips: int
    free_chips: int


class NodeStatus(TypedDict):
    project: str
    zone: str
    name: str
    accelerator_type: str
    chips: int
    hosts: int
    state: str
    capacity_class: str  # on_demand | preemptible | reserved
    reservation: str | None
    queued_resource: str | None
    preempted: bool  # the metadata flag instance/preempted
    preempt_at: str | None  # RFC 3339, when a scheduled/random preemption will start
    host_addresses: list[str]  # each host's own loopback address, in worker order


class QueuedResourceStatus(TypedDict):
    project: str
    zone: str
    name: str
    state: str
    node_count: int
    capacity_class: str


class FaultRates(TypedDict):
    transient_error_rate: float
    ambiguous_error_rate: float


class SimStatus(TypedDict):
    backend: str  # "sim"
    project: str
    now: str  # RFC 3339 real time
    speed: float
    sim_time_s: float  # simulated seconds since the state was created (or reset)
    zones: list[ZoneStatus]
    reservations: list[ReservationStatus]
    nodes: list[NodeStatus]
    queued_resources: list[QueuedResourceStatus]
    faults: FaultRates
    world: dict[str, Any]
    ssh_port: int  # every host's sshd listens on (its address, ssh_port)
    metadata_port: int  # and its metadata server on (its address, metadata_port)
    storage_url: str  # the simulated network's Cloud Storage (JSON API) for every client


class SimAdminClient:
    """Typed access to a running simulator's admin API. ``base_url`` is ``SimServer.url``."""

    def __init__(
        self, base_url: str, *, timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        """``transport`` carries the requests instead of a socket (tests: the simulator in-process)."""
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url + "/sim/v1", timeout=timeout_s, transport=transport)

    # --- reading ---------------------------------------------------------------------------------

    def status(self) -> SimStatus:
        """Zones with capacity in use/free per class, stockouts, nodes, queued resources, faults, world
        summary and the simulated clock."""
        return cast(SimStatus, self._call("GET", "/status"))

    def mutations(self) -> list[dict[str, Any]]:
        """Every mutating API request (POST, PATCH, DELETE) the server was sent: ``at`` (wall time),
        ``method``, ``path``, ``caller`` (the account its token stands for; None: none), oldest first."""
        return list(self._call("GET", "/mutations")["mutations"])

    def deletions(self) -> list[dict[str, Any]]:
        """Every slice deletion, oldest first (``tpuctl.sim.deletions``): ``at``, ``project``, ``zone``,
        ``name``, ``resource``, ``path`` (``api`` or ``scheduled termination``), ``principal``, ``reason``."""
        return list(self._call("GET", "/deletions")["deletions"])

    def world(self) -> dict[str, Any]:
        """The world in force, as JSON data (World.model_dump)."""
        return self._call("GET", "/world")

    def faults(self) -> FaultRates:
        return cast(FaultRates, self._call("GET", "/faults"))

    def metadata(
        self,
        zone: str,
        node: str,
        worker: int,
        key: str = "instance/preempted",
        *,
        project: str | None = None,
    ) -> str:
        """What a simulated host's metadata server answers for ``key`` (path after computeMetadata/v1/)."""
        params = _drop_none({"zone": zone, "node": node, "worker": worker, "key": key, "project": project})
        return str(self._call("GET", "/metadata", params=params)["value"])

    # --- acting ----------------------------------------------------------------------------------

    def credentials(self, email: str) -> dict[str, Any]:
        """A credentials file for simulated account ``email``: a service account key for an address of
        ``*.gserviceaccount.com``, else gcloud-style user credentials; both name this simulator's token
        endpoint (``tpuctl.sim.issuer``)."""
        return self._call("POST", "/credentials", json={"email": email})

    def rotate_signing_key(self) -> str:
        """Sign ID tokens with a new key from now on (the previous one stays published)."""
        return str(self._call("POST", "/issuer/rotate", json={})["kid"])

    def reset(self, world: dict[str, Any] | None = None) -> dict[str, Any]:
        """Forget all simulated state; with ``world`` (World.model_dump() data), put it in force."""
        payload: dict[str, Any] = {"world": world} if world is not None else {}
        return self._call("POST", "/reset", json=payload)

    def preempt(
        self, zone: str, node: str, *, notice: bool = True, project: str | None = None
    ) -> dict[str, Any]:
        """Preempt a READY node now; returns the node (TPU API JSON). With notice: metadata flag and
        SIGTERM to every process of its VMs now; SIGKILL, disks wiped and PREEMPTED after the world's
        grace period (real seconds); without: at once."""
        return self._call(
            "POST",
            "/preempt",
            json=_drop_none({"zone": zone, "node": node, "notice": notice, "project": project}),
        )

    def preempt_compute(
        self, zone: str, name: str, *, notice: bool = True, project: str | None = None
    ) -> dict[str, Any]:
        """Preempt now the Compute Engine slice of instance or MIG ``name`` (one host lost is the whole
        slice lost). With notice: metadata ``instance/preempted`` and SIGTERM now; SIGKILL, disks wiped,
        each instance TERMINATED (termination action STOP) or gone (DELETE) with a
        ``compute.instances.preempted`` operation after the world's grace period; without: at once."""
        payload = _drop_none({"zone": zone, "name": name, "notice": notice, "project": project})
        return self._call("POST", "/compute/preempt", json=payload)

    def maintenance(self, zone: str, node: str, *, project: str | None = None) -> dict[str, Any]:
        """Start a host maintenance of a READY node (a TPU API node or a Compute Engine slice's row) now;
        returns the node (TPU API JSON). Its hosts' metadata ``maintenance-event`` says
        TERMINATE_ON_HOST_MAINTENANCE for the world's ``durations.maintenance_notice_s`` (real seconds),
        then its VMs stop: an on-demand or reserved TPU API node is REPAIRING for
        ``durations.maintenance_s`` and READY again, its disks kept; any other is TERMINATED."""
        return self._call(
            "POST", "/maintenance", json=_drop_none({"zone": zone, "node": node, "project": project})
        )

    def stockout(self, zone: str, *, clear: bool = False) -> bool:
        """Set (or clear) a manual stockout: the zone's on-demand and spot capacity become zero."""
        return bool(self._call("POST", "/stockout", json={"zone": zone, "clear": clear})["stockout"])

    def set_endpoints(
        self, zone: str, node: str, endpoints: list[dict[str, Any]] | None, *, project: str | None = None
    ) -> dict[str, Any]:
        """Override a node's networkEndpoints ([{"ipAddress", "port", ...}]); None restores the default.
        Returns the node (TPU API JSON)."""
        payload = {"zone": zone, "node": node, "endpoints": endpoints}
        if project is not None:
            payload["project"] = project
        return self._call("PUT", "/endpoints", json=payload)

    def set_faults(
        self, *, transient_error_rate: float | None = None, ambiguous_error_rate: float | None = None
    ) -> FaultRates:
        """Change the injected fault rates at runtime (persisted in the state until reset)."""
        payload = _drop_none(
            {"transient_error_rate": transient_error_rate, "ambiguous_error_rate": ambiguous_error_rate}
        )
        return cast(FaultRates, self._call("POST", "/faults", json=payload))

    def advance(self) -> None:
        """Apply every transition due now (the server's ticker does this on its own)."""
        self._call("POST", "/advance")

    # --- plumbing --------------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise UnreachableError(
                f"no simulator answers at {self.base_url} ({exc})",
                fix="start one with `tpuctl sim serve` (it prints the URL), or unset TPUCTL_SIM_URL to use "
                "an in-process simulator",
            ) from None
        try:
            data = response.json()
        except ValueError:
            data = {}
        if response.status_code >= 400:
            error = data.get("error", {}) if isinstance(data, dict) else {}
            message = str(error.get("message") or f"HTTP {response.status_code}")
            if response.status_code == 404:
                raise NotFoundError(message)
            raise SimAdminError(
                message, http_status=response.status_code, status=str(error.get("status", "UNKNOWN"))
            )
        return cast(dict[str, Any], data)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SimAdminClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}
