"""Cost by whose it is: ``--group-by workspace`` and ``--group-by user``, and every report limited to a
scope (``--workspace``, ``--user``, or the workspaces a server's reader may see: ``scope.CostScope``).

Each such group is the sum of the per-slice rows of the slices it holds (``--group-by slice``'s rows, the
same SQL: ``items``), so the groups add up to the slices exactly. Unscoped, the totals, per-day figures
and preemption counts are the whole ledger's (the aggregate fast path's, as for every grouping); scoped,
they are the scope's: the totals are the sum of its slices and its preemptions are counted over its
slices, and the per-day figures are left out (no per-slice day split is kept) with a warning.

Scoped reports group by what a slice row says: ``--group-by run`` puts a slice with the run that made it
(slices no run made are "(none)": the unscoped report also bills runs for their time on such slices);
``--group-by day`` needs the per-day split and is refused with a scope (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from tpuctl.errors import UsageError
from tpuctl.services.cost.aggregate import Query
from tpuctl.services.cost.details import NONE_KEY, limited, sorted_lines
from tpuctl.services.cost.item_report import ItemReport, item_report
from tpuctl.services.cost.model import FIGURE_FIELDS, CostLine
from tpuctl.services.cost.pricing import region_or
from tpuctl.services.cost.scope import PRINCIPAL_OF_P, WORKSPACE_OF_P, CostScope, scope_sql
from tpuctl.services.cost.sql_scan import preemptions_sql
from tpuctl.services.cost.window import GroupBy

#: The groupings only this path computes.
ATTRIBUTED_KINDS: Final = frozenset({"workspace", "user"})

_SLICE = GroupBy("slice")
#: The groupings summed in SQL: their key over a slice (alias p).
_SUMMED_BY: Final = {"workspace": WORKSPACE_OF_P, "user": PRINCIPAL_OF_P}
_KeyOf = Callable[[Mapping[str, Any]], Any]


def _key_of(group: GroupBy) -> _KeyOf:
    """A slice row's group key (None: "(none)")."""
    if group.kind == "label":
        label = group.label_key or ""
        return lambda row: row["labels"].get(label)
    if group.kind == "region":
        return lambda row: region_or(str(row["zone"]))
    field = {"workspace": "workspace", "user": "principal", "zone": "zone", "type": "accelerator_type",
             "capacity": "capacity", "run": "run_id", "total": "total"}[group.kind]  # fmt: skip
    if field == "total":
        return lambda row: None
    return lambda row: row[field]


def lines_of(group: GroupBy, rows: list[dict[str, Any]], key_of: _KeyOf | None = None) -> list[CostLine]:
    """The groups of ``group`` summed from rows holding ``FIGURES`` (slice rows, ``items.slice_records``;
    or groups already summed, keyed by ``key_of``), in report order."""
    key_of = key_of or _key_of(group)
    lines: dict[str, CostLine] = {}
    for row in rows:
        key = key_of(row)
        name = NONE_KEY if key is None else str(key)
        line = lines.get(name)
        if line is None:
            line = lines[name] = CostLine(name)
        line.add(CostLine(name, **{figure: row[figure] for figure in FIGURE_FIELDS}))
    return sorted_lines(group, list(lines.values()))


def attributed_report(
    q: Query, group: GroupBy, scope: CostScope, *, with_days: bool, limit: int | None
) -> ItemReport:
    """The groups of ``group`` over the slices of ``scope``, each the sum of its slice rows (summed in SQL
    for the workspace and user groupings, in Python for what else a scoped report groups by)."""
    scoped = not scope.everything
    if scoped and group.kind == "day":
        raise UsageError(
            "--group-by day cannot be limited to a workspace or a user",
            field="group_by",
            value="day",
            fix="drop --workspace/--user, or group by workspace, user, run, slice, zone or type",
        )
    q.params.update(scope.params())
    summed_by = _SUMMED_BY.get(group.kind)
    rows, _count, by_day, counts, totals = item_report(
        q, _SLICE, with_days=with_days and not scoped, limit=None, scoped=scoped, summed_by=summed_by
    )
    if scoped:
        totals = CostLine("total")
        for line in lines_of(GroupBy("total"), rows):
            totals.add(line)
        d = q.reader.dialect
        preempted, free = q.reader.query(f"{preemptions_sql(d)} AND {scope_sql('p', d)}", q.params)[0]
        counts = (int(preempted), int(free), int(totals.slices))
        by_day = []
        if with_days:
            q.warnings.append("no per-day figures in a report limited to a workspace or a user")
    if group.kind == "slice":
        return (rows if limit is None else rows[:limit]), len(rows), by_day, counts, totals
    lines = lines_of(group, rows, _summed_key if summed_by is not None else None)
    return [line.to_dict() for line in limited(group, lines, limit)], len(lines), by_day, counts, totals


def _summed_key(row: Mapping[str, Any]) -> Any:
    return row["key"]
