"""Look-before-acting wrappers for node create and delete, for callers that must never duplicate a slice.

The v2 API has no requestId for node create, so after a create whose outcome is unknown (a connection
broken after sending, a 500, an operation we lost track of) sending it again is only safe after looking:

* the node exists and carries our ``tpuctl-request`` label: it is ours; wait for it instead of creating;
* the node exists with another request label: someone else's; ``AlreadyExistsError``;
* the node does not exist: the create did not happen (or failed and was cleaned up); send it again.

Delete is the mirror: after an unknown outcome, a node that is gone or DELETING needs nothing more.

These work on any ``TpuCloud`` (services can use them with a fake), and retry through tenacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuctl.cloud.base import LABEL_REQUEST, Node, NodeRequest, OperationProgress, TpuCloud
from tpuctl.cloud.retry import Polling, Sleep
from tpuctl.errors import AlreadyExistsError, NotFoundError, TransientError

if TYPE_CHECKING:
    from tenacity import RetryCallState

#: States a node passes through on its way to READY (waiting for it stops at any other state).
_SETTLING = frozenset({"CREATING", "STATE_UNSPECIFIED"})


class _SendAgain(Exception):
    """The earlier request certainly did not take effect: send it again."""


def create_node_idempotent(
    cloud: TpuCloud,
    request: NodeRequest,
    *,
    request_id: str,
    wait: bool = True,
    progress: OperationProgress | None = None,
    attempts: int = 5,
    poll_interval_s: float = 0.2,
    poll_max_interval_s: float = 2.0,
    timeout_s: float = 1800.0,
    sleep: Sleep | None = None,
) -> Node:
    """Create ``request`` at most once, even across ambiguous failures; return the node (READY if ``wait``).

    ``request_id`` is written as the node's ``tpuctl-request`` label (see ``TpuCloud.create_node``) and
    is how an existing node is recognised as this request's. Stockout, quota and bad-request errors
    propagate unchanged: they are answers, not uncertainty.
    """
    import tenacity

    polling = Polling(timeout_s, poll_interval_s, poll_max_interval_s, sleep)

    def attempt() -> Node:
        try:
            return cloud.create_node(request, request_id=request_id, wait=wait, progress=progress)
        except (TransientError, AlreadyExistsError):
            # Ambiguous (may have happened), transient after sending (the operation poll gave up), or
            # already there (an earlier attempt of ours succeeded?): look before anything else.
            node = _own_node(cloud, request, request_id)
            if node is None:
                raise _SendAgain() from None
            if not wait or node.state not in _SETTLING:
                return node
            return _wait_settled(cloud, request, node, polling, progress)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        retry=tenacity.retry_if_exception_type((_SendAgain, TransientError)),
        wait=tenacity.wait_random_exponential(multiplier=poll_interval_s, max=poll_max_interval_s),
        sleep=sleep or _sleep,
        retry_error_callback=lambda state: _give_up(state, request, attempts),
    )
    result: Node = retrying(attempt)
    return result


def _own_node(cloud: TpuCloud, request: NodeRequest, request_id: str) -> Node | None:
    """The node named by ``request`` if this request made it; None if there is none; someone else's is
    ``AlreadyExistsError``."""
    try:
        node = cloud.get_node(request.zone, request.name)
    except NotFoundError:
        return None
    if node.labels.get(LABEL_REQUEST) != request_id:
        raise AlreadyExistsError(
            f"create node {request.name} in {request.zone}: a node with this name exists and was not "
            f"made by this request (its {LABEL_REQUEST} label is "
            f"{node.labels.get(LABEL_REQUEST)!r}, not {request_id!r})",
            code=6,
            fix="choose another name, or delete the existing node first",
        )
    return node


def _wait_settled(
    cloud: TpuCloud, request: NodeRequest, node: Node, polling: Polling, progress: OperationProgress | None
) -> Node:
    """Wait for our ``node`` (found still settling after a retry) to settle; ``_SendAgain`` if it went."""
    if progress is not None:
        progress.update(
            f"create node {request.name} in {request.zone}: waiting (found after a retry)", elapsed_s=0.0
        )

    def poll() -> Node | None:
        try:
            return cloud.get_node(request.zone, request.name)
        except NotFoundError:
            return None  # it went away: the create failed (a lost stockout, say)

    final = polling.until(
        poll,
        lambda n: n is None or n.state not in _SETTLING,
        still=f"create node {request.name} in {request.zone}: still {node.state}",
        fix="it continues on the server: check it later with tpuctl pod describe",
    )
    if final is None:
        raise _SendAgain()  # send it again: the real error (if any) will be answered this time
    return final


def _give_up(state: RetryCallState, request: NodeRequest, attempts: int) -> Node:
    """After the last attempt: its transient error as it is, else (the node never appeared) a transient
    error saying so."""
    exc = state.outcome.exception() if state.outcome is not None else None
    if isinstance(exc, TransientError):
        raise exc
    raise TransientError(
        f"create node {request.name} in {request.zone}: the outcome stayed unknown after {attempts} "
        "attempts; no node of this request exists",
        fix="retry later; tpuctl pod list shows what exists",
    )


def delete_node_idempotent(
    cloud: TpuCloud,
    zone: str,
    name: str,
    *,
    wait: bool = True,
    progress: OperationProgress | None = None,
    attempts: int = 5,
    poll_interval_s: float = 0.2,
    poll_max_interval_s: float = 2.0,
    timeout_s: float = 1800.0,
    sleep: Sleep | None = None,
) -> None:
    """Delete a node, tolerating unknown outcomes: gone (or DELETING, when not waiting) counts as done."""
    import tenacity

    def gone() -> bool:
        try:
            cloud.get_node(zone, name)
        except NotFoundError:
            return True
        return False

    def attempt() -> None:
        try:
            cloud.delete_node(zone, name, wait=wait, progress=progress)
            return
        except NotFoundError:
            return  # already gone: an earlier attempt of ours did it
        except TransientError:
            try:
                node = cloud.get_node(zone, name)
            except NotFoundError:
                return
            if node.state != "DELETING":
                raise _SendAgain() from None
        if wait:
            Polling(timeout_s, poll_interval_s, poll_max_interval_s, sleep).until(
                gone,
                bool,
                still=f"delete node {name} in {zone}: still DELETING",
                fix="it continues on the server: check it later with tpuctl pod list",
            )

    def give_up(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, TransientError):
            raise exc
        raise TransientError(
            f"delete node {name} in {zone}: the node is still there after {attempts} attempts",
            fix="retry later; tpuctl pod list shows what exists",
        )

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        retry=tenacity.retry_if_exception_type((_SendAgain, TransientError)),
        wait=tenacity.wait_random_exponential(multiplier=poll_interval_s, max=poll_max_interval_s),
        sleep=sleep or _sleep,
        retry_error_callback=give_up,
    )
    retrying(attempt)


def _sleep(seconds: float) -> Any:
    import time

    time.sleep(seconds)
