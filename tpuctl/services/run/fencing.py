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

from tpuctl.cloud.forwarding import ForwardingCloud
from tpuctl.errors import LeaseLostError
from tpuctl.hosts.base import ForwardingExecutor
from tpuctl.store.records import CancelRequest, IntentAction, LeaseClaim

if TYPE_CHECKING:
    from tpuctl.cloud.base import (
        Node,
        NodeRequest,
        OperationProgress,
        QueuedResource,
        QueuedResourceRequest,
        TpuCloud,
    )
    from tpuctl.hosts.base import CommandResult, Executor, HostEvent, LaunchSpec, ShipResult
    from tpuctl.services.session import Session
    from tpuctl.store.ledger import Ledger


def loss_margin(ttl_s: float, renew_every_s: float) -> float:
    """How long before the lease could expire by the ledger's clock its keeper gives it up: one renewal
    interval, and at least a tenth of the lease.

    The margin covers what the local clock cannot see: a cloud request checked just before the deadline
    still has to travel (an HTTP round trip, the client's own retry of a dropped connection) before the
    cloud acts on it, and the database's clock may run ahead of this machine's. At the defaults (60 s,
    renewed every 15 s) the loss is declared 45 s after the last successful renewal began, once the two
    renewals after it failed, 15 s before another owner could claim the run. Settings keep
    ``renew_every_s`` at most half the lease, so the margin never exceeds ``ttl_s - renew_every_s``: one
    failed renewal alone never declares a loss."""
    return max(renew_every_s, 0.1 * ttl_s)


