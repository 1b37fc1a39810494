"""Host maintenance as a run meets it: whether Google keeps the slice's VMs through it, and waiting for the
slice to come back where it does (docs/preemption.md#host-maintenance).

A TPU VM cannot live-migrate: a host taken for maintenance stops its VM
(docs/google-facts.md#host-maintenance). What follows depends on the slice:

- a Cloud TPU API node of on-demand or reserved capacity is kept: Google restarts its VMs (the node shows
  REPAIRING, then READY again; the boot disk stays), so the run waits for it and starts the program again
  on the same slice, from its last checkpoint;
- a spot or preemptible VM is not restarted (Compute Engine never restarts those after a host event), and
  a Compute Engine VM tpuctl made has ``automaticRestart: false`` (``tpuctl.cloud.compute_shapes``): both
  are lost as to a preemption, and the run replaces the slice.

A slice Google keeps may still not come back (a large slice waits for capacity, "up to a few hours"): the
wait is bounded, and a slice that turns dead or vanishes meanwhile is replaced as a preempted one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tpuctl.catalog import Surface
from tpuctl.cloud.base import DEAD_NODE_STATES
from tpuctl.errors import CloudError, NotFoundError
from tpuctl.services.run.sliceset import SliceSet

#: Node states of a slice whose hosts are being maintained or restarted: it may come back READY.
MAINTENANCE_NODE_STATES = frozenset({"REPAIRING", "RESTARTING"})
#: The TPU API's health while a host is maintained.
MAINTENANCE_HEALTH = "UNHEALTHY_MAINTENANCE"


def kept_through_maintenance(slices: SliceSet) -> bool:
    """Whether Google restarts the slice's VMs after host maintenance (see the module docstring)."""
    return all(node.surface is Surface.TPU_API and not node.capacity.is_preemptible for node in slices.nodes)


def in_maintenance(state: str | None, health: str | None = None) -> bool:
    """Whether a node in ``state`` (with ``health``) is being maintained."""
    return state in MAINTENANCE_NODE_STATES or health == MAINTENANCE_HEALTH


class Return(StrEnum):
    """How a wait for a maintained slice ended."""

    BACK = "back"  # every slice READY again after its hosts went down (or the notice passed)
    LOST = "lost"  # a slice turned dead or vanished: Google did not keep it after all
    TIMED_OUT = "timed_out"  # not back within the wait


@dataclass(frozen=True)
class Waited:
    """The end of a wait: how, the state last read, and whether the hosts were seen down."""

    how: Return
    state: str | None
    went_down: bool
    waited_s: float


@dataclass
class SliceReturn:
    """Waits for a maintained slice to be READY again.

    The hosts are down once the API shows a maintenance state (or the program's hosts died with them).
    A slice that the API still shows READY once the notice's window (``notice_s`` after the notice) and a
    margin (``settle_s``) have passed was not taken after all (or came back between two polls): the run
    goes on with it. ``get_node(zone, name)`` reads one slice; ``sleep``/``monotonic`` are the session's.
    """

    get_node: Callable[[str, str], Any]
    poll_s: float
    timeout_s: float
    notice_s: float
    settle_s: float
    sleep: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic
    clock: Callable[[], float] = time.time

    def wait(self, slices: SliceSet, *, noticed_at: float | None, went_down: bool) -> Waited:
        started = self.monotonic()
        # The notice's window is counted from the notice (host time), not from now: a program that
        # stopped on it early waits out the rest; one whose host was taken long ago waits for nothing.
        window_ends = (noticed_at if noticed_at is not None else self.clock()) + self.notice_s + self.settle_s
        state: str | None = None
        while True:
            state = self._state(slices)
            if state is not None:
                if state == "LOST":
                    return Waited(Return.LOST, state, went_down, self.monotonic() - started)
                if state != "READY":
                    went_down = True
                elif went_down or self.clock() >= window_ends:
                    return Waited(Return.BACK, state, went_down, self.monotonic() - started)
            if self.monotonic() - started >= self.timeout_s:
                return Waited(Return.TIMED_OUT, state, went_down, self.monotonic() - started)
            self.sleep(self.poll_s)

    def _state(self, slices: SliceSet) -> str | None:
        """READY when every slice is; LOST when one is dead or gone; else the first other state (None:
        the API could not be asked, no evidence either way)."""
        states: list[str] = []
        for node in slices.nodes:
            try:
                now = self.get_node(node.zone, node.name)
            except NotFoundError:
                return "LOST"
            except CloudError:
                return None
            if now.state in DEAD_NODE_STATES:
                return "LOST"
            states.append("MAINTENANCE" if in_maintenance(now.state, now.health) else str(now.state))
        return next((s for s in states if s != "READY"), "READY")


@dataclass
class MaintenanceRecord:
    """One host maintenance a run lived through on its slice (``runs describe``: ``maintenance``)."""

    number: int
    pod: str
    zone: str
    value: str  # what the metadata server said (TERMINATE_ON_HOST_MAINTENANCE), or "" (seen by the API)
    source: str  # follower-maintenance | runtime-maintenance | api
    occurred_at: float | None  # the notice's time on the host, else the first host's death
    detected_at: float
    checkpoint_step: int | None = None
    back_at: float | None = None
    waited_s: float | None = None
    went_down: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MaintenanceRecord:
        """A record as ``to_dict`` stored it (a resumed run keeps its predecessor's)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "pod": self.pod,
            "zone": self.zone,
            "value": self.value,
            "source": self.source,
            "occurred_at": self.occurred_at,
            "detected_at": self.detected_at,
            "checkpoint_step": self.checkpoint_step,
            "back_at": self.back_at,
            "waited_s": None if self.waited_s is None else round(self.waited_s, 3),
            "went_down": self.went_down,
        }
