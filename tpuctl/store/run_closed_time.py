"""Closed time by run (revision 0006): ``run_closed_time``, each run's closed slices' time at their recorded
price.

A report by run with a limit (the money page's 7 costliest runs) bounds every run's cost to find the few
worth costing, and counts every run group. Both read every slice runs created (200,000 at a million
events, a quarter of the page's time) on every request. For a window that holds every closed slice whole
(no ``--since``, every slice ended before the window's end), this table holds those sums per run, so the
bounds and the count read a row per run; the slices still open are added by the reader (their time grows
with the clock).

Per run, over the slices it created (``pods.run_id``) that are closed, were READY and have a chip count:

* ``slices``: how many;
* ``priced_usd_s``: their chip-seconds from READY to their end times their recorded price per chip-hour
  (the last one, for a slice whose price changed: what the bound reads), USD x 3600;
* ``unpriced_chip_s``: those chip-seconds of the slices with no price recorded.

``run_sums.RunSums`` keeps it (triggers on ``pods``, both engines) and re-derives it for ``check_view``.
"""

from __future__ import annotations

from typing import Final

from tpuctl.store.run_sums import RunSums


def _chip_s(r: str) -> str:
    return f"{r}.chips * ({r}.ended_at - {r}.ready_at)"


def _shares(r: str) -> list[str]:
    """The slice ``r``'s share of each sum (never NULL: only a slice with a share is summed)."""
    return [
        "1.0",
        f"COALESCE({_chip_s(r)} * {r}.price_per_chip_hour, 0.0)",
        f"(CASE WHEN {r}.price_per_chip_hour IS NULL THEN {_chip_s(r)} ELSE 0.0 END)",
    ]


def _has_share(r: str) -> str:
    """Whether the slice ``r`` adds anything to its run's row: its run named, closed, READY, chips known."""
    return (
        f"({r}.run_id IS NOT NULL AND {r}.ended_at IS NOT NULL AND {r}.ready_at IS NOT NULL"
        f" AND {r}.chips IS NOT NULL)"
    )


CLOSED_TIME: Final = RunSums(
    table="run_closed_time",
    sums=("slices", "priced_usd_s", "unpriced_chip_s"),
    watched=("run_id", "ended_at", "ready_at", "chips", "price_per_chip_hour"),
    triggers=("pods_run_closed_time_insert", "pods_run_closed_time_update"),
    shares=_shares,
    has_share=_has_share,
)
