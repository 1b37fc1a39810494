"""Attempt results as the attempt loop makes them, for the tests of what the supervisor concludes from
one (tests/services/run/test_accounting.py, test_maintenance.py)."""

from __future__ import annotations

from tpuctl.services.run.model import AttemptResult


def attempt_ended(codes: dict[int, int | None], *, started_at: float, ended_at: float) -> AttemptResult:
    """An attempt whose hosts all ended at ``ended_at`` with ``codes`` (the first status that is neither 0
    nor 75, the runtime's "preempted, checkpoint saved", is its failure)."""
    failed = next(((w, c) for w, c in sorted(codes.items()) if c not in (0, 75)), None)
    return AttemptResult(
        exit_codes=codes,
        failed_worker=None if failed is None else failed[0],
        returncode=None if failed is None else failed[1],
        interrupted=False,
        timed_out=False,
        shipped=[],
        started_at=started_at,
        ended_at=ended_at,
        exit_times=dict.fromkeys(codes, ended_at),
    )
