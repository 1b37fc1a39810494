"""Pods as tpuctl shows them: list, describe and delete slices, recording every event in the ledger.

Slices are created by the allocator (``tpuctl.services.allocator``), the one creation path.

Plain Python: no CLI, no rendering. Collaborators come in through the ``Session``.
"""

from __future__ import annotations

import builtins
import contextlib
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tpuctl.catalog import AcceleratorType, Surface, validate_zone
from tpuctl.cloud.base import (
    Node,
    OperationProgress,
)
from tpuctl.cloud.idempotent import delete_node_idempotent
from tpuctl.cloud.surfaces import asking_only
from tpuctl.errors import (
    NotFoundError,
    UsageError,
)
from tpuctl.services.session import Session
from tpuctl.store.records import LOCAL_WORKSPACE, EventKind, EventRecord, PodRecord
from tpuctl.timefmt import iso

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
    #: Whose slice it is (the ledger's; a slice it does not know, or from before workspaces: the local
    #: workspace, an unknown principal).
    workspace: str = LOCAL_WORKSPACE
    principal: str | None = None

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
            "workspace": self.workspace,
            "principal": self.principal,
        }


def _event_dict(event: EventRecord) -> dict[str, Any]:
    """A ledger event as shown by `pod describe`: when, what, and the facts recorded with it."""
    detail = dict(event.detail or {})
    return {
        "time": iso(event.ts),
        "kind": str(event.kind),
        "zone": event.zone,
        "capacity": event.capacity.value if event.capacity is not None else None,
        "price_per_chip_hour": event.price_per_chip_hour,
        "request_id": event.request_id,
        "run_id": event.run_id,
        "detail": detail or None,
    }


def _deleted_by(event: EventRecord) -> str:
    """``alice (user)``: who deleted a slice and why, as far as its deleted event says (events written
    by gc or older versions have only the reason)."""
    detail = event.detail or {}
    reason, by = detail.get("reason"), detail.get("by")
    if by and reason:
        return f"{by} ({reason})"
    return str(by or reason or "unknown")


def _no_slice(name: str) -> NotFoundError:
    return NotFoundError(f"no slice named {name!r}", fix="`tpuctl pod list` shows the slices that exist")


@dataclass(frozen=True)
class Deletion:
    """A deleted slice, and the queued resource deleted with it (its id), if any."""

    node: Node
    queued_resource: str | None = None


