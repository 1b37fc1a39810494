"""A supervisor's hold on its run, as everything it runs sees it: the ledger lease kept renewed
(``LeaseKeeper``), a session whose every ledger write is fenced by the claim (``fenced_session``), a
cloud that records a fenced intent before every create and delete of a slice (``FencedCloud``), and an
executor that lets go of the hosts without a word once the lease is lost (``LeaseBoundExecutor``).

Why fence the cloud as well as the ledger: a supervisor that lost its lease (a pause longer than the
lease, a partition) may wake up in the middle of a recovery. Its next ledger write fails, but a delete or
a create sent before that write would already have hit a slice the new owner now works on. Recording the
intent first, in a transaction fenced by the claim, makes "lost" fail before the request leaves.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tpuctl.errors import LeaseLostError
from tpuctl.hosts.base import ForwardingExecutor
from tpuctl.store.records import CancelRequest, IntentAction, LeaseClaim, LedgerBusyError

if TYPE_CHECKING:
    from tpuctl.cloud.base import (
        HostIdentity,
        Node,
        NodeRequest,
        OperationProgress,
        PlannedRequest,
        QueuedResource,
        QueuedResourceRequest,
        QuotaLimit,
        TpuCloud,
    )
    from tpuctl.hosts.base import CommandResult, Executor, HostEvent, LaunchSpec, ShipResult
    from tpuctl.services.session import Session
    from tpuctl.store.ledger import Ledger


class LeaseKeeper:
    """Renews ``claim`` every ``renew_every_s`` on a thread of its own. The first loss (a renewal the
    ledger refused) is kept in ``lost`` and handed to ``on_lost`` once; the first cancel request a claim
    or renewal carries is handed to ``on_cancel`` once. A ledger that stays busy is retried at the next
    tick: the lease is lost only when the ledger says so. Any other error is retried too, but once no
    renewal succeeded for a whole ttl the lease has expired: that is a loss as well."""

    def __init__(
        self,
        ledger: Ledger,
        claim: LeaseClaim,
        *,
        ttl_s: float,
        renew_every_s: float,
        on_lost: Callable[[LeaseLostError], None],
        on_cancel: Callable[[CancelRequest], None],
    ) -> None:
        self.claim = claim
        self.lost: LeaseLostError | None = None
        self._ledger = ledger
        self._ttl_s = ttl_s
        self._every_s = renew_every_s
        self._on_lost = on_lost
        self._on_cancel = on_cancel
        self._cancel_seen = False
        self._losing = threading.Lock()  # the renewal thread and a fenced write may both find the loss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_until_stopped, name="tpuctl-lease", daemon=True)

    def start(self) -> None:
        self._notice_cancel(self.claim.cancel)
        self._thread.start()

    def stop(self) -> None:
        """No more renewals (the lease itself stays until ``release`` or its expiry)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._every_s + 5.0)

    def release(self) -> None:
        """Stop renewing and give the lease back, unless it is already lost (then nothing is written)."""
        self.stop()
        if self.lost is None:
            self._ledger.release_lease(self.claim)

    def _renew_until_stopped(self) -> None:
        renewed_at = time.monotonic()
        while not self._stop.wait(self._every_s):
            try:
                self.claim = self._ledger.renew_lease(self.claim, self._ttl_s)
            except LeaseLostError as exc:
                self._lose(exc)
                return
            except LedgerBusyError:
                continue  # another writer held the file past the busy timeout: try at the next tick
            except Exception as exc:
                # Anything else (the database gone, a bug): retried at each tick while the lease may
                # still be ours, then taken as lost: a thread that died here would leave the supervisor
                # acting on a run whose lease nobody renews.
                if time.monotonic() - renewed_at < self._ttl_s:
                    continue
                self._lose(self._unrenewable(exc))
                return
            renewed_at = time.monotonic()
            self._notice_cancel(self.claim.cancel)

    def note_lost(self, lost: LeaseLostError) -> None:
        """A loss found elsewhere (a fenced write): kept in ``lost`` and handed to ``on_lost`` as a
        renewal's would be, once, so whoever asks ``lost`` stops speaking for the run."""
        self._lose(lost)

    def _lose(self, lost: LeaseLostError) -> None:
        with self._losing:
            if self.lost is not None:
                return
            self.lost = lost
        self._stop.set()  # nothing left to renew
        self._on_lost(lost)

    def _unrenewable(self, exc: Exception) -> LeaseLostError:
        claim = self.claim
        return LeaseLostError(
            f"the lease on run {claim.run_id} (generation {claim.generation}) could not be renewed for "
            f"{self._ttl_s:g} s, so it has expired: {exc}. This supervisor stops acting on the run",
            run_id=claim.run_id,
            generation=claim.generation,
            fix=f"check the ledger (`tpuctl doctor`); `tpuctl runs resume {claim.run_id}` carries the run on",
        )

    def _notice_cancel(self, request: CancelRequest | None) -> None:
        if request is not None and not self._cancel_seen:
            self._cancel_seen = True
            self._on_cancel(request)


