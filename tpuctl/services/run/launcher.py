"""The launcher: the steps of one attempt that the supervisor (``supervisor``, the lifecycle of every run,
``tpuctl run`` and ``bench step`` alike) takes: ``provision`` the run's slices and ``execute`` the program
on every host; and, before a run starts, ``prepare`` (validate, bundle) and ``plan`` (``--dry-run``).

Plain Python: the CLI renders through a ``LaunchObserver`` (``line(worker, text)`` for host output,
``status(text)`` for the launcher's own steps). State: the run is a row of the ledger's ``runs`` table
with its segments; each host's output goes to its log in the run's directory (``rundir``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tpuctl.services.run import attempt, hosts, prepare, provision
from tpuctl.services.run.model import AttemptResult, LaunchObserver, PreparedRun, RunRequest, Silent

if TYPE_CHECKING:
    from tpuctl.cloud.base import OperationProgress
    from tpuctl.hosts.base import Executor
    from tpuctl.services.run.sliceset import SliceSet
    from tpuctl.services.session import Session


class Launcher:
    """Runs a program on every host of a slice. Collaborators come in through the session; the executor
    for a node comes from ``executor_factory`` (tests inject their own)."""

    def __init__(
        self,
        session: Session,
        *,
        observer: LaunchObserver | None = None,
        executor_factory: Callable[[PreparedRun, SliceSet], Executor] | None = None,
    ) -> None:
        self._session = session
        self._observer: LaunchObserver = observer or Silent()
        self._executor_factory = executor_factory or self._default_executor
        #: The executor of the attempt in progress (tests and the supervisor look at it).
        self.current_executor: Executor | None = None

    def prepare(self, request: RunRequest) -> PreparedRun:
        """Validate the request and build the bundle; raises UsageError for any bad input."""
        return prepare.prepare(self._session, request)

    def plan(self, prepared: PreparedRun) -> dict[str, Any]:
        """What ``run`` would ship and run where (``--dry-run``). Changes nothing."""
        return prepare.plan(self._session, prepared)

    def provision(
        self,
        prepared: PreparedRun,
        *,
        progress: OperationProgress | None = None,
        prefer_zone: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> SliceSet:
        """Create the run's slices and wait until READY (see ``provision.provision``)."""
        return provision.provision(
            self._session, self._observer, prepared, progress=progress, prefer_zone=prefer_zone, detail=detail
        )

    def execute(
        self,
        prepared: PreparedRun,
        slices: SliceSet,
        *,
        restart_count: int = 0,
        soft_exit_codes: frozenset[int] = frozenset(),
        soft_wait_s: float = 60.0,
        on_started: Callable[[Executor, float], None] | None = None,
        may_start: Callable[[], bool] | None = None,
        stopping: Callable[[], bool] | None = None,
    ) -> AttemptResult:
        """One attempt on ``slices`` (see ``attempt.execute``)."""
        executor = self._executor_factory(prepared, slices)
        self.current_executor = executor
        try:
            return attempt.execute(
                self._session,
                self._observer,
                executor,
                prepared,
                slices,
                restart_count=restart_count,
                soft_exit_codes=soft_exit_codes,
                soft_wait_s=soft_wait_s,
                on_started=on_started,
                may_start=may_start,
                stopping=stopping,
            )
        finally:
            self.current_executor = None

    def _default_executor(self, prepared: PreparedRun, slices: SliceSet) -> Executor:
        return hosts.build_executor(self._session, prepared, slices, for_plan=False)
