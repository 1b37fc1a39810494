"""Waste by run (revision 0005): ``run_waste``, what each run's slices wasted, as far as the ledger has
stored it: the quota its preempted slices held until they were deleted, and the recomputed work the
ledger keeps per closed slice (``pods.rec_*``).

The money page lists the runs that wasted most. Finding them summed those two facts over every preempted
slice and every slice that redid steps, grouped by run (tens of thousands of rows sorted at a million
events, a quarter of the page's time), on every request. This table holds those sums per run, so the
candidates are read from a row per run instead; what it cannot hold is added by the reader: the quota of
preempted slices not deleted yet (it grows with the clock).

Per run, over the slices it created (``pods.run_id``):

* ``held_usd_s``: the chip-seconds between a preempted slice's end and its deletion, times its recorded
  price per chip-hour (USD x 3600); ``held_unpriced_chip_s`` those chip-seconds of slices with no price;
* ``rec_priced``, ``rec_unpriced``: the sums of ``pods.rec_priced`` and ``pods.rec_unpriced``.

``run_sums.RunSums`` keeps it (triggers on ``pods``, both engines) and re-derives it for ``check_view``.
"""

from __future__ import annotations

from typing import Final

from tpuctl.store.run_sums import RunSums


def _held_s(r: str) -> str:
    """The chip-seconds the slice ``r`` held after its preemption, until deleted (NULL if none)."""
    return (
        f"(CASE WHEN {r}.end_reason = 'preempted' AND {r}.deleted_at IS NOT NULL AND {r}.ended_at IS NOT NULL"
        f" THEN {r}.chips * ({r}.deleted_at - {r}.ended_at) END)"
    )


def _shares(r: str) -> list[str]:
    """The slice ``r``'s share of each sum (never NULL)."""
    held = _held_s(r)
    return [
        f"COALESCE({held} * {r}.price_per_chip_hour, 0.0)",
        f"COALESCE(CASE WHEN {r}.price_per_chip_hour IS NULL THEN {held} END, 0.0)",
        f"{r}.rec_priced",
        f"{r}.rec_unpriced",
    ]


def _has_share(r: str) -> str:
    """Whether the slice ``r`` adds anything to its run's row."""
    return (
        f"({r}.run_id IS NOT NULL AND ({r}.rec_priced != 0 OR {r}.rec_unpriced != 0"
        f" OR ({r}.end_reason = 'preempted' AND {r}.deleted_at IS NOT NULL AND {r}.chips IS NOT NULL)))"
    )


WASTE: Final = RunSums(
    table="run_waste",
    sums=("held_usd_s", "held_unpriced_chip_s", "rec_priced", "rec_unpriced"),
    # The facts of a slice its share depends on (an update of any of them moves it).
    watched=("run_id", "end_reason", "ended_at", "deleted_at", "chips", "price_per_chip_hour", "rec_priced",
             "rec_unpriced"),
    triggers=("pods_run_waste_insert", "pods_run_waste_update"),
    shares=_shares,
    has_share=_has_share,
)  # fmt: skip
