"""Cost by owner (revision 0004): ``cost_rollup_owner``, the billed slices of ``cost_rollup`` keyed by
whose they are instead of by labels.

Cost grouped by workspace or principal read every slice (``cost_rollup`` is keyed by day, zone, type,
capacity and labels: no owner in it), a quarter of a million rows at a million events. This table sums
the very slices ``cost_rollup`` sums (``schema.rolled_sql``: closed, billed, within one UTC day, not a
free preemption) per first day, workspace, principal, zone, type and capacity, so such a report reads a
row per owner and day. A NULL workspace, principal, type or capacity is keyed as
``billing.null_key_sql`` (a NULL never conflicts in a key).

``slice_rollup.SliceRollup`` keeps it (triggers on ``pods``, both engines): a closed slice whose principal or
workspace changes moves its sums.
"""

from __future__ import annotations

from typing import Final

from tpuctl.store import billing
from tpuctl.store.slice_rollup import SliceRollup
from tpuctl.store.sql import Dialect

#: Covering indexes of the slices a report by owner reads one by one (``tables._cost_by_owner`` defines
#: them; their rows are wide, and a look-up each was most of those passes): the preempted ones (the quota
#: held), those crossing midnight (the rollup holds only slices closed within a day), and those that
#: redid steps (their stored recomputed work).
OWNER_INDEXES: Final = ("pods_preempted_owner", "pods_crossing_owner", "pods_rec_owner")


def _key_values(r: str, dialect: Dialect) -> list[str]:
    null = billing.null_key_sql(dialect)
    return [billing.first_day_sql(r, dialect), f"COALESCE({r}.workspace, {null})",
            f"COALESCE({r}.principal, {null})", f"{r}.zone", f"COALESCE({r}.accelerator_type, {null})",
            f"COALESCE({r}.capacity, {null})"]  # fmt: skip


OWNER: Final = SliceRollup(
    table="cost_rollup_owner",
    key=("day", "workspace", "principal", "zone", "accelerator_type", "capacity"),
    key_values=_key_values,
    only=None,
    moved_by=("principal", "workspace"),
    triggers=("pods_owner_rollup_insert", "pods_owner_rollup_close", "pods_owner_rollup_move"),
)
