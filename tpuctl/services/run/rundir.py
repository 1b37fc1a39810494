"""Where one run keeps its files on this machine: ``<state>/runs/<run_id>/``, with each host's log, the
saved request (``--detach``, ``runs resume``), the background supervisor's own log and the lease's lock
file. Every per-run path is made here and nowhere else."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.services.run.lease import LOCK_FILE
from tpuctl.store.paths import ensure_private_dir

if TYPE_CHECKING:
    from tpuctl.store.records import RunRecord

#: The state dir's folder of run directories.
RUNS_FOLDER = "runs"
#: What a run's request is saved as (0600: --env values may be secrets).
REQUEST_FILE = "request.json"
#: What a background supervisor (``--detach``) writes its own output to.
SUPERVISOR_LOG = "supervisor.log"


@dataclass(frozen=True)
class RunDir:
    """One run's directory. A value: nothing is created until ``make``."""

    root: Path

    @classmethod
    def of(cls, state_dir: Path, run_id: str) -> RunDir:
        """Run ``run_id``'s directory under ``state_dir``."""
        return cls(state_dir / RUNS_FOLDER / run_id)

    @classmethod
    def recorded(cls, state_dir: Path, record: RunRecord) -> RunDir:
        """The directory the run's record names (its detail's ``log_dir``, which keeps the path the run
        was started with), else the one under ``state_dir``."""
        logged = (record.detail or {}).get("log_dir")
        return cls(Path(logged)) if logged else cls.of(state_dir, record.run_id)

    @property
    def request_file(self) -> Path:
        return self.root / REQUEST_FILE

    @property
    def supervisor_log(self) -> Path:
        return self.root / SUPERVISOR_LOG

    @property
    def lock_file(self) -> Path:
        return self.root / LOCK_FILE

    def host_log(self, worker: int) -> Path:
        """Host ``worker``'s output, every attempt appended (``hostlog.HostLog``)."""
        return self.root / f"worker-{worker}.log"

    def host_logs(self, workers: range | list[int]) -> list[tuple[int, Path]]:
        """(worker, log file) of each of ``workers``."""
        return [(worker, self.host_log(worker)) for worker in workers]

    def make(self) -> RunDir:
        """Create the directory (and the runs folder above it) private, 0700: the logs hold the program's
        output and the request its --env values."""
        ensure_private_dir(self.root.parent)
        ensure_private_dir(self.root)
        return self
