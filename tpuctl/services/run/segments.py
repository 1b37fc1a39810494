"""A supervised run's segments in the ledger: provisioning, running, checkpointing, preempted and
recovering spans, each with its slice. At most one is open at a time (opening the next one ends it in the
ledger's view; ``close`` ends it here), and the running segment of the attempt in progress carries its
step counts."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tpuctl.errors import TpuctlError
from tpuctl.store.records import SegmentKind

if TYPE_CHECKING:
    from tpuctl.services.run.accounting import Progress
    from tpuctl.services.run.sliceset import SliceSet
    from tpuctl.services.session import Session


class Segments:
    """The open segment and the attempt's running segment of one supervised run."""

    def __init__(self, session: Session, progress: Progress) -> None:
        self._session = session
        self._progress = progress
        self.current: int | None = None  # the open segment, closed by ``close``
        self.running: int | None = None  # the running segment of the attempt in progress (or the last)

    def open(
        self,
        run_id: str,
        kind: SegmentKind,
        slices: SliceSet | None,
        *,
        at: float,
        detail: Mapping[str, Any] | None = None,
    ) -> int:
        """Start a ``kind`` segment at ``at`` on ``slices`` (None: no slice, e.g. recovering). A checkpointing
        segment first writes the steps the attempt ran up to the notice."""
        if kind is SegmentKind.CHECKPOINTING:
            self.record_steps()
        segment = self._session.ledger.add_segment(
            run_id,
            kind,
            start=at,
            pod=None if slices is None else slices.name,
            zone=None if slices is None else slices.zone,
            capacity=None if slices is None else slices.capacity,
            detail=detail,
        )
        self.current = segment
        if kind is SegmentKind.RUNNING:
            self.running = segment
        return segment

    def record_steps(self) -> None:
        """The attempt's step counts so far, on its running segment."""
        if self.running is not None:
            self._session.ledger.update_segment(
                self.running,
                steps_completed=self._progress.attempt_steps,
                steps_recomputed=self._progress.attempt_recomputed_known,
            )

    def describe_running(self, detail: Mapping[str, Any]) -> None:
        """Replace the running segment's detail (e.g. how the slice looked from the API meanwhile)."""
        if self.running is not None:
            self._session.ledger.update_segment(self.running, detail=dict(detail))

    def forget(self) -> None:
        """Leave the open segment to whoever opened it (provisioning keeps and closes its own)."""
        self.current = None

    def close(self) -> None:
        segment, self.current = self.current, None
        if segment is None:
            return
        with contextlib.suppress(TpuctlError):  # already closed by the next one's start
            self._session.ledger.close_segment(segment, end=time.time())
