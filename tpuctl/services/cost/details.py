"""A report's groups as shown: their keys (a region, a date, a slice's name), their order, the facts shown
with a slice or a run, and the ``limit`` costliest kept."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final

from tpuctl.services.cost.model import CostLine
from tpuctl.services.cost.pricing import region_or
from tpuctl.services.cost.scope import PRINCIPAL_OF_P, WORKSPACE_OF_P
from tpuctl.services.cost.subs import Sub
from tpuctl.services.cost.window import GroupBy, iso
from tpuctl.store import cost_sql as sd
from tpuctl.store.billing import DAY_S
from tpuctl.store.billing import round_usd as _r
from tpuctl.store.cost_reader import LedgerReader
from tpuctl.store.sql import Dialect

#: The group of what belongs to none (slices no run created, with --group-by run).
NONE_KEY: Final = "(none)"


def display_key(group: GroupBy, sub: Sub) -> Any:
    if sub.key is None:
        return NONE_KEY
    if group.kind == "region":
        return region_or(str(sub.key))
    if group.kind == "day":
        return datetime.fromtimestamp(int(sub.key) * DAY_S, UTC).date().isoformat()
    if group.kind == "slice":
        return int(sub.key)
    return str(sub.key)


def sorted_lines(group: GroupBy, lines: list[CostLine]) -> list[CostLine]:
    if group.kind == "day":
        return sorted(lines, key=lambda line: line.key)
    if group.kind == "slice":
        return lines  # ordered by slice_info (cost, then ready time and id)
    # By the cost as shown (rounded): the order must not hang on the last bits of a float sum, which
    # the fast path adds up in another order.
    return sorted(lines, key=lambda line: (-_r(line.cost_usd), line.key))


def slice_info(reader: LedgerReader, lines: list[CostLine]) -> None:
    by_id = {int(line.key): line for line in lines}
    if not by_id:
        return
    d = reader.dialect
    rows = reader.query(
        # Times formatted by the database: a few hundred thousand datetime objects cost seconds in Python.
        f"SELECT id, zone, name, incarnation, accelerator_type, chips, capacity, state, run_id, "
        f"{sd.iso('ready_at', d)}, {sd.iso('ended_at', d)}, end_reason, "
        f"{sd.iso('deleted_at', d)}, price_per_chip_hour, labels, ready_at, {WORKSPACE_OF_P}, "
        f"{PRINCIPAL_OF_P} FROM pods AS p "
        f"WHERE id IN ({sd.json_values(':ids', 'INTEGER', d)})",
        {"ids": json.dumps(sorted(by_id))},
    )
    order: dict[int, tuple[float, int]] = {}
    for r in rows:
        line = by_id[int(r[0])]
        line.key = f"{r[1]}/{r[2]}#{r[3]}"
        line.info = {
            "name": r[2],
            "zone": r[1],
            "incarnation": r[3],
            "accelerator_type": r[4],
            "chips": r[5],
            "capacity": r[6],
            "state": r[7],
            "run_id": r[8],
            "ready_at": r[9],
            "ended_at": r[10],
            "end_reason": r[11],
            "deleted_at": r[12],
            "price_per_chip_hour": r[13],
            "labels": json.loads(r[14]) if r[14] else {},
            "workspace": r[16],
            "principal": r[17],
        }
        order[id(line)] = (r[15] if r[15] is not None else math.inf, int(r[0]))
    lines.sort(key=lambda line: (-_r(line.cost_usd), *order.get(id(line), (math.inf, 0))))


def run_info(reader: LedgerReader, lines: list[CostLine]) -> None:
    ids = [line.key for line in lines if line.key != NONE_KEY]
    if not ids:
        return
    rows = reader.query(
        "SELECT run_id, status, created_at, ended_at, restarts, preemptions, steps, script FROM runs "
        f"WHERE run_id IN ({sd.json_values(':ids', 'TEXT', reader.dialect)})",
        {"ids": json.dumps(ids)},
    )
    info = {
        r[0]: {
            "status": r[1],
            "created_at": iso(r[2]),
            "ended_at": iso(r[3]),
            "restarts": r[4],
            "preemptions": r[5],
            "steps": r[6],
            "program": r[7],
        }
        for r in rows
    }
    for line in lines:
        if line.key in info:
            line.info = info[line.key]


def mark_unknown_steps(reader: LedgerReader, groups: list[dict[str, Any]]) -> None:
    """Run groups whose program reports no steps: what they recomputed, and so their waste, is unknown
    (null), not 0 (the supervisor records ``recovery.steps_reported`` false for them). Their quota held
    after a preemption is still known, and counts in the totals as before."""
    ids = [g["key"] for g in groups if g["key"] != NONE_KEY]
    if not ids:
        return
    rows = reader.query(
        f"SELECT run_id FROM runs WHERE run_id IN ({sd.json_values(':ids', 'TEXT', reader.dialect)}) "
        f"AND {_steps_unreported(reader.dialect)}",
        {"ids": json.dumps(ids)},
    )
    silent = {r[0] for r in rows}
    for g in groups:
        if g["key"] in silent:
            g.update(steps=None, recomputed_usd=None, waste_usd=None, steps_reported=False)


def _steps_unreported(d: Dialect) -> str:
    """A run (its JSON ``detail``) whose supervisor recorded ``recovery.steps_reported`` false."""
    return sd.json_path_is_false("detail", ("recovery", "steps_reported"), d)


def limited(group: GroupBy, lines: list[CostLine], limit: int | None) -> list[CostLine]:
    """The ``limit`` costliest of ``lines`` (already in report order), kept in that order."""
    if limit is None or len(lines) <= limit:
        return lines
    if group.kind != "day":
        return lines[:limit]  # already most expensive first
    ranked = sorted(range(len(lines)), key=lambda i: (-_r(lines[i].cost_usd), lines[i].key))
    keep = sorted(ranked[:limit])
    return [lines[i] for i in keep]


def dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
