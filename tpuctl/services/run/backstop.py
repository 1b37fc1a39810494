"""A run's backstop: what deletes the slices a run made when no supervisor is left to (docs/architecture.md,
"The backstop"). Neither path needs a tpuctl process:

- a deadman on host 0 of the run's slices (``tpuctl/hosts/deadman.py``), armed by the supervisor at the
  start of every attempt; it deletes the slices with the VM's own service-account token once the program is
  over (or the run's deadline passed) and no supervisor checked in for ``backstop_grace``. The supervisor
  checks in over SSH every ``checkin_every(grace)`` seconds while an attempt's executor is open;
- on Compute Engine, a run with ``--max-hours`` creates its slices with ``terminationTime`` at the deadline
  plus the grace (``termination_at``): the cloud ends them whatever happens to the hosts.

Only slices the run creates and deletes at its end are guarded: not a ``--pod`` slice, not one kept with
``--keep-pod``.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from tpuctl.errors import TpuctlError
from tpuctl.hosts import deadman
from tpuctl.hosts.base import ForwardingExecutor

if TYPE_CHECKING:
    from tpuctl.cloud.base import PlannedRequest
    from tpuctl.hosts.base import Executor, ShipResult
    from tpuctl.services.run.model import PreparedRun
    from tpuctl.services.run.sliceset import SliceSet
    from tpuctl.services.session import Session

#: How long one arm or check-in command may take on host 0.
_COMMAND_TIMEOUT_S = 30.0
#: The check-in period's bounds: often enough that a grace of a few seconds (tests) holds, rarely enough
#: that a long run opens an SSH channel at most once a minute.
_CHECKIN_MIN_S = 0.2
_CHECKIN_MAX_S = 60.0


def guards(prepared: PreparedRun) -> bool:
    """Whether the run's slices get a backstop: the run creates them and deletes them at its end."""
    return prepared.target.creates and not prepared.request.keep_pod


def termination_at(session: Session, prepared: PreparedRun) -> float | None:
    """When Compute Engine itself ends a slice of the run: the deadline plus the grace (the supervisor
    stops the run before its deadline; the cloud only acts once nobody did)."""
    deadline = prepared.request.deadline_at
    if deadline is None or not guards(prepared):
        return None
    return deadline + session.settings.backstop_grace


def checkin_every(grace_s: float) -> float:
    """The supervisor's check-in period: a quarter of the grace, so three missed check-ins still fit."""
    return min(_CHECKIN_MAX_S, max(_CHECKIN_MIN_S, grace_s / 4))


@dataclass(frozen=True)
class BackstopPlan:
    """What the deadman of one slice set is told: where the run's attempts live on host 0, the grace, the
    deadline and the requests that delete every slice (host 0's own last: the deadman goes with it)."""

    run_id: str
    remote_root: str
    grace_s: float
    deadline_at: float | None
    delete: tuple[PlannedRequest, ...]

    @property
    def runs_dir(self) -> str:
        """The run's directory on the host (``follow.py``'s layout, relative to the login directory)."""
        return f"{self.remote_root}/runs/{self.run_id}"

    @property
    def directory(self) -> str:
        return f"{self.runs_dir}/backstop"

    def config(self) -> dict[str, Any]:
        """The deadman's ``config.json``."""
        return {
            "grace_s": self.grace_s,
            "deadline_at": self.deadline_at,
            "runs_dir": self.runs_dir,
            "delete": [{"method": r.method, "url": r.url} for r in self.delete],
        }

    def arm_command(self) -> str:
        """The shell command that writes the deadman (its text on stdin) and arms it."""
        folder = shlex.quote(self.directory)
        script = f'"$d"/{deadman.SCRIPT}'
        return (
            f'd={folder} && mkdir -p "$d" && cat > {script}.new && mv -f {script}.new {script} && '
            f'exec python3 -I -S {script} arm "$d" {shlex.quote(json.dumps(self.config()))}'
        )

    def checkin_command(self) -> str:
        # A missing directory (a wiped disk) fails the check-in, which arms the deadman again.
        path = shlex.quote(f"{self.directory}/{deadman.CHECKIN}")
        return f"touch -c {path} && test -e {path}"

    def to_dict(self) -> dict[str, Any]:
        """For the run's detail in the ledger (``runs describe``, the reconciliation's note)."""
        return {
            "grace_s": self.grace_s,
            "deadline_at": self.deadline_at,
            "deletes": [r.url for r in self.delete],
        }


