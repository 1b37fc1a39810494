"""Cost: reports from the ledger, reconciliation with the live listing, and estimates before creating.

Modules, each one idea (the billing rules themselves are ``tpuctl.store.billing``):

* ``service``: ``CostService``, the report's facade; ``window``: its inputs (grouping, limit, window);
  ``model``: its records (``CostLine``, ``CostReport``). The report reads through
  ``tpuctl.store.cost_reader.LedgerReader`` (a read-only snapshot, whichever engine is behind it).
* The aggregate groupings: ``aggregate`` (groups from the scans' rows), ``scan`` (the fast path and its
  reference oracle side by side), ``subs`` (the rows), ``pricing`` (catalog and on-demand prices).
* The slice and run groupings: ``item_report`` and the SQL that computes them, ``items``.
* The SQL: ``sql_intervals`` (billed intervals, price pieces, segments, per-day split: both paths),
  ``sql_scan`` (the pods scans), ``sql_fast`` (the rollup-driven fast path), each written from
  ``tpuctl.store.cost_sql``'s fragments, which know what the engines write differently.
* ``details``: the groups' keys, order and facts; ``reconcile``: the ledger against the live listing;
  ``estimate``: ``cost estimate``.
* Whose the cost is: ``scope`` (``CostScope``: some workspaces, one principal), ``attributed`` (the
  workspace and user groupings, and every scoped report, summed from the slice rows), ``monthly_spend``
  (a calendar month's spend per workspace and per user: the server's queue and metrics).

The public names are importable from here; each is loaded with its module on first use, so that a command
importing one of them (``cost report`` parses its flags first) does not load the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuctl.services.cost.estimate import Estimate, EstimateRequest, build_estimate_request, estimate
    from tpuctl.services.cost.model import CSV_COLUMNS, FIGURES, CostLine, CostReport
    from tpuctl.services.cost.monthly_spend import MonthSpend, Spend, month_spend
    from tpuctl.services.cost.reconcile import InBackground, Reconciler, reconciled_report
    from tpuctl.services.cost.scope import CostScope
    from tpuctl.services.cost.service import CostService
    from tpuctl.services.cost.window import (
        DEFAULT_TABLE_LIMIT,
        GROUP_BY_CHOICES,
        GroupBy,
        iso,
        parse_group_by,
        parse_instant,
        parse_limit,
        parse_window,
    )
    from tpuctl.store.billing import FREE_PREEMPTION_S, recompute_fraction_sql
    from tpuctl.store.cost_reader import KNOWN_SCHEMA, LedgerReader

#: Public name -> the module that defines it.
_HOMES = {
    "CostService": "tpuctl.services.cost.service",
    "CostScope": "tpuctl.services.cost.scope",
    "MonthSpend": "tpuctl.services.cost.monthly_spend",
    "Spend": "tpuctl.services.cost.monthly_spend",
    "month_spend": "tpuctl.services.cost.monthly_spend",
    "CostLine": "tpuctl.services.cost.model",
    "CostReport": "tpuctl.services.cost.model",
    "CSV_COLUMNS": "tpuctl.services.cost.model",
    "FIGURES": "tpuctl.services.cost.model",
    "LedgerReader": "tpuctl.store.cost_reader",
    "KNOWN_SCHEMA": "tpuctl.store.cost_reader",
    "DEFAULT_TABLE_LIMIT": "tpuctl.services.cost.window",
    "GROUP_BY_CHOICES": "tpuctl.services.cost.window",
    "GroupBy": "tpuctl.services.cost.window",
    "iso": "tpuctl.services.cost.window",
    "parse_group_by": "tpuctl.services.cost.window",
    "parse_instant": "tpuctl.services.cost.window",
    "parse_limit": "tpuctl.services.cost.window",
    "parse_window": "tpuctl.services.cost.window",
    "InBackground": "tpuctl.services.cost.reconcile",
    "Reconciler": "tpuctl.services.cost.reconcile",
    "reconciled_report": "tpuctl.services.cost.reconcile",
    "Estimate": "tpuctl.services.cost.estimate",
    "EstimateRequest": "tpuctl.services.cost.estimate",
    "build_estimate_request": "tpuctl.services.cost.estimate",
    "estimate": "tpuctl.services.cost.estimate",
    "FREE_PREEMPTION_S": "tpuctl.store.billing",
    "recompute_fraction_sql": "tpuctl.store.billing",
}

__all__ = [
    "CSV_COLUMNS",
    "DEFAULT_TABLE_LIMIT",
    "FIGURES",
    "FREE_PREEMPTION_S",
    "GROUP_BY_CHOICES",
    "KNOWN_SCHEMA",
    "CostLine",
    "CostReport",
    "CostScope",
    "CostService",
    "Estimate",
    "EstimateRequest",
    "GroupBy",
    "InBackground",
    "LedgerReader",
    "MonthSpend",
    "Reconciler",
    "Spend",
    "build_estimate_request",
    "estimate",
    "iso",
    "month_spend",
    "parse_group_by",
    "parse_instant",
    "parse_limit",
    "parse_window",
    "recompute_fraction_sql",
    "reconciled_report",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later look-ups are plain attribute reads
    return value
