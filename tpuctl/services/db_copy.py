"""`tpuctl db copy SRC DST`: a ledger's history moved into another database (``tpuctl.store.copy`` says
what is copied and how), then checked on both sides.

The check: the copy's own marker counted every event and attempt of the source; every finished run of the
source is in the target. When the target holds nothing but this source's history (the usual move of a
laptop into a new team database), every table's rows and the cost report's totals (all its figures, to
the cent) must be the same on both sides. When it holds other history too (a second laptop copied into
the same database), whole-ledger figures cannot match and are shown, not compared (``scope``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from tpuctl.errors import UsageError
from tpuctl.store import copy as store_copy
from tpuctl.store.copy import CopyOutcome, CopyPlan, CopyStep
from tpuctl.store.database import Database, open_database
from tpuctl.store.ledger import Ledger
from tpuctl.store.migrate import schema_state
from tpuctl.store.records import LedgerError

if TYPE_CHECKING:
    from tpuctl.catalog import Catalog
    from tpuctl.services.prices import PriceSource
    from tpuctl.store.url import DatabaseUrl

#: "ledger": the target holds only this source's history, and every figure was compared; "copied": it
#: holds more, and only what the copy itself wrote was.
Scope = Literal["ledger", "copied"]

#: The cost report's totals that are compared (``CostLine``'s figures, and the preemptions).
_FIGURES: Final = ("slices", "billed_hours", "chip_hours", "cost_usd", "on_demand_usd", "spot_savings_usd",
                   "recomputed_usd", "quota_held_chip_hours", "quota_held_usd")  # fmt: skip
#: Of those, the ones compared in whole units (the rest to the cent).
_COUNTS: Final = ("slices", "preemptions", "free_preemptions")


@dataclass(frozen=True, slots=True)
class CopyResult:
    """What `db copy` did (``outcome``) or would do (``plan``, on a dry run), and what it checked."""

    source: str
    target: str
    dry_run: bool
    plan: CopyPlan | None
    outcome: CopyOutcome | None
    scope: Scope | None
    source_rows: Mapping[str, int]
    target_rows: Mapping[str, int]
    source_cost: Mapping[str, float]
    target_cost: Mapping[str, float]
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "dry_run": self.dry_run,
            **({"plan": asdict(self.plan)} if self.plan is not None else {}),
            **({"copied": asdict(self.outcome)} if self.outcome is not None else {}),
            "verified": self.scope,
            "rows": {"source": dict(self.source_rows), "target": dict(self.target_rows)},
            "cost_totals": {"source": dict(self.source_cost), "target": dict(self.target_cost)},
            "elapsed_s": round(self.elapsed_s, 3),
        }


def copy_database(
    source_url: DatabaseUrl,
    target_url: DatabaseUrl,
    *,
    catalog: Catalog,
    prices: PriceSource,
    dry_run: bool = False,
    chunk: int = store_copy.EVENT_CHUNK,
    on_step: Callable[[CopyStep], None] = lambda _step: None,
    clock: Callable[[], float] = time.time,
) -> CopyResult:
    """Copy the ledger at ``source_url`` into the one at ``target_url`` (created or upgraded to this
    tpuctl's schema) and check it; ``dry_run``: only say what would be copied (nothing is written, the
    target not even created). A ``UsageError`` for a source still in use or a target that is the source;
    a ``LedgerError`` naming what differs when the check fails."""
    if source_url.text == target_url.text:
        raise UsageError(
            f"the source and the target are the same database ({source_url.text})",
            field="target",
            value=target_url.text,
            fix="name the database to copy into as DST",
        )
    state = schema_state(source_url)
    if state.revision is None and not state.legacy_version:
        # Opening it would make an empty ledger there (a mistyped path): nothing to copy, say so.
        raise UsageError(
            f"there is no ledger at {source_url.text}",
            field="source",
            value=source_url.text,
            fix="name the ledger to copy as SRC (the laptop's: `tpuctl db status` shows its URL)",
        )
    started = time.monotonic()
    source = open_database(source_url)
    try:
        store_copy.refuse_live(source)
        if dry_run:
            plan = _plan(source, target_url)
            rows = store_copy.table_counts(source)
            return CopyResult(source_url.text, target_url.text, True, plan, None, None, rows, {}, {}, {},
                              time.monotonic() - started)  # fmt: skip
        target_db = open_database(target_url)
        with Ledger(target_db) as target:
            outcome = store_copy.copy_ledger(source, target, target_db, chunk=chunk, on_step=on_step)
            result = _checked(source, target_db, outcome, catalog, prices, clock())
    finally:
        source.close()
    return CopyResult(source_url.text, target_url.text, False, None, outcome, *result,
                      time.monotonic() - started)  # fmt: skip


def _plan(source: Database, target_url: DatabaseUrl) -> CopyPlan:
    """The plan against the target as it is, without creating or upgrading it."""
    identity = store_copy.ledger_identity(source)
    state = schema_state(target_url)
    if state.revision is None and state.legacy_version in (None, 0):
        return store_copy.plan(source, None, identity)  # a new database: everything would be copied
    if state.pending or state.newer:
        raise UsageError(
            f"the target {target_url.text} is not at this tpuctl's schema, so a dry run cannot read it",
            field="target",
            value=target_url.text,
            fix=f"run `tpuctl --database {target_url.text} db upgrade` first, or copy without --dry-run",
        )
    target = open_database(target_url)
    try:
        return store_copy.plan(source, target, identity)
    finally:
        target.close()


_Checked = tuple[Scope, Mapping[str, int], Mapping[str, int], Mapping[str, float], Mapping[str, float]]


def _checked(
    source: Database,
    target: Database,
    outcome: CopyOutcome,
    catalog: Catalog,
    prices: PriceSource,
    now: float,
) -> _Checked:
    """Compare both sides (see the module doc); raise a ``LedgerError`` naming every difference."""
    source_rows, target_rows = store_copy.table_counts(source), store_copy.table_counts(target)
    source_cost, target_cost = (_cost_totals(db, catalog, prices, now) for db in (source, target))
    progress = outcome.progress
    differences = [
        f"{what}: {want} in the source, {got} copied"
        for what, want, got in (
            ("events", source_rows["events"], progress.events),
            ("attempts", source_rows["attempts"], progress.attempts),
        )
        if want != got
    ]
    alone = target_rows["events"] == progress.events and target_rows["runs"] == source_rows["runs"]
    if alone:
        differences += [
            f"{table} rows: {n} in the source, {target_rows[table]} in the target"
            for table, n in source_rows.items()
            if target_rows[table] != n
        ]
        differences += [
            f"cost {figure}: {value} in the source, {target_cost[figure]} in the target"
            for figure, value in source_cost.items()
            if not _same(figure, value, target_cost[figure])
        ]
    if differences:
        raise LedgerError(
            f"the copy in {target.where} does not match its source {source.where}: " + "; ".join(differences),
            fix="run the same `tpuctl db copy` again (it goes on where it stopped); if a difference "
            "stays, keep the source ledger as it is and report it",
        )
    return ("ledger" if alone else "copied"), source_rows, target_rows, source_cost, target_cost


def _cost_totals(db: Database, catalog: Catalog, prices: PriceSource, now: float) -> dict[str, float]:
    """The cost report's totals over the whole ledger until ``now``: what `cost report` ends with."""
    from tpuctl.services.cost import CostService, GroupBy

    report = CostService(db, catalog, prices, clock=lambda: now, workers=1).report(
        group_by=GroupBy("total"), with_days=False
    )
    totals: dict[str, float] = {figure: getattr(report.totals, figure) for figure in _FIGURES}
    totals["preemptions"] = report.preemptions
    totals["free_preemptions"] = report.free_preemptions
    return totals


def _same(figure: str, a: float, b: float) -> bool:
    """Equal to the cent (hours to the hundredth), or in whole units for a count. Sums taken in another
    order may differ in their last bits, and so round apart across a half cent: that is the same."""
    if figure in _COUNTS:
        return a == b
    return round(a, 2) == round(b, 2) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
