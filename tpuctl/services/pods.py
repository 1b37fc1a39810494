"""Pod lifecycle: create, list, describe and delete TPU slices, recording every event in the ledger.

Plain Python: no CLI, no rendering. Collaborators come in through the ``Session``.
"""

from __future__ import annotations

import builtins
import contextlib
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tpuctl.catalog import AcceleratorType, CapacityType, region_of_zone, validate_zone
from tpuctl.cloud.base import (
    LABEL_MANAGED_BY,
    LABEL_MANAGED_BY_VALUE,
    LABEL_OWNER,
    LABEL_REQUEST,
    Node,
    NodeRequest,
    OperationProgress,
    PlannedRequest,
)
from tpuctl.cloud.idempotent import create_node_idempotent, delete_node_idempotent
from tpuctl.errors import (
    CloudError,
    NotFoundError,
    TransientError,
    UsageError,
)
from tpuctl.services.attempts import REQUESTED_BY, requester
from tpuctl.services.session import Session
from tpuctl.store.records import AttemptOutcome, EventKind, EventRecord

_NODE_ID_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def validate_node_name(name: str) -> str:
    if not _NODE_ID_RE.match(name):
        raise UsageError(
            f"invalid pod name {name!r}",
            field="pod_name",
            value=name,
            fix="use 1-63 lowercase letters, digits and dashes, starting with a letter and not ending "
            "with a dash",
        )
    return name


def new_request_id() -> str:
    return secrets.token_hex(6)


def default_pod_name(accel: AcceleratorType, request_id: str) -> str:
    return f"tpu-{accel.friendly_name.replace('.', '-')}-{request_id[:6]}"


@dataclass(frozen=True)
class CreateSpec:
    """A validated request for one slice in one zone."""

    accelerator: AcceleratorType
    zone: str
    name: str
    capacity: CapacityType
    runtime_version: str
    labels: dict[str, str]
    request_id: str
    reservation: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def region(self) -> str:
        return region_of_zone(self.zone)


@dataclass(frozen=True)
class PodView:
    """A slice as tpuctl shows it: the live node joined with what the ledger knows."""

    name: str
    zone: str
    accelerator_type: str
    topology: str | None
    chips: int | None
    hosts: int
    state: str
    capacity: str
    price_per_chip_hour: float | None
    price_per_hour: float | None
    labels: dict[str, str]
    created_at: str | None
    tracked: bool
    queued_resource: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "zone": self.zone,
            "accelerator_type": self.accelerator_type,
            "topology": self.topology,
            "chips": self.chips,
            "hosts": self.hosts,
            "state": self.state,
            "capacity": self.capacity,
            "price_per_chip_hour": self.price_per_chip_hour,
            "price_per_hour": self.price_per_hour,
            "labels": self.labels,
            "created_at": self.created_at,
            "tracked": self.tracked,
            "queued_resource": self.queued_resource,
        }


def _attempt_outcome(kind: str) -> AttemptOutcome:
    """The ledger's outcome for an error kind (stockout, quota_exceeded, ...); unknown kinds are 'failed'."""
    aliases = {"quota_exceeded": "quota"}
    try:
        return AttemptOutcome(aliases.get(kind, kind))
    except ValueError:
        return AttemptOutcome.FAILED


def _event_dict(event: EventRecord) -> dict[str, Any]:
    """A ledger event as shown by `pod describe`: when, what, and the facts recorded with it."""
    detail = dict(event.detail or {})
    return {
        "time": datetime.fromtimestamp(event.ts, tz=UTC).isoformat(timespec="seconds"),
        "kind": str(event.kind),
        "zone": event.zone,
        "capacity": event.capacity.value if event.capacity is not None else None,
        "price_per_chip_hour": event.price_per_chip_hour,
        "request_id": event.request_id,
        "run_id": event.run_id,
        "detail": detail or None,
    }


