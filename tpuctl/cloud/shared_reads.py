"""Node reads shared by every thread of a process: one listing of a zone answers each ``get_node`` of
that zone for ``max_age_s``. A `tpuctl server` supervising hundreds of runs would otherwise ask the TPU
API for each run's slice once a second (its slice watch): the reads, and the replica's CPU, grow with the
runs. With this they grow with the zones.

What stays exact: a slice the listing does not show is asked for by itself (the listing may predate its
creation, and only the API's own answer may say a slice is gone); a create, delete, stop or start
through this cloud drops the zone's listing, so the next read sees the change; an error of the listing
is the caller's, never cached. A state read from a listing is at most ``max_age_s`` old: a slice watch
polling every ``max_age_s`` sees a preemption as late as it did polling alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpuctl.cloud.forwarding import ForwardingCloud

if TYPE_CHECKING:
    from tpuctl.cloud.base import Node, NodeRequest, OperationProgress, QueuedResource, TpuCloud


@dataclass(frozen=True)
class _Listing:
    asked_at: float  # when the listing was asked for: its answers are at least this fresh
    nodes: dict[str, Node]


class SharedNodeReads(ForwardingCloud):
    """``cloud`` with ``get_node`` answered from a zone's listing of at most ``max_age_s`` (the module
    docstring says what stays exact). Thread-safe: callers of one zone wait for one listing."""

    def __init__(
        self, cloud: TpuCloud, *, max_age_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0 seconds, got {max_age_s!r}")
        super().__init__(cloud)
        self._max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._zone_locks: dict[str, threading.Lock] = {}
        self._listings: dict[str, _Listing] = {}
        self.listings_asked = 0  # how many listings were asked for (tests, benchmarks)

    def get_node(self, zone: str, name: str) -> Node:
        node = self._listing(zone).nodes.get(name)
        return node if node is not None else self._cloud.get_node(zone, name)

    def _listing(self, zone: str) -> _Listing:
        with self._lock:
            zone_lock = self._zone_locks.setdefault(zone, threading.Lock())
        with zone_lock:  # one listing per zone at a time; the others wait for it and share it
            with self._lock:
                listing = self._listings.get(zone)
            if listing is not None and self._clock() - listing.asked_at < self._max_age_s:
                return listing
            asked_at = self._clock()
            nodes = self._cloud.list_nodes(zone)
            listing = _Listing(asked_at, {n.name: n for n in nodes if n.zone == zone})
            with self._lock:
                self._listings[zone] = listing
                self.listings_asked += 1
            return listing

    def _forget(self, zone: str) -> None:
        with self._lock:
            self._listings.pop(zone, None)

    # --- mutations: the zone's listing is stale once they are sent -------------------------------------

    def create_node(
        self,
        request: NodeRequest,
        *,
        request_id: str | None = None,
        wait: bool = True,
        progress: OperationProgress | None = None,
    ) -> Node:
        try:
            return super().create_node(request, request_id=request_id, wait=wait, progress=progress)
        finally:
            self._forget(request.zone)

    def delete_node(
        self, zone: str, name: str, *, wait: bool = True, progress: OperationProgress | None = None
    ) -> None:
        try:
            super().delete_node(zone, name, wait=wait, progress=progress)
        finally:
            self._forget(zone)

    def stop_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        try:
            return super().stop_node(zone, name, wait=wait)
        finally:
            self._forget(zone)

    def start_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        try:
            return super().start_node(zone, name, wait=wait)
        finally:
            self._forget(zone)

    def delete_queued_resource(
        self,
        zone: str,
        qr_id: str,
        *,
        force: bool = False,
        wait: bool = True,
        request_id: str | None = None,
    ) -> None:
        try:  # its nodes go with it
            super().delete_queued_resource(zone, qr_id, force=force, wait=wait, request_id=request_id)
        finally:
            self._forget(zone)

    def reset_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        try:
            return super().reset_queued_resource(zone, qr_id)
        finally:
            self._forget(zone)
