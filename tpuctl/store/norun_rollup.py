"""Cost of the slices no run created (revision 0007): ``cost_rollup_norun``, the slices ``cost_rollup`` sums
that no run created (``pods.run_id`` NULL), keyed by day, zone, type and capacity.

A report by run has a group "(none)" for the slices no run created, and the money page by run draws it
(most of a team's ledger may be slices made with ``pod create``). Its figures and its days read every such
slice one by one (39,512 at a million events, a fifth of the page's time). This table sums the rolled ones
(closed within one UTC day: most) per day and combination, so the report reads a row per day and
combination for the window's whole days and the other slices one by one.

``slice_rollup.SliceRollup`` keeps it (triggers on ``pods``, both engines): a closed slice whose run
changes (a tool attributing it) moves in or out.
"""

from __future__ import annotations

from typing import Final

from tpuctl.store import billing
from tpuctl.store.slice_rollup import SliceRollup
from tpuctl.store.sql import Dialect


def _key_values(r: str, dialect: Dialect) -> list[str]:
    null = billing.null_key_sql(dialect)
    return [billing.first_day_sql(r, dialect), f"{r}.zone", f"COALESCE({r}.accelerator_type, {null})",
            f"COALESCE({r}.capacity, {null})"]  # fmt: skip


NORUN: Final = SliceRollup(
    table="cost_rollup_norun",
    key=("day", "zone", "accelerator_type", "capacity"),
    key_values=_key_values,
    only=lambda r: f"{r}.run_id IS NULL",
    moved_by=("run_id",),
    triggers=("pods_norun_rollup_insert", "pods_norun_rollup_close", "pods_norun_rollup_move"),
)