def fenced_session(
    session: Session, claim: LeaseClaim, *, on_lost: Callable[[LeaseLostError], None] | None = None
) -> Session:
    """``session`` with its ledger fenced by ``claim`` (a loss a write finds goes to ``on_lost``) and its
    cloud recording a fenced intent before every slice create and delete. Closing it closes nothing
    (``session`` owns the connections, OS Login's among them)."""
    ledger = session.ledger.fenced(claim, on_lost=on_lost)
    cloud = FencedCloud(session.cloud, ledger, claim)
    return dataclasses.replace(session, ledger=ledger, cloud=cloud, _closers=[], _os_login=session.os_login())


class FencedCloud:
    """A ``TpuCloud`` whose mutations first record a fenced intent (``Ledger.record_intent``): a
    supervisor that lost its lease gets ``LeaseLostError`` before the request is sent. Reads pass."""

    def __init__(self, cloud: TpuCloud, ledger: Ledger, claim: LeaseClaim) -> None:
        self._cloud = cloud
        self._ledger = ledger
        self._claim = claim

    def _intend(self, action: IntentAction, name: str, zone: str, call: str) -> None:
        self._ledger.record_intent(self._claim, action, name, zone, detail={"call": call})

    # --- mutations: fenced --------------------------------------------------------------------------

    def create_node(
        self,
        request: NodeRequest,
        *,
        request_id: str | None = None,
        wait: bool = True,
        progress: OperationProgress | None = None,
    ) -> Node:
        self._intend(IntentAction.CREATE, request.name, request.zone, "create_node")
        return self._cloud.create_node(request, request_id=request_id, wait=wait, progress=progress)

    def delete_node(
        self, zone: str, name: str, *, wait: bool = True, progress: OperationProgress | None = None
    ) -> None:
        self._intend(IntentAction.DELETE, name, zone, "delete_node")
        self._cloud.delete_node(zone, name, wait=wait, progress=progress)

    def stop_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        # Stopping releases the hosts as a delete does (and starting takes them again): the same fence.
        self._intend(IntentAction.DELETE, name, zone, "stop_node")
        return self._cloud.stop_node(zone, name, wait=wait)

    def start_node(self, zone: str, name: str, *, wait: bool = True) -> Node:
        self._intend(IntentAction.CREATE, name, zone, "start_node")
        return self._cloud.start_node(zone, name, wait=wait)

    def create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> QueuedResource:
        self._intend(IntentAction.CREATE, request.node.name, request.zone, "create_queued_resource")
        return self._cloud.create_queued_resource(request, request_id=request_id)

    def delete_queued_resource(
        self,
        zone: str,
        qr_id: str,
        *,
        force: bool = False,
        wait: bool = True,
        request_id: str | None = None,
    ) -> None:
        self._intend(IntentAction.DELETE, qr_id, zone, "delete_queued_resource")
        self._cloud.delete_queued_resource(zone, qr_id, force=force, wait=wait, request_id=request_id)

    def reset_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        self._intend(IntentAction.CREATE, qr_id, zone, "reset_queued_resource")
        return self._cloud.reset_queued_resource(zone, qr_id)

    # --- everything else: as the cloud answers --------------------------------------------------------

    @property
    def backend(self) -> str:
        return self._cloud.backend

    @property
    def project(self) -> str:
        return self._cloud.project

    @property
    def endpoint(self) -> str:
        return self._cloud.endpoint

    def list_nodes(self, zone: str | None = None) -> list[Node]:
        return self._cloud.list_nodes(zone)

    def get_node(self, zone: str, name: str) -> Node:
        return self._cloud.get_node(zone, name)

    def host_identities(self, zone: str, name: str) -> list[HostIdentity]:
        return self._cloud.host_identities(zone, name)

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResource:
        return self._cloud.get_queued_resource(zone, qr_id)

    def list_queued_resources(self, zone: str | None = None) -> list[QueuedResource]:
        return self._cloud.list_queued_resources(zone)

    def list_accelerator_types(self, zone: str) -> list[str]:
        return self._cloud.list_accelerator_types(zone)

    def list_runtime_versions(self, zone: str) -> list[str]:
        return self._cloud.list_runtime_versions(zone)

    def list_zones(self) -> list[str]:
        return self._cloud.list_zones()

    def quota_limits(self) -> list[QuotaLimit]:
        return self._cloud.quota_limits()

    def plan_create_node(
        self, request: NodeRequest, *, request_id: str | None = None
    ) -> list[PlannedRequest]:
        return self._cloud.plan_create_node(request, request_id=request_id)

    def plan_create_queued_resource(
        self, request: QueuedResourceRequest, *, request_id: str | None = None
    ) -> PlannedRequest:
        return self._cloud.plan_create_queued_resource(request, request_id=request_id)

    def plan_delete_node(self, zone: str, name: str) -> list[PlannedRequest]:
        return self._cloud.plan_delete_node(zone, name)

    def plan_delete_queued_resource(
        self, zone: str, qr_id: str, *, force: bool = False, request_id: str | None = None
    ) -> PlannedRequest:
        return self._cloud.plan_delete_queued_resource(zone, qr_id, force=force, request_id=request_id)

    def close(self) -> None:
        """Nothing: the session the cloud came from closes it."""