class LeaseKeeper:
    """Renews ``claim`` every ``renew_every_s`` on a thread of its own. The first loss (a renewal the
    ledger refused, or the local deadline passed) is kept in ``lost`` and handed to ``on_lost`` once; the
    first cancel request a claim or renewal carries is handed to ``on_cancel`` once.

    A renewal that fails for any other reason (the ledger busy, the database out of reach) is retried at
    the next tick, but only until the lease's local deadline: ``ttl_s`` minus ``loss_margin`` after the
    START of the last successful renewal request (or of the claim, ``claimed_at``), on the local monotonic
    ``clock``. The ledger computes the expiry from its own clock at or after that start, so the deadline
    falls before any moment another owner could claim the run. At the deadline the lease is lost: a
    second thread watches it, because the renewing thread may be stuck in a request to a database that
    does not answer, and whoever asks ``lost`` past it finds the loss too."""

    def __init__(
        self,
        ledger: Ledger,
        claim: LeaseClaim,
        *,
        ttl_s: float,
        renew_every_s: float,
        on_lost: Callable[[LeaseLostError], None],
        on_cancel: Callable[[CancelRequest], None],
        claimed_at: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``claimed_at``: the ``clock`` time the claim request was sent (default: now, which is later
        than it was and so less safe: pass it)."""
        self.claim = claim
        self._ledger = ledger
        self._ttl_s = ttl_s
        self._every_s = renew_every_s
        self._margin_s = loss_margin(ttl_s, renew_every_s)
        self._clock = clock
        self._deadline = (clock() if claimed_at is None else claimed_at) + ttl_s - self._margin_s
        self._last_error: Exception | None = None
        self._lost: LeaseLostError | None = None
        self._on_lost = on_lost
        self._on_cancel = on_cancel
        self._cancel_seen = False
        self._losing = threading.Lock()  # the threads and a fenced write may all find the loss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_until_stopped, name="tpuctl-lease", daemon=True)
        self._watch = threading.Thread(target=self._watch_deadline, name="tpuctl-lease-deadline", daemon=True)

    @property
    def lost(self) -> LeaseLostError | None:
        """The loss, once seen: a renewal or a fenced write found the lease gone, or its local deadline
        passed (found here by whoever asks first, if the watching thread has not yet)."""
        if self._lost is None and self._clock() >= self._deadline:
            self._lose(self._expiring())
        return self._lost

    @property
    def deadline(self) -> float:
        """When (``clock`` time) the lease is given up unless a renewal succeeds before."""
        return self._deadline

    def start(self) -> None:
        self._notice_cancel(self.claim.cancel)
        self._thread.start()
        self._watch.start()

    def stop(self) -> None:
        """No more renewals (the lease itself stays until ``release`` or its expiry)."""
        self._stop.set()
        for thread in (self._thread, self._watch):
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=self._every_s + 5.0)

    def release(self) -> None:
        """Stop renewing and give the lease back, unless it is already lost (then nothing is written)."""
        self.stop()
        if self.lost is None:
            self._ledger.release_lease(self.claim)

    def renew(self) -> None:
        """One renewal (the thread's tick). A success moves the deadline to the request's start + ttl -
        margin, unless the deadline passed while it was under way: that is a loss all the same, since
        whoever asked ``lost`` meanwhile was told so."""
        if self.lost is not None:
            return
        started = self._clock()
        try:
            claim = self._ledger.renew_lease(self.claim, self._ttl_s)
        except LeaseLostError as exc:
            self._lose(exc)
            return
        except Exception as exc:
            # The ledger busy, the database gone, a bug: retried at the next tick until the deadline. A
            # thread that died here would leave the supervisor acting on a run whose lease nobody renews.
            self._last_error = exc
            return
        if self.lost is not None:
            return
        self.claim = claim
        self._deadline = started + self._ttl_s - self._margin_s
        self._last_error = None
        self._notice_cancel(claim.cancel)

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self._every_s):
            self.renew()
            if self._lost is not None:
                return

    def _watch_deadline(self) -> None:
        """Declare the loss at the deadline even while the renewing thread waits on the database."""
        while self.lost is None and not self._stop.wait(max(self._deadline - self._clock(), 0.0) + 0.01):
            pass

    def give_up(self, why: Exception) -> LeaseLostError:
        """Stop holding the run because its supervisor cannot go on (``why``: the ledger out of reach
        mid-run): renew no more and act no more, as on a loss; the lease expires and the next owner
        carries the run on. Returns the loss (the first one, if it was already lost)."""
        claim = self.claim
        self._lose(
            LeaseLostError(
                f"run {claim.run_id} (generation {claim.generation}): the ledger could not be written "
                f"({why}), so this supervisor stops acting on the run and leaves it to the next owner once "
                "its lease expires",
                run_id=claim.run_id,
                generation=claim.generation,
                fix=_carry_on(claim),
            )
        )
        lost = self._lost
        assert lost is not None
        return lost

    def note_lost(self, lost: LeaseLostError) -> None:
        """A loss found elsewhere (a fenced write): kept in ``lost`` and handed to ``on_lost`` as a
        renewal's would be, once, so whoever asks ``lost`` stops speaking for the run."""
        self._lose(lost)

    def _lose(self, lost: LeaseLostError) -> None:
        with self._losing:
            if self._lost is not None:
                return
            self._lost = lost
        self._stop.set()  # nothing left to renew
        self._on_lost(lost)

    def _expiring(self) -> LeaseLostError:
        claim = self.claim
        why = f": {self._last_error}" if self._last_error is not None else ""
        return LeaseLostError(
            f"the lease on run {claim.run_id} (generation {claim.generation}) could not be renewed in time; "
            f"it may expire within {self._margin_s:g} s, so this supervisor stops acting on the run before "
            f"it does{why}",
            run_id=claim.run_id,
            generation=claim.generation,
            fix=_carry_on(claim),
        )

    def _notice_cancel(self, request: CancelRequest | None) -> None:
        if request is not None and not self._cancel_seen:
            self._cancel_seen = True
            self._on_cancel(request)


def _carry_on(claim: LeaseClaim) -> str:
    return f"check the ledger (`tpuctl doctor`); `tpuctl runs resume {claim.run_id}` carries the run on"


def fenced_session(
    session: Session,
    claim: LeaseClaim,
    *,
    on_lost: Callable[[LeaseLostError], None] | None = None,
    lost: Callable[[], LeaseLostError | None] | None = None,
) -> Session:
    """``session`` with its ledger fenced by ``claim`` (a loss a write finds goes to ``on_lost``) and its
    cloud recording a fenced intent before every slice create and delete, and refusing it once ``lost``
    (the keeper's local deadline) says the lease is gone. Closing it closes nothing (``session`` owns the
    connections, OS Login's among them)."""
    ledger = session.ledger.fenced(claim, on_lost=on_lost)
    cloud = FencedCloud(session.cloud, ledger, claim, lost=lost)
    session.os_login()  # opened by (and closed with) ``session``: the copy shares its opened clients
    return dataclasses.replace(session, ledger=ledger, cloud=cloud, _closers=[])


class FencedCloud(ForwardingCloud):
    """A ``TpuCloud`` whose mutations first record a fenced intent (``Ledger.record_intent``): a
    supervisor that lost its lease gets ``LeaseLostError`` before the request is sent. ``lost`` (the
    keeper's) is asked before the intent and again after it, right before the request: the intent's write
    may have waited on the database past the keeper's local deadline. Reads pass."""

    def __init__(
        self,
        cloud: TpuCloud,
        ledger: Ledger,
        claim: LeaseClaim,
        *,
        lost: Callable[[], LeaseLostError | None] | None = None,
    ) -> None:
        self._cloud = cloud
        self._ledger = ledger
        self._claim = claim
        self._lost = lost

    def _intend(self, action: IntentAction, name: str, zone: str, call: str) -> None:
        self._refuse_if_lost()
        self._ledger.record_intent(self._claim, action, name, zone, detail={"call": call})
        self._refuse_if_lost()

    def _refuse_if_lost(self) -> None:
        lost = None if self._lost is None else self._lost()
        if lost is not None:
            raise lost

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