class PodService:
    """Create, list, describe and delete slices through the cloud boundary, recording to the ledger."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._cloud = session.cloud
        self._ledger = session.ledger
        self._catalog = session.catalog

    # --- building a request -------------------------------------------------------------------------

    def build_spec(
        self,
        type_name: str,
        *,
        name: str | None = None,
        zone: str | None = None,
        capacity: CapacityType = CapacityType.ON_DEMAND,
        runtime_version: str | None = None,
        labels: Mapping[str, str] | None = None,
        reservation: str | None = None,
        request_id: str | None = None,
    ) -> CreateSpec:
        accel = self._catalog.resolve(type_name)
        if capacity is CapacityType.RESERVED and not reservation:
            raise UsageError(
                "reserved capacity needs a reservation name",
                field="reserved",
                fix="pass --reserved RESERVATION_NAME",
            )
        chosen_zone = zone or (self._session.settings.zones[0] if self._session.settings.zones else None)
        chosen_zone = validate_zone(chosen_zone) if chosen_zone else accel.generation.zones[0]
        rid = request_id or new_request_id()
        pod_name = validate_node_name(name) if name else default_pod_name(accel, rid)
        all_labels = dict(labels or {})
        all_labels.update(
            {
                LABEL_MANAGED_BY: LABEL_MANAGED_BY_VALUE,
                LABEL_OWNER: self._session.settings.resolved_owner,
                LABEL_REQUEST: rid,
            }
        )
        return CreateSpec(
            accelerator=accel,
            zone=chosen_zone,
            name=pod_name,
            capacity=capacity,
            runtime_version=runtime_version or accel.runtime_version,
            labels=all_labels,
            request_id=rid,
            reservation=reservation,
        )

    def node_request(self, spec: CreateSpec) -> NodeRequest:
        return NodeRequest(
            name=spec.name,
            zone=spec.zone,
            accelerator_type=spec.accelerator.api_name,
            runtime_version=spec.runtime_version,
            capacity=spec.capacity,
            labels=spec.labels,
            metadata=spec.metadata,
            reservation=spec.reservation,
            description=f"created by tpuctl (request {spec.request_id})",
        )

    def price_per_chip_hour(self, spec: CreateSpec) -> float | None:
        return self._catalog.price_per_chip_hour(spec.accelerator, spec.zone, spec.capacity)

    def plan_create(self, spec: CreateSpec) -> dict[str, Any]:
        """What ``create`` would do, without doing it: the exact request and the price."""
        planned: PlannedRequest = self._cloud.plan_create_node(self.node_request(spec))
        per_chip = self.price_per_chip_hour(spec)
        return {
            "action": "create",
            "name": spec.name,
            "zone": spec.zone,
            "accelerator_type": spec.accelerator.api_name,
            "topology": spec.accelerator.topology,
            "chips": spec.accelerator.chips,
            "hosts": spec.accelerator.hosts,
            "capacity": spec.capacity.value,
            "price_per_chip_hour": per_chip,
            "price_per_hour": None if per_chip is None else per_chip * spec.accelerator.chips,
            "requests": [planned.to_dict()],
        }

    # --- create --------------------------------------------------------------------------------------

    def create(
        self,
        spec: CreateSpec,
        *,
        wait: bool = True,
        progress: OperationProgress | None = None,
        run_id: str | None = None,
    ) -> Node:
        """Create the slice and (with ``wait``) wait until READY. Never creates two slices for one spec:
        after an ambiguous failure it looks before it creates again. A failure leaves nothing behind."""
        per_chip = self.price_per_chip_hour(spec)
        common: dict[str, Any] = {
            "pod": spec.name,
            "zone": spec.zone,
            "accelerator_type": spec.accelerator.api_name,
            "chips": spec.accelerator.chips,
            "capacity": spec.capacity.value,
            "price_per_chip_hour": per_chip,
            "labels": spec.labels,
            "request_id": spec.request_id,
            "run_id": run_id,
        }
        self._ledger.record_event(EventKind.REQUESTED, **common, detail={REQUESTED_BY: requester()})
        started = time.monotonic()
        try:
            node = self._create_once(spec, wait=wait, progress=progress)
        except CloudError as exc:
            self._ledger.record_event(EventKind.FAILED, **common, detail={"error": exc.to_dict()})
            self._ledger.record_attempt(
                request_id=spec.request_id,
                zone=spec.zone,
                capacity=spec.capacity,
                outcome=_attempt_outcome(exc.kind),
                message=exc.message,
                duration_s=time.monotonic() - started,
            )
            self._clean_up_failed(spec)
            raise
        self._ledger.record_attempt(
            request_id=spec.request_id,
            zone=spec.zone,
            capacity=spec.capacity,
            outcome=AttemptOutcome.CREATED,
            message="",
            duration_s=time.monotonic() - started,
        )
        self._ledger.record_event(
            EventKind.CREATED, **common, detail={"hosts": spec.accelerator.hosts, "state": node.state}
        )
        if wait:
            node = self.wait_ready(spec.zone, spec.name, progress=progress)
            self._ledger.record_event(EventKind.READY, **common)
        return node

    def _create_once(self, spec: CreateSpec, *, wait: bool, progress: OperationProgress | None) -> Node:
        # At most one slice per request, even across ambiguous failures: the cloud layer looks before
        # it sends the create again, and recognises our node by its request label.
        return create_node_idempotent(
            self._cloud,
            self.node_request(spec),
            request_id=spec.request_id,
            wait=wait,
            progress=progress,
        )

    def _find_own(self, spec: CreateSpec) -> Node | None:
        try:
            node = self._cloud.get_node(spec.zone, spec.name)
        except NotFoundError:
            return None
        return node if node.labels.get(LABEL_REQUEST) == spec.request_id else None

    def wait_ready(
        self,
        zone: str,
        name: str,
        *,
        timeout_s: float = 1800.0,
        progress: OperationProgress | None = None,
    ) -> Node:
        """Poll the node until READY; a terminal state or the timeout raises."""
        from tenacity import Retrying, retry_if_result, stop_after_delay, wait_exponential

        started = time.monotonic()

        def _not_ready(node: Node) -> bool:
            if progress is not None:
                progress.update(f"{name}: {node.state}", elapsed_s=time.monotonic() - started)
            if node.state in ("PREEMPTED", "TERMINATED", "STOPPED", "DELETING"):
                raise CloudError(
                    f"slice {name} in {zone} went {node.state} while waiting for READY",
                    fix="`tpuctl pod describe` shows its history; `tpuctl pod gc` cleans it up",
                )
            return node.state != "READY"

        retrying = Retrying(
            retry=retry_if_result(_not_ready),
            wait=wait_exponential(multiplier=0.05, min=0.05, max=2.0),
            stop=stop_after_delay(timeout_s),
            reraise=True,
        )
        node: Node = retrying(self._cloud.get_node, zone, name)
        if node.state != "READY":
            raise TransientError(
                f"slice {name} in {zone} was not READY after {timeout_s:.0f} s (state {node.state})",
                fix="check `tpuctl pod describe`; delete it if it is stuck",
            )
        return node

    def _clean_up_failed(self, spec: CreateSpec) -> None:
        """A failed create leaves nothing behind: delete a node of ours that the failure left over."""
        try:
            leftover = self._find_own(spec)
        except CloudError:
            return
        if leftover is None:
            return
        with contextlib.suppress(NotFoundError):
            self._cloud.delete_node(spec.zone, spec.name, wait=True)
        self._ledger.record_event(
            EventKind.DELETED,
            pod=spec.name,
            zone=spec.zone,
            request_id=spec.request_id,
            detail={"reason": "cleanup after failed create"},
        )

    # --- read ------------------------------------------------------------------------------------------

    def list(self, zone: str | None = None) -> builtins.list[PodView]:
        nodes = self._cloud.list_nodes(validate_zone(zone) if zone else None)
        return [self._view(node) for node in sorted(nodes, key=lambda n: (n.zone, n.name))]

    def describe(self, name: str, zone: str | None = None) -> dict[str, Any]:
        node = self._locate(name, zone)
        view = self._view(node)
        events = [_event_dict(e) for e in self._ledger.pod_events(node.name, zone=node.zone)]
        return {
            **view.to_dict(),
            "runtime_version": node.runtime_version,
            "health": node.health,
            "network_endpoints": [
                {"ip_address": e.ip_address, "port": e.port} for e in node.network_endpoints
            ],
            "events": events,
        }

    def _locate(self, name: str, zone: str | None) -> Node:
        """Find a slice by name: in the given zone, the ledger's zone for it, or any zone."""
        if zone:
            return self._cloud.get_node(validate_zone(zone), name)
        record = self._ledger.get_pod(name)
        if record is not None and record.ended_at is None:
            try:
                return self._cloud.get_node(record.zone, name)
            except NotFoundError:
                pass
        matches = [n for n in self._cloud.list_nodes(None) if n.name == name]
        if not matches:
            raise NotFoundError(
                f"no slice named {name!r}",
                fix="`tpuctl pod list` shows the slices that exist",
            )
        if len(matches) > 1:
            zones = ", ".join(sorted(n.zone for n in matches))
            raise UsageError(
                f"slice name {name!r} exists in several zones ({zones})",
                field="zone",
                value=name,
                fix="pass --zone to say which",
            )
        return matches[0]

    def _view(self, node: Node) -> PodView:
        record = self._ledger.get_pod(node.name, zone=node.zone)
        accel = self._accelerator_or_none(node.accelerator_type)
        chips = accel.chips if accel else (record.chips if record else None)
        per_chip = record.price_per_chip_hour if record and record.price_per_chip_hour is not None else None
        if per_chip is None and accel is not None:
            per_chip = self._catalog.price_per_chip_hour(accel, node.zone, node.capacity)
        return PodView(
            name=node.name,
            zone=node.zone,
            accelerator_type=node.accelerator_type,
            topology=node.topology or (accel.topology if accel else None),
            chips=chips,
            hosts=len(node.network_endpoints) or (accel.hosts if accel else 0),
            state=node.state,
            capacity=node.capacity.value,
            price_per_chip_hour=per_chip,
            price_per_hour=None if per_chip is None or chips is None else per_chip * chips,
            labels=dict(node.labels),
            created_at=node.create_time.isoformat() if node.create_time else None,
            tracked=record is not None,
            queued_resource=node.queued_resource,
        )

    def _accelerator_or_none(self, api_name: str) -> AcceleratorType | None:
        try:
            return self._catalog.resolve(api_name)
        except UsageError:
            return None

    # --- delete ----------------------------------------------------------------------------------------

    def plan_delete(self, names: Sequence[str], zone: str | None = None) -> builtins.list[dict[str, Any]]:
        plans = []
        for name in names:
            node = self._locate(name, zone)
            plans.append(
                {
                    "action": "delete",
                    "name": node.name,
                    "zone": node.zone,
                    "requests": [self._cloud.plan_delete_node(node.zone, node.name).to_dict()],
                }
            )
        return plans

    def delete(
        self,
        name: str,
        *,
        zone: str | None = None,
        wait: bool = True,
        progress: OperationProgress | None = None,
        reason: str = "user",
    ) -> Node:
        node = self._locate(name, zone)
        # Gone (or DELETING) after an unknown outcome is the outcome the user asked for.
        delete_node_idempotent(self._cloud, node.zone, node.name, wait=wait, progress=progress)
        self._ledger.record_event(
            EventKind.DELETED,
            pod=node.name,
            zone=node.zone,
            accelerator_type=node.accelerator_type,
            capacity=node.capacity,
            labels=dict(node.labels),
            detail={"reason": reason, "state_before": node.state},
        )
        return node