def plan_for(session: Session, prepared: PreparedRun, slices: SliceSet) -> BackstopPlan | None:
    """The backstop of ``slices`` (None: the run does not guard them)."""
    if not guards(prepared):
        return None
    cloud = session.cloud
    nodes = list(slices.nodes)
    # Host 0 is on the first slice: the others go first, its own last. A slice a queued resource made
    # goes with it (force: its nodes too), so that no queued resource is left behind.
    ordered = [*nodes[1:], nodes[0]]
    queued = {n.queued_resource.rsplit("/", 1)[-1]: n.zone for n in ordered if n.queued_resource}
    delete = tuple(
        [req for n in ordered if not n.queued_resource for req in cloud.plan_delete_node(n.zone, n.name)]
        + [cloud.plan_delete_queued_resource(zone, qr, force=True) for qr, zone in queued.items()]
    )
    return BackstopPlan(
        run_id=prepared.run_id,
        remote_root=prepared.request.ssh_remote_root,
        grace_s=session.settings.backstop_grace,
        deadline_at=prepared.request.deadline_at,
        delete=delete,
    )


def script_text() -> bytes:
    """The deadman's source, as host 0 runs it."""
    return resources.files("tpuctl.hosts").joinpath(f"{deadman.SCRIPT}").read_bytes()


class Backstopped(ForwardingExecutor):
    """An executor whose host 0 carries the run's deadman: armed while the bundle is shipped (a
    supervisor that dies during a long setup is covered too), then checked in every
    ``checkin_every(grace)``, both on a thread of its own, until the executor closes; ``on_armed`` is told
    once. A deadman that cannot be armed is said (``status``) and the attempt goes on without it: the run
    itself is not at stake."""

    def __init__(
        self,
        inner: Executor,
        plan: BackstopPlan,
        *,
        status: Callable[[str], None],
        on_armed: Callable[[BackstopPlan], None] | None = None,
    ) -> None:
        super().__init__(inner)
        self.backstop = plan
        self._status = status
        self._on_armed = on_armed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.armed = False

    # --- the backstop -------------------------------------------------------------------------------

    def arm(self) -> bool:
        """Write and start (or re-arm) the deadman on host 0; whether it runs."""
        try:
            results = self._inner.run_command(
                self.backstop.arm_command(),
                stdin=script_text(),
                on_line=lambda worker, text: None,
                timeout_s=_COMMAND_TIMEOUT_S,
                workers=[0],
            )
        except TpuctlError as exc:
            self._status(f"warning: the run's backstop could not be armed on host 0: {exc.message}")
            return False
        result = results.get(0)
        if result is None or result.exit_status != 0:
            said = " / ".join(result.tail[-3:]) if result is not None else "no answer"
            self._status(f"warning: the run's backstop could not be armed on host 0: {said}")
            return False
        if not self.armed and self._on_armed is not None:
            # Recorded, not said: the console is for what the user must act on (a failure to arm is).
            try:
                self._on_armed(self.backstop)
            except Exception as exc:  # the record (e.g. a lost lease's refused write) must not stop check-ins
                self._status(f"note: the run's backstop is armed but could not be recorded: {exc}")
        self.armed = True
        return True

    def _keep(self) -> None:
        """Arm, then check in until the executor closes (on a thread of its own: the attempt's ship and
        setup do not wait for either)."""
        try:
            armed = self.arm()
        except CancelledError:  # the executor closed while arming: the attempt is over, nothing to keep
            return
        if not armed:
            return
        every = checkin_every(self.backstop.grace_s)
        while not self._stop.wait(every):
            try:
                results = self._inner.run_command(
                    self.backstop.checkin_command(),
                    on_line=lambda worker, text: None,
                    timeout_s=_COMMAND_TIMEOUT_S,
                    workers=[0],
                )
            except Exception:  # unreachable for now: the next tick tries again (the grace covers a few)
                continue
            result = results.get(0)
            if result is not None and result.exit_status not in (0, None) and not self._stop.is_set():
                self.arm()  # its directory is gone (the disk was wiped): arm it again

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._keep, name="tpuctl-backstop", daemon=True)
            self._thread.start()

    def _end(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_COMMAND_TIMEOUT_S + 5.0)

    # --- the executor: the bundle's shipping starts the backstop, closing ends it -----------------

    def ship(self, bundle: Any) -> list[ShipResult]:
        self._start()
        return super().ship(bundle)

    def close(self) -> None:
        self._stop.set()
        try:
            self._inner.close()
        finally:
            self._end()

    def abandon(self) -> None:
        """The lease is lost: no more check-ins (the new owner arms its own), connections dropped."""
        self._stop.set()
        abandon = getattr(self._inner, "abandon", None)
        if callable(abandon):
            abandon()
        else:
            self._inner.close()
        self._end()

    def __getattr__(self, name: str) -> Any:
        # What a particular executor adds beyond the protocol (the SSH one's leftovers and hosts).
        return getattr(self._inner, name)