class PodService:
    """List, describe and delete slices through the cloud boundary, recording to the ledger."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._cloud = session.cloud
        self._ledger = session.ledger
        self._catalog = session.catalog

    # --- read ------------------------------------------------------------------------------------------

    def list(
        self, zone: str | None = None, *, surfaces: Iterable[Surface] | None = None
    ) -> builtins.list[PodView]:
        """The slices in ``zone`` (every zone when None) on ``surfaces`` (both when None; a surface the
        caller may not list is left out, with a note on the cloud)."""
        cloud = self._cloud if surfaces is None else asking_only(self._cloud, surfaces)
        nodes = cloud.list_nodes(validate_zone(zone) if zone else None)
        views = [self._view(node) for node in sorted(nodes, key=lambda n: (n.zone, n.name))]
        return [view for view in views if self._session.actor.may_see(view.workspace)]

    def describe(self, name: str, zone: str | None = None) -> dict[str, Any]:
        """The live slice joined with its ledger record; for one the cloud no longer has, what the ledger
        recorded of its last life (a deleted slice's history is still worth reading)."""
        try:
            node = self._locate(name, zone)
        except NotFoundError:
            record = self._ledger.get_pod(name, zone=validate_zone(zone) if zone else None)
            if record is None or not self._session.actor.may_see(record.workspace):
                raise
            return self._describe_from_ledger(record)
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
            "deleted_at": None,
            "deleted_by": None,
        }

    def _describe_from_ledger(self, record: PodRecord) -> dict[str, Any]:
        """A slice the cloud does not have, as the ledger last saw it: the same keys as a live one's
        (no hosts: they went with it), with when it ended and who or what deleted it."""
        events = list(self._ledger.events(pod_id=record.id))
        deletion = next((e for e in reversed(events) if e.kind == EventKind.DELETED), None)
        chips, per_chip = record.chips, record.price_per_chip_hour
        accel = (
            None if record.accelerator_type is None else self._accelerator_or_none(record.accelerator_type)
        )
        return {
            "name": record.name,
            "zone": record.zone,
            "accelerator_type": record.accelerator_type,
            "topology": None if accel is None else accel.topology,
            "chips": chips,
            "hosts": record.hosts,
            "state": str(record.state) if record.deleted_at is None else "DELETED",
            "capacity": None if record.capacity is None else record.capacity.value,
            "price_per_chip_hour": per_chip,
            "price_per_hour": None if per_chip is None or chips is None else per_chip * chips,
            "labels": dict(record.labels),
            "created_at": None if record.created_at is None else iso(record.created_at),
            "tracked": True,
            "queued_resource": record.queued_resource,
            "runtime_version": None,
            "health": None,
            "network_endpoints": [],
            "events": [_event_dict(e) for e in events],
            "deleted_at": None if record.deleted_at is None else iso(record.deleted_at),
            "deleted_by": None if deletion is None else _deleted_by(deletion),
            "workspace": record.workspace or LOCAL_WORKSPACE,
            "principal": record.principal,
        }

    def _locate(self, name: str, zone: str | None) -> Node:
        """Find a slice by name (one the actor may see: another workspace's is not found, exactly as one
        that does not exist)."""
        node = self._find(name, zone)
        record = self._ledger.get_pod(node.name, zone=node.zone)
        if not self._session.actor.may_see(None if record is None else record.workspace):
            raise _no_slice(name)
        return node

    def _locate_to_change(self, name: str, zone: str | None) -> Node:
        """``_locate``, and ``ForbiddenError`` (exit 13, HTTP 403) unless the actor may change it."""
        node = self._locate(name, zone)
        record = self._ledger.get_pod(node.name, zone=node.zone)
        self._session.actor.check_change(None if record is None else record.workspace, "delete slices")
        return node

    def _find(self, name: str, zone: str | None) -> Node:
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
            raise _no_slice(name)
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
            workspace=(record.workspace if record is not None else None) or LOCAL_WORKSPACE,
            principal=None if record is None else record.principal,
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
            node = self._locate_to_change(name, zone)
            requests = [r.to_dict() for r in self._cloud.plan_delete_node(node.zone, node.name)]
            qr_id = self._queue_to_delete(node)
            if qr_id is not None:
                requests.append(
                    self._cloud.plan_delete_queued_resource(node.zone, qr_id, force=True).to_dict()
                )
            plans.append(
                {
                    "action": "delete",
                    "name": node.name,
                    "zone": node.zone,
                    "queued_resource": qr_id,
                    "requests": requests,
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
    ) -> Deletion:
        """Delete the slice, and the queued resource that made it when nothing else of it is left (a
        queued resource holds quota until it is deleted, whatever became of its slices)."""
        node = self._locate_to_change(name, zone)
        qr_id = self._queue_to_delete(node)
        # Gone (or DELETING) after an unknown outcome is the outcome the user asked for.
        delete_node_idempotent(self._cloud, node.zone, node.name, wait=wait, progress=progress)
        if qr_id is not None:
            with contextlib.suppress(NotFoundError):
                self._cloud.delete_queued_resource(node.zone, qr_id, force=True, wait=wait)
        # ``by``: who ran the command (the owner label's value), so a shared ledger says who deleted it.
        detail: dict[str, Any] = {
            "reason": reason,
            "state_before": node.state,
            "by": self._session.settings.resolved_owner,
        }
        if qr_id is not None:
            detail["queued_resource_deleted"] = qr_id
        self._ledger.record_event(
            EventKind.DELETED,
            pod=node.name,
            zone=node.zone,
            accelerator_type=node.accelerator_type,
            capacity=node.capacity,
            labels=dict(node.labels),
            detail=detail,
        )
        return Deletion(node, qr_id)

    def _queue_to_delete(self, node: Node) -> str | None:
        """The id of the queued resource that made ``node``, when deleting ``node`` leaves it no slice."""
        qr_id = (node.queued_resource or "").rsplit("/", 1)[-1]
        if not qr_id:
            return None
        try:
            qr = self._cloud.get_queued_resource(node.zone, qr_id)
        except NotFoundError:
            return None
        others = set(qr.node_ids) - {node.name}
        if others and others & {n.name for n in self._cloud.list_nodes(node.zone)}:
            return None  # a multislice queued resource with other slices alive: they still use it
        return qr_id