@runtime_checkable
class Abandonable(Protocol):
    """An executor that can drop its connections to the hosts without signalling the programs."""

    def abandon(self) -> None: ...


class LeaseBoundExecutor(ForwardingExecutor):
    """An executor that stops speaking for the run once ``lost()`` says the lease is gone: waiting for
    host events raises the loss, and stopping or closing signals no host (the new owner decides what
    becomes of them) but only drops the connections."""

    def __init__(self, inner: Executor, lost: Callable[[], LeaseLostError | None]) -> None:
        super().__init__(inner)
        self._lost = lost

    def ship(self, bundle: Any) -> list[ShipResult]:
        self._raise_if_lost()
        return super().ship(bundle)

    def start(self, spec: LaunchSpec) -> None:
        self._raise_if_lost()
        super().start(spec)

    def next_event(self, timeout_s: float) -> HostEvent | None:
        self._raise_if_lost()
        return super().next_event(timeout_s)

    def run_command(
        self,
        command: str,
        *,
        on_line: Callable[[int, str], None],
        timeout_s: float,
        workers: Sequence[int] | None = None,
        stdin: bytes = b"",
    ) -> dict[int, CommandResult]:
        self._raise_if_lost()
        return super().run_command(
            command, on_line=on_line, timeout_s=timeout_s, workers=workers, stdin=stdin
        )

    def stop(self, grace_s: float = 5.0) -> None:
        if self._lost() is None:
            self._inner.stop(grace_s)

    def close(self) -> None:
        if self._lost() is not None and isinstance(self._inner, Abandonable):
            self._inner.abandon()
        else:
            self._inner.close()

    def _raise_if_lost(self) -> None:
        lost = self._lost()
        if lost is not None:
            raise lost
